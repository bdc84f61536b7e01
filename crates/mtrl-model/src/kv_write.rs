//! The paged store's write as one op per layer and buffer: token `i` of `src` (`[t · kv, d]`, the
//! token's `kv` heads in order) goes to the rows of `slots[i]` in the store buffer (`[rows, d]`,
//! [`crate::kv_pool::row_of`]). On CUDA it is `mtrl-kernels`' `kv_write` (one thread block per
//! token over kv · d); on the CPU it is its twin below, a row copy per (token, head). Both are
//! exact copies, so they equal candle's `scatter_set` with a [`crate::kv_pool::write_index`] —
//! the write this replaces, which on CUDA walks the written rows one after another in a single
//! thread block (448 dependent iterations per decode row of Qwen3-0.6B; docs/gpu.md).

use candle_core::{CpuStorage, InplaceOp3, Layout, Result, WithDType};

use crate::kv_pool::{row_of, BLOCK};

/// The op: `store.inplace_op3(&src, &slots, &KvWrite)`.
pub(crate) struct KvWrite;

/// `(tokens, kv heads, head dim)` of a write, checking the operands' shapes and layouts.
fn dims(dst: &Layout, src: &Layout, slots: &Layout) -> Result<(usize, usize, usize)> {
    let (rows, d) = dst.shape().dims2()?;
    let (n, ds) = src.shape().dims2()?;
    let t = slots.shape().dims1()?;
    if ds != d || t == 0 || n % t != 0 || rows % BLOCK != 0 {
        candle_core::bail!(
            "kv-write: store {:?}, source {:?}, slots {:?}",
            dst.shape(),
            src.shape(),
            slots.shape()
        )
    }
    for (what, l) in [("store", dst), ("source", src), ("slots", slots)] {
        if !l.is_contiguous() {
            candle_core::bail!("kv-write: the {what} is not contiguous")
        }
    }
    Ok((t, n / t, d))
}

/// The CPU twin: row copies.
fn copy_rows<T: WithDType>(
    dst: &mut [T],
    src: &[T],
    slots: &[u32],
    kv: usize,
    d: usize,
) -> Result<()> {
    let rows = dst.len() / d.max(1);
    for (i, &s) in slots.iter().enumerate() {
        for h in 0..kv {
            let r = row_of(s, h, kv);
            if r >= rows {
                candle_core::bail!("kv-write: slot {s} is outside the store of {rows} rows")
            }
            dst[r * d..(r + 1) * d].copy_from_slice(&src[(i * kv + h) * d..(i * kv + h + 1) * d]);
        }
    }
    Ok(())
}

impl InplaceOp3 for KvWrite {
    fn name(&self) -> &'static str {
        "kv-write"
    }

    fn cpu_fwd(
        &self,
        dst: &mut CpuStorage,
        dl: &Layout,
        src: &CpuStorage,
        sl: &Layout,
        slots: &CpuStorage,
        il: &Layout,
    ) -> Result<()> {
        let (t, kv, d) = dims(dl, sl, il)?;
        let CpuStorage::U32(slots) = slots else {
            candle_core::bail!("kv-write: slots must be u32")
        };
        let slots = &slots[il.start_offset()..il.start_offset() + t];
        let (o, so, n) = (dl.start_offset(), sl.start_offset(), t * kv * d);
        macro_rules! go {
            ($($v:ident),*) => {
                match (dst, src) {
                    $((CpuStorage::$v(a), CpuStorage::$v(b)) => {
                        let len = dl.shape().elem_count();
                        copy_rows(&mut a[o..o + len], &b[so..so + n], slots, kv, d)
                    })*
                    _ => candle_core::bail!("kv-write: the store and the source differ in dtype"),
                }
            };
        }
        go!(BF16, F16, F32, F64)
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        dst: &mut candle_core::CudaStorage,
        dl: &Layout,
        src: &candle_core::CudaStorage,
        sl: &Layout,
        slots: &candle_core::CudaStorage,
        il: &Layout,
    ) -> Result<()> {
        use candle_core::backend::BackendStorage;
        use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
        use candle_core::cuda_backend::WrapErr;
        use candle_core::DType;

        let (t, kv, d) = dims(dl, sl, il)?;
        let dev = dst.device().clone();
        let ids = slots.as_cuda_slice::<u32>()?;
        let ids = ids.slice(il.start_offset()..il.start_offset() + t);
        let (n, len) = (t * kv * d, dl.shape().elem_count());
        let (o, so) = (dl.start_offset(), sl.start_offset());
        let (grid_dim, block_dim) =
            mtrl_kernels::kv_write_geometry(t, kv * d).map_err(candle_core::Error::msg)?;
        let cfg = LaunchConfig {
            grid_dim,
            block_dim,
            shared_mem_bytes: 0,
        };
        let (kv32, d32, b32) = (kv as u32, d as u32, BLOCK as u32);
        macro_rules! launch {
            ($ty:ty, $func:literal) => {{
                let f = dev.get_or_load_custom_func(
                    $func,
                    mtrl_kernels::KV_WRITE_MODULE,
                    mtrl_kernels::KV_WRITE,
                )?;
                let s = src.as_cuda_slice::<$ty>()?.slice(so..so + n);
                let out = dst.as_cuda_slice_mut::<$ty>()?;
                let mut out = out.slice_mut(o..o + len);
                let mut b = f.builder();
                b.arg(&s);
                b.arg(&mut out);
                b.arg(&ids);
                b.arg(&kv32);
                b.arg(&d32);
                b.arg(&b32);
                // SAFETY: the shapes were checked by `dims`; each thread writes inside `out`
                // (a slot outside the store is the caller's bug, as with `scatter_set`).
                unsafe { b.launch(cfg) }.w()?;
            }};
        }
        match dst.dtype() {
            DType::BF16 => launch!(half::bf16, "kv_write_u16"),
            DType::F16 => launch!(half::f16, "kv_write_u16"),
            DType::F32 => launch!(f32, "kv_write_u32"),
            DType::F64 => launch!(f64, "kv_write_u64"),
            other => candle_core::bail!("kv-write: no kernel for {other:?}"),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::kv_pool::BLOCK;

    /// The CUDA kernel's source, run under the emulation (`mtrl-kernels`' `emu`), leaves the
    /// store its twin leaves, bit for bit: 2- and 4-byte elements, slots out of order across
    /// blocks, a row of fewer than 32 elements per thread block and one of more than 1,024 (the
    /// block's threads then stride).
    #[test]
    fn kernel_under_emulation_equals_the_twin() {
        fn store<T: candle_core::WithDType>(
            name: &str,
            (kv, d): (usize, usize),
            make: impl Fn(usize) -> T,
            bits: impl Fn(&T) -> u64,
        ) {
            let slots: Vec<u32> = vec![130, 0, 64, 1, 255, 63, 200];
            let t = slots.len();
            let rows = 4 * kv * BLOCK;
            let src: Vec<T> = (0..t * kv * d).map(&make).collect();
            let mut twin = vec![T::zero(); rows * d];
            let mut kernel = twin.clone();
            super::copy_rows(&mut twin, &src, &slots, kv, d).unwrap();
            let geometry = mtrl_kernels::kv_write_geometry(t, kv * d).unwrap();
            // SAFETY: the arguments follow `kv_write.cu`'s signature; `src` holds t · kv · d
            // elements and every slot's rows lie inside `kernel` (4 blocks).
            unsafe {
                mtrl_kernels::emu::Launch::new(name)
                    .slice(&src)
                    .slice_mut(&mut kernel)
                    .slice(&slots)
                    .u32(kv as u32)
                    .u32(d as u32)
                    .u32(BLOCK as u32)
                    .run(geometry)
                    .unwrap();
            }
            let same = twin.iter().zip(&kernel).all(|(a, b)| bits(a) == bits(b));
            assert!(same, "{name} kv {kv} d {d}: the stores differ");
        }
        for dims in [(1, 16), (2, 40), (8, 160)] {
            // Arbitrary bit patterns (NaNs included): the copy moves bits, whatever they mean.
            store(
                "kv_write_u16",
                dims,
                |i| half::bf16::from_bits((i * 40_503 % 65_521) as u16),
                |x| x.to_bits() as u64,
            );
            store(
                "kv_write_u32",
                dims,
                |i| f32::from_bits((i as u32).wrapping_mul(2_654_435_761)),
                |x| x.to_bits() as u64,
            );
            store(
                "kv_write_u64",
                dims,
                |i| f64::from_bits((i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)),
                |x| x.to_bits(),
            );
        }
    }
}
