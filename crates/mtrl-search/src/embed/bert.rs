//! Sentence-transformers BERT embedder on candle (all-MiniLM-L6-v2 and friends).
//!
//! Loads a local folder with `config.json`, `tokenizer.json` and `model.safetensors`. The pipeline
//! is sentence-transformers' `Transformer → Pooling(mean) → Normalize`: token type ids are all 0,
//! GELU is the erf form, and mean pooling runs over real tokens only. The official
//! `tokenizer.json` bakes in padding to 128, which would pool over `[PAD]` tokens and give wrong
//! embeddings, so padding is switched off and truncation set to `max_seq_len` (256 for MiniLM).
//! Texts are sorted by length and embedded in batches padded to the longest member, with an
//! attention mask, so a batch gives the same vectors as one text at a time.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device};
use candle_nn::VarBuilder;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use tokenizers::{Tokenizer, TruncationParams};

use super::bert_candle::Bert;
use super::bert_cpu::CpuBert;
use super::{hex, Embedder};
use crate::error::{Result, SearchError};

/// The subset of a BERT `config.json` this implementation reads.
#[derive(Debug, Clone, Deserialize)]
pub struct BertConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
    #[serde(default = "default_act")]
    pub hidden_act: String,
    pub max_position_embeddings: usize,
    #[serde(default = "default_type_vocab")]
    pub type_vocab_size: usize,
    #[serde(default = "default_eps")]
    pub layer_norm_eps: f64,
    #[serde(default)]
    pub position_embedding_type: Option<String>,
}

fn default_act() -> String {
    "gelu".into()
}
fn default_type_vocab() -> usize {
    2
}
fn default_eps() -> f64 {
    1e-12
}

/// Which implementation runs the encoder.
enum Model {
    /// The hand-written f32 kernels (`bert_cpu.rs`): every CPU embedder.
    Cpu(CpuBert),
    /// candle ops on `device` (CUDA; on the CPU only in tests, as the reference).
    Candle { model: Bert, device: Device },
}

/// Which path [`BertEmbedder::open`] builds.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kernels {
    Auto,
    #[cfg_attr(not(test), allow(dead_code))]
    Candle,
}

/// A loaded sentence embedder.
pub struct BertEmbedder {
    model: Model,
    tokenizer: Tokenizer,
    dim: usize,
    max_seq_len: usize,
    batch_size: usize,
    id: String,
}

impl BertEmbedder {
    /// Loads `dir` (a sentence-transformers folder) onto `device`: on the CPU the encoder runs on
    /// the hand-written kernels, elsewhere on candle's ops.
    pub fn load(
        dir: &Path,
        device: &Device,
        max_seq_len: usize,
        batch_size: usize,
    ) -> Result<BertEmbedder> {
        Self::open(dir, device, max_seq_len, batch_size, Kernels::Auto)
    }

    fn open(
        dir: &Path,
        device: &Device,
        max_seq_len: usize,
        batch_size: usize,
        path: Kernels,
    ) -> Result<BertEmbedder> {
        let file = |name: &str| -> Result<PathBuf> {
            let p = dir.join(name);
            if p.is_file() {
                Ok(p)
            } else {
                Err(SearchError::Embedder {
                    path: dir.to_path_buf(),
                    message: format!(
                        "missing {name} (for all-MiniLM-L6-v2 run scripts/fetch-embedder.sh)"
                    ),
                })
            }
        };
        let err = |path: &Path, message: String| SearchError::Embedder {
            path: path.to_path_buf(),
            message,
        };
        let cfg_path = file("config.json")?;
        let cfg_text =
            std::fs::read_to_string(&cfg_path).map_err(SearchError::io("read", &cfg_path))?;
        let cfg: BertConfig =
            serde_json::from_str(&cfg_text).map_err(|e| err(&cfg_path, e.to_string()))?;
        if !matches!(cfg.hidden_act.as_str(), "gelu" | "gelu_python") {
            return Err(err(
                &cfg_path,
                format!(
                    "`hidden_act` = `{}` is not supported (gelu only)",
                    cfg.hidden_act
                ),
            ));
        }
        if cfg
            .position_embedding_type
            .as_deref()
            .is_some_and(|p| p != "absolute")
        {
            return Err(err(
                &cfg_path,
                "`position_embedding_type` must be `absolute`".into(),
            ));
        }
        if cfg.num_attention_heads == 0 || !cfg.hidden_size.is_multiple_of(cfg.num_attention_heads)
        {
            return Err(err(
                &cfg_path,
                "`hidden_size` must be a multiple of `num_attention_heads`".into(),
            ));
        }
        let weights = file("model.safetensors")?;
        let bytes = std::fs::read(&weights).map_err(SearchError::io("read", &weights))?;
        let digest = hex(&Sha256::digest(&bytes));
        let tensors = candle_core::safetensors::load_buffer(&bytes, device)
            .map_err(|e| err(&weights, format!("not a valid safetensors file: {e}")))?;
        drop(bytes);
        let prefix = if tensors.contains_key("bert.embeddings.word_embeddings.weight") {
            "bert"
        } else {
            ""
        };
        let model = if device.is_cpu() && path == Kernels::Auto {
            Model::Cpu(CpuBert::new(&cfg, &tensors, prefix).map_err(|e| err(&weights, e))?)
        } else {
            let vb = VarBuilder::from_tensors(tensors, DType::F32, device);
            let vb = if prefix.is_empty() { vb } else { vb.pp(prefix) };
            Model::Candle {
                model: Bert::new(&cfg, vb).map_err(|e| err(&weights, e.to_string()))?,
                device: device.clone(),
            }
        };

        let tok_path = file("tokenizer.json")?;
        let mut tokenizer =
            Tokenizer::from_file(&tok_path).map_err(|e| err(&tok_path, e.to_string()))?;
        let max_seq_len = max_seq_len.min(cfg.max_position_embeddings);
        tokenizer.with_padding(None);
        tokenizer
            .with_truncation(Some(TruncationParams {
                max_length: max_seq_len,
                ..Default::default()
            }))
            .map_err(|e| err(&tok_path, e.to_string()))?;
        let vocab = tokenizer.get_vocab_size(true);
        if vocab > cfg.vocab_size {
            return Err(err(
                &tok_path,
                format!(
                    "tokenizer has {vocab} tokens but the model's vocab_size is {}",
                    cfg.vocab_size
                ),
            ));
        }
        Ok(BertEmbedder {
            model,
            tokenizer,
            dim: cfg.hidden_size,
            max_seq_len,
            batch_size: batch_size.max(1),
            id: format!("bert:{digest}:{max_seq_len}"),
        })
    }
}

impl Embedder for BertEmbedder {
    fn id(&self) -> String {
        self.id.clone()
    }

    fn dim(&self) -> usize {
        self.dim
    }

    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
        let enc = self
            .tokenizer
            .encode_batch(texts.to_vec(), true)
            .map_err(|e| SearchError::InvalidArgument(format!("tokenization failed: {e}")))?;
        let ids: Vec<Vec<u32>> = enc
            .iter()
            .map(|e| e.get_ids().iter().take(self.max_seq_len).copied().collect())
            .collect();
        let mut order: Vec<usize> = (0..ids.len()).collect();
        order.sort_by_key(|&i| ids[i].len());
        let mut out = vec![Vec::new(); ids.len()];
        for chunk in order.chunks(self.batch_size) {
            let vectors = match &self.model {
                Model::Cpu(m) => {
                    let batch: Vec<&[u32]> = chunk.iter().map(|&i| ids[i].as_slice()).collect();
                    m.embed(&batch)
                }
                Model::Candle { model, device } => {
                    let batch: Vec<Vec<u32>> = chunk.iter().map(|&i| ids[i].clone()).collect();
                    model.embed(&batch, device)?
                }
            };
            for (&i, v) in chunk.iter().zip(vectors) {
                out[i] = v;
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The real all-MiniLM-L6-v2 (scripts/fetch-embedder.sh, run by scripts/test.sh).
    fn minilm() -> PathBuf {
        let dir = PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../models/all-minilm-l6-v2"
        ));
        assert!(
            dir.join("model.safetensors").is_file(),
            "{} has no weights: run scripts/fetch-embedder.sh",
            dir.display()
        );
        dir
    }

    #[test]
    fn cpu_kernels_match_the_candle_path() {
        let dir = minilm();
        let cpu = BertEmbedder::open(&dir, &Device::Cpu, 256, 8, Kernels::Auto).unwrap();
        let reference = BertEmbedder::open(&dir, &Device::Cpu, 256, 8, Kernels::Candle).unwrap();
        assert!(matches!(cpu.model, Model::Cpu(_)));
        assert!(matches!(reference.model, Model::Candle { .. }));
        let long = "supersonic wing flutter and boundary layer heat transfer ".repeat(40);
        let texts = [
            "A man is eating food.",
            "",
            "x",
            "🚀 emoji and \"quotes\" (brackets) AND OR",
            long.as_str(),
            "The new movie is awesome.",
        ];
        let (a, b) = (cpu.embed(&texts).unwrap(), reference.embed(&texts).unwrap());
        for ((t, x), y) in texts.iter().zip(&a).zip(&b) {
            let diff = x
                .iter()
                .zip(y)
                .map(|(p, q)| (p - q).abs())
                .fold(0f32, f32::max);
            assert!(diff < 2e-5, "{t:?}: max difference {diff}");
        }
        // A text's vector does not depend on the other texts of its call (packing, chunking).
        let single = cpu.embed(&[texts[4]]).unwrap().pop().unwrap();
        assert_eq!(single, a[4]);
    }
}
