//! The CUDA launches of `mtrl-kernels`' `swiglu.cu`.

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::WrapErr;
use candle_core::{CudaStorage, DType, Layout, Result};

/// Kernel `<name>_<dtype>` over operands of `n` elements each, writing a fresh `[out]`.
pub(super) fn launch(
    name: &str,
    ops: &[(&CudaStorage, &Layout)],
    n: usize,
    out: usize,
) -> Result<CudaStorage> {
    let dev = ops[0].0.device().clone();
    let (grid_dim, block_dim) =
        mtrl_kernels::swiglu_geometry(n).map_err(candle_core::Error::msg)?;
    let cfg = LaunchConfig {
        grid_dim,
        block_dim,
        shared_mem_bytes: 0,
    };
    let n32 = u32::try_from(n).map_err(|_| candle_core::Error::msg("swiglu: over 2³² elements"))?;
    macro_rules! go {
        ($ty:ty, $sfx:literal) => {{
            let f = dev.get_or_load_custom_func(
                &format!("{name}_{}", $sfx),
                mtrl_kernels::SWIGLU_MODULE,
                mtrl_kernels::SWIGLU,
            )?;
            let views = ops
                .iter()
                .map(|(s, l)| {
                    let o = l.start_offset();
                    Ok(s.as_cuda_slice::<$ty>()?.slice(o..o + n))
                })
                .collect::<Result<Vec<_>>>()?;
            // SAFETY: every element is written by the grid-stride loop.
            let y = unsafe { dev.alloc::<$ty>(out) }?;
            let mut b = f.builder();
            for v in &views {
                b.arg(v);
            }
            b.arg(&y);
            b.arg(&n32);
            // SAFETY: the operands hold n elements each (checked by the op), y `out` (n for the
            // forward, 2n for the backward, as the kernels write).
            unsafe { b.launch(cfg) }.w()?;
            CudaStorage::wrap_cuda_slice(y, dev.clone())
        }};
    }
    Ok(match ops[0].0.dtype() {
        DType::BF16 => go!(half::bf16, "bf16"),
        DType::F16 => go!(half::f16, "f16"),
        DType::F32 => go!(f32, "f32"),
        other => candle_core::bail!("swiglu: no kernel for {other:?}"),
    })
}
