//! LoRA on a linear layer, and the frozen-base product the training view needs.
//!
//! A targeted layer computes `y = x·Wᵀ (+ b) + s·(drop(x)·Aᵀ)·Bᵀ` with `A` `[r, in]`, `B`
//! `[out, r]` (PEFT's `nn.Linear` layout) and `s` = alpha / r (or alpha / √r, rsLoRA). The backend
//! computes the base product its usual way and adds [`LoraPair::delta`] through the same
//! raw product (`x·wᵀ`), so the CPU kernels and candle serve both halves.
//!
//! **Frozen base.** In a LoRA training view the base weights are plain tensors, not `Var`s. candle's
//! `matmul` backward still computes the right-hand gradient of every product, base weights
//! included, and keeps it in the gradient store until the step ends: a full-size gradient per
//! frozen matrix, which is what LoRA exists to avoid. [`FrozenLinear`] is `x·wᵀ` as one graph node
//! whose backward gives `dx` only. The CPU f32 kernel (`cpu::linear::Linear`) skips `dw` the same
//! way when its weight does not track.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp2, DType, Layout, Result, Shape, Tensor};

/// Dropout on the LoRA input of the training view: each call draws a fresh mask from a seeded
/// counter, so a step's masks are a pure function of (seed, step, call).
#[derive(Debug, Clone)]
pub(crate) struct Dropout {
    pub p: f32,
    /// Shared by every targeted layer of one policy; the learner sets it per micro-batch.
    pub seed: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// Which layer this is (the mask stream of one call is `(seed, layer, call)`).
    pub layer: u64,
    pub calls: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

/// One layer's adapter.
#[derive(Debug, Clone)]
pub(crate) struct LoraPair {
    /// `[r, in]`.
    pub a: Tensor,
    /// `[out, r]`.
    pub b: Tensor,
    pub scale: f64,
    /// Training view only, when `lora.dropout > 0`.
    pub dropout: Option<Dropout>,
}

impl LoraPair {
    /// `s·(drop(x)·Aᵀ)·Bᵀ` for `x` `[.., in]` through `mm` (`x·wᵀ`); returns `[.., out]`.
    pub(crate) fn delta(
        &self,
        x: &Tensor,
        mm: &dyn Fn(&Tensor, &Tensor) -> Result<Tensor>,
    ) -> Result<Tensor> {
        let x = match &self.dropout {
            Some(d) => d.apply(x)?,
            None => x.clone(),
        };
        let h = mm(&x, &self.a)?;
        mm(&h, &self.b)? * self.scale
    }
}

impl Dropout {
    /// Zeroes each element with probability `p` and scales the rest by `1/(1-p)` (PyTorch's
    /// inverted dropout). The mask is drawn on the host from SplitMix64 and copied to `x`'s device.
    fn apply(&self, x: &Tensor) -> Result<Tensor> {
        use std::sync::atomic::Ordering;
        let seed = self.seed.load(Ordering::Relaxed);
        let call = self.calls.fetch_add(1, Ordering::Relaxed);
        let mut rng = mtrl_core::rng::SplitMix64(mtrl_core::rng::mix(
            seed ^ mtrl_core::rng::mix(self.layer.wrapping_mul(0x9E37) ^ (call << 32)),
        ));
        let keep = 1.0 / (1.0 - self.p);
        let n = x.elem_count();
        let mask: Vec<f32> = (0..n)
            .map(|_| {
                if (rng.next_f64() as f32) < self.p {
                    0.0
                } else {
                    keep
                }
            })
            .collect();
        let m = Tensor::from_vec(mask, x.shape(), x.device())?.to_dtype(x.dtype())?;
        x * m
    }
}

/// `x·wᵀ` for `x` `[.., k]` (contiguous) and a frozen `w` `[n, k]`: the backward gives `dx` only.
pub(crate) struct FrozenLinear;

fn frozen_layouts(l1: &Layout, l2: &Layout) -> Result<((usize, usize, usize), Layout, Layout)> {
    let (n, k) = l2.shape().dims2()?;
    if l1.dims().last() != Some(&k) || !l1.is_contiguous() || !l2.is_contiguous() {
        candle_core::bail!(
            "frozen linear: input {:?} for weight {:?}",
            l1.dims(),
            l2.dims()
        )
    }
    let m = l1.shape().elem_count() / k.max(1);
    let lhs = Layout::contiguous_with_offset((m, k), l1.start_offset());
    let rhs = l2.transpose(0, 1)?;
    Ok(((m, n, k), lhs, rhs))
}

fn out_shape(l1: &Layout, n: usize) -> Shape {
    let mut dims = l1.dims().to_vec();
    if let Some(last) = dims.last_mut() {
        *last = n;
    }
    Shape::from(dims)
}

impl CustomOp2 for FrozenLinear {
    fn name(&self) -> &'static str {
        "mtrl-frozen-linear"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let ((m, n, k), lhs, rhs) = frozen_layouts(l1, l2)?;
        let out = s1.matmul(s2, (1, m, n, k), &lhs, &rhs)?;
        Ok((out, out_shape(l1, n)))
    }

    // Not behind `cfg(feature = "cuda")`: without the feature candle's `CudaStorage` is a dummy
    // with the same trait, so every CPU build type-checks this path too.
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let ((m, n, k), lhs, rhs) = frozen_layouts(l1, l2)?;
        let out = s1.matmul(s2, (1, m, n, k), &lhs, &rhs)?;
        Ok((out, out_shape(l1, n)))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (n, k) = w.dims2()?;
        let m = x.elem_count() / k.max(1);
        let dx = grad
            .reshape((m, n))?
            .matmul(&w.detach())?
            .reshape(x.shape())?;
        Ok((Some(dx), None))
    }
}

/// `x·wᵀ` with candle ops, or as a [`FrozenLinear`] node when `x` records a graph and `w` does not.
pub(crate) fn candle_product(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    if x.track_op() && !w.track_op() {
        return x.contiguous()?.apply_op2(&w.contiguous()?, FrozenLinear);
    }
    let dims = x.dims().to_vec();
    let inp = dims[dims.len() - 1];
    let rows = x.elem_count() / inp.max(1);
    let y = x.reshape((rows, inp))?.matmul(&w.t()?)?;
    let mut out = dims;
    let last = out.len() - 1;
    out[last] = w.dim(0)?;
    y.reshape(out)
}

/// `w + s·B·A` in f32, back in `w`'s dtype (PEFT's `merge_and_unload`).
pub(crate) fn merged(w: &Tensor, pair: &LoraPair) -> Result<Tensor> {
    let ba = pair
        .b
        .to_dtype(DType::F32)?
        .matmul(&pair.a.to_dtype(DType::F32)?)?;
    (w.to_dtype(DType::F32)? + (ba * pair.scale)?)?.to_dtype(w.dtype())
}

/// The LoRA deltas of layers whose products were packed into one (`[q; k; v]`, `[gate; up]`),
/// concatenated like the product's columns (zeros for a part without an adapter); `None` when no
/// part has one.
pub(crate) fn packed_delta(
    parts: &[&super::Linear],
    x: &Tensor,
    mm: &dyn Fn(&Tensor, &Tensor) -> Result<Tensor>,
) -> Result<Option<Tensor>> {
    if parts.iter().all(|l| l.lora.is_none()) {
        return Ok(None);
    }
    let mut out = Vec::with_capacity(parts.len());
    for l in parts {
        out.push(match &l.lora {
            Some(p) => p.delta(x, mm)?,
            None => {
                let mut dims = x.dims().to_vec();
                let last = dims.len() - 1;
                dims[last] = l.w.dim(0)?;
                Tensor::zeros(dims, x.dtype(), x.device())?
            }
        });
    }
    Ok(Some(Tensor::cat(&out, x.rank() - 1)?))
}
