//! The three losses on a stale batch, against gradients worked by hand.
//!
//! Two sequences of three tokens, the ratio taken against the sampler's log-probs (the managed
//! service's definition): r = π_θ / π_sampler = [1.5, 1.0, 0.5] with A = +1 and [1.5, 0.5, 1.0]
//! with A = −1; bounds [0.8, 1.2] (ε_low = ε_high = 0.2); token-mean over 6 tokens, so every
//! gradient below is divided by 6. d l / d logp for one token:
//!
//! - PPO: −A·r inside the trust region, 0 where the clipped surrogate is the smaller one —
//!   (A > 0, r = 1.5 > 1.2) and (A < 0, r = 0.5 < 0.8); (A > 0, r = 0.5) and (A < 0, r = 1.5)
//!   are *not* clipped (the unclipped surrogate is already the pessimistic one):
//!   row + → [0, −1, −0.5], row − → [+1.5, 0, +1]; clip fraction 2/6.
//! - CISPO: −A·clip(r, 0.8, 1.2): row + → [−1.2, −1, −0.8], row − → [+1.2, +0.8, +1]; 4 of 6
//!   tokens have their weight clipped.
//! - IS: −A·r: row + → [−1.5, −1, −0.5], row − → [+1.5, +0.5, +1]; with the cap C = 1.2:
//!   row + → [−1.2, −1, −0.5], row − → [+1.2, +0.5, +1], 2 tokens capped.

use candle_core::{Device, Tensor, Var};
use mtrl_algo::{aggregate, per_token_loss, Aggregation, GlobalCounts, LossInputs, PolicyLoss};

fn grad(loss: PolicyLoss) -> (Vec<Vec<f64>>, f64) {
    let dev = &Device::Cpu;
    let sampler = Tensor::new(&[[-1.0f64, -2.0, -0.5], [-0.7, -1.2, -3.0]], dev).unwrap();
    let ratios = [[1.5f64, 1.0, 0.5], [1.5, 0.5, 1.0]];
    let logp: Vec<Vec<f64>> = sampler
        .to_vec2::<f64>()
        .unwrap()
        .iter()
        .zip(ratios)
        .map(|(s, r)| s.iter().zip(r).map(|(s, r)| s + r.ln()).collect())
        .collect();
    let logp = Var::new(logp, dev).unwrap();
    let mask = Tensor::ones((2, 3), candle_core::DType::F64, dev).unwrap();
    let adv = Tensor::new(&[1.0f64, -1.0], dev).unwrap();
    let x = LossInputs {
        logp: logp.as_tensor(),
        logp_old: &sampler,
        behaviour: None,
        advantages: &adv,
        mask: &mask,
    };
    let out = per_token_loss(loss, &x).unwrap();
    let global = GlobalCounts::of_mask(&mask).unwrap();
    let l = aggregate(&out.per_token, &mask, Aggregation::TokenMean, global).unwrap();
    let g = l.backward().unwrap();
    let g = g.get(logp.as_tensor()).unwrap().to_vec2::<f64>().unwrap();
    (g, out.clipped_tokens().unwrap())
}

fn check(got: &[Vec<f64>], want: [[f64; 3]; 2], what: &str) {
    for (b, (g, w)) in got.iter().zip(want).enumerate() {
        for (t, (x, y)) in g.iter().zip(w).enumerate() {
            assert!(
                (x - y / 6.0).abs() < 1e-12,
                "{what}[{b},{t}]: {x} vs {}",
                y / 6.0
            );
        }
    }
}

#[test]
fn ppo_cispo_and_is_differ_on_a_stale_batch() {
    let ppo = PolicyLoss::Ppo {
        clip_low: 0.2,
        clip_high: 0.2,
        dual_clip: None,
    };
    let (g, clipped) = grad(ppo);
    check(&g, [[0.0, -1.0, -0.5], [1.5, 0.0, 1.0]], "ppo");
    assert_eq!(clipped, 2.0);

    let cispo = PolicyLoss::Cispo {
        clip_low: 0.2,
        clip_high: 0.2,
    };
    let (g, clipped) = grad(cispo);
    check(&g, [[-1.2, -1.0, -0.8], [1.2, 0.8, 1.0]], "cispo");
    assert_eq!(clipped, 4.0);

    let (g, clipped) = grad(PolicyLoss::Is { cap: None });
    check(&g, [[-1.5, -1.0, -0.5], [1.5, 0.5, 1.0]], "is");
    assert_eq!(clipped, 0.0);
    let (g, clipped) = grad(PolicyLoss::Is { cap: Some(1.2) });
    check(&g, [[-1.2, -1.0, -0.5], [1.2, 0.5, 1.0]], "is capped");
    assert_eq!(clipped, 2.0);
}

#[test]
fn wide_bounds_make_ppo_the_plain_is_gradient() {
    // With bounds no ratio reaches, PPO's gradient is −A·r·∇logp: the IS gradient.
    let wide = PolicyLoss::Ppo {
        clip_low: 0.99,
        clip_high: 10.0,
        dual_clip: None,
    };
    let (g, clipped) = grad(wide);
    check(&g, [[-1.5, -1.0, -0.5], [1.5, 0.5, 1.0]], "wide ppo");
    assert_eq!(clipped, 0.0);
}
