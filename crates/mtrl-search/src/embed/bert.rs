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

use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{embedding, layer_norm, linear, Embedding, LayerNorm, Linear, VarBuilder};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use tokenizers::{Tokenizer, TruncationParams};

use super::{hex, normalize, Embedder};
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

struct Layer {
    q: Linear,
    k: Linear,
    v: Linear,
    attn_out: Linear,
    attn_norm: LayerNorm,
    inter: Linear,
    out: Linear,
    out_norm: LayerNorm,
}

struct Bert {
    word: Embedding,
    pos: Embedding,
    token_type: Embedding,
    emb_norm: LayerNorm,
    layers: Vec<Layer>,
    heads: usize,
    head_dim: usize,
}

impl Bert {
    fn new(cfg: &BertConfig, vb: VarBuilder) -> candle_core::Result<Bert> {
        let h = cfg.hidden_size;
        let e = vb.pp("embeddings");
        let word = embedding(cfg.vocab_size, h, e.pp("word_embeddings"))?;
        let pos = embedding(cfg.max_position_embeddings, h, e.pp("position_embeddings"))?;
        let token_type = embedding(cfg.type_vocab_size, h, e.pp("token_type_embeddings"))?;
        let emb_norm = layer_norm(h, cfg.layer_norm_eps, e.pp("LayerNorm"))?;
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            let l = vb.pp("encoder.layer").pp(i);
            let a = l.pp("attention");
            layers.push(Layer {
                q: linear(h, h, a.pp("self.query"))?,
                k: linear(h, h, a.pp("self.key"))?,
                v: linear(h, h, a.pp("self.value"))?,
                attn_out: linear(h, h, a.pp("output.dense"))?,
                attn_norm: layer_norm(h, cfg.layer_norm_eps, a.pp("output.LayerNorm"))?,
                inter: linear(h, cfg.intermediate_size, l.pp("intermediate.dense"))?,
                out: linear(cfg.intermediate_size, h, l.pp("output.dense"))?,
                out_norm: layer_norm(h, cfg.layer_norm_eps, l.pp("output.LayerNorm"))?,
            });
        }
        Ok(Bert {
            word,
            pos,
            token_type,
            emb_norm,
            layers,
            heads: cfg.num_attention_heads,
            head_dim: h / cfg.num_attention_heads,
        })
    }

    /// Last hidden state `[B, T, H]` for ids `[B, T]` with mask `[B, T]` (1 = token, 0 = pad).
    fn forward(&self, ids: &Tensor, mask: &Tensor) -> candle_core::Result<Tensor> {
        let (b, t) = ids.dims2()?;
        let positions = Tensor::arange(0u32, t as u32, ids.device())?.unsqueeze(0)?;
        let types = ids.zeros_like()?;
        let x = self
            .word
            .forward(ids)?
            .broadcast_add(&self.pos.forward(&positions)?)?
            .add(&self.token_type.forward(&types)?)?;
        let mut x = self.emb_norm.forward(&x)?;
        // Additive mask: 0 on tokens, -1e4 on padding (large enough to zero after softmax).
        let bias = ((mask.to_dtype(DType::F32)? - 1.0)? * 1e4)?.reshape((b, 1, 1, t))?;
        let scale = 1.0 / (self.head_dim as f64).sqrt();
        for l in &self.layers {
            let split = |y: Tensor| -> candle_core::Result<Tensor> {
                y.reshape((b, t, self.heads, self.head_dim))?
                    .transpose(1, 2)?
                    .contiguous()
            };
            let q = split(l.q.forward(&x)?)?;
            let k = split(l.k.forward(&x)?)?;
            let v = split(l.v.forward(&x)?)?;
            let scores = (q.matmul(&k.t()?.contiguous()?)? * scale)?.broadcast_add(&bias)?;
            let probs = candle_nn::ops::softmax_last_dim(&scores)?;
            let ctx =
                probs
                    .matmul(&v)?
                    .transpose(1, 2)?
                    .reshape((b, t, self.heads * self.head_dim))?;
            x = l.attn_norm.forward(&(l.attn_out.forward(&ctx)? + &x)?)?;
            let ff = l.out.forward(&l.inter.forward(&x)?.gelu_erf()?)?;
            x = l.out_norm.forward(&(ff + &x)?)?;
        }
        Ok(x)
    }
}

/// A loaded sentence embedder.
pub struct BertEmbedder {
    model: Bert,
    tokenizer: Tokenizer,
    device: Device,
    dim: usize,
    max_seq_len: usize,
    batch_size: usize,
    id: String,
}

impl BertEmbedder {
    /// Loads `dir` (a sentence-transformers folder) onto `device`.
    pub fn load(
        dir: &Path,
        device: &Device,
        max_seq_len: usize,
        batch_size: usize,
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
        let vb = VarBuilder::from_tensors(tensors, DType::F32, device);
        let vb = if prefix.is_empty() { vb } else { vb.pp(prefix) };
        let model = Bert::new(&cfg, vb).map_err(|e| err(&weights, e.to_string()))?;

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
            device: device.clone(),
            dim: cfg.hidden_size,
            max_seq_len,
            batch_size: batch_size.max(1),
            id: format!("bert:{digest}:{max_seq_len}"),
        })
    }

    fn embed_batch(&self, ids: &[Vec<u32>]) -> Result<Vec<Vec<f32>>> {
        let t = ids.iter().map(Vec::len).max().unwrap_or(1).max(1);
        let b = ids.len();
        let mut flat = vec![0u32; b * t];
        let mut mask = vec![0f32; b * t];
        for (i, row) in ids.iter().enumerate() {
            flat[i * t..i * t + row.len()].copy_from_slice(row);
            mask[i * t..i * t + row.len()]
                .iter_mut()
                .for_each(|m| *m = 1.0);
        }
        let ids_t = Tensor::from_vec(flat, (b, t), &self.device)?;
        let mask_t = Tensor::from_vec(mask, (b, t), &self.device)?;
        let hidden = self.model.forward(&ids_t, &mask_t)?;
        let m = mask_t.unsqueeze(2)?;
        let summed = hidden.broadcast_mul(&m)?.sum(1)?;
        let counts = m.sum(1)?.clamp(1.0, f64::MAX)?;
        let pooled = summed.broadcast_div(&counts)?;
        let mut out: Vec<Vec<f32>> = pooled.to_dtype(DType::F32)?.to_vec2()?;
        out.iter_mut().for_each(|v| normalize(v));
        Ok(out)
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
            let batch: Vec<Vec<u32>> = chunk.iter().map(|&i| ids[i].clone()).collect();
            for (&i, v) in chunk.iter().zip(self.embed_batch(&batch)?) {
                out[i] = v;
            }
        }
        Ok(out)
    }
}
