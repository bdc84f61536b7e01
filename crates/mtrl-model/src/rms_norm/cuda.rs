//! The CUDA launches of `mtrl-kernels`' `rms_norm.cu`.

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::WrapErr;
use candle_core::{CudaStorage, DType, Layout, Result, Storage, Tensor};

type Operand<'a> = (&'a CudaStorage, &'a Layout);

fn config((grid_dim, block_dim): mtrl_kernels::Geometry) -> LaunchConfig {
    LaunchConfig {
        grid_dim,
        block_dim,
        shared_mem_bytes: 0,
    }
}

/// Runs `$body` with `$ty` the element type and `$sfx` the kernels' suffix of `$s`'s dtype.
macro_rules! by_dtype {
    ($s:expr, |$ty:ident, $sfx:ident| $body:expr) => {
        match $s.dtype() {
            DType::BF16 => {
                type $ty = half::bf16;
                let $sfx = "bf16";
                $body
            }
            DType::F16 => {
                type $ty = half::f16;
                let $sfx = "f16";
                $body
            }
            DType::F32 => {
                type $ty = f32;
                let $sfx = "f32";
                $body
            }
            other => candle_core::bail!("rms norm: no kernel for {other:?}"),
        }
    };
}

/// Kernel `$name` of `rms_norm.cu` on `$dev` (its type is not nameable outside candle).
macro_rules! func {
    ($dev:expr, $name:expr) => {
        $dev.get_or_load_custom_func(
            &$name,
            mtrl_kernels::RMS_NORM_MODULE,
            mtrl_kernels::RMS_NORM,
        )
    };
}

fn geometry<T>(r: std::result::Result<T, String>) -> Result<T> {
    r.map_err(candle_core::Error::msg)
}

/// `(y [n, d], rstd [n] f32)`.
pub(super) fn forward(
    (xs, xl): Operand<'_>,
    (ws, wl): Operand<'_>,
    (n, d): (usize, usize),
    eps: f32,
) -> Result<(CudaStorage, Tensor)> {
    let dev = xs.device().clone();
    let cfg = config(geometry(mtrl_kernels::rms_norm_rows_geometry(n, d))?);
    let d32 = d as u32;
    // SAFETY: every row's rstd is written by its block.
    let rstd = unsafe { dev.alloc::<f32>(n) }?;
    let y = by_dtype!(xs, |T, sfx| {
        let f = func!(dev, format!("rms_norm_fwd_{sfx}"))?;
        let x = xs
            .as_cuda_slice::<T>()?
            .slice(xl.start_offset()..xl.start_offset() + n * d);
        let w = ws
            .as_cuda_slice::<T>()?
            .slice(wl.start_offset()..wl.start_offset() + d);
        // SAFETY: every element is written by its row's block.
        let y = unsafe { dev.alloc::<T>(n * d) }?;
        let mut b = f.builder();
        b.arg(&x);
        b.arg(&w);
        b.arg(&y);
        b.arg(&rstd);
        b.arg(&d32);
        b.arg(&eps);
        // SAFETY: x, y [n, d], w [d], rstd [n], shapes checked by the op.
        unsafe { b.launch(cfg) }.w()?;
        CudaStorage::wrap_cuda_slice(y, dev.clone())
    });
    let rstd = Tensor::from_storage(
        Storage::Cuda(CudaStorage::wrap_cuda_slice(rstd, dev)),
        n,
        candle_core::op::BackpropOp::none(),
        false,
    );
    Ok((y, rstd))
}

/// `dx [n, d]`.
pub(super) fn dx(
    (xs, xl): Operand<'_>,
    (ws, wl): Operand<'_>,
    (gs, gl): Operand<'_>,
    rstd: &Tensor,
    (n, d): (usize, usize),
) -> Result<CudaStorage> {
    let dev = xs.device().clone();
    let cfg = config(geometry(mtrl_kernels::rms_norm_rows_geometry(n, d))?);
    let d32 = d as u32;
    let (rs, rl) = rstd.storage_and_layout();
    let r = crate::device::cuda_view::<f32>(&rs, rl, n, "rms norm: rstd")?;
    Ok(by_dtype!(xs, |T, sfx| {
        let f = func!(dev, format!("rms_norm_bwd_dx_{sfx}"))?;
        let x = xs
            .as_cuda_slice::<T>()?
            .slice(xl.start_offset()..xl.start_offset() + n * d);
        let w = ws
            .as_cuda_slice::<T>()?
            .slice(wl.start_offset()..wl.start_offset() + d);
        let g = gs
            .as_cuda_slice::<T>()?
            .slice(gl.start_offset()..gl.start_offset() + n * d);
        // SAFETY: every element is written by its row's block.
        let out = unsafe { dev.alloc::<T>(n * d) }?;
        let mut b = f.builder();
        b.arg(&x);
        b.arg(&w);
        b.arg(&g);
        b.arg(&r);
        b.arg(&out);
        b.arg(&d32);
        // SAFETY: x, dy, dx [n, d], w [d], rstd [n], shapes checked by the op.
        unsafe { b.launch(cfg) }.w()?;
        CudaStorage::wrap_cuda_slice(out, dev.clone())
    }))
}

/// `(dw partial sums [groups, d] f32, groups)`.
pub(super) fn dw(
    (xs, xl): Operand<'_>,
    (gs, gl): Operand<'_>,
    rstd: &Tensor,
    (n, d): (usize, usize),
) -> Result<(CudaStorage, usize)> {
    let dev = xs.device().clone();
    let (geo, groups) = geometry(mtrl_kernels::rms_norm_dw_geometry(n, d))?;
    let cfg = config(geo);
    let (n32, d32) = (n as u32, d as u32);
    let (rs, rl) = rstd.storage_and_layout();
    let r = crate::device::cuda_view::<f32>(&rs, rl, n, "rms norm: rstd")?;
    // SAFETY: every (group, column) is written by the thread of that column in that group.
    let partial = unsafe { dev.alloc::<f32>(groups * d) }?;
    by_dtype!(xs, |T, sfx| {
        let f = func!(dev, format!("rms_norm_bwd_dw_{sfx}"))?;
        let x = xs
            .as_cuda_slice::<T>()?
            .slice(xl.start_offset()..xl.start_offset() + n * d);
        let g = gs
            .as_cuda_slice::<T>()?
            .slice(gl.start_offset()..gl.start_offset() + n * d);
        let mut b = f.builder();
        b.arg(&x);
        b.arg(&g);
        b.arg(&r);
        b.arg(&partial);
        b.arg(&n32);
        b.arg(&d32);
        // SAFETY: x, dy [n, d], rstd [n], partial [groups, d] (grid y = groups).
        unsafe { b.launch(cfg) }.w()?;
    });
    Ok((CudaStorage::wrap_cuda_slice(partial, dev), groups))
}
