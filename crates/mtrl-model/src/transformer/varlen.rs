//! Packed rows ("varlen"): the rows of a training micro-batch laid end to end as one sequence of
//! `T` tokens, without padding. Row `i` is tokens `offsets[i]..offsets[i + 1]` (FlashAttention's
//! `cu_seqlens`); its positions restart at 0, and no token attends across a row boundary.
//!
//! Why: every product of a decoder layer except the attention core is per token, so on packed
//! rows the projections, the norms and the MLP run over the real tokens only (a padded `[b, t]`
//! batch spends them on `b·t_max − T` padding tokens too). Only the attention core needs the row
//! structure (and, without a fused varlen kernel, the padded layout bounds a micro-batch: see
//! `mtrl_learner::batch::micro_batches`). A backend
//! serves it by [`super::Backend::varlen_self_attention`]; both of ours project q/k/v over the
//! packed tokens, [`VarLen::spread`] the products into a padded `[rows, t_max, ·]` layout (one
//! row gather) where head split, q/k norm, RoPE and one batched attention under [`VarLen::mask`]
//! run, and [`VarLen::gather`] the output back: a constant number of kernels whatever the row
//! count. Rows of one length need neither gather (a reshape).
//!
//! Fused ([`VarLen::with_fused`], chosen per forward by [`crate::AttentionKernel`]): q/k/v stay
//! packed `[T, heads, d]`, norms and RoPE run per token (angles of the packed positions), and
//! [`crate::flash_varlen`] attends reading the row offsets in place — FlashAttention-2 on CUDA,
//! its twin elsewhere. No spread, no mask, no `[t_max, t_max]` score matrix is materialised.
//!
//! Exactness: padding keys are masked (probability exactly 0), and padding queries are dropped by
//! the gather back (their gradient is exactly 0), so each row's output and gradients are those of
//! the row alone. A padding query admits key 0 only, so the CPU kernels, which compute each query
//! over its admitted span, spend nothing on it.

use std::sync::OnceLock;

use candle_core::{DType, Device, Result, Tensor};

use super::{Angles, Attention, Backend, Layer, Transformer};

/// The row structure of one packed forward (see the module docs).
#[derive(Debug)]
pub struct VarLen {
    offsets: Vec<usize>,
    dtype: DType,
    device: Device,
    padded: OnceLock<Padded>,
    /// The attention core runs fused (see the module docs).
    fused: bool,
    /// `offsets` as u32 on the device (the fused kernel's `cu_seqlens`).
    cu_seqlens: OnceLock<Tensor>,
}

/// The pure-candle spelling's gathers and mask.
#[derive(Debug)]
struct Padded {
    /// `[rows · len]`: the packed token at each padded slot (0 for a padding slot; masked).
    pad: Tensor,
    /// `[T]`: the padded slot of each packed token.
    unpad: Tensor,
    /// `[rows, 1, len, len]` additive causal + padding mask in the model's dtype.
    mask: Tensor,
}

impl VarLen {
    /// Rows of `lens` tokens (each ≥ 1), for a model in `dtype` on `device`.
    pub fn new(lens: &[usize], dtype: DType, device: &Device) -> Result<Self> {
        if lens.contains(&0) {
            candle_core::bail!("a packed row has no token");
        }
        let mut offsets = Vec::with_capacity(lens.len() + 1);
        offsets.push(0);
        for l in lens {
            offsets.push(offsets.last().copied().unwrap_or(0) + l);
        }
        Ok(Self {
            offsets,
            dtype,
            device: device.clone(),
            padded: OnceLock::new(),
            fused: false,
            cu_seqlens: OnceLock::new(),
        })
    }

    /// The same rows, attended fused (`true`) or through the padded spelling.
    pub fn with_fused(mut self, fused: bool) -> Self {
        self.fused = fused;
        self
    }

    /// Whether the attention core runs fused.
    pub fn fused(&self) -> bool {
        self.fused
    }

    /// The row offsets on the device, `[rows + 1]` u32.
    fn cu_seqlens(&self) -> Result<&Tensor> {
        if let Some(c) = self.cu_seqlens.get() {
            return Ok(c);
        }
        let offs: Vec<u32> = self.offsets.iter().map(|&o| o as u32).collect();
        let _ = self
            .cu_seqlens
            .set(Tensor::from_vec(offs, self.offsets.len(), &self.device)?);
        match self.cu_seqlens.get() {
            Some(c) => Ok(c),
            None => candle_core::bail!("row offsets not built"),
        }
    }

    /// Tokens of all rows.
    pub fn tokens(&self) -> usize {
        self.offsets.last().copied().unwrap_or(0)
    }

    /// `(offset, len)` of every row.
    pub fn rows(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.offsets.windows(2).map(|w| (w[0], w[1] - w[0]))
    }

    /// The longest row.
    pub fn max_len(&self) -> usize {
        self.rows().map(|(_, l)| l).max().unwrap_or(0)
    }

    fn padded(&self) -> Result<&Padded> {
        if let Some(p) = self.padded.get() {
            return Ok(p);
        }
        let (rows, len) = (self.offsets.len() - 1, self.max_len());
        let mut pad = vec![0u32; rows * len];
        let mut unpad = Vec::with_capacity(self.tokens());
        // Key j is visible to query i of row r when j < limit: i + 1 for the row's tokens, 1 for
        // a padding query. The mask is formed on the device from these limits.
        let mut limits = vec![1u32; rows * len];
        for (r, (off, l)) in self.rows().enumerate() {
            for j in 0..l {
                limits[r * len + j] = j as u32 + 1;
                pad[r * len + j] = (off + j) as u32;
                unpad.push((r * len + j) as u32);
            }
        }
        let limits = Tensor::from_vec(limits, (rows, len, 1), &self.device)?;
        let off = Tensor::arange(0u32, len as u32, &self.device)?
            .reshape((1, 1, len))?
            .broadcast_ge(&limits)?;
        let p = Padded {
            pad: Tensor::from_vec(pad, rows * len, &self.device)?,
            unpad: Tensor::from_vec(unpad, self.tokens(), &self.device)?,
            mask: super::step_meta::additive(&off, self.dtype)?.reshape((rows, 1, len, len))?,
        };
        let _ = self.padded.set(p);
        match self.padded.get() {
            Some(p) => Ok(p),
            None => candle_core::bail!("packed layout not built"),
        }
    }
}

impl VarLen {
    /// Whether every row has the same length (the spread layout is then the packed one).
    fn uniform(&self) -> bool {
        self.rows().all(|(_, l)| l == self.max_len())
    }

    /// Token-major `t` `[1, T, w]` over the packed tokens → `[rows, t_max, w]`.
    pub(crate) fn spread(&self, t: &Tensor) -> Result<Tensor> {
        let (rows, len) = (self.offsets.len() - 1, self.max_len());
        let w = t.dim(2)?;
        if self.uniform() {
            return t.reshape((rows, len, w));
        }
        let p = self.padded()?;
        t.squeeze(0)?
            .index_select(&p.pad, 0)?
            .reshape((rows, len, w))
    }

    /// `[rows, t_max, w]` of the spread layout → `[1, T, w]` (padding dropped).
    pub(crate) fn gather(&self, out: &Tensor) -> Result<Tensor> {
        let (rows, len, w) = out.dims3()?;
        if self.uniform() {
            return out.reshape((1, rows * len, w));
        }
        let p = self.padded()?;
        out.reshape((rows * len, w))?
            .index_select(&p.unpad, 0)?
            .unsqueeze(0)
    }

    /// The additive `[rows, 1, t_max, t_max]` mask of the spread layout (see the module docs).
    pub(crate) fn mask(&self) -> Result<&Tensor> {
        Ok(&self.padded()?.mask)
    }

    /// The RoPE angles every layer's attention takes: of the packed positions `[1, T]` (each
    /// row from 0) when fused, else of the spread layout `[rows, t_max]` (`0..t_max` in every
    /// row: a row's own tokens are its first positions; the rest is padding).
    pub(crate) fn angles(&self, rope: &super::rope::Rope) -> Result<Angles> {
        let positions = if self.fused {
            let pos: Vec<u32> = self.rows().flat_map(|(_, l)| 0..l as u32).collect();
            Tensor::from_vec(pos, (1, self.tokens()), &self.device)?
        } else {
            let (rows, len) = (self.offsets.len() - 1, self.max_len());
            Tensor::arange(0u32, len as u32, &self.device)?
                .unsqueeze(0)?
                .repeat((rows, 1))?
        };
        rope.gather(&positions)
    }
}

/// The fused varlen self-attention of normed packed `x` `[1, T, hidden]` through `o_proj`;
/// `rope`: the packed tokens' angles `[1, T, d / 2]`; `differentiable`: the training view's
/// RoPE spelling (candle's fused RoPE has no backward).
pub(crate) fn fused_attention(
    be: &dyn Backend,
    a: &Attention,
    x: &Tensor,
    rope: &Angles,
    v: &VarLen,
    differentiable: bool,
) -> Result<Tensor> {
    let t = v.tokens();
    let (hd, kv, heads) = (a.head_dim, a.kv_heads, a.heads);
    let q = be.linear(x, &a.q)?.reshape((1, t, heads, hd))?;
    let k = be.linear(x, &a.k)?.reshape((1, t, kv, hd))?;
    let val = be.linear(x, &a.v)?.reshape((t, kv, hd))?;
    let q = match &a.q_norm {
        Some(w) => be.rms_norm(&q, w, a.eps)?,
        None => q,
    };
    let k = match &a.k_norm {
        Some(w) => be.rms_norm(&k, w, a.eps)?,
        None => k,
    };
    let q = rope_thd(&q, rope, differentiable)?.squeeze(0)?;
    let k = rope_thd(&k, rope, differentiable)?.squeeze(0)?;
    let out = crate::flash_varlen::attend(&q, &k, &val, &v.offsets, v.cu_seqlens()?)?;
    be.linear(&out.reshape((1, t, heads * hd))?, &a.o)
}

/// RoPE of `x` `[1, T, heads, d]` (token-major) with `rope` `[1, T, d / 2]`.
fn rope_thd(x: &Tensor, rope: &Angles, differentiable: bool) -> Result<Tensor> {
    if !differentiable {
        return candle_nn::rotary_emb::rope_thd(&x.contiguous()?, &rope.cos, &rope.sin);
    }
    super::rope::spelled(x, &rope.cos, &rope.sin, 2)
}

/// The pure-candle varlen self-attention of normed packed `x` `[1, T, hidden]` through `o_proj`;
/// `rope`: the angles of the spread layout (see the module docs).
pub(crate) fn padded_attention(
    be: &dyn Backend,
    a: &Attention,
    x: &Tensor,
    rope: &Angles,
    v: &VarLen,
) -> Result<Tensor> {
    let [q, k, val] = [&a.q, &a.k, &a.v].map(|l| be.linear(x, l).and_then(|y| v.spread(&y)));
    let (q, k, val) = a.heads_of(be, &q?, &k?, &val?, rope)?;
    let out = be.attention(&q, &k, &val, Some(v.mask()?))?;
    be.linear(&v.gather(&out)?, &a.o)
}

impl Transformer {
    /// Final-normed hidden states `[1, T, hidden]` of packed rows `ids` `[1, T]` (see the module
    /// docs), recording the graph in the training view.
    pub fn forward_varlen(&self, ids: &Tensor, v: &VarLen) -> Result<Tensor> {
        let rope = v.angles(&self.rope)?;
        let mut x = self.embed_ids(ids)?;
        for l in &self.layers {
            x = self.layer_varlen(l, x, &rope, v)?;
        }
        self.be.rms_norm(&x, &self.norm, self.eps)
    }

    /// Layer `l` over packed rows.
    pub(super) fn layer_varlen(
        &self,
        l: &Layer,
        x: Tensor,
        rope: &Angles,
        v: &VarLen,
    ) -> Result<Tensor> {
        let h = self.be.rms_norm(&x, &l.input_ln, self.eps)?;
        let x = (x + self.be.varlen_self_attention(&l.attn, &h, rope, v)?)?;
        self.mlp_block(l, x)
    }
}
