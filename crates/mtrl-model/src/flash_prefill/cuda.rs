//! The CUDA side of the prefill attention: FlashAttention-2's varlen forward through
//! `mtrl_kernels::flash::mtrl_flash_prefix_fwd` (built with the `flash-attn` feature; without it
//! every call says so).

use candle_core::{CudaStorage, Layout, Result};

use super::{Dims, PrefixRows};

type Operand<'a> = (&'a CudaStorage, &'a Layout);

#[cfg(not(feature = "flash-attn"))]
pub(super) fn forward(
    _: &PrefixRows,
    _: f32,
    _: Operand<'_>,
    _: Operand<'_>,
    _: Operand<'_>,
    _: Dims,
) -> Result<CudaStorage> {
    candle_core::bail!("prefill attention: this binary was built without the flash-attn feature")
}

/// `out` `[Tq, heads, d]` by the kernel (its `lse` is scratch: the engine has no backward).
#[cfg(feature = "flash-attn")]
pub(super) fn forward(
    rows: &PrefixRows,
    scale: f32,
    q: Operand<'_>,
    k: Operand<'_>,
    v: Operand<'_>,
    (tq, tk, heads, kv, d): Dims,
) -> Result<CudaStorage> {
    use std::ffi::c_void;

    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::{DevicePtr, DevicePtrMut};
    use half::bf16;
    use mtrl_kernels::flash as ffi;

    use crate::device::{bf16_operand, cuda_view};
    const WHAT: &str = "prefill attention";

    let dev = q.0.device().clone();
    let stream = dev.cuda_stream();
    let (qv, kv_, vv) = (
        bf16_operand(q, tq * heads * d, WHAT)?,
        bf16_operand(k, tk * kv * d, WHAT)?,
        bf16_operand(v, tk * kv * d, WHAT)?,
    );
    let n = rows.q_offsets.len();
    let (qs, ql) = rows.cu_q.storage_and_layout();
    let (ks, kl) = rows.cu_k.storage_and_layout();
    let cu_q = cuda_view::<u32>(&qs, ql, n, "prefill attention: query offsets")?;
    let cu_k = cuda_view::<u32>(&ks, kl, n, "prefill attention: key offsets")?;
    let (max_q, max_k) = rows
        .lens()
        .fold((0, 0), |(a, b), (lq, lk)| (a.max(lq), b.max(lk)));
    // SAFETY: every element of `out` and `lse` is written by the kernel (each query, each head).
    let mut out = unsafe { dev.alloc::<bf16>(tq * heads * d) }?;
    let mut lse = unsafe { dev.alloc::<f32>(heads * tq) }?;
    let mut rng = dev.alloc_zeros::<u64>(2)?;
    let code = {
        let (qp, _g1) = qv.device_ptr(&stream);
        let (kp, _g2) = kv_.device_ptr(&stream);
        let (vp, _g3) = vv.device_ptr(&stream);
        let (cqp, _g4) = cu_q.device_ptr(&stream);
        let (ckp, _g5) = cu_k.device_ptr(&stream);
        let (op, _g6) = out.device_ptr_mut(&stream);
        let (lp, _g7) = lse.device_ptr_mut(&stream);
        let (rp, _g8) = rng.device_ptr_mut(&stream);
        // SAFETY: pointers on the stream's device, sized as api.cu documents (shapes and rows
        // checked by `FlashPrefill::dims`: offsets cover Tq and Tk, no row has more queries
        // than keys).
        unsafe {
            ffi::mtrl_flash_prefix_fwd(
                qp as *const c_void,
                kp as *const c_void,
                vp as *const c_void,
                op as *mut c_void,
                lp as *mut f32,
                cqp as *const i32,
                ckp as *const i32,
                (n - 1) as i32,
                max_q as i32,
                max_k as i32,
                tq as i32,
                heads as i32,
                kv as i32,
                d as i32,
                scale,
                1,
                rp as *mut u64,
                stream.cu_stream() as *mut c_void,
            )
        }
    };
    if code != 0 {
        candle_core::bail!("prefill attention: {}", ffi::last_error())
    }
    Ok(CudaStorage::wrap_cuda_slice(out, dev))
}
