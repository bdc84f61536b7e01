//! The fused attention op against the matmul spelling it replaces, with left and right padding.

use candle_core::{Device, Tensor, Var, D};

/// The matmul spelling the op replaces.
fn reference(q: &Tensor, k: &Tensor, v: &Tensor, m: &Tensor, scale: f64) -> Tensor {
    let (b, h, t, d) = q.dims4().unwrap();
    let (kv, s) = (k.dim(1).unwrap(), k.dim(2).unwrap());
    let q = q.reshape((b, kv, h / kv * t, d)).unwrap();
    let sc = (q.matmul(&k.t().unwrap()).unwrap() * scale).unwrap();
    let sc = sc
        .reshape((b, kv, h / kv, t, s))
        .unwrap()
        .broadcast_add(&m.unsqueeze(1).unwrap())
        .unwrap()
        .reshape((b, kv, h / kv * t, s))
        .unwrap();
    let mx = sc.max_keepdim(D::Minus1).unwrap().detach();
    let e = sc.broadcast_sub(&mx).unwrap().exp().unwrap();
    let p = e.broadcast_div(&e.sum_keepdim(D::Minus1).unwrap()).unwrap();
    let o = p.matmul(v).unwrap().reshape((b, h, t, d)).unwrap();
    o.transpose(1, 2).unwrap().reshape((b, t, h * d)).unwrap()
}

fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar()
        .unwrap()
}

#[test]
fn matches_matmul_spelling_with_padding() {
    check(21, 8);
}

/// More query rows than one block (`attn::BLOCK`), so blocks with different key spans meet.
#[test]
fn matches_matmul_spelling_across_row_blocks() {
    check(150, 16);
}

fn check(t: usize, d: usize) {
    let dev = Device::Cpu;
    let (b, h, kv) = (3, 4, 2);
    // Sequence 0 left-padded by 5, 1 right-padded after 2t/3, 2 unpadded; causal.
    let valid = |bi: usize, j: usize| match bi {
        0 => j >= 5,
        1 => j < t * 2 / 3,
        _ => true,
    };
    let mut m = vec![0f32; b * t * t];
    for bi in 0..b {
        for i in 0..t {
            for j in 0..t {
                if j > i || !valid(bi, j) {
                    m[(bi * t + i) * t + j] = -1.0e30;
                }
            }
        }
    }
    let m = Tensor::from_vec(m, (b, 1, t, t), &dev).unwrap();
    let q = Var::randn(0f32, 1.0, (b, h, t, d), &dev).unwrap();
    let k = Var::randn(0f32, 1.0, (b, kv, t, d), &dev).unwrap();
    let v = Var::randn(0f32, 1.0, (b, kv, t, d), &dev).unwrap();
    let w = Tensor::randn(0f32, 1.0, (b, t, h * d), &dev).unwrap();
    let scale = 1.0 / (d as f64).sqrt();
    let op = super::attn::MaskedAttention::new(scale as f32, m.clone(), true);
    let got = q.apply_op3(&k, &v, op).unwrap();
    let want = reference(&q, &k, &v, &m, scale);
    assert!(max_diff(&got, &want) < 1e-5);
    let gg = (&got * &w).unwrap().sum_all().unwrap().backward().unwrap();
    let gw = (&want * &w).unwrap().sum_all().unwrap().backward().unwrap();
    for x in [&q, &k, &v] {
        let (a, b) = (gg.get(x).unwrap(), gw.get(x).unwrap());
        assert!(max_diff(a, b) < 1e-4, "grad diff {}", max_diff(a, b));
    }
}
