//! The candle spelling of the BERT encoder: the path a GPU embedder takes (and the reference the
//! CPU kernels of `bert_cpu.rs` are tested against). Inputs are padded to the longest text of the
//! batch, with an additive attention mask.

use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{embedding, layer_norm, linear, Embedding, LayerNorm, Linear, VarBuilder};

use super::bert::BertConfig;
use super::normalize;

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

pub(super) struct Bert {
    word: Embedding,
    pos: Embedding,
    token_type: Embedding,
    emb_norm: LayerNorm,
    layers: Vec<Layer>,
    heads: usize,
    head_dim: usize,
}

impl Bert {
    pub fn new(cfg: &BertConfig, vb: VarBuilder) -> candle_core::Result<Bert> {
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
    pub fn forward(&self, ids: &Tensor, mask: &Tensor) -> candle_core::Result<Tensor> {
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

    /// Mean-pooled, unit-length vectors for a batch of token id lists (padded to the longest).
    pub fn embed(&self, ids: &[Vec<u32>], device: &Device) -> candle_core::Result<Vec<Vec<f32>>> {
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
        let ids_t = Tensor::from_vec(flat, (b, t), device)?;
        let mask_t = Tensor::from_vec(mask, (b, t), device)?;
        let hidden = self.forward(&ids_t, &mask_t)?;
        let m = mask_t.unsqueeze(2)?;
        let summed = hidden.broadcast_mul(&m)?.sum(1)?;
        let counts = m.sum(1)?.clamp(1.0, f64::MAX)?;
        let pooled = summed.broadcast_div(&counts)?;
        let mut out: Vec<Vec<f32>> = pooled.to_dtype(DType::F32)?.to_vec2()?;
        out.iter_mut().for_each(|v| normalize(v));
        Ok(out)
    }
}
