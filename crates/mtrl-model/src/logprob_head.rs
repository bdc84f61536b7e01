//! The log-prob head's two passes over one chunk of logits `z` `[n, V]` (`h · Wᵀ`, in the
//! weights' dtype), for the candle backend (CUDA's path; the CPU f32 kernels have their own,
//! `cpu::logits`): on CUDA `mtrl-kernels`' `logprob_head` (one kernel per pass, computing in
//! f32), elsewhere the twin below (f64). Each replaces a chain of candle ops and their `[n, V]`
//! f32 temporaries (cast, log-softmax, gather, exp, product, sum; softmax, product, scatter-add,
//! cast in the backward).
//!
//! - [`lse_pick_entropy`]: per row `(lse, y[target] − lse, lse − Σ p·y)` with `y = z / T`, `p =
//!   softmax(y)`: the log-sum-exp, the picked token's log-prob, the entropy.
//! - [`dlogits`]: `dz = g · (onehot(target) − p) / T`, the gradient of `Σ g · logp` with respect
//!   to `z`, in `z`'s dtype (the backward products run in it).

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp1, CustomOp3, DType, Layout, Result, Shape, Tensor};

use crate::cpu::{slice_of, twin_vec};

/// `[n, 3]` f32: `(lse, picked log-prob, entropy)` of each row of `z` `[n, V]` at temperature
/// `1 / inv_t`; `targets` `[n]` u32 on `z`'s device.
pub(crate) fn lse_pick_entropy(z: &Tensor, targets: &Tensor, inv_t: f32) -> Result<Tensor> {
    let (n, _) = z.dims2()?;
    if targets.dims1()? != n || targets.dtype() != DType::U32 {
        candle_core::bail!("log-prob head: {n} rows, targets {:?}", targets.dims())
    }
    z.contiguous()?.apply_op1_no_bwd(&Lpe {
        targets: targets.contiguous()?,
        inv_t,
    })
}

/// `dz` `[n, V]` in `z`'s dtype (see the module docs); `lse` and `g` `[n]` f32.
pub(crate) fn dlogits(
    z: &Tensor,
    lse: &Tensor,
    targets: &Tensor,
    g: &Tensor,
    inv_t: f32,
) -> Result<Tensor> {
    let (n, _) = z.dims2()?;
    for (what, t) in [("lse", lse), ("g", g)] {
        if t.dims1()? != n || t.dtype() != DType::F32 {
            candle_core::bail!("log-prob head: {what} {:?} for {n} rows", t.dims())
        }
    }
    if targets.dims1()? != n || targets.dtype() != DType::U32 {
        candle_core::bail!("log-prob head: {n} rows, targets {:?}", targets.dims())
    }
    z.contiguous()?.apply_op3_no_bwd(
        &lse.contiguous()?,
        &g.contiguous()?,
        &Dz {
            targets: targets.contiguous()?,
            inv_t,
        },
    )
}

struct Lpe {
    targets: Tensor,
    inv_t: f32,
}

struct Dz {
    targets: Tensor,
    inv_t: f32,
}

/// The twin of `lse_pick_entropy` (f64 inside), rows in parallel on the CPU pool.
fn twin_lpe<T: candle_core::WithDType>(z: &[T], targets: &[u32], inv_t: f64) -> Vec<f32> {
    let vocab = z.len() / targets.len().max(1);
    let mut out = vec![0f32; 3 * targets.len()];
    crate::cpu::for_rows(&mut out, 3, 6, |r, o| {
        let row = &z[r * vocab..][..vocab];
        let m = row
            .iter()
            .map(|x| x.to_f64() * inv_t)
            .fold(f64::NEG_INFINITY, f64::max);
        let (mut s, mut e) = (0f64, 0f64);
        for x in row {
            let y = x.to_f64() * inv_t;
            let p = (y - m).exp();
            s += p;
            e += p * y;
        }
        let lse = m + s.ln();
        o[0] = lse as f32;
        o[1] = (row[targets[r] as usize].to_f64() * inv_t - lse) as f32;
        o[2] = (lse - e / s).max(0.0) as f32;
    });
    out
}

/// `dz` of row `r` into `o` (f64 arithmetic, any output type).
fn dz_row<T: candle_core::WithDType, O>(
    row: &[T],
    (l, c, t): (f64, f64, usize),
    inv_t: f64,
    o: &mut [O],
    put: impl Fn(f64) -> O,
) {
    for (col, (x, oe)) in row.iter().zip(o.iter_mut()).enumerate() {
        let p = (x.to_f64() * inv_t - l).exp();
        let hot = if col == t { 1.0 } else { 0.0 };
        *oe = put(c * (hot - p));
    }
}

/// The twin of `dlogits`: f64 models row by row in f64; the others' rows in parallel through an
/// f32 buffer (the kernel's own precision), then cast.
fn twin_dz<T: candle_core::WithDType>(
    z: &[T],
    lse: &[f32],
    targets: &[u32],
    g: &[f32],
    inv_t: f64,
) -> Vec<T> {
    let vocab = z.len() / targets.len().max(1);
    let args = |r: usize| (lse[r] as f64, g[r] as f64 * inv_t, targets[r] as usize);
    if T::DTYPE == DType::F64 {
        let mut out = vec![T::zero(); z.len()];
        for (r, o) in out.chunks_mut(vocab.max(1)).enumerate() {
            dz_row(&z[r * vocab..][..vocab], args(r), inv_t, o, T::from_f64);
        }
        return out;
    }
    let mut out = vec![0f32; z.len()];
    crate::cpu::par_rows(&mut out, vocab, |r, o| {
        dz_row(&z[r * vocab..][..vocab], args(r), inv_t, o, |x| x as f32);
    });
    out.into_iter().map(|x| T::from_f64(x as f64)).collect()
}

impl CustomOp1 for Lpe {
    fn name(&self) -> &'static str {
        "lse-pick-entropy"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (n, _) = l.shape().dims2()?;
        let t = twin_vec::<u32>(&self.targets)?;
        let inv_t = self.inv_t as f64;
        let out = match s.dtype() {
            DType::F32 => twin_lpe(slice_of::<f32>(s, l)?, &t, inv_t),
            DType::F64 => twin_lpe(slice_of::<f64>(s, l)?, &t, inv_t),
            DType::BF16 => twin_lpe(slice_of::<half::bf16>(s, l)?, &t, inv_t),
            DType::F16 => twin_lpe(slice_of::<half::f16>(s, l)?, &t, inv_t),
            other => candle_core::bail!("log-prob head: no twin for {other:?}"),
        };
        Ok((CpuStorage::F32(out), Shape::from((n, 3))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        cuda::lpe(self, s, l)
    }
}

impl CustomOp3 for Dz {
    fn name(&self) -> &'static str {
        "dlogits"
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
        let t = twin_vec::<u32>(&self.targets)?;
        let (lse, g) = (slice_of::<f32>(s2, l2)?, slice_of::<f32>(s3, l3)?);
        let inv_t = self.inv_t as f64;
        macro_rules! run {
            ($ty:ty) => {
                <$ty as candle_core::WithDType>::to_cpu_storage_owned(twin_dz(
                    slice_of::<$ty>(s1, l1)?,
                    lse,
                    &t,
                    g,
                    inv_t,
                ))
            };
        }
        let out = match s1.dtype() {
            DType::F32 => run!(f32),
            DType::F64 => run!(f64),
            DType::BF16 => run!(half::bf16),
            DType::F16 => run!(half::f16),
            other => candle_core::bail!("log-prob head: no twin for {other:?}"),
        };
        Ok((out, l1.shape().clone()))
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
        cuda::dz(self, (s1, l1), (s2, l2), (s3, l3))
    }
}

/// The largest differences between the passes on `dev` (the kernels on a GPU) and the CPU twin,
/// each relative to the largest entry it is compared with: `(lse/picked/entropy, dz)`, over 37
/// rows of Qwen's 151,936-entry vocabulary at temperature 0.7, in `dtype`. `mtrl selftest`
/// reports it; on the CPU it compares the twin with itself.
pub fn check_against_twin(dev: &candle_core::Device, dtype: DType) -> crate::Result<(f32, f32)> {
    let (n, v) = (37usize, 151_936usize);
    let cpu = candle_core::Device::Cpu;
    let z = (Tensor::randn(0f32, 1.0, (n, v), &cpu)? * 4.0)?.to_dtype(dtype)?;
    let targets: Vec<u32> = (0..n as u32).map(|r| (r * 4099 + 11) % v as u32).collect();
    let g: Vec<f32> = (0..n).map(|r| 1.0 - r as f32 / n as f32).collect();
    let inv_t = (1.0f64 / 0.7) as f32;
    let run = |on: &candle_core::Device| -> Result<(Tensor, Tensor)> {
        let z = z.to_device(on)?;
        let t = Tensor::from_slice(&targets, n, on)?;
        let o = lse_pick_entropy(&z, &t, inv_t)?;
        let lse = o.narrow(1, 0, 1)?.squeeze(1)?;
        let dz = dlogits(&z, &lse, &t, &Tensor::from_slice(&g, n, on)?, inv_t)?;
        Ok((o.to_device(&cpu)?, dz.to_device(&cpu)?))
    };
    let ((o1, d1), (o2, d2)) = (run(dev)?, run(&cpu)?);
    let rel = crate::cpu::max_rel_gap;
    Ok((rel(&o1, &o2)?, rel(&d1, &d2)?))
}

#[cfg(feature = "cuda")]
mod cuda;

#[cfg(test)]
mod tests;
