//! RMSNorm with a backward as three kernels — the forward (keeping each row's `1/rms`), the
//! backward's `dx` and its `dw` partial sums — for the candle backend's training view on CUDA
//! (`mtrl-kernels`' `rms_norm.cu`); its CPU twin below runs the same arithmetic row by row in
//! f64. It replaces candle's spelling (cast to f32, square, mean, add, sqrt, divide, cast,
//! multiply) and the backward autograd forms from it: about twenty passes over `[T, d]`, half
//! of them in f32, per norm — and a Qwen3 layer has four (input, post-attention, q and k), so on
//! a training step of `[8, 2048]` tokens of Qwen3-0.6B the spelled norms move ≈ 250 GB
//! (computed, docs/gpu.md), the fused ones ≈ 30 GB.
//!
//! Contract (Hugging Face's `Qwen3RMSNorm`, candle's spelling): `x` `[.., d]`, `w` `[d]`;
//! `rstd = 1/√(mean(x²) + ε)`, `y = T(T(x · rstd) · w)` — the normed row rounded to the dtype
//! before the weight. Backward, with `dn = dy · w`: `dx = rstd · (dn − x · rstd · Σ(dn · x ·
//! rstd)/d)`, `dw = Σ_rows dy · T(x · rstd)` (f32 sums, then the weight's dtype).

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp2, CustomOp3, DType, Device, Layout, Result, Shape, Tensor};

use crate::cpu::slice_of;

/// Where the kernels serve: CUDA, bf16/f16/f32.
pub(crate) fn serves(dev: &Device, dtype: DType) -> bool {
    dev.is_cuda() && matches!(dtype, DType::BF16 | DType::F16 | DType::F32)
}

/// `y` (see the module docs) with a backward; `x` `[.., d]`, `w` `[d]` in `x`'s dtype.
pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    let d = x.dim(candle_core::D::Minus1)?;
    if w.dims1()? != d || w.dtype() != x.dtype() {
        candle_core::bail!(
            "rms norm: x {:?} {:?}, w {:?} {:?}",
            x.dims(),
            x.dtype(),
            w.dims(),
            w.dtype()
        )
    }
    let n = x.elem_count() / d.max(1);
    let op = RmsNorm {
        eps: eps as f32,
        rstd: crate::stash::Stash::new("rms norm", "rstd"),
    };
    x.contiguous()?
        .reshape((n, d))?
        .apply_op2(&w.contiguous()?, op)?
        .reshape(x.shape())
}

/// The forward: `x.apply_op2(w, RmsNorm { .. })` → `y` `[n, d]`.
struct RmsNorm {
    eps: f32,
    /// The forward's `rstd` `[n]` f32, taken by the backward.
    rstd: crate::stash::Stash,
}

/// The backward's `dx`: `x.apply_op3_no_bwd(w, dy, ..)` → `[n, d]` in the dtype.
struct RmsNormDx {
    rstd: Tensor,
}

/// The backward's `dw` partial sums: `x.apply_op2_no_bwd(dy, ..)` → `[groups, d]` f32 (f64 for
/// an f64 model's twin).
struct RmsNormDw {
    rstd: Tensor,
}

/// `(n, d)` of `x` `[n, d]` with a `[d]` operand, both contiguous.
fn dims(x: &Layout, other: &Layout, other_is_row: bool) -> Result<(usize, usize)> {
    let (n, d) = x.shape().dims2()?;
    let fits = match other_is_row {
        true => other.shape().dims() == [d],
        false => other.shape().dims() == [n, d],
    };
    if !fits || !x.is_contiguous() || !other.is_contiguous() {
        candle_core::bail!("rms norm: operands {:?} and {:?}", x.shape(), other.shape())
    }
    Ok((n, d))
}

/// The row groups of the `dw` partial sums for `n` rows (the kernel's and the twin's).
fn dw_groups(n: usize, d: usize) -> Result<usize> {
    mtrl_kernels::rms_norm_dw_geometry(n, d)
        .map(|(_, g)| g)
        .map_err(candle_core::Error::msg)
}

fn f<T: candle_core::WithDType>(x: T) -> f64 {
    x.to_f64()
}

/// `x` rounded to `T`.
fn round<T: candle_core::WithDType>(x: f64) -> f64 {
    T::from_f64(x).to_f64()
}

mod twin {
    use super::{f, round};
    use candle_core::WithDType;

    /// `(y [n, d], rstd [n])`; `rstd` rounded to f32 (as the kernel keeps it) unless `T` is f64.
    pub fn forward<T: WithDType>(x: &[T], w: &[T], d: usize, eps: f32) -> (Vec<T>, Vec<f64>) {
        let n = x.len() / d.max(1);
        let (mut y, mut rstd) = (Vec::with_capacity(x.len()), Vec::with_capacity(n));
        for row in x.chunks(d) {
            let ss: f64 = row.iter().map(|&v| f(v) * f(v)).sum();
            let mut rs = 1.0 / (ss / d as f64 + eps as f64).sqrt();
            if T::DTYPE != candle_core::DType::F64 {
                rs = rs as f32 as f64;
            }
            y.extend(
                row.iter()
                    .zip(w)
                    .map(|(&v, &wj)| T::from_f64(round::<T>(f(v) * rs) * f(wj))),
            );
            rstd.push(rs);
        }
        (y, rstd)
    }

    /// `dx [n, d]`.
    pub fn dx<T: WithDType>(x: &[T], w: &[T], dy: &[T], rstd: &[f64], d: usize) -> Vec<T> {
        let mut out = Vec::with_capacity(x.len());
        for ((row, g), &rs) in x.chunks(d).zip(dy.chunks(d)).zip(rstd) {
            let c: f64 = row
                .iter()
                .zip(g)
                .zip(w)
                .map(|((&v, &gj), &wj)| f(gj) * f(wj) * f(v))
                .sum::<f64>()
                * rs
                / d as f64;
            out.extend(
                row.iter()
                    .zip(g)
                    .zip(w)
                    .map(|((&v, &gj), &wj)| T::from_f64(rs * (f(gj) * f(wj) - f(v) * rs * c))),
            );
        }
        out
    }

    /// `dw` partial sums `[groups, d]`: group `k` sums rows `k, k + groups, …` (the kernel's
    /// split).
    pub fn dw<T: WithDType>(x: &[T], dy: &[T], rstd: &[f64], d: usize, groups: usize) -> Vec<f64> {
        let mut out = vec![0f64; groups * d];
        for (r, ((row, g), &rs)) in x.chunks(d).zip(dy.chunks(d)).zip(rstd).enumerate() {
            let acc = &mut out[(r % groups) * d..][..d];
            for ((a, &v), &gj) in acc.iter_mut().zip(row).zip(g) {
                *a += f(gj) * round::<T>(f(v) * rs);
            }
        }
        out
    }
}

impl CustomOp2 for RmsNorm {
    fn name(&self) -> &'static str {
        "rms-norm"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (n, d) = dims(l1, l2, true)?;
        let y = crate::cpu::by_dtype!(s1.dtype(), "rms norm", |T| {
            let (y, rstd) = twin::forward::<T>(slice_of(s1, l1)?, slice_of(s2, l2)?, d, self.eps);
            let rstd = Tensor::from_vec(rstd, n, &Device::Cpu)?;
            // f32 as the kernel keeps it, unless the model is f64.
            let keep = match s1.dtype() {
                DType::F64 => DType::F64,
                _ => DType::F32,
            };
            self.rstd.keep(rstd.to_dtype(keep)?)?;
            <T as candle_core::WithDType>::to_cpu_storage_owned(y)
        });
        Ok((y, Shape::from((n, d))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let (n, d) = dims(l1, l2, true)?;
        let (y, rstd) = cuda::forward((s1, l1), (s2, l2), (n, d), self.eps)?;
        self.rstd.keep(rstd)?;
        Ok((y, Shape::from((n, d))))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _: &Tensor,
        dy: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let rstd = self.rstd.take()?;
        let dy = dy.contiguous()?;
        let dx = x.apply_op3_no_bwd(w, &dy, &RmsNormDx { rstd: rstd.clone() })?;
        let dw = x
            .apply_op2_no_bwd(&dy, &RmsNormDw { rstd })?
            .sum(0)?
            .to_dtype(w.dtype())?;
        Ok((Some(dx), Some(dw)))
    }
}

impl CustomOp3 for RmsNormDx {
    fn name(&self) -> &'static str {
        "rms-norm-dx"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (n, d) = dims(l1, l2, true)?;
        dims(l1, l3, false)?;
        let rstd = crate::cpu::twin_vec::<f64>(&self.rstd.to_dtype(DType::F64)?)?;
        let dx = crate::cpu::by_dtype!(s1.dtype(), "rms norm", |T| {
            let dx = twin::dx::<T>(
                slice_of(s1, l1)?,
                slice_of(s2, l2)?,
                slice_of(s3, l3)?,
                &rstd,
                d,
            );
            <T as candle_core::WithDType>::to_cpu_storage_owned(dx)
        });
        Ok((dx, Shape::from((n, d))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let (n, d) = dims(l1, l2, true)?;
        dims(l1, l3, false)?;
        let dx = cuda::dx((s1, l1), (s2, l2), (s3, l3), &self.rstd, (n, d))?;
        Ok((dx, Shape::from((n, d))))
    }
}

impl CustomOp2 for RmsNormDw {
    fn name(&self) -> &'static str {
        "rms-norm-dw"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (n, d) = dims(l1, l2, false)?;
        let groups = dw_groups(n, d)?;
        let rstd = crate::cpu::twin_vec::<f64>(&self.rstd.to_dtype(DType::F64)?)?;
        let partial = crate::cpu::by_dtype!(s1.dtype(), "rms norm", |T| twin::dw::<T>(
            slice_of(s1, l1)?,
            slice_of(s2, l2)?,
            &rstd,
            d,
            groups
        ));
        // f32 as the kernel writes them, unless the model is f64.
        let partial = match s1.dtype() {
            DType::F64 => CpuStorage::F64(partial),
            _ => CpuStorage::F32(partial.into_iter().map(|x| x as f32).collect()),
        };
        Ok((partial, Shape::from((groups, d))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let (n, d) = dims(l1, l2, false)?;
        let (partial, groups) = cuda::dw((s1, l1), (s2, l2), &self.rstd, (n, d))?;
        Ok((partial, Shape::from((groups, d))))
    }
}

#[cfg(feature = "cuda")]
mod cuda;

/// The largest differences, relative to each tensor's largest entry, between [`rms_norm`] on
/// `dev` (the kernels on a GPU) and the CPU twin, for `y` and for the gradients of `x` and `w`
/// (of a weighted sum of `y`): 300 rows of 1,024 (a hidden norm of Qwen3-0.6B) and 600 of 128 (a
/// q/k norm), in `dtype`. `mtrl selftest` reports it; on the CPU it compares the twin with itself.
pub fn check_against_twin(dev: &Device, dtype: DType) -> crate::Result<(f32, f32)> {
    let cpu = Device::Cpu;
    let (mut wy, mut wg) = (0f32, 0f32);
    for (n, d) in [(300usize, 1024usize), (600, 128)] {
        let x = (Tensor::randn(0f32, 1.0, (n, d), &cpu)? * 2.0)?.to_dtype(dtype)?;
        let w = ((Tensor::randn(0f32, 1.0, d, &cpu)? * 0.5)? + 1.0)?.to_dtype(dtype)?;
        let c = Tensor::randn(0f32, 1.0, (n, d), &cpu)?.to_dtype(dtype)?;
        let run = |on: &Device| -> Result<(Tensor, Tensor, Tensor)> {
            let x = candle_core::Var::from_tensor(&x.to_device(on)?)?;
            let w = candle_core::Var::from_tensor(&w.to_device(on)?)?;
            let y = rms_norm(x.as_tensor(), w.as_tensor(), 1e-6)?;
            let loss =
                (y.to_dtype(DType::F32)? * c.to_device(on)?.to_dtype(DType::F32)?)?.sum_all()?;
            let g = loss.backward()?;
            let grad = |v: &candle_core::Var| -> Result<Tensor> {
                match g.get(v.as_tensor()) {
                    Some(t) => t.to_device(&cpu),
                    None => candle_core::bail!("rms norm check: no gradient"),
                }
            };
            Ok((y.to_device(&cpu)?, grad(&x)?, grad(&w)?))
        };
        let ((y1, dx1, dw1), (y2, dx2, dw2)) = (run(dev)?, run(&cpu)?);
        let rel = crate::cpu::max_rel_gap;
        wy = wy.max(rel(&y1, &y2)?);
        wg = wg.max(rel(&dx1, &dx2)?).max(rel(&dw1, &dw2)?);
    }
    Ok((wy, wg))
}

#[cfg(test)]
mod tests;
