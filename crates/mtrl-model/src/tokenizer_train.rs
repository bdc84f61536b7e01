//! Training a small Qwen-style byte-level BPE tokenizer on a text collection (for policies trained
//! from scratch, like the default CPU job's).
//!
//! The result is a Hugging Face tokenizer folder — `tokenizer.json` (byte-level BPE with Qwen's
//! pre-tokenization regex: digits split one by one, words with their leading space) and
//! `tokenizer_config.json` (Qwen's special and tool tokens, `<|im_end|>` as end of turn, the chat
//! template) — that [`crate::Tokenizer::from_dir`] and transformers load unchanged.
//!
//! Invariants: the special tokens get the first ids, in [`SPECIAL_TOKENS`] order, so a rendered
//! chat never splits them; training is deterministic for the same texts and options.

use std::path::Path;

use serde_json::{json, Value};
use tokenizers::models::bpe::BpeTrainerBuilder;
use tokenizers::models::TrainerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, Tokenizer as HfTokenizer};

use crate::error::{ModelError, Result};

/// Qwen's special and tool tokens, in id order.
pub const SPECIAL_TOKENS: [&str; 9] = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
];

/// Qwen2/3's pre-tokenization regex (contractions, letters with one leading non-letter, single
/// digits, punctuation runs, newlines, spaces).
const QWEN_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// What to train.
#[derive(Debug, Clone)]
pub struct TokenizerTraining {
    /// Total ids, special tokens and the 256 byte symbols included.
    pub vocab_size: usize,
    /// Pairs seen fewer times are not merged.
    pub min_frequency: u64,
    /// Jinja chat template written to `tokenizer_config.json`.
    pub chat_template: String,
    pub model_max_length: usize,
    /// Strings added as whole (non-special) tokens after training, e.g. document ids; they are
    /// matched before pre-tokenization, longest first.
    pub extra_tokens: Vec<String>,
}

fn tok_err(what: &str, e: impl std::fmt::Display) -> ModelError {
    ModelError::Tokenizer(format!("{what}: {e}"))
}

/// Trains on `texts` and writes `tokenizer.json` + `tokenizer_config.json` into `out_dir`.
pub fn train_tokenizer<I, S>(texts: I, opts: &TokenizerTraining, out_dir: &Path) -> Result<()>
where
    I: Iterator<Item = S> + Send,
    S: AsRef<str> + Send,
{
    if opts.vocab_size < 256 + SPECIAL_TOKENS.len() + 1 {
        return Err(ModelError::Tokenizer(format!(
            "vocab_size {} is too small: the byte alphabet and special tokens alone take {}",
            opts.vocab_size,
            256 + SPECIAL_TOKENS.len()
        )));
    }
    let specials: Vec<AddedToken> = SPECIAL_TOKENS
        .iter()
        .map(|t| AddedToken::from(*t, true))
        .collect();
    let mut trainer: TrainerWrapper = BpeTrainerBuilder::new()
        .vocab_size(opts.vocab_size)
        .min_frequency(opts.min_frequency)
        .show_progress(false)
        .special_tokens(specials)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build()
        .into();
    // Build through JSON so the pre-tokenizer is exactly Qwen's (a regex split, then byte-level
    // mapping without its own regex), which the builder API spells differently across versions.
    let skeleton = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [],
        "normalizer": null,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN_SPLIT}, "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}
        ]},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "ignore_merges": false, "vocab": {}, "merges": []}
    });
    let mut tok: HfTokenizer = serde_json::from_value::<HfTokenizer>(skeleton)
        .map_err(|e| tok_err("building the tokenizer skeleton", e))?;
    tok.train(&mut trainer, texts)
        .map_err(|e| tok_err("training the tokenizer", e))?;
    if !opts.extra_tokens.is_empty() {
        let extra: Vec<AddedToken> = opts
            .extra_tokens
            .iter()
            .filter(|t| !t.is_empty())
            .map(|t| AddedToken::from(t.clone(), false).normalized(false))
            .collect();
        tok.add_tokens(&extra);
    }
    std::fs::create_dir_all(out_dir).map_err(|e| ModelError::io(out_dir, e))?;
    let tj = out_dir.join("tokenizer.json");
    tok.save(&tj, false)
        .map_err(|e| tok_err(&tj.display().to_string(), e))?;
    let mut decoder = serde_json::Map::new();
    for t in SPECIAL_TOKENS {
        let id = tok
            .token_to_id(t)
            .ok_or_else(|| ModelError::Tokenizer(format!("trained tokenizer lacks `{t}`")))?;
        decoder.insert(
            id.to_string(),
            json!({"content": t, "lstrip": false, "normalized": false, "rstrip": false,
                   "single_word": false, "special": true}),
        );
    }
    let cfg: Value = json!({
        "add_bos_token": false,
        "add_prefix_space": false,
        "added_tokens_decoder": decoder,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": null,
        "chat_template": opts.chat_template,
        "clean_up_tokenization_spaces": false,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": opts.model_max_length,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": false,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": null
    });
    let cp = out_dir.join("tokenizer_config.json");
    let text = serde_json::to_string_pretty(&cfg).map_err(|e| tok_err("tokenizer_config", e))?;
    std::fs::write(&cp, text).map_err(|e| ModelError::io(&cp, e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Tokenizer;

    #[test]
    fn trains_loads_and_keeps_special_tokens_whole() {
        let dir = tempfile::tempdir().unwrap();
        let texts: Vec<String> = (0..200)
            .map(|i| format!("the boundary layer of wing {i} in a supersonic flow ."))
            .collect();
        let template = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
        let opts = TokenizerTraining {
            vocab_size: 400,
            min_frequency: 2,
            chat_template: template.into(),
            model_max_length: 1024,
            extra_tokens: vec!["1042".into(), "7".into()],
        };
        train_tokenizer(texts.iter(), &opts, dir.path()).unwrap();
        let tok = Tokenizer::from_dir(dir.path()).unwrap();
        assert!(tok.vocab_size() <= 402);
        assert_eq!(tok.tokens("1042").unwrap(), vec!["1042".to_string()]);
        assert_eq!(tok.encode("17").unwrap().len(), 2);
        for (i, t) in SPECIAL_TOKENS.iter().enumerate() {
            assert_eq!(tok.token_id(t), Some(i as u32));
        }
        let ids = tok
            .encode("<|im_start|>user\nboundary layer 12<|im_end|>")
            .unwrap();
        assert_eq!(ids[0], 1);
        assert_eq!(*ids.last().unwrap(), 2);
        // Merges happened: a frequent word is one id (with its leading space).
        assert_eq!(tok.tokens(" boundary").unwrap().len(), 1);
        assert_eq!(
            tok.decode(&ids, false).unwrap(),
            "<|im_start|>user\nboundary layer 12<|im_end|>"
        );
        // Same texts, same tokenizer.
        let dir2 = tempfile::tempdir().unwrap();
        train_tokenizer(texts.iter(), &opts, dir2.path()).unwrap();
        assert_eq!(
            std::fs::read(dir.path().join("tokenizer.json")).unwrap(),
            std::fs::read(dir2.path().join("tokenizer.json")).unwrap()
        );
        assert!(train_tokenizer(
            texts.iter(),
            &TokenizerTraining {
                vocab_size: 100,
                ..opts
            },
            dir.path()
        )
        .is_err());
    }
}
