//! A Hugging Face `tokenizer.json` + `tokenizer_config.json` from a GGUF's `tokenizer.*` metadata.
//!
//! Supported: `tokenizer.ggml.model = "gpt2"` (byte-level BPE) with `tokenizer.ggml.pre = "qwen2"`
//! (the Qwen2/Qwen2.5/Qwen3 split regex, NFC normalisation), which is what llama.cpp writes for
//! every Qwen2/Qwen3 model. Token types: 1 normal and 5 unused (the `[PAD…]` fillers up to the
//! embedding's row count) go into the BPE vocabulary; 3 control (`<|im_end|>`, …) become special
//! added tokens; 4 user-defined (`<tool_call>`, `</tool_call>`) become non-special added tokens,
//! so they are split out before BPE and survive decoding, as in the model's original
//! `tokenizer.json`. Anything else is an error naming the key.

use serde_json::{json, Map, Value};

use super::Gguf;
use crate::error::{invalid, unsupported, Result};
use candle_core::quantized::gguf_file::Value as G;

/// The Qwen2 pre-tokenizer split (the same pattern Qwen's own `tokenizer.json` carries).
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Special token ids named by the metadata.
pub(super) struct SpecialIds {
    pub eos: u32,
    pub bos: Option<u32>,
    pub pad: Option<u32>,
    pub eot: Option<u32>,
}

fn id_of(g: &Gguf, key: &str, n: usize) -> Result<Option<u32>> {
    let Some(v) = g.get(key) else { return Ok(None) };
    let wide = super::int_of(v).ok_or_else(|| invalid(&g.path, key, "expected a token id"))?;
    let id = u32::try_from(wide)
        .map_err(|_| invalid(&g.path, key, format!("{wide} is not a token id")))?;
    if id as usize >= n {
        return Err(invalid(
            &g.path,
            key,
            format!("token id {id} is outside the vocabulary of {n}"),
        ));
    }
    Ok(Some(id))
}

fn flag(g: &Gguf, key: &str) -> Result<bool> {
    match g.get(key) {
        None => Ok(false),
        Some(v) => v
            .to_bool()
            .map_err(|_| invalid(&g.path, key, "expected a boolean")),
    }
}

pub(super) fn special_ids(g: &Gguf) -> Result<SpecialIds> {
    let n = g.tokens()?.len();
    let eos = id_of(g, "tokenizer.ggml.eos_token_id", n)?
        .ok_or_else(|| invalid(&g.path, "tokenizer.ggml.eos_token_id", "missing"))?;
    Ok(SpecialIds {
        eos,
        bos: id_of(g, "tokenizer.ggml.bos_token_id", n)?,
        pad: id_of(g, "tokenizer.ggml.padding_token_id", n)?,
        eot: id_of(g, "tokenizer.ggml.eot_token_id", n)?,
    })
}

pub(super) fn strings<'a>(g: &'a Gguf, key: &str) -> Result<Vec<&'a str>> {
    let arr = g
        .get(key)
        .ok_or_else(|| invalid(&g.path, key, "missing"))?
        .to_vec()
        .map_err(|_| invalid(&g.path, key, "expected an array of strings"))?;
    arr.iter()
        .map(|v| {
            v.to_string()
                .map(String::as_str)
                .map_err(|_| invalid(&g.path, key, "expected an array of strings"))
        })
        .collect()
}

fn check_string(g: &Gguf, key: &str, want: &str, what: &str) -> Result<()> {
    match g.get(key) {
        Some(G::String(s)) if s == want => Ok(()),
        Some(v) => Err(unsupported(
            &g.path,
            key,
            format!("{} (only {want:?}: {what})", super::describe(v)),
        )),
        None => Err(invalid(&g.path, key, "missing")),
    }
}

pub(super) fn build(g: &Gguf) -> Result<(Value, Value)> {
    check_string(g, "tokenizer.ggml.model", "gpt2", "byte-level BPE")?;
    check_string(g, "tokenizer.ggml.pre", "qwen2", "the Qwen2 split regex")?;
    for key in [
        "tokenizer.ggml.add_bos_token",
        "tokenizer.ggml.add_eos_token",
    ] {
        if flag(g, key)? {
            return Err(unsupported(
                &g.path,
                key,
                "true is not supported: special tokens come only from the chat template",
            ));
        }
    }
    let tokens = g.tokens()?;
    let tkey = "tokenizer.ggml.token_type";
    let types: Vec<i64> = g
        .get(tkey)
        .ok_or_else(|| invalid(&g.path, tkey, "missing"))?
        .to_vec()
        .map_err(|_| invalid(&g.path, tkey, "expected an array of integers"))?
        .iter()
        .map(|v| v.to_i32().map(i64::from).or_else(|_| v.to_i64()))
        .collect::<std::result::Result<_, _>>()
        .map_err(|_| invalid(&g.path, tkey, "expected an array of integers"))?;
    if types.len() != tokens.len() {
        return Err(invalid(
            &g.path,
            tkey,
            format!("{} entries for {} tokens", types.len(), tokens.len()),
        ));
    }
    let mut vocab = Map::new();
    let mut added = Vec::new();
    for (id, (tok, ty)) in tokens.iter().zip(&types).enumerate() {
        match ty {
            1 | 5 => {
                vocab.insert((*tok).to_string(), json!(id));
            }
            3 | 4 => {
                // In the vocabulary too: the tokenizers crate ignores an added token's `id` and
                // numbers it after the vocabulary unless the model already knows the content.
                vocab.insert((*tok).to_string(), json!(id));
                added.push(json!({
                "id": id, "content": tok, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": *ty == 3,
                }))
            }
            other => {
                return Err(unsupported(
                    &g.path,
                    tkey,
                    format!("token {id} ({tok:?}) has type {other}; a gpt2 BPE vocabulary has only types 1, 3, 4 and 5"),
                ))
            }
        }
    }
    let merges = strings(g, "tokenizer.ggml.merges")?;
    for (i, m) in merges.iter().enumerate() {
        if m.split(' ').count() != 2 {
            return Err(invalid(
                &g.path,
                "tokenizer.ggml.merges",
                format!("entry {i} ({m:?}) is not two tokens separated by one space"),
            ));
        }
    }
    let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false});
    let tok = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2_SPLIT}, "behavior": "Isolated", "invert": false},
            byte_level,
        ]},
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": "",
            "end_of_word_suffix": "", "fuse_unk": false, "byte_fallback": false,
            "ignore_merges": false, "vocab": vocab, "merges": merges,
        },
    });
    let s = special_ids(g)?;
    let name = |id: Option<u32>| id.map(|i| json!(tokens[i as usize])).unwrap_or(Value::Null);
    let mut cfg = json!({
        "add_bos_token": false,
        "add_prefix_space": false,
        "bos_token": null,
        "eos_token": tokens[s.eos as usize],
        "pad_token": name(s.pad),
        "errors": "replace",
        "model_max_length": g.usize_of("context_length")?.unwrap_or(32768),
        "split_special_tokens": false,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": null,
    });
    match g.get("tokenizer.chat_template") {
        Some(G::String(t)) => cfg["chat_template"] = json!(t),
        Some(_) => {
            return Err(invalid(
                &g.path,
                "tokenizer.chat_template",
                "expected a string",
            ))
        }
        None => {}
    }
    Ok((tok, cfg))
}
