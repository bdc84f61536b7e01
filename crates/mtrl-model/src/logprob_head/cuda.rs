//! The CUDA launches of the log-prob head's kernels (`mtrl-kernels`' `logprob_head.cu`).

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::WrapErr;
use candle_core::{CudaStorage, DType, Layout, Result, Shape};

use super::{Dz, Lpe};

type Operand<'a> = (&'a CudaStorage, &'a Layout);

pub(super) fn lpe(op: &Lpe, s: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
    let (n, vocab) = l.shape().dims2()?;
    let dev = s.device().clone();
    let o = l.start_offset();
    let (ts, tl) = op.targets.storage_and_layout();
    let t = &crate::device::cuda_view::<u32>(&ts, tl, n, "log-prob head: targets")?;
    let out = {
        // SAFETY: every row's three values are written by its block.
        let out = unsafe { dev.alloc::<f32>(3 * n) }?;
        let (grid_dim, block_dim) =
            mtrl_kernels::lse_pick_entropy_geometry(n).map_err(candle_core::Error::msg)?;
        let cfg = LaunchConfig {
            grid_dim,
            block_dim,
            shared_mem_bytes: 0,
        };
        let v32 = vocab as u32;
        macro_rules! launch {
            ($ty:ty, $func:literal) => {{
                let f = dev.get_or_load_custom_func(
                    $func,
                    mtrl_kernels::LOGPROB_HEAD_MODULE,
                    mtrl_kernels::LOGPROB_HEAD,
                )?;
                let z = s.as_cuda_slice::<$ty>()?.slice(o..o + n * vocab);
                let mut b = f.builder();
                b.arg(&z);
                b.arg(t);
                b.arg(&out);
                b.arg(&v32);
                b.arg(&op.inv_t);
                // SAFETY: z is [n, vocab] contiguous, targets [n] (each < vocab: the caller's
                // ids were checked against the vocabulary), out [n, 3].
                unsafe { b.launch(cfg) }.w()?;
            }};
        }
        match s.dtype() {
            DType::BF16 => launch!(half::bf16, "lse_pick_entropy_bf16"),
            DType::F16 => launch!(half::f16, "lse_pick_entropy_f16"),
            DType::F32 => launch!(f32, "lse_pick_entropy_f32"),
            other => candle_core::bail!("log-prob head: no kernel for {other:?}"),
        }
        out
    };
    Ok((CudaStorage::wrap_cuda_slice(out, dev), Shape::from((n, 3))))
}

pub(super) fn dz(
    op: &Dz,
    (s, l): Operand<'_>,
    (ls, ll): Operand<'_>,
    (gs, gl): Operand<'_>,
) -> Result<(CudaStorage, Shape)> {
    let (n, vocab) = l.shape().dims2()?;
    let dev = s.device().clone();
    let o = l.start_offset();
    let lse = ls
        .as_cuda_slice::<f32>()?
        .slice(ll.start_offset()..ll.start_offset() + n);
    let g = gs
        .as_cuda_slice::<f32>()?
        .slice(gl.start_offset()..gl.start_offset() + n);
    let (grid_dim, block_dim) =
        mtrl_kernels::dlogits_geometry(n, vocab).map_err(candle_core::Error::msg)?;
    let cfg = LaunchConfig {
        grid_dim,
        block_dim,
        shared_mem_bytes: 0,
    };
    let v32 = vocab as u32;
    let (ts, tl) = op.targets.storage_and_layout();
    let t = &crate::device::cuda_view::<u32>(&ts, tl, n, "log-prob head: targets")?;
    let out = {
        macro_rules! launch {
            ($ty:ty, $func:literal) => {{
                let f = dev.get_or_load_custom_func(
                    $func,
                    mtrl_kernels::LOGPROB_HEAD_MODULE,
                    mtrl_kernels::LOGPROB_HEAD,
                )?;
                let z = s.as_cuda_slice::<$ty>()?.slice(o..o + n * vocab);
                // SAFETY: every element is written by the grid (columns strided per thread).
                let dz = unsafe { dev.alloc::<$ty>(n * vocab) }?;
                let mut b = f.builder();
                b.arg(&z);
                b.arg(&lse);
                b.arg(t);
                b.arg(&g);
                b.arg(&dz);
                b.arg(&v32);
                b.arg(&op.inv_t);
                // SAFETY: z and dz [n, vocab] contiguous; lse, targets, g [n].
                unsafe { b.launch(cfg) }.w()?;
                CudaStorage::wrap_cuda_slice(dz, dev.clone())
            }};
        }
        match s.dtype() {
            DType::BF16 => launch!(half::bf16, "dlogits_bf16"),
            DType::F16 => launch!(half::f16, "dlogits_f16"),
            DType::F32 => launch!(f32, "dlogits_f32"),
            other => candle_core::bail!("log-prob head: no kernel for {other:?}"),
        }
    };
    Ok((out, Shape::from((n, vocab))))
}
