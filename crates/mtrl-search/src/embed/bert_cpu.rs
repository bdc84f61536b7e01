//! BERT inference on the CPU in f32 with hand-written kernels: the path every CPU embedder takes.
//!
//! Why not candle's ops: on a few cores candle spends a BERT forward on padding (a batch is padded
//! to its longest text), zero fills and a fresh tensor per op, a scalar `erf` for GELU and
//! single-row layer norms. Here a chunk of texts is *packed*: its tokens are concatenated, every
//! product runs over the real tokens only, attention runs text by text (so no mask is needed),
//! and each buffer is allocated once per chunk. Chunks run on rayon's pool, one chunk per task,
//! each product on the task's thread, so the threads never wait on each other inside a forward.
//!
//! Per layer: `qkv = x·Wqkv + b` (the three projections as one product) → per text and head
//! `softmax(q·kᵀ/√d)·v` → `x = LN(x + ctx·Wo + b)` → `x = LN(x + gelu(x·Wi + b)·Wo2 + b)`; then
//! mean pooling over the text's tokens and L2 normalisation, as sentence-transformers does. The
//! candle path (`bert_candle.rs`, used on CUDA) computes the same function; tests hold the two
//! together on all-MiniLM-L6-v2.

use std::collections::HashMap;

use candle_core::Tensor;
use rayon::prelude::*;

use super::bert::BertConfig;
use super::normalize;
use crate::kernels::{axpy, bias_gelu, dot, layer_norm, softmax};
use crate::packed::{self, Packed};

/// A weight matrix stored `[in, out]` row-major (the transpose of PyTorch's `Linear.weight`), with
/// its bias.
struct Dense {
    w: Packed,
    b: Vec<f32>,
    inp: usize,
    out: usize,
}

struct Norm {
    gamma: Vec<f32>,
    beta: Vec<f32>,
}

struct Layer {
    qkv: Dense,
    attn_out: Dense,
    attn_norm: Norm,
    inter: Dense,
    out: Dense,
    out_norm: Norm,
}

/// The weights of a BERT encoder, copied out of the safetensors tensors.
pub(super) struct CpuBert {
    word: Vec<f32>,
    pos: Vec<f32>,
    token_type0: Vec<f32>,
    emb_norm: Norm,
    layers: Vec<Layer>,
    hidden: usize,
    heads: usize,
    eps: f32,
}

/// Takes tensors by name, checking shapes; errors name the tensor.
struct Weights<'a> {
    map: &'a HashMap<String, Tensor>,
    prefix: &'a str,
}

impl Weights<'_> {
    fn get(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, String> {
        let full = if self.prefix.is_empty() {
            name.to_string()
        } else {
            format!("{}.{name}", self.prefix)
        };
        let t = self
            .map
            .get(&full)
            .ok_or_else(|| format!("tensor `{full}` is missing"))?;
        if t.dims() != shape {
            return Err(format!(
                "tensor `{full}` has shape {:?}, expected {shape:?}",
                t.dims()
            ));
        }
        t.to_dtype(candle_core::DType::F32)
            .and_then(|t| t.flatten_all())
            .and_then(|t| t.to_vec1())
            .map_err(|e| format!("tensor `{full}`: {e}"))
    }

    fn norm(&self, name: &str, h: usize) -> Result<Norm, String> {
        Ok(Norm {
            gamma: self.get(&format!("{name}.weight"), &[h])?,
            beta: self.get(&format!("{name}.bias"), &[h])?,
        })
    }

    /// `Linear` weights, transposed to `[in, out]`; several of them side by side when `names`
    /// has more than one (the fused q/k/v projection).
    fn dense(&self, names: &[&str], inp: usize, out: usize) -> Result<Dense, String> {
        let total = out * names.len();
        let mut w = vec![0f32; inp * total];
        let mut b = Vec::with_capacity(total);
        for (j, name) in names.iter().enumerate() {
            let part = self.get(&format!("{name}.weight"), &[out, inp])?;
            for o in 0..out {
                for i in 0..inp {
                    w[i * total + j * out + o] = part[o * inp + i];
                }
            }
            b.extend(self.get(&format!("{name}.bias"), &[out])?);
        }
        Ok(Dense {
            w: Packed::new(&w, inp, total),
            b,
            inp,
            out: total,
        })
    }
}

impl CpuBert {
    /// Copies the encoder's weights out of `map` (keys with an optional `bert.` prefix).
    pub fn new(
        cfg: &BertConfig,
        map: &HashMap<String, Tensor>,
        prefix: &str,
    ) -> Result<CpuBert, String> {
        let w = Weights { map, prefix };
        let h = cfg.hidden_size;
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            let l = format!("encoder.layer.{i}");
            let a = format!("{l}.attention");
            let qkv = ["query", "key", "value"].map(|p| format!("{a}.self.{p}"));
            layers.push(Layer {
                qkv: w.dense(&qkv.each_ref().map(String::as_str), h, h)?,
                attn_out: w.dense(&[&format!("{a}.output.dense")], h, h)?,
                attn_norm: w.norm(&format!("{a}.output.LayerNorm"), h)?,
                inter: w.dense(
                    &[&format!("{l}.intermediate.dense")],
                    h,
                    cfg.intermediate_size,
                )?,
                out: w.dense(&[&format!("{l}.output.dense")], cfg.intermediate_size, h)?,
                out_norm: w.norm(&format!("{l}.output.LayerNorm"), h)?,
            });
        }
        let e = "embeddings";
        let types = w.get(
            &format!("{e}.token_type_embeddings.weight"),
            &[cfg.type_vocab_size, h],
        )?;
        Ok(CpuBert {
            word: w.get(&format!("{e}.word_embeddings.weight"), &[cfg.vocab_size, h])?,
            pos: w.get(
                &format!("{e}.position_embeddings.weight"),
                &[cfg.max_position_embeddings, h],
            )?,
            token_type0: types[..h].to_vec(),
            emb_norm: w.norm(&format!("{e}.LayerNorm"), h)?,
            layers,
            hidden: h,
            heads: cfg.num_attention_heads,
            eps: cfg.layer_norm_eps as f32,
        })
    }

    /// One unit vector per text of `ids` (token ids, each within the vocabulary and at most
    /// `max_position_embeddings` long). `ids` should be sorted by length so that chunks are even.
    pub fn embed(&self, ids: &[&[u32]]) -> Vec<Vec<f32>> {
        let total: usize = ids.iter().map(|s| s.len()).sum();
        let threads = rayon::current_num_threads().max(1);
        // A few chunks per thread so that uneven ones even out; at least 256 tokens each so that
        // the products stay efficient, at most 4096 so that buffers stay small.
        let target = (total / (threads * 2)).clamp(256, 4096);
        let mut chunks: Vec<&[&[u32]]> = Vec::new();
        let (mut start, mut tokens) = (0, 0);
        for (i, s) in ids.iter().enumerate() {
            tokens += s.len();
            if tokens >= target {
                chunks.push(&ids[start..=i]);
                (start, tokens) = (i + 1, 0);
            }
        }
        if start < ids.len() {
            chunks.push(&ids[start..]);
        }
        // One chunk (a lone query, a short batch): its products are split over the threads
        // instead.
        let out: Vec<Vec<Vec<f32>>> = if chunks.len() > 1 {
            chunks.par_iter().map(|c| self.forward(c, 1)).collect()
        } else {
            chunks.iter().map(|c| self.forward(c, threads)).collect()
        };
        out.into_iter().flatten().collect()
    }

    /// The packed forward of one chunk on the calling thread.
    fn forward(&self, seqs: &[&[u32]], threads: usize) -> Vec<Vec<f32>> {
        let h = self.hidden;
        let n: usize = seqs.iter().map(|s| s.len().max(1)).sum();
        let mut x = vec![0f32; n * h];
        let mut row = 0;
        for s in seqs {
            if s.is_empty() {
                // No tokens at all (cannot come from the tokenizer, which adds [CLS] and [SEP]):
                // one zero row, normalised later to the first basis vector.
                row += 1;
                continue;
            }
            for (p, &id) in s.iter().enumerate() {
                let dst = &mut x[row * h..(row + 1) * h];
                let w = &self.word[id as usize * h..(id as usize + 1) * h];
                let q = &self.pos[p * h..(p + 1) * h];
                for (((d, a), b), c) in dst.iter_mut().zip(w).zip(q).zip(&self.token_type0) {
                    *d = a + b + c;
                }
                row += 1;
            }
        }
        layer_norm(&mut x, &self.emb_norm.gamma, &self.emb_norm.beta, self.eps);

        let inter = self.layers.first().map_or(0, |l| l.inter.out);
        let mut qkv = vec![0f32; n * 3 * h];
        let mut ctx = vec![0f32; n * h];
        let mut y = vec![0f32; n * h];
        let mut ff = vec![0f32; n * inter];
        let longest = seqs.iter().map(|s| s.len()).max().unwrap_or(1).max(1);
        let mut scores = vec![0f32; longest * longest];
        for l in &self.layers {
            dense(&l.qkv, &x, n, &mut qkv, None, threads);
            self.attention(seqs, &qkv, &mut ctx, &mut scores);
            dense(&l.attn_out, &ctx, n, &mut y, Some(&x), threads);
            layer_norm(&mut y, &l.attn_norm.gamma, &l.attn_norm.beta, self.eps);
            packed::matmul(&y, n, &l.inter.w, &mut ff, threads);
            bias_gelu(&mut ff, &l.inter.b);
            dense(&l.out, &ff, n, &mut x, Some(&y), threads);
            layer_norm(&mut x, &l.out_norm.gamma, &l.out_norm.beta, self.eps);
        }

        let mut out = Vec::with_capacity(seqs.len());
        let mut row = 0;
        for s in seqs {
            let len = s.len().max(1);
            let mut v = vec![0f32; h];
            if !s.is_empty() {
                for r in row..row + len {
                    v.iter_mut()
                        .zip(&x[r * h..(r + 1) * h])
                        .for_each(|(a, b)| *a += b);
                }
                v.iter_mut().for_each(|a| *a /= len as f32);
            }
            normalize(&mut v);
            out.push(v);
            row += len;
        }
        out
    }

    /// `ctx = softmax(q·kᵀ/√d)·v` per text and head, over the packed `qkv` rows.
    fn attention(&self, seqs: &[&[u32]], qkv: &[f32], ctx: &mut [f32], scores: &mut [f32]) {
        let h = self.hidden;
        let d = h / self.heads;
        let scale = 1.0 / (d as f32).sqrt();
        let mut row = 0;
        for s in seqs {
            let len = s.len().max(1);
            let block = &qkv[row * 3 * h..(row + len) * 3 * h];
            let out = &mut ctx[row * h..(row + len) * h];
            for head in 0..self.heads {
                let sc = &mut scores[..len * len];
                // Scores by row: each is the dot product of two contiguous `d`-wide slices.
                for i in 0..len {
                    let q = &block[i * 3 * h + head * d..][..d];
                    for (j, s) in sc[i * len..(i + 1) * len].iter_mut().enumerate() {
                        *s = dot(q, &block[j * 3 * h + h + head * d..][..d]) * scale;
                    }
                }
                sc.chunks_exact_mut(len).for_each(softmax);
                // ctx_i = Σ_j p_ij · v_j, accumulated in j order.
                for i in 0..len {
                    let o = &mut out[i * h + head * d..][..d];
                    o.fill(0.0);
                    for (j, &p) in sc[i * len..(i + 1) * len].iter().enumerate() {
                        axpy(o, p, &block[j * 3 * h + 2 * h + head * d..][..d]);
                    }
                }
            }
            row += len;
        }
    }
}

/// `dst[n, out] = src[n, in]·W + b (+ residual)`.
fn dense(
    l: &Dense,
    src: &[f32],
    n: usize,
    dst: &mut [f32],
    residual: Option<&[f32]>,
    threads: usize,
) {
    packed::matmul(&src[..n * l.inp], n, &l.w, dst, threads);
    for (r, d) in dst[..n * l.out].chunks_exact_mut(l.out).enumerate() {
        match residual {
            Some(res) => d
                .iter_mut()
                .zip(&res[r * l.out..(r + 1) * l.out])
                .zip(&l.b)
                .for_each(|((d, x), b)| *d += x + b),
            None => d.iter_mut().zip(&l.b).for_each(|(d, b)| *d += b),
        }
    }
}
