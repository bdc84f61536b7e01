//! SwiGLU, `silu(g) · u`, with a backward as one kernel per pass (`mtrl-kernels`' `swiglu.cu`)
//! for the candle backend on CUDA; its CPU twin below runs the same arithmetic in f64. It
//! replaces candle's `silu` and product and the backward autograd forms from them (the sigmoid,
//! its derivative and the products: about ten passes over `[T, intermediate]`, the model's widest
//! activation). Forward `y = T(silu(g) · u)`; backward `dg = dy · u · σ(g) · (1 + g · (1 −
//! σ(g)))`, `du = dy · silu(g)`.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp2, CustomOp3, DType, Device, Layout, Result, Shape, Tensor};

use crate::cpu::slice_of;

/// Where the kernels serve: CUDA, bf16/f16/f32.
pub(crate) fn serves(dev: &Device, dtype: DType) -> bool {
    dev.is_cuda() && matches!(dtype, DType::BF16 | DType::F16 | DType::F32)
}

/// `silu(g) · u` with a backward; `g`, `u` of one shape and dtype.
pub fn swiglu(g: &Tensor, u: &Tensor) -> Result<Tensor> {
    if g.shape() != u.shape() || g.dtype() != u.dtype() {
        candle_core::bail!(
            "swiglu: g {:?} {:?}, u {:?} {:?}",
            g.dims(),
            g.dtype(),
            u.dims(),
            u.dtype()
        )
    }
    let n = g.elem_count();
    g.contiguous()?
        .reshape(n)?
        .apply_op2(&u.contiguous()?.reshape(n)?, Swiglu)?
        .reshape(g.shape())
}

/// The forward: `g.apply_op2(u, Swiglu)` → `y` `[n]`.
struct Swiglu;

/// The backward: `g.apply_op3_no_bwd(u, dy, SwigluBwd)` → `[dg | du]` `[2n]`.
struct SwigluBwd;

/// `n`, checking that every operand is a contiguous `[n]`.
fn len(ls: &[&Layout]) -> Result<usize> {
    let n = ls[0].shape().dims1()?;
    if ls
        .iter()
        .any(|l| l.shape().dims() != [n] || !l.is_contiguous())
    {
        candle_core::bail!("swiglu: operands of different shapes or not contiguous")
    }
    Ok(n)
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

mod twin {
    use super::sigmoid;
    use candle_core::WithDType;

    pub fn forward<T: WithDType>(g: &[T], u: &[T]) -> Vec<T> {
        g.iter()
            .zip(u)
            .map(|(&a, &b)| {
                let a = a.to_f64();
                T::from_f64(a * sigmoid(a) * b.to_f64())
            })
            .collect()
    }

    /// `[dg | du]`.
    pub fn backward<T: WithDType>(g: &[T], u: &[T], dy: &[T]) -> Vec<T> {
        let mut out = vec![T::zero(); 2 * g.len()];
        let (dg, du) = out.split_at_mut(g.len());
        for i in 0..g.len() {
            let (a, b, dz) = (g[i].to_f64(), u[i].to_f64(), dy[i].to_f64());
            let s = sigmoid(a);
            dg[i] = T::from_f64(dz * b * s * (1.0 + a * (1.0 - s)));
            du[i] = T::from_f64(dz * a * s);
        }
        out
    }
}

impl CustomOp2 for Swiglu {
    fn name(&self) -> &'static str {
        "swiglu"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let n = len(&[l1, l2])?;
        let y = crate::cpu::by_dtype!(s1.dtype(), "swiglu", |T| {
            <T as candle_core::WithDType>::to_cpu_storage_owned(twin::forward::<T>(
                slice_of(s1, l1)?,
                slice_of(s2, l2)?,
            ))
        });
        Ok((y, Shape::from(n)))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let n = len(&[l1, l2])?;
        let y = cuda::launch("swiglu_fwd", &[(s1, l1), (s2, l2)], n, n)?;
        Ok((y, Shape::from(n)))
    }

    fn bwd(
        &self,
        g: &Tensor,
        u: &Tensor,
        _: &Tensor,
        dy: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let n = g.elem_count();
        let all = g.apply_op3_no_bwd(u, &dy.contiguous()?, &SwigluBwd)?;
        Ok((Some(all.narrow(0, 0, n)?), Some(all.narrow(0, n, n)?)))
    }
}

impl CustomOp3 for SwigluBwd {
    fn name(&self) -> &'static str {
        "swiglu-bwd"
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
        let n = len(&[l1, l2, l3])?;
        let out = crate::cpu::by_dtype!(s1.dtype(), "swiglu", |T| {
            <T as candle_core::WithDType>::to_cpu_storage_owned(twin::backward::<T>(
                slice_of(s1, l1)?,
                slice_of(s2, l2)?,
                slice_of(s3, l3)?,
            ))
        });
        Ok((out, Shape::from(2 * n)))
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
        let n = len(&[l1, l2, l3])?;
        let out = cuda::launch("swiglu_bwd", &[(s1, l1), (s2, l2), (s3, l3)], n, 2 * n)?;
        Ok((out, Shape::from(2 * n)))
    }
}

#[cfg(feature = "cuda")]
mod cuda;

/// The largest differences, relative to each tensor's largest entry, between [`swiglu`] on `dev`
/// (the kernels on a GPU) and the CPU twin, for `y` and for the gradients of `g` and `u` (of a
/// weighted sum of `y`): 300 rows of Qwen3-0.6B's 3,072-wide MLP, in `dtype`. `mtrl selftest`
/// reports it; on the CPU it compares the twin with itself.
pub fn check_against_twin(dev: &Device, dtype: DType) -> crate::Result<(f32, f32)> {
    let cpu = Device::Cpu;
    let shape = (300usize, 3072usize);
    let g = (Tensor::randn(0f32, 1.0, shape, &cpu)? * 3.0)?.to_dtype(dtype)?;
    let u = Tensor::randn(0f32, 1.0, shape, &cpu)?.to_dtype(dtype)?;
    let c = Tensor::randn(0f32, 1.0, shape, &cpu)?;
    let run = |on: &Device| -> Result<(Tensor, Tensor, Tensor)> {
        let g = candle_core::Var::from_tensor(&g.to_device(on)?)?;
        let u = candle_core::Var::from_tensor(&u.to_device(on)?)?;
        let y = swiglu(g.as_tensor(), u.as_tensor())?;
        let loss = (y.to_dtype(DType::F32)? * c.to_device(on)?)?.sum_all()?;
        let grads = loss.backward()?;
        let grad = |v: &candle_core::Var| -> Result<Tensor> {
            match grads.get(v.as_tensor()) {
                Some(t) => t.to_device(&cpu),
                None => candle_core::bail!("swiglu check: no gradient"),
            }
        };
        Ok((y.to_device(&cpu)?, grad(&g)?, grad(&u)?))
    };
    let ((y1, dg1, du1), (y2, dg2, du2)) = (run(dev)?, run(&cpu)?);
    let rel = crate::cpu::max_rel_gap;
    Ok((rel(&y1, &y2)?, rel(&dg1, &dg2)?.max(rel(&du1, &du2)?)))
}

#[cfg(test)]
mod tests;
