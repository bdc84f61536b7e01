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
//! count. Rows of one length need neither gather (a reshape). A fused varlen kernel that reads
//! `cu_seqlens` in place would replace the gathers on a GPU.
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
        })
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

    /// Positions `[rows, t_max]` of the spread layout: `0..t_max` in every row (a row's own
    /// tokens are its first positions; the rest is padding).
    pub(crate) fn spread_positions(&self) -> Result<Tensor> {
        let (rows, len) = (self.offsets.len() - 1, self.max_len());
        Tensor::arange(0u32, len as u32, &self.device)?
            .unsqueeze(0)?
            .repeat((rows, 1))
    }
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
        let rope = self.rope.gather(&v.spread_positions()?)?;
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
