//! The Qwen2/Qwen3 decoder, written once for both families, on any device.
//!
//! embedding → N × [RMSNorm → attention (q/k/v proj, + bias for Qwen2, per-head q/k RMSNorm for
//! Qwen3, RoPE with `rotate_half`, GQA, causal + padding mask) → o_proj → residual → RMSNorm →
//! SwiGLU MLP → residual] → RMSNorm → `lm_head` (tied to the embedding when configured).
//!
//! Why one file instead of candle's one-file-per-model: the two families differ in exactly two
//! switches (`attention_bias`, q/k norm), both read from `Config`; two copies of the same code
//! would be two places for the same bug. `qwen2.rs`/`qwen3.rs` would hold nothing but those flags.
//!
//! This file is the model and nothing else: it never asks which device or dtype it runs on. Every
//! operation goes through the [`Backend`] picked once in [`Transformer::new`] (see `backend`):
//! pure candle ops on CUDA and for half precision, the hand-written kernels of `crate::cpu` on the
//! CPU in f32. The backend may fuse a whole block ([`Backend::self_attention`], [`Backend::mlp`],
//! [`Backend::decode_attention`]); the spelled-out compositions of those blocks live here
//! ([`Attention::forward`], [`Mlp::forward`], [`decode_per_sequence`]), and a backend that does
//! not fuse calls them back.
//!
//! Two views share the weights: the inference view (`differentiable == false`) uses kernels without
//! a backward; the training view records a graph. Both are checked against the PyTorch goldens.
//! GQA never materialises repeated keys: the query heads of one KV group are folded into the row
//! dimension of one matmul.

use std::sync::Arc;

use candle_core::{DType, Device, Result, Tensor};

use crate::config::{Config, Family};
use crate::kv_cache::KvCache;

pub(crate) use backend::Backend;
pub(crate) use rope::Angles;
use rope::Rope;

pub(crate) mod backend;
pub(crate) mod lora;
pub mod paged;
mod recompute;
mod rope;
mod step_meta;
pub mod varlen;

pub(crate) use lora::LoraPair;
pub(crate) use recompute::{leaves_only, Checkpointed};
pub use varlen::VarLen;

/// Weight lookup used while building the model: `(HF name, expected shape)` → tensor.
pub type WeightFn<'a> = dyn Fn(&str, &[usize]) -> crate::error::Result<Tensor> + 'a;

/// Adapter lookup: the HF module name (`model.layers.0.self_attn.q_proj`) and its `[out, in]` →
/// the layer's LoRA pair, if it has one.
pub(crate) type LoraFn<'a> =
    dyn Fn(&str, usize, usize) -> crate::error::Result<Option<LoraPair>> + 'a;

/// A linear layer `x · wᵀ (+ b)`, `w` `[out, in]`, plus its LoRA pair when adapted.
#[derive(Debug, Clone)]
pub(crate) struct Linear {
    pub w: Tensor,
    pub b: Option<Tensor>,
    pub lora: Option<LoraPair>,
}

/// What [`Transformer::new`] reads the weights through.
pub(crate) struct Weights<'a> {
    pub get: &'a WeightFn<'a>,
    pub lora: &'a LoraFn<'a>,
}

impl Linear {
    fn load(
        wts: &Weights,
        name: &str,
        out: usize,
        inp: usize,
        bias: bool,
    ) -> crate::error::Result<Self> {
        Ok(Self {
            w: (wts.get)(&format!("{name}.weight"), &[out, inp])?,
            b: if bias {
                Some((wts.get)(&format!("{name}.bias"), &[out])?)
            } else {
                None
            },
            lora: (wts.lora)(name, out, inp)?,
        })
    }
}

/// The self-attention of one layer.
#[derive(Debug, Clone)]
pub(crate) struct Attention {
    pub q: Linear,
    pub k: Linear,
    pub v: Linear,
    pub o: Linear,
    /// Per-head RMSNorm weights of q and k (Qwen3), `[head_dim]` each.
    pub q_norm: Option<Tensor>,
    pub k_norm: Option<Tensor>,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub eps: f64,
}

impl Attention {
    /// q, k, v of `x` `[b, t, hidden]` with norms and RoPE applied: `[b, heads, t, d]` and
    /// `[b, kv, t, d]` twice.
    pub(crate) fn qkv(
        &self,
        be: &dyn Backend,
        x: &Tensor,
        rope: &Angles,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let (q, k, v) = (
            be.linear(x, &self.q)?,
            be.linear(x, &self.k)?,
            be.linear(x, &self.v)?,
        );
        self.heads_of(be, &q, &k, &v, rope)
    }

    /// The q, k, v products `[b, t, heads · d]`, `[b, t, kv · d]` twice, split into heads, with
    /// norms and RoPE applied (see [`Self::qkv`]).
    pub(crate) fn heads_of(
        &self,
        be: &dyn Backend,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        rope: &Angles,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let (b, t, _) = q.dims3()?;
        let (hd, kv) = (self.head_dim, self.kv_heads);
        let q = q.reshape((b, t, self.heads, hd))?;
        let k = k.reshape((b, t, kv, hd))?;
        let v = v.reshape((b, t, kv, hd))?;
        let q = match &self.q_norm {
            Some(w) => be.rms_norm(&q, w, self.eps)?,
            None => q,
        };
        let k = match &self.k_norm {
            Some(w) => be.rms_norm(&k, w, self.eps)?,
            None => k,
        };
        let q = be.rope(&q.transpose(1, 2)?.contiguous()?, &rope.cos, &rope.sin)?;
        let k = be.rope(&k.transpose(1, 2)?.contiguous()?, &rope.cos, &rope.sin)?;
        Ok((q, k, v.transpose(1, 2)?.contiguous()?))
    }

    /// Attention of normed `x` over itself under `mask` `[b, 1, t, t]`, through `o_proj`.
    pub(crate) fn forward(
        &self,
        be: &dyn Backend,
        x: &Tensor,
        rope: &Angles,
        mask: &Tensor,
    ) -> Result<Tensor> {
        let (q, k, v) = self.qkv(be, x, rope)?;
        let a = be.attention(&q, &k, &v, Some(mask))?;
        be.linear(&a, &self.o)
    }
}

/// The SwiGLU MLP of one layer.
#[derive(Debug, Clone)]
pub(crate) struct Mlp {
    pub gate: Linear,
    pub up: Linear,
    pub down: Linear,
}

impl Mlp {
    /// `down(silu(gate(x)) · up(x))` of normed `x`.
    pub(crate) fn forward(&self, be: &dyn Backend, x: &Tensor) -> Result<Tensor> {
        let g = be.linear(x, &self.gate)?;
        let u = be.linear(x, &self.up)?;
        let a = be.swiglu(&g, &u)?;
        be.linear(&a, &self.down)
    }
}

#[derive(Debug, Clone)]
struct Layer {
    attn: Attention,
    mlp: Mlp,
    input_ln: Tensor,
    post_ln: Tensor,
}

impl Layer {
    /// Every weight tensor of the layer (adapters included).
    fn parameters(&self) -> Vec<Tensor> {
        let (a, m) = (&self.attn, &self.mlp);
        let mut out = vec![self.input_ln.clone(), self.post_ln.clone()];
        out.extend(a.q_norm.iter().chain(&a.k_norm).cloned());
        for lin in [&a.q, &a.k, &a.v, &a.o, &m.gate, &m.up, &m.down] {
            out.push(lin.w.clone());
            out.extend(lin.b.iter().cloned());
            if let Some(p) = &lin.lora {
                out.extend([p.a.clone(), p.b.clone()]);
            }
        }
        out
    }
}

/// The decoder with its weights. Cheap to clone (tensors are reference counted).
#[derive(Debug, Clone)]
pub struct Transformer {
    embed: Tensor,
    layers: Vec<Layer>,
    norm: Tensor,
    lm_head: Tensor,
    rope: Rope,
    eps: f64,
    max_positions: usize,
    /// The kernels, chosen once for this model's device, dtype and view.
    be: Arc<dyn Backend>,
}

impl Transformer {
    /// Builds the decoder from HF-named weights. `differentiable` selects the training view.
    pub(crate) fn new(
        cfg: &Config,
        wts: &Weights,
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
        let get = wts.get;
        let be = backend::select(dev, dtype, differentiable, hd);
        let bias = cfg.attention_bias;
        let qk_norm = cfg.family == Family::Qwen3;
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            let p = format!("model.layers.{i}");
            let norm = |name: &str| -> crate::error::Result<Option<Tensor>> {
                Ok(if qk_norm {
                    Some(get(&format!("{p}.self_attn.{name}.weight"), &[hd])?)
                } else {
                    None
                })
            };
            let attn = Attention {
                q: Linear::load(wts, &format!("{p}.self_attn.q_proj"), nh * hd, h, bias)?,
                k: Linear::load(wts, &format!("{p}.self_attn.k_proj"), nkv * hd, h, bias)?,
                v: Linear::load(wts, &format!("{p}.self_attn.v_proj"), nkv * hd, h, bias)?,
                o: Linear::load(wts, &format!("{p}.self_attn.o_proj"), h, nh * hd, false)?,
                q_norm: norm("q_norm")?,
                k_norm: norm("k_norm")?,
                heads: nh,
                kv_heads: nkv,
                head_dim: hd,
                eps: cfg.rms_norm_eps,
            };
            layers.push(Layer {
                attn,
                input_ln: get(&format!("{p}.input_layernorm.weight"), &[h])?,
                post_ln: get(&format!("{p}.post_attention_layernorm.weight"), &[h])?,
                mlp: Mlp {
                    gate: Linear::load(wts, &format!("{p}.mlp.gate_proj"), inter, h, false)?,
                    up: Linear::load(wts, &format!("{p}.mlp.up_proj"), inter, h, false)?,
                    down: Linear::load(wts, &format!("{p}.mlp.down_proj"), h, inter, false)?,
                },
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
            eps: cfg.rms_norm_eps,
            max_positions: cfg.max_position_embeddings,
            be,
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
        let head = Linear {
            w: self.lm_head.clone(),
            b: None,
            lora: None,
        };
        self.be.linear(hidden, &head)
    }

    /// The MLP half of layer `l` with its residual.
    fn mlp_block(&self, l: &Layer, x: Tensor) -> Result<Tensor> {
        let h = self.be.rms_norm(&x, &l.post_ln, self.eps)?;
        x + self.be.mlp(&l.mlp, &h)?
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
        let rope = self.rope.gather(positions)?;
        for l in &self.layers {
            let h = self.be.rms_norm(&x, &l.input_ln, self.eps)?;
            x = (x + self.be.self_attention(&l.attn, &h, &rope, &mask)?)?;
            x = self.mlp_block(l, x)?;
        }
        self.be.rms_norm(&x, &self.norm, self.eps)
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
        let rope = self.rope.gather(&positions)?;
        for (li, l) in self.layers.iter().enumerate() {
            let h = self.be.rms_norm(&x, &l.input_ln, self.eps)?;
            let (q, k, v) = l.attn.qkv(&*self.be, &h, &rope)?;
            let (k, v) = cache.append(li, &k, &v)?;
            let a = self.be.attention(&q, &k, &v, mask.as_ref())?;
            x = (x + self.be.linear(&a, &l.attn.o)?)?;
            x = self.mlp_block(l, x)?;
        }
        self.be.rms_norm(&x, &self.norm, self.eps)
    }

    /// One decode step for many sequences at once: `tokens[i]` is appended to `caches[i]`.
    /// Projections and the MLP run batched; attention runs per sequence over its own cache.
    /// Returns hidden states `[n, hidden]`.
    pub fn decode_step(&self, tokens: &[u32], caches: &mut [&mut KvCache]) -> Result<Tensor> {
        let n = tokens.len();
        let dev = self.embed.device();
        let ids = Tensor::from_slice(tokens, (n, 1), dev)?;
        let pos: Vec<u32> = caches.iter().map(|c| c.len() as u32).collect();
        let positions = Tensor::from_vec(pos, (n, 1), dev)?;
        let mut x = self.embed_ids(&ids)?;
        let rope = self.rope.gather(&positions)?;
        for (li, l) in self.layers.iter().enumerate() {
            let h = self.be.rms_norm(&x, &l.input_ln, self.eps)?;
            let (q, k, v) = l.attn.qkv(&*self.be, &h, &rope)?;
            let a = self.be.decode_attention(li, &q, &k, &v, caches)?;
            x = (x + self.be.linear(&a, &l.attn.o)?)?;
            x = self.mlp_block(l, x)?;
        }
        self.be.rms_norm(&x, &self.norm, self.eps)?.squeeze(1)
    }
}

/// Decode attention spelled per sequence: append row `i` of `k`, `v` (`[n, kv, 1, d]`) to layer
/// `li` of `caches[i]`, attend row `i` of `q` over that cache, concatenate: `[n, 1, heads · d]`.
pub(crate) fn decode_per_sequence(
    be: &dyn Backend,
    li: usize,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    caches: &mut [&mut KvCache],
) -> Result<Tensor> {
    let mut outs = Vec::with_capacity(caches.len());
    for (i, cache) in caches.iter_mut().enumerate() {
        let (kc, vc) = cache.append(li, &k.narrow(0, i, 1)?, &v.narrow(0, i, 1)?)?;
        outs.push(be.attention(&q.narrow(0, i, 1)?, &kc, &vc, None)?);
    }
    Tensor::cat(&outs, 0)
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
