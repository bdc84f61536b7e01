//! Issue 43, defect 2 and item 8: losses stay finite, with finite gradients, under extreme
//! log-probs — a masked position whose current log-prob underflows `exp` while its behaviour
//! log-prob is the padding value 0 (truncated IS used to give 0/0 = NaN there, which masking by
//! multiplication kept, so every update was skipped), and trained positions whose ratio overflows.

use candle_core::{DType, Device, Tensor, Var};
use mtrl_algo::PolicyLoss;
use mtrl_algo::{aggregate, kl_k3, per_token_loss, Aggregation, GlobalCounts, LossInputs};

const LOSSES: [PolicyLoss; 5] = [
    PolicyLoss::Ppo {
        clip_low: 0.2,
        clip_high: 0.28,
        dual_clip: None,
    },
    PolicyLoss::Ppo {
        clip_low: 0.2,
        clip_high: 0.28,
        dual_clip: Some(3.0),
    },
    PolicyLoss::Cispo {
        clip_low: 1.0,
        clip_high: 0.28,
    },
    PolicyLoss::Is { cap: None },
    PolicyLoss::Is { cap: Some(2.0) },
];

/// Loss and gradient of one [2, 4] batch in `dtype`; with `kl`, plus 0.1 × k3 KL to `old`.
fn run(
    loss: PolicyLoss,
    logp: &[f32],
    old: &[f32],
    mask: &[f32],
    dtype: DType,
    kl: bool,
) -> (f64, Vec<f64>) {
    let dev = Device::Cpu;
    let t = |v: &[f32]| {
        Tensor::from_slice(v, (2, 4), &dev)
            .unwrap()
            .to_dtype(dtype)
            .unwrap()
    };
    let lp = Var::from_tensor(&t(logp)).unwrap();
    let (old, mask) = (t(old), t(mask));
    let adv = Tensor::new(&[1.0f32, -1.0], &dev)
        .unwrap()
        .to_dtype(dtype)
        .unwrap();
    let x = LossInputs {
        logp: lp.as_tensor(),
        logp_old: &old,
        behaviour: None,
        advantages: &adv,
        mask: &mask,
    };
    let out = per_token_loss(loss, &x).unwrap();
    let global = GlobalCounts::of_mask(&mask).unwrap();
    let mut l = aggregate(&out.per_token, &mask, Aggregation::TokenMean, global).unwrap();
    if kl {
        let k = kl_k3(lp.as_tensor(), &old).unwrap();
        l = (l + (aggregate(&k, &mask, Aggregation::TokenMean, global).unwrap() * 0.1).unwrap())
            .unwrap();
    }
    let value = l.to_dtype(DType::F64).unwrap().to_scalar::<f64>().unwrap();
    let g = l.backward().unwrap();
    let grad = g
        .get(lp.as_tensor())
        .unwrap()
        .to_dtype(DType::F64)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f64>()
        .unwrap();
    (value, grad)
}

#[test]
fn masked_positions_with_underflowing_ratio_stay_finite() {
    // Row 0: a prompt token (masked, behaviour 0) whose log-prob underflows exp in f32.
    let logp = [-120.0, -0.5, -1.0, -0.2, -300.0, -0.7, -0.1, -2.0];
    let old = [0.0, -0.6, -1.0, -0.3, 0.0, -0.7, -0.2, -1.5];
    let mask = [0.0, 1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0];
    // Without the KL term first: the IS cap's 0/0 alone made every update NaN.
    for kl in [false, true] {
        for dtype in [DType::F32, DType::BF16, DType::F64] {
            for loss in LOSSES {
                let (v, g) = run(loss, &logp, &old, &mask, dtype, kl);
                assert!(v.is_finite(), "{loss:?} {dtype:?} kl {kl}: loss {v}");
                assert!(g.iter().all(|x| x.is_finite()), "{loss:?} {dtype:?}: {g:?}");
                // Masked positions get exactly no gradient.
                assert_eq!((g[0], g[4]), (0.0, 0.0), "{loss:?} {dtype:?} kl {kl}");
            }
        }
    }
}

#[test]
fn trained_positions_with_overflowing_ratio_stay_finite() {
    // Ratios of e^±500 at trained tokens (a sample from a far-off policy): the log-ratio is
    // clamped to ±20 as in verl, the k3 KL to 10.
    let logp = [-0.01, -500.0, -1.0, -0.2, -0.01, -600.0, -0.1, -2.0];
    let old = [-500.0, -0.01, -1.0, -0.3, -700.0, -0.1, -0.2, -1.5];
    let mask = [1.0; 8];
    for dtype in [DType::F32, DType::F64] {
        for loss in LOSSES {
            let (v, g) = run(loss, &logp, &old, &mask, dtype, true);
            assert!(v.is_finite(), "{loss:?} {dtype:?}: loss {v}");
            assert!(g.iter().all(|x| x.is_finite()), "{loss:?} {dtype:?}: {g:?}");
        }
    }
}

#[test]
fn kl_is_clamped_but_exact_in_range() {
    let dev = Device::Cpu;
    let logp = Tensor::new(&[-0.5f64, -1000.0, 0.0], &dev).unwrap();
    let r = Tensor::new(&[-1.0f64, 0.0, -1000.0], &dev).unwrap();
    let v = kl_k3(&logp, &r).unwrap().to_vec1::<f64>().unwrap();
    // d = −0.5: e^−0.5 + 0.5 − 1 = 0.10653065971263342 (exact in range).
    assert!((v[0] - 0.10653065971263342).abs() < 1e-12, "{v:?}");
    assert_eq!(v[1], 10.0, "{v:?}");
    assert!(v[2].is_finite() && v[2] <= 10.0, "{v:?}");
}
