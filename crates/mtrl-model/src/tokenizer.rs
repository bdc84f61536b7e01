//! Tokenizer (HF `tokenizer.json` via the `tokenizers` crate) with the checkpoint's chat template
//! and special tokens from `tokenizer_config.json`.
//!
//! Invariant: text is always encoded with `add_special_tokens = false`; special tokens come only
//! from the chat template's text (Qwen has no BOS), exactly as transformers'
//! `apply_chat_template(tokenize=True)` does.

use std::path::Path;

use serde::Serialize;
use serde_json::Value;

use crate::chat_template::{ChatOptions, ChatTemplate};
use crate::error::{ModelError, Result};

/// A tokenizer plus chat template.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    template: Option<ChatTemplate>,
    eos_token: Option<String>,
    pad_token: Option<String>,
}

fn token_string(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(Value::as_str).map(str::to_string),
        _ => None,
    }
}

impl Tokenizer {
    /// Loads `tokenizer.json` and (if present) `tokenizer_config.json` from `dir`.
    /// A `.gguf` file is accepted too (its converted folder is used, see [`crate::gguf`]).
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let dir = &crate::gguf::checkpoint_dir(dir)?;
        let tj = dir.join("tokenizer.json");
        if !tj.exists() {
            return Err(ModelError::Tokenizer(format!(
                "{} is missing",
                tj.display()
            )));
        }
        let inner = tokenizers::Tokenizer::from_file(&tj)
            .map_err(|e| ModelError::Tokenizer(format!("{}: {e}", tj.display())))?;
        let cfg_path = dir.join("tokenizer_config.json");
        let cfg: Value = if cfg_path.exists() {
            let text =
                std::fs::read_to_string(&cfg_path).map_err(|e| ModelError::io(&cfg_path, e))?;
            serde_json::from_str(&text).map_err(|e| ModelError::Json {
                path: cfg_path.clone(),
                msg: e.to_string(),
            })?
        } else {
            Value::Null
        };
        Self::from_parts(inner, &cfg)
    }

    /// Builds from a loaded `tokenizers::Tokenizer` and a parsed `tokenizer_config.json`.
    pub fn from_parts(inner: tokenizers::Tokenizer, cfg: &Value) -> Result<Self> {
        let eos_token = token_string(cfg.get("eos_token"));
        let pad_token = token_string(cfg.get("pad_token"));
        let bos = token_string(cfg.get("bos_token")).unwrap_or_default();
        let source = match cfg.get("chat_template") {
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Array(list)) => list
                .iter()
                .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                .or_else(|| list.first())
                .and_then(|t| t.get("template"))
                .and_then(Value::as_str)
                .map(str::to_string),
            _ => None,
        };
        let template = match source {
            Some(s) => Some(ChatTemplate::new(
                &s,
                &bos,
                eos_token.as_deref().unwrap_or_default(),
            )?),
            None => None,
        };
        Ok(Self {
            inner,
            template,
            eos_token,
            pad_token,
        })
    }

    /// Errors if the tokenizer can produce ids the model's embedding does not have.
    pub fn check_vocab(&self, model_vocab: usize) -> Result<()> {
        let n = self.vocab_size();
        if n > model_vocab {
            return Err(ModelError::Tokenizer(format!(
                "tokenizer has {n} ids but the model's embedding has only {model_vocab} rows"
            )));
        }
        Ok(())
    }

    /// Number of ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Encodes `text` without adding special tokens.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode(text, false)
            .map_err(|e| ModelError::Tokenizer(format!("encode failed: {e}")))?;
        Ok(enc.get_ids().to_vec())
    }

    /// The token strings of `text` (byte-level forms such as `Ġworld`).
    pub fn tokens(&self, text: &str) -> Result<Vec<String>> {
        let enc = self
            .inner
            .encode(text, false)
            .map_err(|e| ModelError::Tokenizer(format!("encode failed: {e}")))?;
        Ok(enc.get_tokens().to_vec())
    }

    /// Decodes ids to text.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| ModelError::Tokenizer(format!("decode failed: {e}")))
    }

    /// The id of a token string (`<|im_end|>` …), if it exists.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The EOS token id from `tokenizer_config.json`.
    pub fn eos_token_id(&self) -> Option<u32> {
        self.eos_token.as_deref().and_then(|t| self.token_id(t))
    }

    /// The pad token id from `tokenizer_config.json`.
    pub fn pad_token_id(&self) -> Option<u32> {
        self.pad_token.as_deref().and_then(|t| self.token_id(t))
    }

    /// Renders the chat template (see [`ChatTemplate::render`]).
    pub fn apply_chat_template<M: Serialize + ?Sized, T: Serialize + ?Sized>(
        &self,
        messages: &M,
        tools: Option<&T>,
        opts: ChatOptions,
    ) -> Result<String> {
        self.template
            .as_ref()
            .ok_or_else(|| {
                ModelError::ChatTemplate("tokenizer_config.json has no chat_template".into())
            })?
            .render(messages, tools, opts)
    }

    /// Renders the chat template and encodes the result.
    pub fn encode_chat<M: Serialize + ?Sized, T: Serialize + ?Sized>(
        &self,
        messages: &M,
        tools: Option<&T>,
        opts: ChatOptions,
    ) -> Result<Vec<u32>> {
        self.encode(&self.apply_chat_template(messages, tools, opts)?)
    }

    /// The wrapped `tokenizers::Tokenizer`.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}
