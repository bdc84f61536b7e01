//! [`CpuF32`]: the decoder's operations on the CPU in f32, each routed to the kernel of this
//! module that serves it, or back to the pure-candle spelling where none is better.
//!
//! What runs where (both views unless said):
//! - linear: [`super::skinny`] for at most `MAX_ROWS` rows without a graph (decode steps, short
//!   prefills), else one [`linear::Linear`] node;
//! - RMSNorm, RoPE: candle's fused kernels for inference, [`norm_rope`] for training;
//! - masked attention: [`MaskedAttention`]; unmasked (one query row) attention: candle;
//! - SwiGLU: [`swiglu::SwiGlu`];
//! - training only: the MLP over one packed gate/up product ([`swiglu::SwiGluPacked`]) and the
//!   self-attention over one packed q/k/v product ([`packed`]), of a padded batch or of packed rows
//!   ([`crate::transformer::VarLen`]);
//! - inference only: the decode attention over all caches at once ([`decode`]), and over the
//!   engine's paged store ([`paged`]).

use candle_core::{DType, Result, Tensor};

use super::attn::MaskedAttention;
use super::{decode, linear, norm_rope, packed, paged, skinny, swiglu};
use crate::kv_cache::KvCache;
use crate::transformer::backend::{Backend, Candle};
use crate::transformer::lora;
use crate::transformer::paged::{decode_gathered, DecodeTable};
use crate::transformer::varlen::{fused_attention, padded_attention, VarLen};
use crate::transformer::{decode_per_sequence, Angles, Attention, Linear, Mlp};

/// The CPU f32 kernels (see the module docs).
#[derive(Debug, Clone, Copy)]
pub(crate) struct CpuF32 {
    differentiable: bool,
    /// Training self-attention over the packed q/k/v product: the kernels keep one head row on
    /// the stack and rotate halves, so the head size must be even and at most `MAX_HEAD_DIM`.
    packed_attention: bool,
    /// The pure-candle spellings this backend falls back to.
    candle: Candle,
}

impl CpuF32 {
    pub(crate) fn new(differentiable: bool, head_dim: usize) -> Self {
        Self {
            differentiable,
            packed_attention: differentiable
                && head_dim.is_multiple_of(2)
                && head_dim <= packed::MAX_HEAD_DIM,
            candle: Candle { differentiable },
        }
    }
}

impl Backend for CpuF32 {
    fn linear(&self, x: &Tensor, l: &Linear) -> Result<Tensor> {
        if x.dtype() != DType::F32 || l.w.dtype() != DType::F32 {
            return self.candle.linear(x, l);
        }
        let y = product(x, &l.w)?;
        let y = match &l.lora {
            Some(p) => (y + p.delta(x, &product)?)?,
            None => y,
        };
        match &l.b {
            Some(b) => y.broadcast_add(b),
            None => Ok(y),
        }
    }

    fn rms_norm(&self, x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
        if !self.differentiable {
            return self.candle.rms_norm(x, w, eps);
        }
        x.contiguous()?
            .apply_op2(w, norm_rope::RmsNorm { eps: eps as f32 })
    }

    fn rope(&self, x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
        if !self.differentiable {
            return self.candle.rope(x, cos, sin);
        }
        x.contiguous()?.apply_op1(norm_rope::Rope {
            cos: cos.contiguous()?,
            sin: sin.contiguous()?,
            sign: 1.0,
        })
    }

    fn attention(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        let Some(m) = mask else {
            return self.candle.attention(q, k, v, None);
        };
        let d = q.dim(3)?;
        let scale = (1.0 / (d as f64).sqrt()) as f32;
        let op = MaskedAttention::new(scale, m.contiguous()?, self.differentiable);
        let (q, k, v) = (q.contiguous()?, k.contiguous()?, v.contiguous()?);
        if self.differentiable {
            q.apply_op3(&k, &v, op)
        } else {
            q.apply_op3_no_bwd(&k, &v, &op)
        }
    }

    fn swiglu(&self, g: &Tensor, u: &Tensor) -> Result<Tensor> {
        let (g, u) = (g.contiguous()?, u.contiguous()?);
        if self.differentiable {
            g.apply_op2(&u, swiglu::SwiGlu)
        } else {
            g.apply_op2_no_bwd(&u, &swiglu::SwiGlu)
        }
    }

    fn mlp(&self, m: &Mlp, x: &Tensor) -> Result<Tensor> {
        if !self.differentiable {
            return m.forward(self, x);
        }
        // Training: one product with the concatenated gate/up weights.
        let w = Tensor::cat(&[&m.gate.w, &m.up.w], 0)?;
        let mut gu = x.contiguous()?.apply_op2(&w, linear::Linear)?;
        if let Some(d) = lora::packed_delta(&[&m.gate, &m.up], x, &product)? {
            gu = (gu + d)?;
        }
        let a = gu.apply_op1(swiglu::SwiGluPacked)?;
        self.linear(&a, &m.down)
    }

    fn self_attention(
        &self,
        a: &Attention,
        x: &Tensor,
        rope: &Angles,
        mask: &Tensor,
    ) -> Result<Tensor> {
        if !self.packed_attention {
            return a.forward(self, x, rope, mask);
        }
        let out = packed::self_attention(a, x, rope, mask)?;
        self.linear(&out, &a.o)
    }

    fn varlen_self_attention(
        &self,
        a: &Attention,
        x: &Tensor,
        rope: &Angles,
        v: &VarLen,
    ) -> Result<Tensor> {
        if v.fused() {
            return fused_attention(self, a, x, rope, v, self.differentiable);
        }
        if !self.packed_attention {
            return padded_attention(self, a, x, rope, v);
        }
        let out = packed::varlen_self_attention(a, x, rope, v)?;
        self.linear(&out, &a.o)
    }

    fn decode_attention(
        &self,
        li: usize,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        caches: &mut [&mut KvCache],
    ) -> Result<Tensor> {
        if self.differentiable {
            return decode_per_sequence(self, li, q, k, v, caches);
        }
        decode::decode_attention(li, q, k, v, caches)
    }

    fn ragged_in_one_pass(&self) -> bool {
        false
    }

    fn paged_decode_attention(
        &self,
        q: &Tensor,
        k_pool: &Tensor,
        v_pool: &Tensor,
        kv: usize,
        table: &DecodeTable,
    ) -> Result<Tensor> {
        if self.differentiable || q.dtype() != DType::F32 || k_pool.dtype() != DType::F32 {
            return decode_gathered(self, q, k_pool, v_pool, kv, table);
        }
        paged::paged_decode_attention(q, k_pool, v_pool, kv, table)
    }
}

/// `x · wᵀ` in f32 over the last dimension of `x`: [`skinny`] for a few rows without a graph, else
/// one [`linear::Linear`] node (with a backward when either side records one).
pub(crate) fn product(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let dims = x.dims().to_vec();
    let inp = dims[dims.len() - 1];
    let rows = x.elem_count() / inp.max(1);
    if rows <= skinny::MAX_ROWS && !x.track_op() && !w.track_op() {
        let mut out = dims;
        let last = out.len() - 1;
        out[last] = w.dim(0)?;
        return linear::skinny(&x.reshape((rows, inp))?, w)?.reshape(out);
    }
    // One graph node, no reshapes: the op keeps the leading dims.
    let (x, w) = (x.contiguous()?, w.contiguous()?);
    if x.track_op() || w.track_op() {
        x.apply_op2(&w, linear::Linear)
    } else {
        x.apply_op2_no_bwd(&w, &linear::Linear)
    }
}
