//! [`TemplateCodec`]: `mtrl-core`'s [`ChatCodec`] for this crate's [`Tokenizer`] and chat template,
//! so that `mtrl-env` can run token-in/token-out episodes without depending on the model.
//!
//! A tool turn is computed by rendering the template twice — the history ending with the assistant
//! message (no generation prompt), and the history plus the new tool messages (with the generation
//! prompt) — checking that the first rendering, cut just after its last end-of-turn token, is a
//! prefix of the second, and tokenizing only the rest. The cut sits right after a special token
//! (`<|im_end|>`), where the tokenizer's pre-tokenization splits anyway, so tokenizing the suffix
//! alone gives the same ids as tokenizing the whole rendering.
//!
//! Invariant: the transcript is never re-tokenized; a template whose rendering of earlier turns
//! changes when tool messages are added is refused with an error instead of silently producing
//! ids the model never saw.

use std::sync::Arc;

use mtrl_core::{ChatCodec, CodecError, Message};
use serde_json::Value;

use crate::chat_template::ChatOptions;
use crate::tokenizer::Tokenizer;

/// A chat codec over a tokenizer with a chat template.
pub struct TemplateCodec {
    tok: Arc<Tokenizer>,
    end_of_turn: String,
    stops: Vec<u32>,
    enable_thinking: Option<bool>,
}

fn err(e: impl std::fmt::Display) -> CodecError {
    CodecError(e.to_string())
}

impl TemplateCodec {
    /// `end_of_turn` is the token that closes a message in the template (`<|im_end|>` for Qwen);
    /// the stop ids are it and the EOS token. `enable_thinking` is passed to the template as is.
    pub fn new(
        tok: Arc<Tokenizer>,
        end_of_turn: &str,
        enable_thinking: Option<bool>,
    ) -> Result<TemplateCodec, CodecError> {
        let eot = tok
            .token_id(end_of_turn)
            .ok_or_else(|| err(format!("the tokenizer has no `{end_of_turn}` token")))?;
        let mut stops = vec![eot];
        if let Some(eos) = tok.eos_token_id() {
            if eos != eot {
                stops.push(eos);
            }
        }
        Ok(TemplateCodec {
            tok,
            end_of_turn: end_of_turn.to_string(),
            stops,
            enable_thinking,
        })
    }

    /// Qwen's ChatML: `<|im_end|>` ends a turn.
    pub fn qwen(tok: Arc<Tokenizer>) -> Result<TemplateCodec, CodecError> {
        TemplateCodec::new(tok, "<|im_end|>", None)
    }

    fn opts(&self, add_generation_prompt: bool) -> ChatOptions {
        ChatOptions {
            add_generation_prompt,
            enable_thinking: self.enable_thinking,
        }
    }
}

impl ChatCodec for TemplateCodec {
    fn encode_prompt(&self, messages: &[Message], tools: &[Value]) -> Result<Vec<u32>, CodecError> {
        let text = self.render(messages, tools, true)?;
        self.encode_text(&text)
    }

    fn encode_tool_turn(
        &self,
        history: &[Message],
        new: &[Message],
        tools: &[Value],
    ) -> Result<Vec<u32>, CodecError> {
        let before = self.render(history, tools, false)?;
        let cut = before
            .rfind(&self.end_of_turn)
            .map(|i| i + self.end_of_turn.len())
            .ok_or_else(|| {
                err(format!(
                    "the rendered history has no `{}` to continue after",
                    self.end_of_turn
                ))
            })?;
        let mut all = history.to_vec();
        all.extend_from_slice(new);
        let after = self.render(&all, tools, true)?;
        if !after.starts_with(&before[..cut]) {
            return Err(err(
                "the chat template renders earlier turns differently once tool results are added; \
                 token-in/token-out is impossible with this template",
            ));
        }
        self.encode_text(&after[cut..])
    }

    fn decode(&self, ids: &[u32]) -> Result<String, CodecError> {
        self.tok.decode(ids, false).map_err(err)
    }

    fn stop_token_ids(&self) -> Vec<u32> {
        self.stops.clone()
    }

    fn render(
        &self,
        messages: &[Message],
        tools: &[Value],
        add_generation_prompt: bool,
    ) -> Result<String, CodecError> {
        let tools = (!tools.is_empty()).then_some(tools);
        self.tok
            .apply_chat_template(messages, tools, self.opts(add_generation_prompt))
            .map_err(err)
    }

    fn encode_text(&self, text: &str) -> Result<Vec<u32>, CodecError> {
        self.tok.encode(text).map_err(err)
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn codec() -> TemplateCodec {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tokenizer");
        TemplateCodec::qwen(Arc::new(Tokenizer::from_dir(&dir).unwrap())).unwrap()
    }

    #[test]
    fn tool_turn_is_the_suffix_after_end_of_turn() {
        let c = codec();
        let history = vec![Message::user("q"), Message::assistant("a")];
        let new = vec![
            Message::tool("bm25_search", "r1"),
            Message::tool("bm25_search", "r2"),
        ];
        let ids = c.encode_tool_turn(&history, &new, &[]).unwrap();
        let text = c.decode(&ids).unwrap();
        assert_eq!(
            text,
            "\n<|im_start|>user\n<tool_response>\nr1\n</tool_response>\n<tool_response>\nr2\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
        );
        assert!(!c.stop_token_ids().is_empty());
        assert!(c.encode_tool_turn(&[], &new, &[]).is_err());
    }
}
