//! The kernels a decoder runs on: the [`Backend`] interface, its pure-candle implementation
//! [`Candle`], and [`select`], the one place that picks an implementation for a model.
//!
//! Why an interface instead of `if device.is_cpu()` in the decoder: the CPU f32 kernels of
//! `crate::cpu` replace whole blocks (the training attention over one packed q/k/v product, the
//! decode attention over all caches at once), not only single ops, and each such choice spread
//! through the decoder made it unreadable. Here the decoder asks for an operation; which kernel
//! runs was settled when the model was built.
//!
//! [`Candle`] is candle ops only (CUDA, and any dtype other than f32 on the CPU), so it compiles
//! and runs wherever candle does. Each method has two spellings chosen by the view: without a
//! backward (candle's fused RMSNorm, RoPE and softmax kernels) for inference, elementary
//! differentiable ops for training.

use std::fmt;
use std::sync::Arc;

use candle_core::{DType, Device, Result, Tensor, D};

use super::paged::{self, DecodeTable};
use super::varlen::{self, VarLen};
use super::{decode_per_sequence, lora, Angles, Attention, Linear, Mlp};
use crate::host;
use crate::kv_cache::KvCache;

/// The operations of the decoder. Shapes: `x` `[.., hidden]`; `q` `[b, heads, t, d]`; `k`, `v`
/// `[b, kv, s, d]` (`heads` a multiple of `kv`, GQA); masks are additive `[b, 1, t, s]`.
pub(crate) trait Backend: fmt::Debug + Send + Sync {
    /// `x · wᵀ (+ b)` over the last dimension of `x`.
    fn linear(&self, x: &Tensor, l: &Linear) -> Result<Tensor>;

    /// RMSNorm over the last dimension with weight `w`.
    fn rms_norm(&self, x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor>;

    /// Non-interleaved RoPE (`rotate_half`) of `x` `[b, h, t, d]`; `cos`/`sin` `[b, t, d/2]`.
    fn rope(&self, x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor>;

    /// `softmax(q·kᵀ/√d + mask) · v`; returns `[b, t, heads · d]`.
    fn attention(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: Option<&Tensor>,
    ) -> Result<Tensor>;

    /// `silu(g) · u`, elementwise.
    fn swiglu(&self, g: &Tensor, u: &Tensor) -> Result<Tensor>;

    /// The MLP of normed `x` (spelled out: [`Mlp::forward`]).
    fn mlp(&self, m: &Mlp, x: &Tensor) -> Result<Tensor>;

    /// Self-attention of normed `x` `[b, t, hidden]` under `mask`, through `o_proj` (spelled out:
    /// [`Attention::forward`]).
    fn self_attention(
        &self,
        a: &Attention,
        x: &Tensor,
        rope: &Angles,
        mask: &Tensor,
    ) -> Result<Tensor>;

    /// Self-attention of normed packed rows `x` `[1, T, hidden]` (`v`: the rows; `rope`: their
    /// tokens' angles), through `o_proj` (spelled out: [`varlen::padded_attention`]).
    fn varlen_self_attention(
        &self,
        a: &Attention,
        x: &Tensor,
        rope: &Angles,
        v: &VarLen,
    ) -> Result<Tensor>;

    /// One decode step's attention of layer `li`: row `i` of `k`, `v` (`[n, kv, 1, d]`) joins
    /// `caches[i]`, row `i` of `q` attends over it; returns `[n, 1, heads · d]` (spelled out:
    /// [`decode_per_sequence`]).
    fn decode_attention(
        &self,
        li: usize,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        caches: &mut [&mut KvCache],
    ) -> Result<Tensor>;

    /// Whether the engine's forward should run a step's decode rows and prompt segments in one
    /// pass (fewest kernels) rather than one pass per segment (a row's arithmetic then never
    /// depends on what shares its step: the CPU kernels pick their blocking by row count).
    fn ragged_in_one_pass(&self) -> bool {
        true
    }

    /// Whether the engine's forward attends through [`crate::paged_attention`] — a step's decode
    /// rows and prefill chunks in one call per layer, reading the paged store in place — for a
    /// model on `dev` in `dtype` with heads of `head_dim`. Otherwise it runs
    /// [`Self::paged_decode_attention`] for the decode rows and a masked attention over gathered
    /// keys and values for the prefill chunks.
    fn paged_in_place(&self, dev: &Device, dtype: DType, head_dim: usize) -> bool {
        let _ = (dev, dtype, head_dim);
        false
    }

    /// The engine's decode attention when not [`Self::paged_in_place`]: `q` `[n, heads, 1, d]`
    /// attends over the positions of `table` in the paged pool buffers
    /// `[blocks · kv · BLOCK, d]`; returns `[n, 1, heads · d]` (spelled out:
    /// [`paged::decode_gathered`]).
    fn paged_decode_attention(
        &self,
        q: &Tensor,
        k_pool: &Tensor,
        v_pool: &Tensor,
        kv: usize,
        table: &DecodeTable,
    ) -> Result<Tensor>;
}

/// The backend of a model on `dev` with weights in `dtype`; `differentiable` selects the training
/// view. The only place that looks at the device: everything after it asks the backend.
pub(super) fn select(
    dev: &Device,
    dtype: DType,
    differentiable: bool,
    head_dim: usize,
) -> Arc<dyn Backend> {
    if dev.is_cpu() {
        // Every CPU model, whatever its dtype: candle's CPU ops allocate the same way.
        crate::cpu::alloc::tune();
    }
    if crate::cpu::handles(dev, dtype) {
        Arc::new(crate::cpu::CpuF32::new(differentiable, head_dim))
    } else {
        Arc::new(Candle { differentiable })
    }
}

/// Pure candle ops.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Candle {
    /// The training view: every op records a backward.
    pub differentiable: bool,
}

impl Backend for Candle {
    fn linear(&self, x: &Tensor, l: &Linear) -> Result<Tensor> {
        host::nonempty(x, "linear");
        let y = lora::candle_product(x, &l.w)?;
        let y = match &l.lora {
            Some(p) => (y + p.delta(x, &lora::candle_product)?)?,
            None => y,
        };
        with_bias(y, l, x.dims().to_vec())
    }

    fn rms_norm(&self, x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
        host::nonempty(x, "rms_norm");
        // candle's fused kernel has no f64 version: f64 models take the spelled-out norm.
        if !self.differentiable && x.dtype() != DType::F64 {
            return candle_nn::ops::rms_norm(&x.contiguous()?, w, eps as f32);
        }
        // Training on a GPU: mtrl's kernels, forward and backward (`crate::rms_norm`).
        if self.differentiable
            && (crate::rms_norm::serves(x.device(), x.dtype()) || fused_twins_forced())
        {
            return crate::rms_norm::rms_norm(x, w, eps);
        }
        let dtype = x.dtype();
        let x = x.to_dtype(DType::F32)?;
        let var = x.sqr()?.mean_keepdim(D::Minus1)?;
        let normed = x.broadcast_div(&(var + eps)?.sqrt()?)?;
        normed.to_dtype(dtype)?.broadcast_mul(w)
    }

    fn rope(&self, x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
        host::nonempty(x, "rope");
        if !self.differentiable {
            return candle_nn::rotary_emb::rope(&x.contiguous()?, cos, sin);
        }
        super::rope::spelled(x, cos, sin, 1)
    }

    fn attention(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        host::nonempty(q, "attention queries");
        host::nonempty(k, "attention keys");
        let (b, heads, t, d) = q.dims4()?;
        let (kv, s) = (k.dim(1)?, k.dim(2)?);
        let rep = heads / kv;
        let q = q.contiguous()?.reshape((b, kv, rep * t, d))?;
        let scale = 1.0 / (d as f64).sqrt();
        let scores = (q.matmul(&k.t()?)? * scale)?;
        let scores = match mask {
            Some(m) => scores
                .reshape((b, kv, rep, t, s))?
                .broadcast_add(&m.unsqueeze(1)?)?
                .reshape((b, kv, rep * t, s))?,
            None => scores,
        };
        let p = self.softmax(&scores)?;
        let out = p.matmul(v)?.reshape((b, heads, t, d))?;
        out.transpose(1, 2)?.reshape((b, t, heads * d))
    }

    fn swiglu(&self, g: &Tensor, u: &Tensor) -> Result<Tensor> {
        host::nonempty(g, "swiglu");
        // On a GPU one kernel per pass, forward and backward (`crate::swiglu`).
        if crate::swiglu::serves(g.device(), g.dtype()) || fused_twins_forced() {
            return crate::swiglu::swiglu(g, u);
        }
        g.silu()? * u
    }

    fn mlp(&self, m: &Mlp, x: &Tensor) -> Result<Tensor> {
        m.forward(self, x)
    }

    fn self_attention(
        &self,
        a: &Attention,
        x: &Tensor,
        rope: &Angles,
        mask: &Tensor,
    ) -> Result<Tensor> {
        a.forward(self, x, rope, mask)
    }

    fn varlen_self_attention(
        &self,
        a: &Attention,
        x: &Tensor,
        rope: &Angles,
        v: &VarLen,
    ) -> Result<Tensor> {
        if v.fused() {
            return varlen::fused_attention(self, a, x, rope, v, self.differentiable);
        }
        varlen::padded_attention(self, a, x, rope, v)
    }

    fn decode_attention(
        &self,
        li: usize,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        caches: &mut [&mut KvCache],
    ) -> Result<Tensor> {
        decode_per_sequence(self, li, q, k, v, caches)
    }

    fn paged_decode_attention(
        &self,
        q: &Tensor,
        k_pool: &Tensor,
        v_pool: &Tensor,
        kv: usize,
        table: &DecodeTable,
    ) -> Result<Tensor> {
        host::nonempty(q, "paged decode attention");
        paged::decode_gathered(self, q, k_pool, v_pool, kv, table)
    }

    fn paged_in_place(&self, dev: &Device, dtype: DType, head_dim: usize) -> bool {
        // On a GPU, the kernel that reads the store in place (no padded copies of the rows' keys
        // and values, no padded queries, no masks); elsewhere, for shapes it does not take and
        // in the training view, the gather spelling.
        !self.differentiable && crate::paged_attention::serves(dev, dtype, head_dim)
    }
}

impl Candle {
    /// Softmax over the last dimension; in training the max is detached (it cancels in the
    /// gradient).
    fn softmax(&self, x: &Tensor) -> Result<Tensor> {
        if !self.differentiable {
            return candle_nn::ops::softmax_last_dim(&x.contiguous()?);
        }
        let m = x.max_keepdim(D::Minus1)?.detach();
        let e = x.broadcast_sub(&m)?.exp()?;
        e.broadcast_div(&e.sum_keepdim(D::Minus1)?)
    }
}

/// `y` (`[rows, out]` or already `[.., out]`) plus the layer's bias, reshaped to `dims` with the
/// last one replaced by `out`.
pub(crate) fn with_bias(y: Tensor, l: &Linear, mut dims: Vec<usize>) -> Result<Tensor> {
    let y = match &l.b {
        Some(b) => y.broadcast_add(b)?,
        None => y,
    };
    let last = dims.len() - 1;
    dims[last] = l.w.dim(0)?;
    y.reshape(dims)
}

#[cfg(test)]
thread_local! {
    static FUSED_TWINS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Tests: the candle backend routes RMSNorm (training view) and SwiGLU through mtrl's fused ops
/// on the CPU too (their twins) while the returned guard lives on this thread.
#[cfg(test)]
pub(crate) fn force_fused_twins() -> impl Drop {
    struct Guard;
    impl Drop for Guard {
        fn drop(&mut self) {
            FUSED_TWINS.with(|f| f.set(false));
        }
    }
    FUSED_TWINS.with(|f| f.set(true));
    Guard
}

fn fused_twins_forced() -> bool {
    #[cfg(test)]
    return FUSED_TWINS.with(|f| f.get());
    #[cfg(not(test))]
    false
}

#[cfg(test)]
mod tests;
