//! The engine's prefill attention on tensor cores: each prompt chunk's queries attend to their
//! whole sequence so far — the positions stored by earlier steps and the chunk itself — causal
//! from the bottom right. On CUDA FlashAttention-2's varlen forward (`mtrl-kernels` with the
//! `flash-attn` feature: bf16, head dims 64 and 128; `mtrl_flash_prefix_fwd`); its CPU twin below
//! runs the same arithmetic one query at a time (online softmax in f32, as
//! [`crate::paged_attention`]'s twin).
//!
//! Why beside the paged attention: that kernel walks one query's positions per thread block on
//! CUDA cores, which suits decode rows (one query per sequence, memory-bound) but, for a chunk
//! of `L` queries after `S` stored positions, reads and multiplies the sequence's keys `L` times
//! at CUDA-core rates; FlashAttention-2 reads each key tile once per 128 queries and multiplies
//! on tensor cores. The price: the chunks' sequences' keys and values are first gathered from the
//! paged store into packed `[Σ S, kv, d]` tensors (one copy of the bytes, no padding).
//!
//! Contract: `q` `[Tq, heads, d]` (rows `q_offsets`), `k`, `v` `[Tk, kv, d]` (rows `k_offsets`,
//! each key row at least as long as its query row); query `i` of a row of `lq` queries and `lk`
//! keys sees keys `0..=lk − lq + i`; scores scaled by `1/√d`. Output `[Tq, heads · d]`.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp3, DType, Device, Layout, Result, Shape, Tensor, WithDType};

use crate::cpu::slice_of;
use crate::kv_pool::row_of;
use crate::transformer::paged::Segment;

/// The rows of one call: query and key offsets on the host (`[rows + 1]` each) and on the
/// device (u32, read as int32 by the kernel).
#[derive(Debug, Clone)]
pub struct PrefixRows {
    pub q_offsets: Vec<usize>,
    pub k_offsets: Vec<usize>,
    #[cfg_attr(not(feature = "flash-attn"), allow(dead_code))]
    pub(crate) cu_q: Tensor,
    #[cfg_attr(not(feature = "flash-attn"), allow(dead_code))]
    pub(crate) cu_k: Tensor,
}

impl PrefixRows {
    /// Rows of `(queries, keys)`, offsets uploaded to `dev`.
    pub fn new(rows: &[(usize, usize)], dev: &Device) -> Result<Self> {
        let (q, k) = offsets(rows);
        let (cu_q, cu_k) = (Self::upload(&q, dev)?, Self::upload(&k, dev)?);
        Ok(Self::with_device(q, k, cu_q, cu_k))
    }

    fn upload(o: &[usize], dev: &Device) -> Result<Tensor> {
        Tensor::from_vec(o.iter().map(|&x| x as u32).collect(), o.len(), dev)
    }

    /// Rows whose offsets are already on the device (views of a step's upload).
    pub(crate) fn with_device(
        q_offsets: Vec<usize>,
        k_offsets: Vec<usize>,
        cu_q: Tensor,
        cu_k: Tensor,
    ) -> Self {
        PrefixRows {
            q_offsets,
            k_offsets,
            cu_q,
            cu_k,
        }
    }

    fn lens(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.q_offsets
            .windows(2)
            .zip(self.k_offsets.windows(2))
            .map(|(q, k)| (q[1] - q[0], k[1] - k[0]))
    }
}

/// The pool rows of every position of `segs`' sequences, token-major (segment, position, KV
/// head), appended to `out`: an `index_select` of a pool buffer by them, reshaped, is the packed
/// `[Σ (start + len), kv, d]` keys (or values) this op reads.
pub(crate) fn key_rows(segs: &[&Segment], kv: usize, out: &mut Vec<u32>) {
    out.reserve(segs.iter().map(|s| (s.start + s.len) * kv).sum());
    for s in segs {
        for &slot in &s.slots[..s.start + s.len] {
            out.extend((0..kv).map(|g| row_of(slot, g, kv) as u32));
        }
    }
}

/// Offsets `[rows + 1]` of queries and keys of rows `(queries, keys)`.
pub(crate) fn offsets(rows: &[(usize, usize)]) -> (Vec<usize>, Vec<usize>) {
    let mut q = vec![0];
    let mut k = vec![0];
    for &(lq, lk) in rows {
        q.push(q[q.len() - 1] + lq);
        k.push(k[k.len() - 1] + lk);
    }
    (q, k)
}

/// `softmax(q·kᵀ/√d)·v` of each query over its row's keys up to its own position (see the module
/// docs), by the kernel on CUDA and the twin elsewhere. Returns `[Tq, heads · d]`.
pub fn attend(q: &Tensor, k: &Tensor, v: &Tensor, rows: &PrefixRows) -> Result<Tensor> {
    let (tq, heads, d) = q.dims3()?;
    let op = FlashPrefill {
        rows: rows.clone(),
        scale: 1.0 / (d as f32).sqrt(),
    };
    q.contiguous()?
        .apply_op3_no_bwd(&k.contiguous()?, &v.contiguous()?, &op)?
        .reshape((tq, heads * d))
}

/// The op: `q.apply_op3_no_bwd(k, v, &FlashPrefill { .. })` → `[Tq, heads, d]`.
struct FlashPrefill {
    rows: PrefixRows,
    scale: f32,
}

/// `(Tq, Tk, heads, kv, d)`.
type Dims = (usize, usize, usize, usize, usize);

impl FlashPrefill {
    /// The call's sizes, checking shapes, layouts and rows.
    fn dims(&self, q: &Layout, k: &Layout, v: &Layout) -> Result<Dims> {
        let (tq, heads, d) = q.shape().dims3()?;
        let (tk, kv, dk) = k.shape().dims3()?;
        if dk != d || v.shape() != k.shape() || kv == 0 || heads % kv != 0 {
            candle_core::bail!("prefill attention: q {:?}, k {:?}", q.dims(), k.dims())
        }
        if !(q.is_contiguous() && k.is_contiguous() && v.is_contiguous()) {
            candle_core::bail!("prefill attention: operands must be contiguous")
        }
        let r = &self.rows;
        let covers = |o: &[usize], n: usize| o.first() == Some(&0) && o.last() == Some(&n);
        if r.q_offsets.len() != r.k_offsets.len()
            || !covers(&r.q_offsets, tq)
            || !covers(&r.k_offsets, tk)
            || r.lens().any(|(lq, lk)| lq > lk)
        {
            candle_core::bail!(
                "prefill attention: query rows {:?} and key rows {:?} do not fit {tq} queries \
                 and {tk} keys",
                r.q_offsets,
                r.k_offsets
            )
        }
        Ok((tq, tk, heads, kv, d))
    }
}

/// The CPU twin: per (query, head), an online softmax over the query's keys in order, in f32
/// (`crate::paged_attention::twin_row`).
fn twin<T: WithDType>(
    q: &[T],
    k: &[T],
    v: &[T],
    rows: &PrefixRows,
    (tq, _, heads, kv, d): Dims,
    scale: f32,
) -> Vec<T> {
    let rep = heads / kv;
    let mut out = vec![T::zero(); tq * heads * d];
    let (mut acc, mut qs) = (vec![0f32; d], vec![0f32; d]);
    for (j, (lq, lk)) in rows.lens().enumerate() {
        let (q0, k0) = (rows.q_offsets[j], rows.k_offsets[j]);
        for i in 0..lq {
            let qi = q0 + i;
            for h in 0..heads {
                let g = h / rep;
                crate::paged_attention::twin_row(
                    &q[(qi * heads + h) * d..][..d],
                    scale,
                    (k, v),
                    (0..lk - lq + i + 1).map(|p| (k0 + p) * kv + g),
                    &mut out[(qi * heads + h) * d..][..d],
                    (&mut qs, &mut acc),
                );
            }
        }
    }
    out
}

impl CustomOp3 for FlashPrefill {
    fn name(&self) -> &'static str {
        "flash-prefill"
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
        let dims = self.dims(l1, l2, l3)?;
        let (tq, _, heads, _, d) = dims;
        macro_rules! run {
            ($ty:ty) => {{
                let out = twin::<$ty>(
                    slice_of(s1, l1)?,
                    slice_of(s2, l2)?,
                    slice_of(s3, l3)?,
                    &self.rows,
                    dims,
                    self.scale,
                );
                <$ty as WithDType>::to_cpu_storage_owned(out)
            }};
        }
        let out = match s1.dtype() {
            DType::F32 => run!(f32),
            DType::F64 => run!(f64),
            DType::BF16 => run!(half::bf16),
            DType::F16 => run!(half::f16),
            other => candle_core::bail!("prefill attention: no twin for {other:?}"),
        };
        Ok((out, Shape::from((tq, heads, d))))
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
        let dims = self.dims(l1, l2, l3)?;
        let (tq, _, heads, _, d) = dims;
        let out = cuda::forward(&self.rows, self.scale, (s1, l1), (s2, l2), (s3, l3), dims)?;
        Ok((out, Shape::from((tq, heads, d))))
    }
}

#[cfg(feature = "cuda")]
mod cuda;

mod check;
pub use check::check_against_gathered;

#[cfg(test)]
mod tests;
