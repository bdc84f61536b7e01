//! The fused attention op (its CPU twin) against causal attention spelled out with candle ops one
//! row at a time: outputs and the gradients of q, k, v, in f64, f32 and bf16, with GQA.

use candle_core::{DType, Device, Tensor, Var, D};

use super::attend;

const LENS: [usize; 4] = [7, 13, 3, 10];
const HEADS: usize = 4;
const KV: usize = 2;
const HD: usize = 8;

fn offsets() -> Vec<usize> {
    let mut o = vec![0];
    for l in LENS {
        o.push(o.last().unwrap() + l);
    }
    o
}

/// Deterministic values in about [-1, 1].
fn values(n: usize, seed: usize) -> Vec<f64> {
    (0..n)
        .map(|i| (((i * 7919 + seed * 104_729) % 2003) as f64 / 1001.5) - 1.0)
        .collect()
}

fn operand(shape: (usize, usize, usize), seed: usize, dtype: DType) -> Var {
    let (a, b, c) = shape;
    let t = Tensor::from_vec(values(a * b * c, seed), shape, &Device::Cpu).unwrap();
    Var::from_tensor(&t.to_dtype(dtype).unwrap()).unwrap()
}

/// Causal attention of each row alone, spelled with candle ops (in f32 for bf16 operands).
fn reference(q: &Tensor, k: &Tensor, v: &Tensor, offs: &[usize]) -> Tensor {
    let dt = q.dtype();
    let (q, k, v) = if dt == DType::BF16 {
        (
            q.to_dtype(DType::F32).unwrap(),
            k.to_dtype(DType::F32).unwrap(),
            v.to_dtype(DType::F32).unwrap(),
        )
    } else {
        (q.clone(), k.clone(), v.clone())
    };
    let mut outs = Vec::new();
    for w in offs.windows(2) {
        let (off, l) = (w[0], w[1] - w[0]);
        // [l, heads, d] → [heads, l, d]; KV heads repeated for their query heads.
        let qr = q.narrow(0, off, l).unwrap().transpose(0, 1).unwrap();
        let rep = |x: &Tensor| {
            x.narrow(0, off, l)
                .unwrap()
                .transpose(0, 1)
                .unwrap()
                .unsqueeze(1)
                .unwrap()
                .repeat((1, HEADS / KV, 1, 1))
                .unwrap()
                .reshape((HEADS, l, HD))
                .unwrap()
        };
        let (kr, vr) = (rep(&k), rep(&v));
        let s = (qr.contiguous().unwrap().matmul(&kr.t().unwrap()).unwrap()
            * (1.0 / (HD as f64).sqrt()))
        .unwrap();
        let mask: Vec<f64> = (0..l * l)
            .map(|i| {
                if i % l > i / l {
                    f64::NEG_INFINITY
                } else {
                    0.0
                }
            })
            .collect();
        let mask = Tensor::from_vec(mask, (l, l), &Device::Cpu)
            .unwrap()
            .to_dtype(s.dtype())
            .unwrap();
        let s = s.broadcast_add(&mask).unwrap();
        let p = candle_nn::ops::softmax(&s, D::Minus1).unwrap();
        let o = p.matmul(&vr.contiguous().unwrap()).unwrap();
        outs.push(o.transpose(0, 1).unwrap());
    }
    Tensor::cat(&outs, 0).unwrap().to_dtype(dt).unwrap()
}

fn max_rel(a: &Tensor, b: &Tensor) -> f64 {
    let a = a.to_dtype(DType::F64).unwrap().flatten_all().unwrap();
    let b = b.to_dtype(DType::F64).unwrap().flatten_all().unwrap();
    let scale = b
        .abs()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar::<f64>()
        .unwrap()
        .max(1e-12);
    let d = (a - b).unwrap().abs().unwrap().max(0).unwrap();
    d.to_scalar::<f64>().unwrap() / scale
}

fn check(dtype: DType, tol: f64) {
    let offs = offsets();
    let t = *offs.last().unwrap();
    let q = operand((t, HEADS, HD), 1, dtype);
    let k = operand((t, KV, HD), 2, dtype);
    let v = operand((t, KV, HD), 3, dtype);
    let cu = Tensor::from_vec(
        offs.iter().map(|&o| o as u32).collect::<Vec<_>>(),
        offs.len(),
        &Device::Cpu,
    )
    .unwrap();
    // A weight per output element, so every element's gradient differs.
    let w = Tensor::from_vec(values(t * HEADS * HD, 4), (t, HEADS, HD), &Device::Cpu)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap();
    let fused = attend(q.as_tensor(), k.as_tensor(), v.as_tensor(), &offs, &cu).unwrap();
    let spelled = reference(q.as_tensor(), k.as_tensor(), v.as_tensor(), &offs);
    let gap = max_rel(&fused, &spelled);
    assert!(gap < tol, "{dtype:?}: outputs differ by {gap:e}");
    let loss = |o: &Tensor| {
        (o.to_dtype(DType::F32).unwrap() * &w)
            .unwrap()
            .sum_all()
            .unwrap()
    };
    let gf = loss(&fused).backward().unwrap();
    let gs = loss(&spelled).backward().unwrap();
    for (name, x) in [("q", &q), ("k", &k), ("v", &v)] {
        let (a, b) = (gf.get(x).unwrap(), gs.get(x).unwrap());
        assert_eq!(a.dims(), x.dims());
        let gap = max_rel(a, b);
        assert!(gap < tol, "{dtype:?}: d{name} differs by {gap:e}");
    }
}

#[test]
fn twin_matches_rows_attended_alone_f64() {
    // Not 1e-12: the log-sum-exp the backward reads is kept in f32, as the kernel keeps it.
    check(DType::F64, 1e-6);
}

#[test]
fn twin_matches_rows_attended_alone_f32() {
    check(DType::F32, 1e-5);
}

#[test]
fn twin_matches_rows_attended_alone_bf16() {
    check(DType::BF16, 2e-2);
}

#[test]
fn a_row_never_sees_another() {
    // Changing row 0's keys and values leaves every other row's output unchanged.
    let offs = offsets();
    let t = *offs.last().unwrap();
    let q = operand((t, HEADS, HD), 1, DType::F64);
    let k = operand((t, KV, HD), 2, DType::F64);
    let v = operand((t, KV, HD), 3, DType::F64);
    let cu = Tensor::from_vec(
        offs.iter().map(|&o| o as u32).collect::<Vec<_>>(),
        offs.len(),
        &Device::Cpu,
    )
    .unwrap();
    let a = attend(q.as_tensor(), k.as_tensor(), v.as_tensor(), &offs, &cu).unwrap();
    let k2 = Tensor::cat(
        &[
            (k.as_tensor().narrow(0, 0, LENS[0]).unwrap() * 3.0).unwrap(),
            k.as_tensor().narrow(0, LENS[0], t - LENS[0]).unwrap(),
        ],
        0,
    )
    .unwrap();
    let b = attend(q.as_tensor(), &k2, v.as_tensor(), &offs, &cu).unwrap();
    let rest = |x: &Tensor| x.narrow(0, LENS[0], t - LENS[0]).unwrap();
    assert_eq!(max_rel(&rest(&a), &rest(&b)), 0.0);
    assert!(
        max_rel(
            &a.narrow(0, 0, LENS[0]).unwrap(),
            &b.narrow(0, 0, LENS[0]).unwrap()
        ) > 1e-3
    );
}

#[test]
fn bad_shapes_are_errors() {
    let q = Tensor::zeros((5, 4, 8), DType::F32, &Device::Cpu).unwrap();
    let k = Tensor::zeros((5, 3, 8), DType::F32, &Device::Cpu).unwrap();
    let cu = Tensor::from_vec(vec![0u32, 5], 2, &Device::Cpu).unwrap();
    let e = attend(&q, &k, &k, &[0, 5], &cu).unwrap_err().to_string();
    assert!(e.contains("fused attention"), "{e}");
    let k = Tensor::zeros((5, 2, 8), DType::F32, &Device::Cpu).unwrap();
    let e = attend(&q, &k, &k, &[0, 4], &cu).unwrap_err().to_string();
    assert!(e.contains("do not cover"), "{e}");
}
