//! Clipping that acts, on the tiny Qwen3 fixture: a stale batch whose sampler log-probs are the
//! current policy's shifted by known amounts, so every token's ratio r = π_θ / π_sampler is known
//! in advance — e^{0.5} ≈ 1.65, e^{−0.5} ≈ 0.61 or e^{0.05} ≈ 1.05 — and the tokens each loss
//! clips can be counted by hand.
//!
//! With bounds [0.8, 1.2]: PPO clips (A > 0, r = 1.65) and (A < 0, r = 0.61); CISPO clips the
//! weight of every token with r ∉ [0.8, 1.2]; IS clips nothing. The three updates differ; PPO
//! with bounds no ratio reaches is exactly the IS update (the same gradient −A·r·∇logp), and the
//! decoupled-PPO path (proximal ratio, two updates per batch) clips on its second update.

use std::path::PathBuf;

use candle_core::{DType, Device, Tensor};
use mtrl_core::{AlgorithmConfig, Trajectory};
use mtrl_learner::{AdamW, AdamWConfig, Learner, LrSchedule, StepConfig, StepMetrics};
use mtrl_model::{token_logprobs, Policy};

fn policy() -> Policy {
    let dir = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/tiny-qwen3"
    ));
    Policy::load(&dir, DType::F32, &Device::Cpu).unwrap()
}

const SHIFTS: [f32; 3] = [0.5, -0.5, 0.05];

/// (advantage sign, log-ratio of each sampled token) of every trajectory.
type Known = Vec<(f64, Vec<f32>)>;

/// Two groups of three; sampled token k of a trajectory has log-ratio SHIFTS[k % 3].
fn stale_batch(p: &Policy) -> (Vec<Vec<Trajectory>>, Known) {
    let mut groups = Vec::new();
    let mut tokens = Vec::new();
    for g in 0..2u32 {
        let mut group = Vec::new();
        for s in 0..3u32 {
            let prompt: Vec<u32> = (0..6)
                .map(|i| 20 + (g * 31 + s * 7 + i * 3) % 500)
                .collect();
            let sampled: Vec<u32> = (0..6)
                .map(|i| 40 + (g * 17 + s * 11 + i * 5) % 700)
                .collect();
            let ids: Vec<u32> = prompt.iter().chain(&sampled).copied().collect();
            let t = Tensor::new(ids.as_slice(), &Device::Cpu)
                .unwrap()
                .unsqueeze(0)
                .unwrap();
            let lp = token_logprobs(p, &t, None, 1.0, false, 1 << 25)
                .unwrap()
                .logprobs
                .to_vec2::<f32>()
                .unwrap()
                .remove(0);
            // logp of token i is lp[i − 1]; the sampler's = logp − shift.
            let shifts: Vec<f32> = (0..6).map(|k| SHIFTS[k % 3]).collect();
            let behaviour: Vec<f32> = (0..6).map(|k| lp[5 + k] - shifts[k]).collect();
            let mut tr = Trajectory::new(format!("g{g}s{s}"));
            tr.push_context(&prompt);
            tr.prompt_len = prompt.len();
            tr.push_sampled(&sampled, &behaviour, &[3; 6]);
            tr.reward = s as f64; // advantages: grpo over [0, 1, 2] → [−1.22, 0, +1.22]
            group.push(tr);
            tokens.push(((s as f64) - 1.0, shifts));
        }
        groups.push(group);
    }
    (groups, tokens)
}

fn learner(a: AlgorithmConfig) -> Learner {
    let cfg =
        StepConfig::from_algorithm(&a, 1.0, 0.0, 1 << 20, LrSchedule::constant(1e-3), 64).unwrap();
    Learner::new(policy(), None, AdamW::new(AdamWConfig::default()), cfg, 4)
}

fn algo(loss: &str, clip: f64) -> AlgorithmConfig {
    AlgorithmConfig {
        loss: loss.into(),
        clip_low: clip.min(1.0),
        clip_high: clip,
        tis_cap: 0.0,
        max_staleness: 2,
        ..AlgorithmConfig::default()
    }
}

fn weights(l: &Learner) -> Vec<f32> {
    l.policy
        .named_parameters()
        .values()
        .flat_map(|v| {
            v.as_tensor()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
        })
        .collect()
}

fn run(a: AlgorithmConfig) -> (StepMetrics, Vec<f32>) {
    let mut l = learner(a);
    let (groups, _) = stale_batch(&l.policy);
    let m = l.step(&groups).unwrap();
    (m, weights(&l))
}

/// Tokens each loss clips, counted from the known (advantage sign, shift) of every token.
fn hand_counts() -> (f64, f64, f64) {
    let (_, tokens) = stale_batch(&policy());
    let (mut ppo, mut cispo, mut n) = (0.0, 0.0, 0.0);
    for (a, shifts) in tokens {
        for d in shifts {
            let r = (d as f64).exp();
            n += 1.0;
            if (a > 0.0 && r > 1.2) || (a < 0.0 && r < 0.8) {
                ppo += 1.0;
            }
            if !(0.8..=1.2).contains(&r) {
                cispo += 1.0;
            }
        }
    }
    (ppo / n, cispo / n, n)
}

#[test]
fn the_three_losses_differ_on_a_stale_batch_and_clip_what_is_counted_by_hand() {
    let (ppo_frac, cispo_frac, n) = hand_counts();
    assert_eq!(n, 36.0);
    // Per group: 2 tokens (r = 1.65) of the A > 0 sample and 2 (r = 0.61) of the A < 0 one; the
    // middle sample has A = 0 and nothing to clip. 8 of 36.
    assert!((ppo_frac - 8.0 / 36.0).abs() < 1e-12, "{ppo_frac}");
    assert!((cispo_frac - 24.0 / 36.0).abs() < 1e-12, "{cispo_frac}");

    let (ppo, w_ppo) = run(algo("ppo", 0.2));
    let (cispo, w_cispo) = run(algo("cispo", 0.2));
    let (is, w_is) = run(AlgorithmConfig {
        clip_low: 0.2,
        clip_high: 0.28,
        ..algo("is", 0.2)
    });
    assert!(
        (ppo.clip_fraction - ppo_frac).abs() < 1e-12,
        "{}",
        ppo.clip_fraction
    );
    assert!((cispo.clip_fraction - cispo_frac).abs() < 1e-12);
    assert_eq!(is.clip_fraction, 0.0);
    // |r − 1| averaged over the tokens: (e^{0.5} − 1 + 1 − e^{−0.5} + e^{0.05} − 1) / 3.
    let gap = ((0.5f64).exp() - (-0.5f64).exp() + (0.05f64).exp() - 1.0) / 3.0;
    for m in [&ppo, &cispo, &is] {
        assert!(
            (m.sampler_gap - gap).abs() < 1e-5,
            "{} vs {gap}",
            m.sampler_gap
        );
        assert_eq!(m.updates, 1);
    }
    assert_ne!(w_ppo, w_cispo);
    assert_ne!(w_ppo, w_is);
    assert_ne!(w_cispo, w_is);

    // PPO with bounds no ratio reaches is the IS update, bit for bit; the clip changes it.
    let (wide, w_wide) = run(algo("ppo", 10.0));
    assert_eq!(wide.clip_fraction, 0.0);
    assert_eq!(w_wide, w_is);
}

#[test]
fn decoupled_ppo_clips_against_the_proximal_policy_on_its_second_update() {
    let prox = |bound: f64| AlgorithmConfig {
        ratio: "proximal".into(),
        ppo_mini_batches: 2,
        tis_cap: 2.0,
        ..algo("ppo", bound)
    };
    // The first update sees ratio 1 (the proximal policy is the current one); the second one's
    // ratios moved by the first update, by far more than 1e-6.
    let (tight, w_tight) = run(prox(1e-6));
    assert_eq!(tight.updates, 2);
    assert!(
        tight.clip_fraction > 0.0 && tight.clip_fraction <= 0.5,
        "{}",
        tight.clip_fraction
    );
    // The sampler correction min(π_prox / π_sampler, 2) averages the shifted ratios.
    let w = ((0.5f64).exp() + (-0.5f64).exp() + (0.05f64).exp()) / 3.0;
    assert!(
        (tight.behaviour_weight - w).abs() < 1e-5,
        "{}",
        tight.behaviour_weight
    );
    let (loose, w_loose) = run(prox(0.99));
    assert_eq!(loose.clip_fraction, 0.0);
    assert_ne!(w_tight, w_loose);
    // Against the sampler, the same two updates give yet another result.
    let (_, w_sampler) = run(AlgorithmConfig {
        ppo_mini_batches: 2,
        ..algo("ppo", 1e-6)
    });
    assert_ne!(w_sampler, w_tight);
}

/// Issue 43, item 5: `tis_cap = 0` means "no cap" for both its uses — the truncation of
/// `loss = "is"` and the sampler correction of `ratio = "proximal"` — never "no correction".
/// Tokens are shifted by e^{+0.5} = 1.65, e^{−0.5} and e^{0.05}: a cap of 1.2 binds, none does not.
#[test]
fn tis_cap_zero_means_no_cap_under_both_uses() {
    let prox = |cap: f64| AlgorithmConfig {
        ratio: "proximal".into(),
        ppo_mini_batches: 2,
        tis_cap: cap,
        ..algo("ppo", 0.2)
    };
    let untruncated = ((0.5f64).exp() + (-0.5f64).exp() + (0.05f64).exp()) / 3.0;
    let capped = (1.2 + (-0.5f64).exp() + (0.05f64).exp()) / 3.0;
    let (none, w_none) = run(prox(0.0));
    assert!(
        (none.behaviour_weight - untruncated).abs() < 1e-5,
        "tis_cap = 0 under ratio = proximal: weight {} (expected the untruncated {untruncated})",
        none.behaviour_weight
    );
    let (cap, w_cap) = run(prox(1.2));
    assert!(
        (cap.behaviour_weight - capped).abs() < 1e-5,
        "{}",
        cap.behaviour_weight
    );
    assert_ne!(w_none, w_cap);
    // loss = "is": no cap clips nothing; a cap of 1.2 caps the e^{0.5} tokens.
    let is = |c: f64| AlgorithmConfig {
        tis_cap: c,
        ..algo("is", 0.2)
    };
    let (open, w_open) = run(is(0.0));
    let (shut, w_shut) = run(is(1.2));
    assert_eq!(open.clip_fraction, 0.0);
    assert!(shut.clip_fraction > 0.0);
    assert_ne!(w_open, w_shut);
}
