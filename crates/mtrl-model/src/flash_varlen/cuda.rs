//! The CUDA side of the fused attention: FlashAttention-2's varlen kernels through
//! `mtrl_kernels::flash` (built with the `flash-attn` feature; without it every call says so).

use candle_core::{CudaStorage, Layout};
#[cfg(not(feature = "flash-attn"))]
use candle_core::{Result, Tensor};

use super::FlashVarlen;

type Operand<'a> = (&'a CudaStorage, &'a Layout);

/// `(out [T, heads, d], lse [heads, T])` by the kernel.
#[cfg(not(feature = "flash-attn"))]
pub(super) fn forward(
    _: &FlashVarlen,
    _: Operand<'_>,
    _: Operand<'_>,
    _: Operand<'_>,
    _: (usize, usize, usize, usize),
) -> Result<(
    CudaStorage,
    candle_core::cuda_backend::cudarc::driver::CudaSlice<f32>,
)> {
    candle_core::bail!("fused attention: this binary was built without the flash-attn feature")
}

/// `[dq | dk per query head | dv per query head]` by the kernel.
#[cfg(not(feature = "flash-attn"))]
pub(super) fn backward(
    _: &FlashVarlen,
    _: (&Tensor, &Tensor, &Tensor),
    _: Operand<'_>,
    _: Operand<'_>,
    _: Operand<'_>,
    _: (usize, usize, usize, usize),
) -> Result<CudaStorage> {
    candle_core::bail!("fused attention: this binary was built without the flash-attn feature")
}

#[cfg(feature = "flash-attn")]
pub(super) use kernel::{backward, forward};

#[cfg(feature = "flash-attn")]
mod kernel {
    use std::ffi::c_void;

    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaView, DevicePtr, DevicePtrMut};
    use candle_core::{CudaStorage, Result, Tensor};
    use half::bf16;
    use mtrl_kernels::flash as ffi;

    use super::{FlashVarlen, Operand};
    use crate::device::cuda_view;

    /// The bf16 view of an operand under its (contiguous) layout.
    fn view<'a>(op: Operand<'a>, n: usize) -> Result<CudaView<'a, bf16>> {
        crate::device::bf16_operand(op, n, "fused attention")
    }

    fn rows(op: &FlashVarlen) -> (i32, i32) {
        let batch = op.offsets.len().saturating_sub(1);
        let max = op
            .offsets
            .windows(2)
            .map(|w| w[1] - w[0])
            .max()
            .unwrap_or(0);
        (batch as i32, max as i32)
    }

    fn check(code: i32, what: &str) -> Result<()> {
        match code {
            0 => Ok(()),
            _ => candle_core::bail!("fused attention {what}: {}", ffi::last_error()),
        }
    }

    pub(in crate::flash_varlen) fn forward(
        op: &FlashVarlen,
        q: Operand<'_>,
        k: Operand<'_>,
        v: Operand<'_>,
        (t, heads, kv, d): (usize, usize, usize, usize),
    ) -> Result<(CudaStorage, CudaSlice<f32>)> {
        let dev = q.0.device().clone();
        let stream = dev.cuda_stream();
        let (qv, kv_, vv) = (
            view(q, t * heads * d)?,
            view(k, t * kv * d)?,
            view(v, t * kv * d)?,
        );
        let (cs, cl) = op.cu_seqlens.storage_and_layout();
        let cu = cuda_view::<u32>(&cs, cl, op.offsets.len(), "fused attention: row offsets")?;
        // SAFETY: every element of `out` and `lse` is written by the kernel (each query of each
        // row, each head).
        let mut out = unsafe { dev.alloc::<bf16>(t * heads * d) }?;
        let mut lse = unsafe { dev.alloc::<f32>(heads * t) }?;
        let mut rng = dev.alloc_zeros::<u64>(2)?;
        let (batch, max) = rows(op);
        let code = {
            let (qp, _g1) = qv.device_ptr(&stream);
            let (kp, _g2) = kv_.device_ptr(&stream);
            let (vp, _g3) = vv.device_ptr(&stream);
            let (cp, _g4) = cu.device_ptr(&stream);
            let (op_, _g5) = out.device_ptr_mut(&stream);
            let (lp, _g6) = lse.device_ptr_mut(&stream);
            let (rp, _g7) = rng.device_ptr_mut(&stream);
            // SAFETY: pointers on the stream's device, sized as api.cu documents (shapes checked
            // by `FlashVarlen::dims`; `cu` holds rows + 1 offsets ending at T).
            unsafe {
                ffi::mtrl_flash_varlen_fwd(
                    qp as *const c_void,
                    kp as *const c_void,
                    vp as *const c_void,
                    op_ as *mut c_void,
                    lp as *mut f32,
                    cp as *const i32,
                    batch,
                    max,
                    t as i32,
                    heads as i32,
                    kv as i32,
                    d as i32,
                    op.scale as f32,
                    1,
                    rp as *mut u64,
                    stream.cu_stream() as *mut c_void,
                )
            }
        };
        check(code, "forward")?;
        Ok((CudaStorage::wrap_cuda_slice(out, dev), lse))
    }

    pub(in crate::flash_varlen) fn backward(
        op: &FlashVarlen,
        (out, dout, lse): (&Tensor, &Tensor, &Tensor),
        q: Operand<'_>,
        k: Operand<'_>,
        v: Operand<'_>,
        (t, heads, kv, d): (usize, usize, usize, usize),
    ) -> Result<CudaStorage> {
        let dev = q.0.device().clone();
        let stream = dev.cuda_stream();
        let n = t * heads * d;
        let (qv, kv_, vv) = (view(q, n)?, view(k, t * kv * d)?, view(v, t * kv * d)?);
        let (os, ol) = out.storage_and_layout();
        let (gs, gl) = dout.storage_and_layout();
        let ov = cuda_view::<bf16>(&os, ol, n, "fused attention: out")?;
        let gv = cuda_view::<bf16>(&gs, gl, n, "fused attention: dout")?;
        let (ls, ll) = lse.storage_and_layout();
        let lv = cuda_view::<f32>(&ls, ll, heads * t, "fused attention: lse")?;
        let (cs, cl) = op.cu_seqlens.storage_and_layout();
        let cu = cuda_view::<u32>(&cs, cl, op.offsets.len(), "fused attention: row offsets")?;
        let (batch, max) = rows(op);
        // SAFETY: a plain query of the device's SM count.
        let splits = unsafe { ffi::mtrl_flash_dq_splits(batch, heads as i32) }.max(1) as usize;
        let padded = t + 128 * batch as usize;
        let d_rounded = d.div_ceil(32) * 32;
        // SAFETY: dq, dk and dv (per query head) are written in full by the backward kernels.
        let mut all = unsafe { dev.alloc::<bf16>(3 * n) }?;
        let mut accum = dev.alloc_zeros::<f32>(splits * padded * heads * d_rounded)?;
        // SAFETY: written by the backward's first kernel before it is read.
        let mut softmax_d = unsafe { dev.alloc::<f32>(heads * padded) }?;
        let mut rng = dev.alloc_zeros::<u64>(2)?;
        let code = {
            let (qp, _g1) = qv.device_ptr(&stream);
            let (kp, _g2) = kv_.device_ptr(&stream);
            let (vp, _g3) = vv.device_ptr(&stream);
            let (opp, _g4) = ov.device_ptr(&stream);
            let (gp, _g5) = gv.device_ptr(&stream);
            let (lp, _g6) = lv.device_ptr(&stream);
            let (cp, _g7) = cu.device_ptr(&stream);
            let (ap, _g8) = all.device_ptr_mut(&stream);
            let (accp, _g9) = accum.device_ptr_mut(&stream);
            let (sp, _g10) = softmax_d.device_ptr_mut(&stream);
            let (rp, _g11) = rng.device_ptr_mut(&stream);
            let bytes = (n * std::mem::size_of::<bf16>()) as u64;
            // SAFETY: as for the forward; `all` holds dq, dk, dv back to back (n elements each).
            unsafe {
                ffi::mtrl_flash_varlen_bwd(
                    gp as *const c_void,
                    qp as *const c_void,
                    kp as *const c_void,
                    vp as *const c_void,
                    opp as *const c_void,
                    lp as *const f32,
                    ap as *mut c_void,
                    (ap + bytes) as *mut c_void,
                    (ap + 2 * bytes) as *mut c_void,
                    accp as *mut f32,
                    splits as i32,
                    sp as *mut f32,
                    cp as *const i32,
                    batch,
                    max,
                    t as i32,
                    heads as i32,
                    kv as i32,
                    d as i32,
                    op.scale as f32,
                    1,
                    rp as *mut u64,
                    stream.cu_stream() as *mut c_void,
                )
            }
        };
        check(code, "backward")?;
        Ok(CudaStorage::wrap_cuda_slice(all, dev))
    }
}
