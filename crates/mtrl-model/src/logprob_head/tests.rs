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
