//! Decode attention over the paged store, reading it in place: on CUDA `mtrl-kernels`'
//! `paged_decode` (one thread block per head and row, online softmax in f32); its CPU twin below
//! runs the same arithmetic one position after another. Both replace the candle spelling
//! ([`crate::transformer::paged::decode_gathered`]), which first copies every row's keys and
//! values into a padded `[n, kv, max_len, d]` tensor per layer and step — a copy that grows with
//! the context (about 29 GB per step at 2k-token contexts and batch 64 for Qwen3-0.6B,
//! docs/gpu.md).
//!
//! Operands: `q` `[n, heads, 1, d]`; the layer's pool buffers `[rows, d]`; the step's gather
//! index (pool row of each row's positions per KV head, `[n · kv · max_len]`) and lengths `[n]`,
//! as the step uploaded them. Output `[n, 1, heads · d]`.

use candle_core::{CpuStorage, CustomOp3, DType, Layout, Result, Shape, Tensor, WithDType};

use crate::transformer::paged::DecodeTable;

/// Head sizes the kernel takes: multiples of 32 up to 256 (a lane holds at most 8 elements).
pub(crate) fn serves(q: &Tensor, pool: &Tensor) -> bool {
    let d = q.dim(3).unwrap_or(0);
    q.device().is_cuda()
        && matches!(q.dtype(), DType::BF16 | DType::F16 | DType::F32)
        && pool.dtype() == q.dtype()
        && d.is_multiple_of(32)
        && (32..=256).contains(&d)
}

/// `softmax(q·kᵀ/√d)·v` of each row over its positions in the pool (see the module docs), by
/// the kernel on CUDA and the twin elsewhere.
pub(crate) fn attend(
    q: &Tensor,
    k_pool: &Tensor,
    v_pool: &Tensor,
    kv: usize,
    table: &DecodeTable,
) -> Result<Tensor> {
    let (n, heads, one, d) = q.dims4()?;
    if one != 1 || kv == 0 || heads % kv != 0 || table.lens.len() != n {
        candle_core::bail!(
            "paged decode: q {:?} for {} rows and {kv} KV heads",
            q.dims(),
            table.lens.len()
        )
    }
    let (idx, lens) = table.index_and_lens(kv)?;
    let op = PagedDecode {
        idx,
        lens,
        kv,
        s_max: table.max_len,
        scale: 1.0 / (d as f32).sqrt(),
    };
    let out = q.contiguous()?.apply_op3_no_bwd(k_pool, v_pool, &op)?;
    out.reshape((n, 1, heads * d))
}

/// The op: `q.apply_op3_no_bwd(k_pool, v_pool, &PagedDecode { .. })`.
struct PagedDecode {
    /// `[n · kv · s_max]` u32 pool rows.
    idx: Tensor,
    /// `[n]` u32 valid positions.
    lens: Tensor,
    kv: usize,
    s_max: usize,
    scale: f32,
}

impl PagedDecode {
    /// `(n, heads, d, pool rows)`, checking shapes and layouts.
    fn dims(&self, q: &Layout, k: &Layout, v: &Layout) -> Result<(usize, usize, usize, usize)> {
        let (n, heads, _, d) = q.shape().dims4()?;
        let (rows, dk) = k.shape().dims2()?;
        if dk != d || v.shape().dims() != k.shape().dims() {
            candle_core::bail!("paged decode: q {:?}, pools {:?}", q.dims(), k.dims())
        }
        if !(q.is_contiguous() && k.is_contiguous() && v.is_contiguous()) {
            candle_core::bail!("paged decode: operands must be contiguous")
        }
        if self.idx.dims1()? != n * self.kv * self.s_max || self.lens.dims1()? != n {
            candle_core::bail!("paged decode: index or lengths do not match {n} rows")
        }
        Ok((n, heads, d, rows))
    }
}

/// The CPU twin: per (row, head), an online softmax over the row's positions in order, in f32.
#[allow(clippy::too_many_arguments)]
fn twin<T: WithDType>(
    q: &[T],
    k: &[T],
    v: &[T],
    idx: &[u32],
    lens: &[u32],
    (heads, kv, s_max, d): (usize, usize, usize, usize),
    rows: usize,
    scale: f32,
) -> Result<Vec<T>> {
    let n = lens.len();
    let rep = heads / kv;
    let mut out = vec![T::zero(); n * heads * d];
    let (mut acc, mut qs) = (vec![0f32; d], vec![0f32; d]);
    for i in 0..n {
        let len = lens[i] as usize;
        if len > s_max {
            candle_core::bail!("paged decode: row {i} has {len} positions, the table {s_max}")
        }
        for h in 0..heads {
            let g = h / rep;
            let qrow = &q[(i * heads + h) * d..][..d];
            for (x, &y) in qs.iter_mut().zip(qrow) {
                *x = y.to_f64() as f32 * scale;
            }
            acc.fill(0.0);
            let (mut m, mut l) = (f32::NEG_INFINITY, 0f32);
            for &r in &idx[(i * kv + g) * s_max..][..len] {
                let r = r as usize;
                if r >= rows {
                    candle_core::bail!("paged decode: pool row {r} outside {rows}")
                }
                let krow = &k[r * d..][..d];
                let s: f32 = qs
                    .iter()
                    .zip(krow)
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
            let o = &mut out[(i * heads + h) * d..][..d];
            for (y, x) in o.iter_mut().zip(&acc) {
                *y = T::from_f64(if l > 0.0 { (x / l) as f64 } else { 0.0 });
            }
        }
    }
    Ok(out)
}

impl CustomOp3 for PagedDecode {
    fn name(&self) -> &'static str {
        "paged-decode"
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
        let (n, heads, d, rows) = self.dims(l1, l2, l3)?;
        let (idx, lens) = (
            crate::cpu::twin_vec::<u32>(&self.idx)?,
            crate::cpu::twin_vec::<u32>(&self.lens)?,
        );
        let dims = (heads, self.kv, self.s_max, d);
        let (o1, o2, o3) = (l1.start_offset(), l2.start_offset(), l3.start_offset());
        let (nq, np) = (n * heads * d, rows * d);
        macro_rules! go {
            ($($v:ident),*) => {
                match (s1, s2, s3) {
                    $((CpuStorage::$v(q), CpuStorage::$v(k), CpuStorage::$v(v)) => {
                        CpuStorage::$v(twin(
                            &q[o1..o1 + nq],
                            &k[o2..o2 + np],
                            &v[o3..o3 + np],
                            &idx,
                            &lens,
                            dims,
                            rows,
                            self.scale,
                        )?)
                    })*
                    _ => candle_core::bail!("paged decode: operands differ in dtype"),
                }
            };
        }
        let out = go!(BF16, F16, F32, F64);
        Ok((out, Shape::from((n, heads, d))))
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
        use candle_core::backend::BackendStorage;
        use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
        use candle_core::cuda_backend::WrapErr;

        let (n, heads, d, rows) = self.dims(l1, l2, l3)?;
        let dev = s1.device().clone();
        let (idx_st, idx_l) = self.idx.storage_and_layout();
        let (lens_st, lens_l) = self.lens.storage_and_layout();
        let idx = crate::device::cuda_view::<u32>(
            &idx_st,
            idx_l,
            n * self.kv * self.s_max,
            "paged decode: the index",
        )?;
        let lens =
            crate::device::cuda_view::<u32>(&lens_st, lens_l, n, "paged decode: the lengths")?;
        let cfg = LaunchConfig {
            grid_dim: (heads as u32, n as u32, 1),
            block_dim: (mtrl_kernels::PAGED_DECODE_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let (h32, kv32, s32, d32) = (heads as u32, self.kv as u32, self.s_max as u32, d as u32);
        let (o1, o2, o3) = (l1.start_offset(), l2.start_offset(), l3.start_offset());
        let (nq, np) = (n * heads * d, rows * d);
        macro_rules! launch {
            ($ty:ty, $func:literal) => {{
                let f = dev.get_or_load_custom_func(
                    $func,
                    mtrl_kernels::PAGED_DECODE_MODULE,
                    mtrl_kernels::PAGED_DECODE,
                )?;
                let q = s1.as_cuda_slice::<$ty>()?.slice(o1..o1 + nq);
                let k = s2.as_cuda_slice::<$ty>()?.slice(o2..o2 + np);
                let v = s3.as_cuda_slice::<$ty>()?.slice(o3..o3 + np);
                // SAFETY: allocated for `nq` elements and fully written by the kernel below.
                let out = unsafe { dev.alloc::<$ty>(nq) }?;
                let mut b = f.builder();
                b.arg(&q);
                b.arg(&k);
                b.arg(&v);
                b.arg(&idx);
                b.arg(&lens);
                b.arg(&out);
                b.arg(&h32);
                b.arg(&kv32);
                b.arg(&s32);
                b.arg(&d32);
                b.arg(&self.scale);
                // SAFETY: shapes checked by `dims`; the kernel reads q, the pools at the rows of
                // the step's index (in the pool: the engine's slots, as for the gather it
                // replaces) and writes each (row, head) of `out` once.
                unsafe { b.launch(cfg) }.w()?;
                candle_core::CudaStorage::wrap_cuda_slice(out, dev.clone())
            }};
        }
        let out = match s1.dtype() {
            DType::BF16 => launch!(half::bf16, "paged_decode_bf16"),
            DType::F16 => launch!(half::f16, "paged_decode_f16"),
            DType::F32 => launch!(f32, "paged_decode_f32"),
            other => candle_core::bail!("paged decode: no kernel for {other:?}"),
        };
        Ok((out, Shape::from((n, heads, d))))
    }
}

/// A decode step over one layer's paged store on `dev` in `dtype`: rows of `lens` positions
/// (random keys and values) whose blocks interleave with another owner's, their table, and
/// random queries `[rows, heads, 1, d]` (drawn on the CPU, so every device sees the same values).
pub(crate) fn decode_fixture(
    dev: &candle_core::Device,
    dtype: DType,
    (kv, heads, d): (usize, usize, usize),
    lens: &[usize],
) -> crate::Result<(crate::kv_pool::KvPool, DecodeTable, Tensor)> {
    use crate::kv_pool::{KvPool, SeqBlocks};
    use crate::transformer::paged::Segment;

    let rand = |shape: &[usize]| -> Result<Tensor> {
        Tensor::randn(0f32, 1.0, shape, &candle_core::Device::Cpu)?
            .to_dtype(dtype)?
            .to_device(dev)
    };
    let mut pool = KvPool::new(1, kv, d, 4096, dtype, dev)?;
    let mut segs = Vec::new();
    for (i, &len) in lens.iter().enumerate() {
        let mut s = SeqBlocks::default();
        if !pool.reserve(&mut s, len)? {
            return Err(crate::ModelError::InvalidArgument(
                "paged decode fixture: the pool is too small".into(),
            ));
        }
        let slots: Vec<u32> = s.slots(len).collect();
        let (kt, vt) = (rand(&[len * kv, d])?, rand(&[len * kv, d])?);
        pool.write(0, &pool.slot_mapping(&slots)?, &kt, &vt)?;
        segs.push(Segment {
            start: len - 1,
            len: 1,
            slots,
        });
        // Another owner's blocks between this row's and the next's.
        let mut gap = SeqBlocks::default();
        pool.reserve(&mut gap, 3 + i)?;
    }
    let table = DecodeTable::new(&segs, dev);
    let q = rand(&[segs.len(), heads, 1, d])?;
    Ok((pool, table, q))
}

/// The largest difference between [`attend`] (the kernel on a GPU, the twin on the CPU) and the
/// candle spelling it replaces, on `dev` in `dtype`: rows of different lengths (1 to 130
/// positions) whose blocks interleave with another owner's, GQA (4 query heads per KV head),
/// head dim 64 and 128. `mtrl selftest` reports it.
pub fn check_against_gathered(dev: &candle_core::Device, dtype: DType) -> crate::Result<f32> {
    use crate::transformer::backend::Candle;
    use crate::transformer::paged::decode_gathered;

    let mut worst = 0f32;
    for d in [64usize, 128] {
        let kv = 2;
        let (pool, table, q) = decode_fixture(dev, dtype, (kv, 8, d), &[70, 1, 130, 64])?;
        let (kp, vp) = pool.layer(0);
        let got = attend(&q, kp, vp, kv, &table)?;
        let be = Candle {
            differentiable: false,
        };
        let want = decode_gathered(&be, &q, kp, vp, kv, &table)?;
        let diff = (got.to_dtype(DType::F32)? - want.to_dtype(DType::F32)?)?
            .abs()?
            .max_all()?
            .to_scalar::<f32>()?;
        worst = worst.max(diff);
    }
    Ok(worst)
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device, Tensor};

    use crate::kv_pool::KvPool;
    use crate::transformer::paged::DecodeTable;

    /// The twin against the candle spelling it replaces (see [`super::check_against_gathered`]),
    /// in f32, f64 and bf16 (outputs of magnitude ≤ 1, whose bf16 ulp is 2⁻⁸: the two round
    /// differently by a few ulps; a wrong row or head is off by O(1)).
    #[test]
    fn twin_equals_the_gathered_spelling() {
        for (dtype, tol) in [(DType::F32, 1e-5), (DType::F64, 1e-5), (DType::BF16, 5e-2)] {
            let diff = super::check_against_gathered(&Device::Cpu, dtype).unwrap();
            assert!(diff < tol, "{dtype:?}: twin vs candle spelling {diff}");
        }
    }

    #[test]
    fn a_table_that_does_not_match_the_queries_is_an_error() {
        let dev = Device::Cpu;
        let pool = KvPool::new(1, 2, 32, 256, DType::F32, &dev).unwrap();
        let table = DecodeTable::new(&[], &dev);
        let q = Tensor::zeros((1, 4, 1, 32), DType::F32, &dev).unwrap();
        let (kp, vp) = pool.layer(0);
        let e = super::attend(&q, kp, vp, 2, &table).unwrap_err();
        assert!(e.to_string().contains("paged decode"), "{e}");
    }
}
