//! The engine's attention over the paged store for every row of a step — decode rows and prefill
//! chunks in **one call per layer** — reading the store in place: on CUDA `mtrl-kernels`'
//! `paged_attention` (one thread block per (query, head), online softmax in f32); its CPU twin
//! below runs the same arithmetic one position after another. Both replace the candle spelling
//! ([`crate::transformer::paged`]), which per layer and step copies every decode row's keys and
//! values into a padded `[n, kv, max_len, d]` tensor (about 29 GB per step at 2k-token contexts
//! and batch 64 for Qwen3-0.6B, docs/gpu.md), pads the prefill queries to `[m, heads, t_max, d]`
//! beside a gathered `[m, kv, s_max, d]` copy, and attends under additive masks.
//!
//! Operands: `q` `[t, heads, d]` (the step's rows in order); the layer's pool buffers `[rows, d]`;
//! the step's [`PagedRows`] (one slot table per segment, and per query its segment and the
//! positions it sees — its own position + 1, which makes prefill causal). Output
//! `[t, heads · d]`.

use candle_core::{CpuStorage, CustomOp3, DType, Device, Layout, Result, Shape, Tensor, WithDType};

use crate::kv_pool::{row_of, BLOCK};
use crate::transformer::paged::Segment;

/// Where the kernel serves: CUDA, bf16/f16/f32 (the pool's dtype), head dims that are multiples of
/// 32 up to 256 (a lane holds at most 8 elements; Qwen: 64, 128).
pub(crate) fn serves(dev: &Device, dtype: DType, head_dim: usize) -> bool {
    dev.is_cuda()
        && matches!(dtype, DType::BF16 | DType::F16 | DType::F32)
        && head_dim.is_multiple_of(32)
        && (32..=256).contains(&head_dim)
}

/// The step's rows as the kernel reads them, on the device (views of the step's one upload,
/// `transformer::step_meta`, or built by [`PagedRows::new`]).
#[derive(Debug, Clone)]
pub struct PagedRows {
    /// `[segments · s_max]` u32: the slots of each segment's positions (the rest 0, never read).
    pub table: Tensor,
    /// `[t]` u32: the segment of each query.
    pub qrow: Tensor,
    /// `[t]` u32: the positions each query sees.
    pub qlen: Tensor,
    pub s_max: usize,
}

/// The host arrays of [`PagedRows`] for `segs` in order: `(table, qrow, qlen, s_max)`.
pub(crate) fn layout(segs: &[&Segment]) -> (Vec<u32>, Vec<u32>, Vec<u32>, usize) {
    let s_max = segs.iter().map(|s| s.slots.len()).max().unwrap_or(0).max(1);
    let mut table = vec![0u32; segs.len() * s_max];
    let t: usize = segs.iter().map(|s| s.len).sum();
    let (mut qrow, mut qlen) = (Vec::with_capacity(t), Vec::with_capacity(t));
    for (j, s) in segs.iter().enumerate() {
        table[j * s_max..][..s.slots.len()].copy_from_slice(&s.slots);
        for i in 0..s.len {
            qrow.push(j as u32);
            qlen.push((s.start + i + 1) as u32);
        }
    }
    (table, qrow, qlen, s_max)
}

impl PagedRows {
    /// The rows of `segs` (decode segments, then prefill segments) on `dev`.
    pub fn new(segs: &[&Segment], dev: &Device) -> Result<Self> {
        let (table, qrow, qlen, s_max) = layout(segs);
        let (n, t) = (table.len(), qrow.len());
        Ok(PagedRows {
            table: Tensor::from_vec(table, n, dev)?,
            qrow: Tensor::from_vec(qrow, t, dev)?,
            qlen: Tensor::from_vec(qlen, t, dev)?,
            s_max,
        })
    }
}

/// `softmax(q·kᵀ/√d)·v` of each query over the positions it sees in the pool (see the module
/// docs), by the kernel on CUDA and the twin elsewhere. `q` `[t, heads, d]`; returns
/// `[t, heads · d]`.
pub fn attend(
    q: &Tensor,
    k_pool: &Tensor,
    v_pool: &Tensor,
    kv: usize,
    rows: &PagedRows,
) -> Result<Tensor> {
    let (t, heads, d) = q.dims3()?;
    if kv == 0 || heads % kv != 0 || rows.qrow.dims1()? != t || rows.qlen.dims1()? != t {
        candle_core::bail!(
            "paged attention: q {:?} for {} queries and {kv} KV heads",
            q.dims(),
            rows.qrow.dims1()?
        )
    }
    let op = PagedAttention {
        rows: rows.clone(),
        kv,
        scale: 1.0 / (d as f32).sqrt(),
    };
    let out = q.contiguous()?.apply_op3_no_bwd(k_pool, v_pool, &op)?;
    out.reshape((t, heads * d))
}

/// The op: `q.apply_op3_no_bwd(k_pool, v_pool, &PagedAttention { .. })`.
struct PagedAttention {
    rows: PagedRows,
    kv: usize,
    scale: f32,
}

/// Sizes of one call: `(heads, kv, s_max, d)`.
type Dims = (usize, usize, usize, usize);

impl PagedAttention {
    /// `(t, (heads, kv, s_max, d), pool rows)`, checking shapes and layouts.
    fn dims(&self, q: &Layout, k: &Layout, v: &Layout) -> Result<(usize, Dims, usize)> {
        let (t, heads, d) = q.shape().dims3()?;
        let (rows, dk) = k.shape().dims2()?;
        if dk != d || v.shape().dims() != k.shape().dims() || rows % BLOCK != 0 {
            candle_core::bail!("paged attention: q {:?}, pools {:?}", q.dims(), k.dims())
        }
        if !(q.is_contiguous() && k.is_contiguous() && v.is_contiguous()) {
            candle_core::bail!("paged attention: operands must be contiguous")
        }
        let s_max = self.rows.s_max;
        if s_max == 0 || self.rows.table.dims1()? % s_max != 0 {
            candle_core::bail!("paged attention: a table of {:?}", self.rows.table.dims())
        }
        Ok((t, (heads, self.kv, s_max, d), rows))
    }
}

/// The CPU twin: per (query, head), an online softmax over the query's positions in order, in
/// f32, with the kernel's checks made explicit (segment, length and pool row in range).
#[allow(clippy::too_many_arguments)]
fn twin<T: WithDType>(
    q: &[T],
    k: &[T],
    v: &[T],
    (table, qrow, qlen): (&[u32], &[u32], &[u32]),
    (heads, kv, s_max, d): Dims,
    rows: usize,
    scale: f32,
) -> Result<Vec<T>> {
    let rep = heads / kv;
    let segments = table.len() / s_max;
    let mut out = vec![T::zero(); qrow.len() * heads * d];
    let (mut acc, mut qs) = (vec![0f32; d], vec![0f32; d]);
    for (i, (&seg, &len)) in qrow.iter().zip(qlen).enumerate() {
        let (seg, len) = (seg as usize, len as usize);
        if seg >= segments || len > s_max {
            candle_core::bail!(
                "paged attention: query {i} reads {len} positions of segment {seg} \
                 ({segments} segments of at most {s_max})"
            )
        }
        let slots = &table[seg * s_max..][..len];
        // `row_of` grows with the head: the last KV head's rows are the furthest.
        if let Some(slot) = slots.iter().find(|&&s| row_of(s, kv - 1, kv) >= rows) {
            candle_core::bail!("paged attention: slot {slot} is outside the pool")
        }
        for h in 0..heads {
            let g = h / rep;
            twin_row(
                &q[(i * heads + h) * d..][..d],
                scale,
                (k, v),
                slots.iter().map(|&slot| row_of(slot, g, kv)),
                &mut out[(i * heads + h) * d..][..d],
                (&mut qs, &mut acc),
            );
        }
    }
    Ok(out)
}

/// One query `q` (`d` wide, scaled by `scale`) attending over the key/value rows `rows` of `k`
/// and `v` (each `d` wide), in order, by an online softmax in f32; writes `out` (`d`; zeros when
/// there is no row). The arithmetic of the paged kernel's CPU twin and of FlashAttention-2
/// prefill's (`crate::flash_prefill`); `qs`, `acc` are scratch of `d`.
pub(crate) fn twin_row<T: WithDType>(
    q: &[T],
    scale: f32,
    (k, v): (&[T], &[T]),
    rows: impl IntoIterator<Item = usize>,
    out: &mut [T],
    (qs, acc): (&mut [f32], &mut [f32]),
) {
    let d = q.len();
    for (x, &y) in qs.iter_mut().zip(q) {
        *x = y.to_f64() as f32 * scale;
    }
    acc.fill(0.0);
    let (mut m, mut l) = (f32::NEG_INFINITY, 0f32);
    for r in rows {
        let s: f32 = qs
            .iter()
            .zip(&k[r * d..][..d])
            .map(|(a, b)| a * b.to_f64() as f32)
            .sum();
        let m2 = m.max(s);
        let (a, e) = ((m - m2).exp(), (s - m2).exp());
        for (x, vv) in acc.iter_mut().zip(&v[r * d..][..d]) {
            *x = *x * a + e * vv.to_f64() as f32;
        }
        l = l * a + e;
        m = m2;
    }
    for (y, x) in out.iter_mut().zip(acc.iter()) {
        *y = T::from_f64(if l > 0.0 { (x / l) as f64 } else { 0.0 });
    }
}

impl CustomOp3 for PagedAttention {
    fn name(&self) -> &'static str {
        "paged-attention"
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
        let (t, dims, rows) = self.dims(l1, l2, l3)?;
        let (heads, d) = (dims.0, dims.3);
        let table = crate::cpu::twin_vec::<u32>(&self.rows.table)?;
        let qrow = crate::cpu::twin_vec::<u32>(&self.rows.qrow)?;
        let qlen = crate::cpu::twin_vec::<u32>(&self.rows.qlen)?;
        let meta = (&table[..], &qrow[..], &qlen[..]);
        macro_rules! go {
            ($($v:ident),*) => {
                match (s1, s2, s3) {
                    $((CpuStorage::$v(_), CpuStorage::$v(_), CpuStorage::$v(_)) => {
                        CpuStorage::$v(twin(
                            crate::cpu::slice_of(s1, l1)?,
                            crate::cpu::slice_of(s2, l2)?,
                            crate::cpu::slice_of(s3, l3)?,
                            meta,
                            dims,
                            rows,
                            self.scale,
                        )?)
                    })*
                    _ => candle_core::bail!("paged attention: operands differ in dtype"),
                }
            };
        }
        let out = go!(BF16, F16, F32, F64);
        Ok((out, Shape::from((t, heads, d))))
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
        let (t, dims, rows) = self.dims(l1, l2, l3)?;
        cuda::launch(self, (s1, l1), (s2, l2), (s3, l3), t, dims, rows)
    }
}

#[cfg(feature = "cuda")]
mod cuda;

mod check;
pub use check::check_against_gathered;
#[cfg(test)]
pub(crate) use check::decode_fixture;
pub(crate) use check::{per_query_table, step_fixture};

#[cfg(test)]
mod tests;
