//! Raw access to the f32 data of CPU tensors, for the kernels that work on slices.
//!
//! Every helper takes a contiguous view (copying only when the tensor is strided) and fails with an
//! error, never a panic, when a tensor is not on the CPU or not f32: the dispatch in
//! [`super::backend`] only routes CPU f32 tensors here, so such an error is a bug upstream.

use candle_core::{CpuStorage, Layout, Result, Storage, Tensor, WithDType};

/// The f32 elements of a contiguous layout of `s`.
pub(crate) fn slice<'a>(s: &'a CpuStorage, l: &Layout) -> Result<&'a [f32]> {
    slice_of::<f32>(s, l)
}

/// The elements of a contiguous layout of `s`, in any dtype (the CPU twins of the CUDA kernels).
pub(crate) fn slice_of<'a, T: WithDType>(s: &'a CpuStorage, l: &Layout) -> Result<&'a [T]> {
    let Some((a, b)) = l.contiguous_offsets() else {
        candle_core::bail!("fused kernels need contiguous inputs")
    };
    Ok(&s.as_slice::<T>()?[a..b])
}

/// Runs `$body` with `$ty` bound to the element type of float dtype `$dtype` (f32, f64, bf16,
/// f16): the CPU twins' dispatch. Any other dtype is an error naming the op `$what`.
macro_rules! by_dtype {
    ($dtype:expr, $what:expr, |$ty:ident| $body:expr) => {
        match $dtype {
            candle_core::DType::F32 => {
                type $ty = f32;
                $body
            }
            candle_core::DType::F64 => {
                type $ty = f64;
                $body
            }
            candle_core::DType::BF16 => {
                type $ty = half::bf16;
                $body
            }
            candle_core::DType::F16 => {
                type $ty = half::f16;
                $body
            }
            other => candle_core::bail!("{}: no twin for {other:?}", $what),
        }
    };
}
pub(crate) use by_dtype;

/// The elements of an operand a CPU twin reads beside its storages (an index, the targets), as a
/// host vector. Not a counted device read (`crate::host`): the twins run on the CPU.
pub(crate) fn twin_vec<T: WithDType>(t: &Tensor) -> Result<Vec<T>> {
    t.to_device(&candle_core::Device::Cpu)?
        .flatten_all()?
        .to_vec1::<T>()
}

/// `max |a − b| / max |b|` (the denominator at least 1e-12), in f32: how far a kernel's result
/// `a` is from its twin's `b`, relative to the largest entry (the selftest's kernel checks).
pub(crate) fn max_rel_gap(a: &Tensor, b: &Tensor) -> Result<f32> {
    let (a, b) = (
        a.to_dtype(candle_core::DType::F32)?,
        b.to_dtype(candle_core::DType::F32)?,
    );
    let scale = b.abs()?.max_all()?.to_scalar::<f32>()?.max(1e-12);
    Ok((a - b)?.abs()?.max_all()?.to_scalar::<f32>()? / scale)
}

/// The f32 buffer of a storage (from its start; callers add their layout's offset).
pub(crate) fn cpu_f32(s: &Storage) -> Result<&[f32]> {
    match s {
        Storage::Cpu(c) => c.as_slice::<f32>(),
        _ => candle_core::bail!("expected a CPU tensor"),
    }
}

/// Reads the contiguous f32 data of a CPU tensor.
pub(crate) fn with1<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Result<R> {
    let t = t.contiguous()?;
    let (st, l) = t.storage_and_layout();
    let data = cpu_f32(&st)?;
    Ok(f(&data[l.start_offset()..l.start_offset() + t.elem_count()]))
}

/// Reads the contiguous f32 data of two CPU tensors.
pub(crate) fn with2<R>(a: &Tensor, b: &Tensor, f: impl FnOnce(&[f32], &[f32]) -> R) -> Result<R> {
    let (a, b) = (a.contiguous()?, b.contiguous()?);
    let (sa, la) = a.storage_and_layout();
    let (sb, lb) = b.storage_and_layout();
    let (Storage::Cpu(ca), Storage::Cpu(cb)) = (&*sa, &*sb) else {
        candle_core::bail!("fused kernels run on the CPU")
    };
    Ok(f(slice(ca, la)?, slice(cb, lb)?))
}

/// Reads the contiguous f32 data of three CPU tensors.
pub(crate) fn with3<R>(
    a: &Tensor,
    b: &Tensor,
    c: &Tensor,
    f: impl FnOnce(&[f32], &[f32], &[f32]) -> R,
) -> Result<R> {
    let c = c.contiguous()?;
    let (sc, lc) = c.storage_and_layout();
    let Storage::Cpu(cc) = &*sc else {
        candle_core::bail!("fused kernels run on the CPU")
    };
    let cs = slice(cc, lc)?;
    with2(a, b, |a, b| f(a, b, cs))
}
