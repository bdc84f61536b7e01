//! The Qwen2/Qwen3 decoder, written once for both families.
//!
//! embedding → N × [RMSNorm → attention (q/k/v proj, + bias for Qwen2, per-head q/k RMSNorm for
//! Qwen3, RoPE with `rotate_half`, GQA, causal + padding mask) → o_proj → residual → RMSNorm →
//! SwiGLU MLP → residual] → RMSNorm → `lm_head` (tied to the embedding when configured).
//!
//! Why one file instead of candle's one-file-per-model: the two families differ in exactly two
//! switches (`attention_bias`, q/k norm), both read from `Config`; two copies of the same 400 lines
//! would be two places for the same bug. `qwen2.rs`/`qwen3.rs` would hold nothing but those flags.
//!
//! Two numerical paths share the weights: the inference path (`differentiable == false`) uses
//! candle's fused CPU/CUDA kernels (RMSNorm, RoPE, softmax), which have no backward; the training
//! path spells the same maths in elementary differentiable ops. Both are checked against the
//! PyTorch goldens. On the CPU in f32, graph-free projections of at most `skinny::MAX_ROWS` rows
//! (decode steps, short prefills) bypass candle's matmul (see `skinny`), and the hand-written
//! kernels live in `fused` (with backward passes) and `decode_attn`. GQA never materialises
//! repeated keys: the query heads of one KV group are folded into the row dimension of one matmul.

use candle_core::{DType, Device, Module, Result, Tensor};

use crate::config::{Config, Family};
use crate::kv_cache::KvCache;

/// Weight lookup used while building the model: `(HF name, expected shape)` → tensor.
pub type WeightFn<'a> = dyn Fn(&str, &[usize]) -> crate::error::Result<Tensor> + 'a;

#[derive(Debug, Clone)]
struct Layer {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    q_norm: Option<Tensor>,
    k_norm: Option<Tensor>,
    input_ln: Tensor,
    post_ln: Tensor,
    gate: Linear,
    up: Linear,
    down: Linear,
}

/// The decoder with its weights. Cheap to clone (tensors are reference counted).
#[derive(Debug, Clone)]
pub struct Transformer {
    embed: Tensor,
    layers: Vec<Layer>,
    norm: Tensor,
    lm_head: Tensor,
    rope: Rope,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    eps: f64,
    max_positions: usize,
    differentiable: bool,
}

impl Transformer {
    /// Builds the decoder from HF-named weights. `differentiable` selects the training path.
    pub fn new(
        cfg: &Config,
        get: &WeightFn,
        dtype: DType,
        dev: &Device,
        differentiable: bool,
    ) -> crate::error::Result<Self> {
        let (h, inter) = (cfg.hidden_size, cfg.intermediate_size);
        let (nh, nkv, hd) = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        );
        if dev.is_cpu() {
            crate::cpu_alloc::tune();
        }
        let bias = cfg.attention_bias;
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            let p = format!("model.layers.{i}");
            let qk_norm = cfg.family == Family::Qwen3;
            layers.push(Layer {
                q: Linear::load(get, &format!("{p}.self_attn.q_proj"), nh * hd, h, bias)?,
                k: Linear::load(get, &format!("{p}.self_attn.k_proj"), nkv * hd, h, bias)?,
                v: Linear::load(get, &format!("{p}.self_attn.v_proj"), nkv * hd, h, bias)?,
                o: Linear::load(get, &format!("{p}.self_attn.o_proj"), h, nh * hd, false)?,
                q_norm: if qk_norm {
                    Some(get(&format!("{p}.self_attn.q_norm.weight"), &[hd])?)
                } else {
                    None
                },
                k_norm: if qk_norm {
                    Some(get(&format!("{p}.self_attn.k_norm.weight"), &[hd])?)
                } else {
                    None
                },
                input_ln: get(&format!("{p}.input_layernorm.weight"), &[h])?,
                post_ln: get(&format!("{p}.post_attention_layernorm.weight"), &[h])?,
                gate: Linear::load(get, &format!("{p}.mlp.gate_proj"), inter, h, false)?,
                up: Linear::load(get, &format!("{p}.mlp.up_proj"), inter, h, false)?,
                down: Linear::load(get, &format!("{p}.mlp.down_proj"), h, inter, false)?,
            });
        }
        let embed = get("model.embed_tokens.weight", &[cfg.vocab_size, h])?;
        let lm_head = if cfg.tie_word_embeddings {
            embed.clone()
        } else {
            get("lm_head.weight", &[cfg.vocab_size, h])?
        };
        Ok(Self {
            embed,
            layers,
            norm: get("model.norm.weight", &[h])?,
            lm_head,
            rope: Rope::new(cfg, dtype, dev)?,
            heads: nh,
            kv_heads: nkv,
            head_dim: hd,
            eps: cfg.rms_norm_eps,
            max_positions: cfg.max_position_embeddings,
            differentiable,
        })
    }

    fn embed_ids(&self, ids: &Tensor) -> Result<Tensor> {
        let (b, t) = ids.dims2()?;
        let h = self.embed.dim(1)?;
        self.embed
            .index_select(&ids.flatten_all()?, 0)?
            .reshape((b, t, h))
    }

    /// The output projection `[vocab, hidden]` (the embedding itself when tied).
    pub fn lm_head(&self) -> &Tensor {
        &self.lm_head
    }

    /// Number of positions the RoPE tables cover.
    pub fn max_positions(&self) -> usize {
        self.max_positions
    }

    /// Projects hidden states `[.., hidden]` to logits `[.., vocab]`.
    pub fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        Linear {
            w: self.lm_head.clone(),
            b: None,
        }
        .forward(hidden)
    }

    /// q, k, v for `x` `[b, t, hidden]` at `positions` `[b, t]`, RoPE applied: `[b, heads, t, d]`.
    fn qkv(&self, l: &Layer, x: &Tensor, positions: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
        let (b, t, _) = x.dims3()?;
        let dz = self.differentiable;
        let q = l.q.forward(x)?.reshape((b, t, self.heads, self.head_dim))?;
        let k =
            l.k.forward(x)?
                .reshape((b, t, self.kv_heads, self.head_dim))?;
        let v =
            l.v.forward(x)?
                .reshape((b, t, self.kv_heads, self.head_dim))?;
        let q = match &l.q_norm {
            Some(w) => rms_norm(&q, w, self.eps, dz)?,
            None => q,
        };
        let k = match &l.k_norm {
            Some(w) => rms_norm(&k, w, self.eps, dz)?,
            None => k,
        };
        let (cos, sin) = self.rope.gather(positions)?;
        let q = apply_rope(&q.transpose(1, 2)?.contiguous()?, &cos, &sin, dz)?;
        let k = apply_rope(&k.transpose(1, 2)?.contiguous()?, &cos, &sin, dz)?;
        Ok((q, k, v.transpose(1, 2)?.contiguous()?))
    }

    /// Attention of `q` `[b, heads, t, d]` over `k`, `v` `[b, kv, s, d]` with an optional additive
    /// mask `[b, 1, t, s]`; returns `[b, t, heads*d]`.
    fn attend(&self, q: &Tensor, k: &Tensor, v: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
        let (b, _, t, d) = q.dims4()?;
        let s = k.dim(2)?;
        if let Some(m) = mask.filter(|_| fused_cpu(q)) {
            let op = attn::MaskedAttention::new(
                (1.0 / (d as f64).sqrt()) as f32,
                m.contiguous()?,
                self.differentiable,
            );
            let (q, k, v) = (q.contiguous()?, k.contiguous()?, v.contiguous()?);
            return if self.differentiable {
                q.apply_op3(&k, &v, op)
            } else {
                q.apply_op3_no_bwd(&k, &v, &op)
            };
        }
        let rep = self.heads / self.kv_heads;
        let q = q.contiguous()?.reshape((b, self.kv_heads, rep * t, d))?;
        let scale = 1.0 / (d as f64).sqrt();
        let scores = (q.matmul(&k.t()?)? * scale)?;
        let scores = match mask {
            Some(m) => scores
                .reshape((b, self.kv_heads, rep, t, s))?
                .broadcast_add(&m.unsqueeze(1)?)?
                .reshape((b, self.kv_heads, rep * t, s))?,
            None => scores,
        };
        let p = softmax(&scores, self.differentiable)?;
        let out = p.matmul(v)?.reshape((b, self.heads, t, d))?;
        out.transpose(1, 2)?.reshape((b, t, self.heads * d))
    }

    fn mlp(&self, l: &Layer, x: &Tensor) -> Result<Tensor> {
        let h = rms_norm(x, &l.post_ln, self.eps, self.differentiable)?;
        if self.differentiable && fused_cpu(&h) && l.gate.w.dtype() == DType::F32 {
            // Training on the CPU: one product with the concatenated gate/up weights.
            let w = Tensor::cat(&[&l.gate.w, &l.up.w], 0)?;
            let gu = h.contiguous()?.apply_op2(&w, fused::Linear)?;
            let a = gu.apply_op1(fused::SwiGluPacked)?;
            return x + l.down.forward(&a)?;
        }
        let g = l.gate.forward(&h)?;
        let u = l.up.forward(&h)?;
        let a = if fused_cpu(&g) {
            let (g, u) = (g.contiguous()?, u.contiguous()?);
            if self.differentiable {
                g.apply_op2(&u, fused::SwiGlu)?
            } else {
                g.apply_op2_no_bwd(&u, &fused::SwiGlu)?
            }
        } else {
            (g.silu()? * u)?
        };
        x + l.down.forward(&a)?
    }

    /// Full forward over a padded batch, no cache. `ids`, `positions`: `[b, t]` u32;
    /// `attention_mask`: `[b, t]` (1 = real token) or `None`. Returns final-normed hidden states
    /// `[b, t, hidden]`; apply [`Self::logits`] (or the chunked log-prob path) to them.
    pub fn forward_hidden(
        &self,
        ids: &Tensor,
        positions: &Tensor,
        attention_mask: Option<&[Vec<u8>]>,
    ) -> Result<Tensor> {
        let (b, t) = ids.dims2()?;
        let mut x = self.embed_ids(ids)?;
        let mask = causal_mask(b, t, attention_mask, x.dtype(), x.device())?;
        let packed = self.differentiable
            && fused_cpu(&x)
            && self.embed.dtype() == DType::F32
            && self.head_dim.is_multiple_of(2)
            && self.head_dim <= packed::MAX_HEAD_DIM;
        // The packed path's RoPE tables, gathered once for all layers.
        let rope = if packed {
            let (cos, sin) = self.rope.gather(positions)?;
            Some((cos.contiguous()?, sin.contiguous()?))
        } else {
            None
        };
        for l in &self.layers {
            let h = rms_norm(&x, &l.input_ln, self.eps, self.differentiable)?;
            let a = if let Some((cos, sin)) = &rope {
                self.attend_packed(l, &h, cos, sin, &mask)?
            } else {
                let (q, k, v) = self.qkv(l, &h, positions)?;
                self.attend(&q, &k, &v, Some(&mask))?
            };
            x = (x + l.o.forward(&a)?)?;
            x = self.mlp(l, &x)?;
        }
        rms_norm(&x, &self.norm, self.eps, self.differentiable)
    }

    /// The training path's attention on the CPU in f32 (see `packed`): one product with the
    /// concatenated q/k/v weights, one node for norms + RoPE + head-major layout, one for attention.
    fn attend_packed(
        &self,
        l: &Layer,
        h: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        mask: &Tensor,
    ) -> Result<Tensor> {
        let w = Tensor::cat(&[&l.q.w, &l.k.w, &l.v.w], 0)?;
        let mut qkv = h.contiguous()?.apply_op2(&w, fused::Linear)?;
        if let (Some(qb), Some(kb), Some(vb)) = (&l.q.b, &l.k.b, &l.v.b) {
            qkv = qkv.broadcast_add(&Tensor::cat(&[qb, kb, vb], 0)?)?;
        }
        let d = self.head_dim;
        let norms = match (&l.q_norm, &l.k_norm) {
            (Some(a), Some(b)) => Some(Tensor::cat(&[a, b], 0)?),
            _ => None,
        };
        let prep = packed::QkvPrep {
            heads: self.heads,
            kv: self.kv_heads,
            d,
            eps: self.eps as f32,
            norm: norms.is_some(),
            cos: cos.clone(),
            sin: sin.clone(),
        };
        let norms = match norms {
            Some(n) => n,
            None => Tensor::ones(2 * d, DType::F32, h.device())?,
        };
        let p = qkv.contiguous()?.apply_op2(&norms, prep)?;
        let scale = (1.0 / (d as f64).sqrt()) as f32;
        p.apply_op1(packed::PackedAttention {
            heads: self.heads,
            kv: self.kv_heads,
            inner: attn::MaskedAttention::new(scale, mask.contiguous()?, true),
        })
    }

    /// Runs `ids` (`[1, t]`) of one sequence through the model, appending to its `cache`;
    /// positions continue from `cache.len()`. Returns hidden states `[1, t, hidden]`.
    pub fn forward_cached(&self, ids: &Tensor, cache: &mut KvCache) -> Result<Tensor> {
        let (_, t) = ids.dims2()?;
        let past = cache.len();
        let dev = ids.device();
        let positions = Tensor::arange(past as u32, (past + t) as u32, dev)?.unsqueeze(0)?;
        let mut x = self.embed_ids(ids)?;
        let mask = if t > 1 {
            let mut m = vec![0f32; t * (past + t)];
            for i in 0..t {
                for j in (past + i + 1)..(past + t) {
                    m[i * (past + t) + j] = mask_value(x.dtype());
                }
            }
            Some(Tensor::from_vec(m, (1, 1, t, past + t), dev)?.to_dtype(x.dtype())?)
        } else {
            None
        };
        for (li, l) in self.layers.iter().enumerate() {
            let h = rms_norm(&x, &l.input_ln, self.eps, self.differentiable)?;
            let (q, k, v) = self.qkv(l, &h, &positions)?;
            let (k, v) = cache.append(li, &k, &v)?;
            let a = self.attend(&q, &k, &v, mask.as_ref())?;
            x = (x + l.o.forward(&a)?)?;
            x = self.mlp(l, &x)?;
        }
        rms_norm(&x, &self.norm, self.eps, self.differentiable)
    }

    /// One decode step for many sequences at once: `tokens[i]` is appended to `caches[i]`.
    /// Projections and the MLP run batched; attention runs per sequence over its own cache (on the
    /// CPU in f32, one hand-written pass over all sequences' caches, without per-sequence ops).
    /// Returns hidden states `[n, hidden]`.
    pub fn decode_step(&self, tokens: &[u32], caches: &mut [&mut KvCache]) -> Result<Tensor> {
        let n = tokens.len();
        let dev = self.embed.device();
        let ids = Tensor::from_slice(tokens, (n, 1), dev)?;
        let pos: Vec<u32> = caches.iter().map(|c| c.len() as u32).collect();
        let positions = Tensor::from_vec(pos, (n, 1), dev)?;
        let mut x = self.embed_ids(&ids)?;
        let fast = !self.differentiable && dev.is_cpu() && x.dtype() == DType::F32;
        for (li, l) in self.layers.iter().enumerate() {
            let h = rms_norm(&x, &l.input_ln, self.eps, self.differentiable)?;
            let (q, k, v) = self.qkv(l, &h, &positions)?;
            let a = if fast {
                self.decode_attend_cpu(li, &q, &k, &v, caches)?
            } else {
                let mut outs = Vec::with_capacity(n);
                for (i, cache) in caches.iter_mut().enumerate() {
                    let (kc, vc) = cache.append(li, &k.narrow(0, i, 1)?, &v.narrow(0, i, 1)?)?;
                    outs.push(self.attend(&q.narrow(0, i, 1)?, &kc, &vc, None)?);
                }
                Tensor::cat(&outs, 0)?
            };
            x = (x + l.o.forward(&a)?)?;
            x = self.mlp(l, &x)?;
        }
        rms_norm(&x, &self.norm, self.eps, self.differentiable)?.squeeze(1)
    }

    /// Decode attention of `q` `[n, heads, 1, d]` over each sequence's cache after appending its
    /// `k`, `v` `[n, kv, 1, d]`; CPU, f32. Returns `[n, 1, heads * d]`.
    fn decode_attend_cpu(
        &self,
        li: usize,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        caches: &mut [&mut KvCache],
    ) -> Result<Tensor> {
        let n = caches.len();
        let (heads, d) = (self.heads, self.head_dim);
        let mut lens = Vec::with_capacity(n);
        for (i, c) in caches.iter_mut().enumerate() {
            lens.push(c.write(li, &k.narrow(0, i, 1)?, &v.narrow(0, i, 1)?)?);
        }
        let q = q.contiguous()?;
        let (q_st, q_l) = q.storage_and_layout();
        let qs = &cpu_f32(&q_st)?[q_l.start_offset()..q_l.start_offset() + n * heads * d];
        let mut bufs = Vec::with_capacity(n);
        for c in caches.iter() {
            let Some((kb, vb)) = c.buffers(li) else {
                candle_core::bail!("kv cache layer {li} is empty after a write")
            };
            if !kb.is_contiguous() || !vb.is_contiguous() {
                candle_core::bail!("kv cache buffers must be contiguous")
            }
            bufs.push((kb.storage_and_layout(), vb.storage_and_layout(), kb.dim(2)?));
        }
        let mut views = Vec::with_capacity(n);
        for ((ks, kl), (vs, vl), cap) in &bufs {
            let k = &cpu_f32(ks)?[kl.start_offset()..];
            let v = &cpu_f32(vs)?[vl.start_offset()..];
            views.push((k, v, *cap));
        }
        let attn = DecodeAttn {
            q: qs,
            caches: &views,
            lens: &lens,
            heads,
            kv_heads: self.kv_heads,
            d,
            scale: 1.0 / (d as f32).sqrt(),
        };
        let mut out = vec![0f32; n * heads * d];
        attn.run(&mut out);
        drop(views);
        drop(bufs);
        Tensor::from_vec(out, (n, 1, heads * d), q.device())
    }
}

/// Whether the hand-written CPU kernels of [`fused`] apply (CPU, f32).
fn fused_cpu(x: &Tensor) -> bool {
    x.device().is_cpu() && x.dtype() == DType::F32
}

/// A large finite negative number for masked scores: finite so that a fully masked row (a padding
/// query) gives a uniform softmax instead of NaN, which would poison gradients through `0 · NaN`.
fn mask_value(dtype: DType) -> f32 {
    match dtype {
        DType::F16 => -32752.0,
        _ => -1.0e30,
    }
}

/// Additive mask `[b, 1, t, t]`: 0 where key `j ≤ i` and `mask[b][j] == 1`, else `mask_value`.
fn causal_mask(
    b: usize,
    t: usize,
    attention_mask: Option<&[Vec<u8>]>,
    dtype: DType,
    dev: &Device,
) -> Result<Tensor> {
    let neg = mask_value(dtype);
    let mut m = vec![0f32; b * t * t];
    for bi in 0..b {
        for i in 0..t {
            for j in 0..t {
                let valid =
                    attention_mask.is_none_or(|am| am[bi].get(j).copied().unwrap_or(0) == 1);
                if j > i || !valid {
                    m[(bi * t + i) * t + j] = neg;
                }
            }
        }
    }
    Tensor::from_vec(m, (b, 1, t, t), dev)?.to_dtype(dtype)
}

fn cpu_f32(s: &candle_core::Storage) -> Result<&[f32]> {
    match s {
        candle_core::Storage::Cpu(c) => c.as_slice::<f32>(),
        _ => candle_core::bail!("expected a CPU tensor"),
    }
}

mod attn;
#[cfg(test)]
mod attn_tests;
mod attn_util;
mod decode_attn;
mod fused;
pub(crate) mod mm;
mod ops;
mod packed;
use decode_attn::DecodeAttn;
use ops::{apply_rope, rms_norm, softmax, Linear, Rope};
