//! Chat messages and the token codec the environment uses without depending on the model.
//!
//! [`Message`] and [`ToolCall`] serialise to the Hugging Face chat-message JSON that chat templates
//! consume (`{"role": "tool", "content": "…", "name": "…"}`, tool calls as `{"name", "arguments"}`,
//! which Qwen-style templates accept with or without the `{"function": …}` wrapper).
//!
//! [`ChatCodec`] is the seam between the environment (`mtrl-env`, no model dependency) and a
//! tokenizer with a chat template (`mtrl-model`'s `codec.rs`). Its contract is token-in/token-out:
//! the ids it returns for a tool turn are appended to what the policy sampled, and the transcript
//! is never re-tokenized.
//!
//! Invariant: `encode_prompt(m) ++ sampled ++ encode_tool_turn(…) ++ …` equals the template
//! rendering of the final messages, tokenized, whenever the sampled ids are the tokenizer's own
//! encoding of the decoded text and each assistant message ended with the template's end-of-turn
//! token (see `mtrl-env`'s ARCHITECTURE section for the cases where it cannot).

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
    Tool,
}

/// A tool invocation: the tool's name and its JSON arguments.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    pub name: String,
    pub arguments: Value,
}

/// One chat message in the Hugging Face shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: Role,
    pub content: String,
    /// Structured tool calls (omitted when empty). The environment keeps an assistant's raw text in
    /// `content` and leaves this empty, so that rendering shows exactly what the model wrote.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// Tool messages: the tool that produced the content.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl Message {
    fn new(role: Role, content: impl Into<String>) -> Message {
        Message {
            role,
            content: content.into(),
            tool_calls: Vec::new(),
            name: None,
        }
    }

    pub fn system(content: impl Into<String>) -> Message {
        Self::new(Role::System, content)
    }

    pub fn user(content: impl Into<String>) -> Message {
        Self::new(Role::User, content)
    }

    pub fn assistant(content: impl Into<String>) -> Message {
        Self::new(Role::Assistant, content)
    }

    /// A tool result; `name` is the tool that produced it.
    pub fn tool(name: impl Into<String>, content: impl Into<String>) -> Message {
        Message {
            name: Some(name.into()),
            ..Self::new(Role::Tool, content)
        }
    }
}

/// A codec failure (template rendering, tokenization), described by the implementation.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("chat codec: {0}")]
pub struct CodecError(pub String);

/// Turns messages into the token ids a policy sees, and sampled ids back into text.
///
/// Implementations must be deterministic: the same input gives the same ids.
pub trait ChatCodec: Send + Sync {
    /// The ids of the conversation so far, ending with the assistant header (generation prompt).
    /// `tools` are JSON schemas in the template's tool format (empty: no tools section).
    fn encode_prompt(
        &self,
        messages: &[Message],
        tools: &[Value],
    ) -> std::result::Result<Vec<u32>, CodecError>;

    /// The ids to append after an assistant message (whose last sampled id is an end-of-turn
    /// token) so that the next generation can start: template glue, the `new` messages (tool
    /// results), and the next assistant header. `history` is the whole conversation up to and
    /// including that assistant message; only the new segment is tokenized.
    fn encode_tool_turn(
        &self,
        history: &[Message],
        new: &[Message],
        tools: &[Value],
    ) -> std::result::Result<Vec<u32>, CodecError>;

    /// Text of sampled ids (special tokens kept, so nothing the model wrote is hidden).
    fn decode(&self, ids: &[u32]) -> std::result::Result<String, CodecError>;

    /// Ids that end an assistant message (`<|im_end|>`, EOS).
    fn stop_token_ids(&self) -> Vec<u32>;

    /// The template rendering of `messages` as text (for checks and debugging).
    fn render(
        &self,
        messages: &[Message],
        tools: &[Value],
        add_generation_prompt: bool,
    ) -> std::result::Result<String, CodecError>;

    /// Tokenizes text as-is (no special tokens added).
    fn encode_text(&self, text: &str) -> std::result::Result<Vec<u32>, CodecError>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn messages_serialise_in_hf_shape() {
        let m = Message::tool("bm25_search", "r");
        assert_eq!(
            serde_json::to_value(&m).unwrap(),
            json!({"role": "tool", "content": "r", "name": "bm25_search"})
        );
        let mut a = Message::assistant("");
        a.tool_calls.push(ToolCall {
            name: "submit".into(),
            arguments: json!({"doc_ids": ["1"]}),
        });
        let v = serde_json::to_value(&a).unwrap();
        assert_eq!(v["tool_calls"][0]["name"], "submit");
        let back: Message = serde_json::from_value(v).unwrap();
        assert_eq!(back, a);
        let u: Message = serde_json::from_str(r#"{"role":"user","content":"q"}"#).unwrap();
        assert_eq!(u, Message::user("q"));
    }
}
