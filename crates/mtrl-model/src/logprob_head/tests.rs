//! The log-prob head's passes (their CPU twin; the kernels on a GPU through `mtrl selftest`)
//! against the candle spelling they replace, in f64, f32 and bf16, at two temperatures.

use candle_core::{DType, Device, Tensor, D};

use super::{dlogits, lse_pick_entropy};

const N: usize = 5;
const V: usize = 300;

fn logits(dtype: DType) -> Tensor {
    let v: Vec<f32> = (0..N * V)
        .map(|i| (((i * 7919) % 1009) as f32 / 1009.0 - 0.5) * 12.0)
        .collect();
    Tensor::from_vec(v, (N, V), &Device::Cpu)
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
}

fn max_abs(a: &Tensor, b: &Tensor) -> f32 {
    (a.to_dtype(DType::F32).unwrap() - b.to_dtype(DType::F32).unwrap())
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

fn check(dtype: DType, temperature: f64, tol: f32) {
    let z = logits(dtype);
    let targets: Vec<u32> = (0..N as u32).map(|r| (r * 61 + 7) % V as u32).collect();
    let tg = Tensor::from_slice(&targets, N, &Device::Cpu).unwrap();
    let inv_t = (1.0 / temperature) as f32;
    let got = lse_pick_entropy(&z, &tg, inv_t).unwrap();
    // The spelling: f32 log-softmax of z / T, gathered, and −Σ p · log p.
    let y = (z.to_dtype(DType::F32).unwrap() / temperature).unwrap();
    let lsm = candle_nn::ops::log_softmax(&y, D::Minus1).unwrap();
    let picked = lsm
        .gather(&tg.unsqueeze(1).unwrap(), 1)
        .unwrap()
        .squeeze(1)
        .unwrap();
    let ent = (lsm.exp().unwrap() * &lsm)
        .unwrap()
        .sum(1)
        .unwrap()
        .neg()
        .unwrap();
    let lse = (&y - &lsm)
        .unwrap()
        .narrow(1, 0, 1)
        .unwrap()
        .squeeze(1)
        .unwrap();
    for (i, (what, want)) in [("lse", &lse), ("picked", &picked), ("entropy", &ent)]
        .into_iter()
        .enumerate()
    {
        let d = max_abs(&got.narrow(1, i, 1).unwrap().squeeze(1).unwrap(), want);
        assert!(d < tol, "{dtype:?} T={temperature}: {what} differs by {d}");
    }
    // dz = g (onehot − p) / T.
    let g: Vec<f32> = (0..N).map(|r| 0.5 - r as f32 * 0.3).collect();
    let gt = Tensor::from_slice(&g, N, &Device::Cpu).unwrap();
    let lse_got = got.narrow(1, 0, 1).unwrap().squeeze(1).unwrap();
    let dz = dlogits(&z, &lse_got, &tg, &gt, inv_t).unwrap();
    assert_eq!(dz.dtype(), dtype);
    let gcol = (gt.unsqueeze(1).unwrap() / temperature).unwrap();
    let want = lsm
        .exp()
        .unwrap()
        .broadcast_mul(&gcol.neg().unwrap())
        .unwrap()
        .scatter_add(&tg.unsqueeze(1).unwrap(), &gcol, 1)
        .unwrap();
    let d = max_abs(&dz, &want);
    assert!(d < tol, "{dtype:?} T={temperature}: dz differs by {d}");
}

#[test]
fn twin_matches_the_candle_spelling_f64() {
    check(DType::F64, 1.0, 1e-5);
    check(DType::F64, 0.7, 1e-5);
}

#[test]
fn twin_matches_the_candle_spelling_f32() {
    check(DType::F32, 1.0, 1e-4);
    check(DType::F32, 0.7, 1e-4);
}

#[test]
fn twin_matches_the_candle_spelling_bf16() {
    // The same bf16 logits; dz is rounded to bf16 (|dz| ≤ 0.5 / 0.7: ulp 2⁻⁸ of that).
    check(DType::BF16, 1.0, 4e-3);
    check(DType::BF16, 0.7, 4e-3);
}

#[test]
fn bad_shapes_are_errors() {
    let z = logits(DType::F32);
    let tg = Tensor::from_slice(&[1u32, 2], 2, &Device::Cpu).unwrap();
    assert!(lse_pick_entropy(&z, &tg, 1.0).is_err());
    let g = Tensor::zeros(N, DType::F32, &Device::Cpu).unwrap();
    let l = Tensor::zeros(N + 1, DType::F32, &Device::Cpu).unwrap();
    let tg = Tensor::zeros(N, DType::U32, &Device::Cpu).unwrap();
    let e = dlogits(&z, &l, &tg, &g, 1.0).unwrap_err().to_string();
    assert!(e.contains("lse"), "{e}");
}

/// `lse_pick_entropy_<dt>` then `dlogits_<dt>` under the emulation on `z` `[n, V]`: `([n, 3],
/// dz as f32)`.
fn emulated<T: candle_core::WithDType>(
    dt: &str,
    z: &[T],
    targets: &[u32],
    g: &[f32],
    inv_t: f32,
) -> (Vec<f32>, Vec<f32>) {
    let (n, vocab) = (targets.len(), z.len() / targets.len());
    let mut out = vec![0f32; 3 * n];
    // SAFETY (both launches): the arguments follow `logprob_head.cu`'s signatures; z holds
    // n · V elements, targets and g n, lse n, out 3n and dz n · V.
    unsafe {
        mtrl_kernels::emu::Launch::new(&format!("lse_pick_entropy_{dt}"))
            .slice(z)
            .slice(targets)
            .slice_mut(&mut out)
            .u32(vocab as u32)
            .f32(inv_t)
            .run(mtrl_kernels::lse_pick_entropy_geometry(n).unwrap())
            .unwrap();
    }
    let lse: Vec<f32> = out.chunks(3).map(|r| r[0]).collect();
    let mut dz = vec![T::zero(); n * vocab];
    unsafe {
        mtrl_kernels::emu::Launch::new(&format!("dlogits_{dt}"))
            .slice(z)
            .slice(&lse)
            .slice(targets)
            .slice(g)
            .slice_mut(&mut dz)
            .u32(vocab as u32)
            .f32(inv_t)
            .run(mtrl_kernels::dlogits_geometry(n, vocab).unwrap())
            .unwrap();
    }
    (out, dz.iter().map(|x| x.to_f64() as f32).collect())
}

/// The CUDA kernels' source, run under the emulation (`mtrl-kernels`' `emu`), against the twin:
/// rows of an odd vocabulary (not a multiple of the block, so threads end unevenly, and spanning
/// several column blocks of `dlogits`), the picked token at the first, last and inner columns,
/// in f32, bf16 and f16, at temperature 0.7. The kernel reduces over 256 threads in f32, the twin
/// walks the row in f64, so they agree to f32 rounding (relative to the largest value), and dz
/// to an ulp of its dtype.
#[test]
fn kernels_under_emulation_equal_the_twin() {
    let (n, vocab) = (4usize, 4_999usize);
    let inv_t = (1.0f64 / 0.7) as f32;
    let targets = [0u32, 4_998, 2_500, 17];
    let g = [1.0f32, -0.5, 0.25, 2.0];
    let z32: Vec<f32> = (0..n * vocab)
        .map(|i| (((i * 7919) % 1009) as f32 / 1009.0 - 0.5) * 12.0)
        .collect();
    fn check<T: candle_core::WithDType>(
        dt: &str,
        z: &[T],
        targets: &[u32],
        g: &[f32],
        inv_t: f32,
        tol: f32,
    ) {
        let (out, dz) = emulated(dt, z, targets, g, inv_t);
        let want_out = super::twin_lpe(z, targets, inv_t as f64);
        let lse: Vec<f32> = want_out.chunks(3).map(|r| r[0]).collect();
        let want_dz: Vec<f32> = super::twin_dz(z, &lse, targets, g, inv_t as f64)
            .iter()
            .map(|x| x.to_f64() as f32)
            .collect();
        let rel = |a: &[f32], b: &[f32]| {
            let scale = b.iter().fold(1e-12f32, |m, x| m.max(x.abs()));
            a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
        };
        let (o, d) = (rel(&out, &want_out), rel(&dz, &want_dz));
        assert!(o < 1e-5 && d < tol, "{dt}: lse/pick/entropy {o}, dz {d}");
    }
    check("f32", &z32, &targets, &g, inv_t, 1e-5);
    let bf: Vec<half::bf16> = z32.iter().map(|&x| half::bf16::from_f32(x)).collect();
    check("bf16", &bf, &targets, &g, inv_t, 1e-2);
    let hf: Vec<half::f16> = z32.iter().map(|&x| half::f16::from_f32(x)).collect();
    check("f16", &hf, &targets, &g, inv_t, 2e-3);
}
