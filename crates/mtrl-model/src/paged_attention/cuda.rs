//! The CUDA launch of `mtrl-kernels`' `paged_attention.cu`.

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::WrapErr;
use candle_core::{CudaStorage, DType, Layout, Result, Shape};

use super::{Dims, PagedAttention};
use crate::kv_pool::BLOCK;

type Operand<'a> = (&'a CudaStorage, &'a Layout);

pub(super) fn launch(
    op: &PagedAttention,
    (s1, l1): Operand<'_>,
    (s2, l2): Operand<'_>,
    (s3, l3): Operand<'_>,
    t: usize,
    (heads, kv, s_max, d): Dims,
    rows: usize,
) -> Result<(CudaStorage, Shape)> {
    let dev = s1.device().clone();
    let r = &op.rows;
    let (table_st, table_l) = r.table.storage_and_layout();
    let (qrow_st, qrow_l) = r.qrow.storage_and_layout();
    let (qlen_st, qlen_l) = r.qlen.storage_and_layout();
    let n_table = r.table.dims1()?;
    let table =
        crate::device::cuda_view::<u32>(&table_st, table_l, n_table, "paged attention: table")?;
    let qrow = crate::device::cuda_view::<u32>(&qrow_st, qrow_l, t, "paged attention: segments")?;
    let qlen = crate::device::cuda_view::<u32>(&qlen_st, qlen_l, t, "paged attention: lengths")?;
    let (grid_dim, block_dim) =
        mtrl_kernels::paged_attention_geometry(t, heads).map_err(candle_core::Error::msg)?;
    let cfg = LaunchConfig {
        grid_dim,
        block_dim,
        shared_mem_bytes: 0,
    };
    let (h32, kv32, s32, d32, b32) = (
        heads as u32,
        kv as u32,
        s_max as u32,
        d as u32,
        BLOCK as u32,
    );
    let (o1, o2, o3) = (l1.start_offset(), l2.start_offset(), l3.start_offset());
    let (nq, np) = (t * heads * d, rows * d);
    macro_rules! launch {
        ($ty:ty, $func:literal) => {{
            let f = dev.get_or_load_custom_func(
                $func,
                mtrl_kernels::PAGED_ATTENTION_MODULE,
                mtrl_kernels::PAGED_ATTENTION,
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
            b.arg(&table);
            b.arg(&qrow);
            b.arg(&qlen);
            b.arg(&out);
            b.arg(&h32);
            b.arg(&kv32);
            b.arg(&s32);
            b.arg(&d32);
            b.arg(&b32);
            b.arg(&op.scale);
            // SAFETY: shapes checked by `dims`; the kernel reads q, the step's tables and the
            // pools at the rows of the segments' slots (the engine's, written by this or an
            // earlier step, as for the gather it replaces) and writes each (query, head) of
            // `out` once.
            unsafe { b.launch(cfg) }.w()?;
            CudaStorage::wrap_cuda_slice(out, dev.clone())
        }};
    }
    let out = match s1.dtype() {
        DType::BF16 => launch!(half::bf16, "paged_attention_bf16"),
        DType::F16 => launch!(half::f16, "paged_attention_f16"),
        DType::F32 => launch!(f32, "paged_attention_f32"),
        other => candle_core::bail!("paged attention: no kernel for {other:?}"),
    };
    Ok((out, Shape::from((t, heads, d))))
}
