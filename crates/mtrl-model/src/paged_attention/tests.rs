//! The twin against the candle spelling, the kernel (under the CUDA emulation, `mtrl-kernels`'
//! `emu`) against the twin, and the errors.

use candle_core::{DType, Device, Tensor, WithDType};

use super::{attend, step_fixture, PagedRows};
use crate::kv_pool::{KvPool, BLOCK};
use crate::transformer::paged::Segment;

/// The twin against the candle spelling it replaces (see [`super::check_against_gathered`]), in
/// f32, f64 and bf16 (outputs of magnitude ≤ 1, whose bf16 ulp is 2⁻⁸: the two round
/// differently by a few ulps; a wrong row, head or causal limit is off by O(1)).
#[test]
fn twin_equals_the_gathered_spelling() {
    for (dtype, tol) in [(DType::F32, 1e-5), (DType::F64, 1e-5), (DType::BF16, 5e-2)] {
        let diff = super::check_against_gathered(&Device::Cpu, dtype).unwrap();
        assert!(diff < tol, "{dtype:?}: twin vs candle spelling {diff}");
    }
}

fn host<T: WithDType>(t: &Tensor) -> Vec<T> {
    t.flatten_all().unwrap().to_vec1::<T>().unwrap()
}

/// `paged_attention_<name>` under the emulation on the operands of [`attend`], as f32.
fn emulated<T: WithDType>(
    name: &str,
    q: &Tensor,
    pool: &KvPool,
    kv: usize,
    rows: &PagedRows,
) -> Vec<f32> {
    let (t, heads, d) = q.dims3().unwrap();
    let (kp, vp) = pool.layer(0);
    let (qs, ks, vs) = (host::<T>(q), host::<T>(kp), host::<T>(vp));
    let (table, qrow, qlen) = (
        host::<u32>(&rows.table),
        host::<u32>(&rows.qrow),
        host::<u32>(&rows.qlen),
    );
    let mut out = vec![T::zero(); t * heads * d];
    let geometry = mtrl_kernels::paged_attention_geometry(t, heads).unwrap();
    // SAFETY: the arguments follow `paged_attention.cu`'s signature; every slice covers what the
    // kernel reads at this geometry (q [t, heads, d], the pools, the tables) and `out` what it
    // writes.
    unsafe {
        mtrl_kernels::emu::Launch::new(name)
            .slice(&qs)
            .slice(&ks)
            .slice(&vs)
            .slice(&table)
            .slice(&qrow)
            .slice(&qlen)
            .slice_mut(&mut out)
            .u32(heads as u32)
            .u32(kv as u32)
            .u32(rows.s_max as u32)
            .u32(d as u32)
            .u32(BLOCK as u32)
            .f32(1.0 / (d as f32).sqrt())
            .run(geometry)
            .unwrap();
    }
    out.iter().map(|x| x.to_f64() as f32).collect()
}

/// The CUDA kernel's source, run under the emulation, against the twin on a mixed step (decode
/// rows and prefill chunks, GQA, head dims 64 and 128) in f32, bf16 and f16. The kernel splits
/// each query's positions over 4 warps and merges their softmax states; the twin walks them in
/// order, so they agree to rounding (f32: 1e-5; bf16/f16: an ulp of outputs ≤ 1).
#[test]
fn kernel_under_emulation_equals_the_twin() {
    let dev = Device::Cpu;
    for d in [64usize, 128] {
        for (dtype, name, tol) in [
            (DType::F32, "paged_attention_f32", 1e-5f32),
            (DType::BF16, "paged_attention_bf16", 1e-2),
            (DType::F16, "paged_attention_f16", 2e-3),
        ] {
            let (kv, heads) = (2, 8);
            let (pool, segs, q) = step_fixture(
                &dev,
                dtype,
                (kv, heads, d),
                &[70, 1, 130],
                &[(0, 4), (62, 3)],
            )
            .unwrap();
            let refs: Vec<&Segment> = segs.iter().collect();
            let rows = PagedRows::new(&refs, &dev).unwrap();
            let (kp, vp) = pool.layer(0);
            let twin: Vec<f32> = host::<f32>(
                &attend(&q, kp, vp, kv, &rows)
                    .unwrap()
                    .to_dtype(DType::F32)
                    .unwrap(),
            );
            let got = match dtype {
                DType::F32 => emulated::<f32>(name, &q, &pool, kv, &rows),
                DType::BF16 => emulated::<half::bf16>(name, &q, &pool, kv, &rows),
                _ => emulated::<half::f16>(name, &q, &pool, kv, &rows),
            };
            assert_eq!(got.len(), twin.len());
            let diff = got
                .iter()
                .zip(&twin)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(diff < tol, "d {d} {dtype:?}: kernel vs twin {diff}");
        }
    }
}

#[test]
fn queries_that_do_not_match_their_rows_are_an_error() {
    let dev = Device::Cpu;
    let pool = KvPool::new(1, 2, 32, 256, DType::F32, &dev).unwrap();
    let rows = PagedRows::new(&[], &dev).unwrap();
    let q = Tensor::zeros((1, 4, 32), DType::F32, &dev).unwrap();
    let (kp, vp) = pool.layer(0);
    let e = attend(&q, kp, vp, 2, &rows).unwrap_err();
    assert!(e.to_string().contains("paged attention"), "{e}");
    // A query that would read past its segment's table.
    let seg = Segment {
        start: 0,
        len: 1,
        slots: vec![0],
    };
    let mut rows = PagedRows::new(&[&seg], &dev).unwrap();
    rows.qlen = Tensor::new(&[2u32], &dev).unwrap();
    let e = attend(&q, kp, vp, 2, &rows).unwrap_err();
    assert!(e.to_string().contains("reads 2 positions"), "{e}");
}
