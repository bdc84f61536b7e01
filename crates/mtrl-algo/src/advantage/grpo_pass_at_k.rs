//! `grpo_pass_at_k` (service name `grpo_passk`): advantages that optimise pass@k instead of
//! pass@1. Two variants ([`PassAtKReward`]):
//!
//! **Binary** (success = r > threshold): the analytical form of Chen et al. 2025, "Pass@k
//! Training for Adaptively Balancing Exploration and Exploitation of Large Reasoning Models"
//! (arXiv:2508.10751). With n samples of which c succeed, the group's pass@k (the probability
//! that a random k-subset holds a success) and its std are
//!
//! ρ = 1 − C(n − c, k) / C(n, k),  σ = √(ρ (1 − ρ))
//!
//! and a success gets A⁺ = (1 − ρ) / (σ + 1e-6), a failure
//! A⁻ = (1 − ρ − C(n − c − 1, k − 1) / C(n − 1, k − 1)) / (σ + 1e-6) (the k-subsets holding it
//! that hold no success score 0). c = 0 or c = n gives 0. k = 1 is GRPO with the population std
//! on binary rewards. Needs 1 ≤ k ≤ n. verl has no binary pass@k estimator.
//!
//! **Continuous** (k acts): the same construction on real-valued rewards (nDCG), with the
//! group reward of a k-subset its *max*. Sort the n rewards ascending, r₍₁₎ ≤ … ≤ r₍ₙ₎. A
//! random k-subset has max r₍ᵢ₎ with probability C(i − 1, k − 1)/C(n, k), so its mean and
//! variance are R̄ = Σᵢ r₍ᵢ₎ C(i − 1, k − 1)/C(n, k) and σ² = Σᵢ r₍ᵢ₎² C(i − 1, k − 1)/C(n, k) − R̄².
//! Sample (i) gets A = (Eᵢ − R̄)/(σ + 1e-6), Eᵢ the mean max of the k-subsets holding it:
//! Eᵢ = [r₍ᵢ₎ C(i − 1, k − 1) + Σ_{j > i} r₍ⱼ₎ C(j − 2, k − 2)] / C(n − 1, k − 1). On 0/1 rewards
//! this is exactly the binary closed form above, and k = 1 is GRPO (population std): a sample
//! that can never be the max of its k-subset (the k − 1 lowest) gets the same, lowest, value.
//!
//! **Best only**: verl's `compute_grpo_passk_outcome_advantage` (which cites Tang et al. 2025,
//! "Optimizing Language Models for Inference Time Objectives using Reinforcement Learning",
//! arXiv:2503.19595): only the group's best sample gets r_max − r_second (the first of tied bests
//! gets their gap, 0), every other sample 0 — the leave-one-out gradient of the group's max
//! reward, i.e. max@k with k = n. Like verl it has no k: k is not used (nor range-checked) by
//! this variant. verl divides the gap by `torch.std(rewards) + 1e-6` when
//! `norm_adv_by_std_in_grpo` (its default, true): `norm_by_std: true` does the same (unbiased
//! std); `false` is this crate's historical behaviour. verl raises on a group of one; here it
//! gets 0 (there is no second sample, so no gap).

use serde::{Deserialize, Serialize};

use super::{mean_std, Std, EPS};
use crate::error::{AlgoError, Result};

/// How `grpo_pass_at_k` reads rewards.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum PassAtKReward {
    /// success = reward > threshold, analytical pass@k advantage.
    Binary { threshold: f64 },
    /// Real-valued rewards, the k-subset's reward its max (k acts).
    Continuous,
    /// Only the best sample gets r_max − r_second, divided by the group's unbiased std + 1e-6
    /// when `norm_by_std` (verl's default); k is not used.
    BestOnly { norm_by_std: bool },
}

/// Advantages of group `g`'s outcome rewards (not empty).
pub(super) fn group(g: usize, r: &[f64], k: usize, reward: PassAtKReward) -> Result<Vec<f64>> {
    match reward {
        PassAtKReward::Binary { threshold } => binary(g, r, k, threshold),
        PassAtKReward::Continuous => max_of_k(g, r, k),
        PassAtKReward::BestOnly { norm_by_std } => Ok(best_only(r, norm_by_std)),
    }
}

fn max_of_k(g: usize, r: &[f64], k: usize) -> Result<Vec<f64>> {
    let n = r.len();
    if k < 1 || k > n {
        return Err(AlgoError::Invalid(format!(
            "pass@k needs 1 <= k <= group size, got k = {k} for group {g} of {n}"
        )));
    }
    if r.iter().all(|x| *x == r[0]) {
        return Ok(vec![0.0; n]);
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|a, b| r[*a].total_cmp(&r[*b]));
    let sorted: Vec<f64> = order.iter().map(|&i| r[i]).collect();
    let (ni, ki) = (n as i64, k as i64);
    let (total, others) = (binom(ni, ki), binom(ni - 1, ki - 1));
    // P(max = r₍ᵢ₎) with 1-based i = pos + 1.
    let p: Vec<f64> = (0..n)
        .map(|pos| binom(pos as i64, ki - 1) / total)
        .collect();
    let mean: f64 = sorted.iter().zip(&p).map(|(x, p)| x * p).sum();
    let var: f64 = sorted.iter().zip(&p).map(|(x, p)| x * x * p).sum::<f64>() - mean * mean;
    let sigma = var.max(0.0).sqrt();
    // tail[pos] = Σ_{j > pos} r₍ⱼ₎ C(j − 2, k − 2), j 1-based = q + 1.
    let mut tail = vec![0.0; n + 1];
    for q in (0..n).rev() {
        tail[q] = tail[q + 1] + sorted[q] * binom(q as i64 - 1, ki - 2);
    }
    let mut out = vec![0.0; n];
    for (pos, &i) in order.iter().enumerate() {
        let e = (sorted[pos] * binom(pos as i64, ki - 1) + tail[pos + 1]) / others;
        out[i] = (e - mean) / (sigma + EPS);
    }
    Ok(out)
}

/// C(n, k) as f64, 0 when k < 0 or k > n.
fn binom(n: i64, k: i64) -> f64 {
    if k < 0 || k > n || n < 0 {
        return 0.0;
    }
    let k = k.min(n - k);
    (0..k).fold(1.0, |acc, i| acc * (n - i) as f64 / (i + 1) as f64)
}

fn binary(g: usize, r: &[f64], k: usize, threshold: f64) -> Result<Vec<f64>> {
    let n = r.len();
    if k < 1 || k > n {
        return Err(AlgoError::Invalid(format!(
            "pass@k needs 1 <= k <= group size, got k = {k} for group {g} of {n}"
        )));
    }
    let (n, k) = (n as i64, k as i64);
    let c = r.iter().filter(|x| **x > threshold).count() as i64;
    if c == 0 || c == n {
        return Ok(vec![0.0; n as usize]);
    }
    let rho = 1.0 - binom(n - c, k) / binom(n, k);
    let sigma = (rho * (1.0 - rho)).sqrt();
    let a_pos = (1.0 - rho) / (sigma + EPS);
    let a_neg = (1.0 - rho - binom(n - c - 1, k - 1) / binom(n - 1, k - 1)) / (sigma + EPS);
    Ok(r.iter()
        .map(|x| if *x > threshold { a_pos } else { a_neg })
        .collect())
}

fn best_only(r: &[f64], norm_by_std: bool) -> Vec<f64> {
    let mut out = vec![0.0; r.len()];
    if r.len() < 2 {
        return out;
    }
    let best = (1..r.len()).fold(0, |b, i| if r[i] > r[b] { i } else { b });
    let second = (0..r.len())
        .filter(|&i| i != best)
        .map(|i| r[i])
        .fold(f64::NEG_INFINITY, f64::max);
    let mut gap = r[best] - second;
    if norm_by_std {
        gap /= mean_std(r, Std::Unbiased).1 + EPS;
    }
    out[best] = gap;
    out
}

#[cfg(test)]
mod tests {
    use super::super::grpo;
    use super::*;

    const BIN: PassAtKReward = PassAtKReward::Binary { threshold: 0.5 };

    #[test]
    fn binomials() {
        assert_eq!(binom(4, 2), 6.0);
        assert_eq!(binom(3, 0), 1.0);
        assert_eq!(binom(2, 3), 0.0);
        assert_eq!(binom(2, -1), 0.0);
    }

    #[test]
    fn binary_closed_form() {
        // n = 4, c = 1, k = 2: ρ = 1 − C(3,2)/C(4,2) = 1 − 3/6 = 0.5, σ = √(0.25) = 0.5;
        // A⁺ = 0.5/(0.5 + 1e-6) ≈ 1; A⁻ = (0.5 − C(2,1)/C(3,1))/(0.5 + 1e-6) = (0.5 − 2/3)/0.5
        // ≈ −1/3.
        let a = group(0, &[0.0, 1.0, 0.0, 0.2], 2, BIN).unwrap();
        let (p, q) = (0.5 / (0.5 + 1e-6), (0.5 - 2.0 / 3.0) / (0.5 + 1e-6));
        assert_eq!(a, vec![q, p, q, q]);
        assert!((p - 1.0).abs() < 1e-5 && (q + 1.0 / 3.0).abs() < 1e-5);
        // All fail / all succeed: 0.
        assert_eq!(group(0, &[0.0; 3], 2, BIN).unwrap(), vec![0.0; 3]);
        assert_eq!(group(0, &[1.0; 3], 3, BIN).unwrap(), vec![0.0; 3]);
    }

    #[test]
    fn k_one_is_grpo_on_binary_rewards() {
        // k = 1: ρ = 1 − (n − c)/n = c/n = p, σ = √(p(1 − p)) the population std of 0/1
        // rewards, A⁺ = (1 − p)/σ, A⁻ = (1 − p − 1)/σ = −p/σ: GRPO's (r − p)/σ.
        let r = [1.0, 0.0, 0.0, 0.0, 1.0];
        let a = group(0, &r, 1, BIN).unwrap();
        for (x, y) in a.iter().zip(grpo::group(&r, Std::Population)) {
            assert!((x - y).abs() < 1e-12, "{a:?}");
        }
    }

    #[test]
    fn k_out_of_range() {
        let e = group(2, &[1.0, 0.0], 5, BIN).unwrap_err().to_string();
        assert!(e.contains("k = 5 for group 2 of 2"), "{e}");
        assert!(group(0, &[1.0, 0.0], 0, BIN).is_err());
    }

    #[test]
    fn continuous_is_the_expected_max_of_k() {
        // r = (0.2, 0.9, 0.5, 0), k = 2: the six pairs have maxes .2 .5 .9 .5 .9 .9, so
        // R̄ = 3.9/6 = 0.65 and σ² = (.04 + .25 + .81 + .25 + .81 + .81)/6 − 0.65² = 0.0725.
        // Pairs holding 0: maxes .2 .5 .9 → E = 1.6/3; holding .2: .2 .5 .9 → 1.6/3;
        // holding .5: .5 .5 .9 → 1.9/3; holding .9: 0.9.
        let a = group(0, &[0.2, 0.9, 0.5, 0.0], 2, PassAtKReward::Continuous).unwrap();
        let s = 0.0725f64.sqrt() + 1e-6;
        let want = [1.6 / 3.0, 0.9, 1.9 / 3.0, 1.6 / 3.0].map(|e: f64| (e - 0.65) / s);
        for (x, y) in a.iter().zip(want) {
            assert!((x - y).abs() < 1e-9, "{a:?} vs {want:?}");
        }
        // k changes the advantages (k = 1 is GRPO with the population std).
        let k1 = group(0, &[0.2, 0.9, 0.5, 0.0], 1, PassAtKReward::Continuous).unwrap();
        for (x, y) in k1
            .iter()
            .zip(grpo::group(&[0.2, 0.9, 0.5, 0.0], Std::Population))
        {
            assert!((x - y).abs() < 1e-9, "{k1:?}");
        }
        // On 0/1 rewards it is the binary closed form.
        for k in 1..=4 {
            let r = [0.0, 1.0, 0.0, 1.0, 0.0];
            let c = group(0, &r, k, PassAtKReward::Continuous).unwrap();
            let b = group(0, &r, k, BIN).unwrap();
            for (x, y) in c.iter().zip(&b) {
                assert!((x - y).abs() < 1e-9, "k = {k}: {c:?} vs {b:?}");
            }
        }
        assert_eq!(
            group(0, &[0.3; 4], 2, PassAtKReward::Continuous).unwrap(),
            vec![0.0; 4]
        );
        assert!(group(0, &[0.3, 0.1], 3, PassAtKReward::Continuous).is_err());
    }

    #[test]
    fn best_only_rewards_only_the_best() {
        let raw = PassAtKReward::BestOnly { norm_by_std: false };
        // Best 0.9, second 0.5 ⇒ 0.9 − 0.5 at index 1, 0 elsewhere; k is not used.
        let a = group(0, &[0.2, 0.9, 0.5, -1.0], 2, raw).unwrap();
        assert_eq!(a, vec![0.0, 0.9 - 0.5, 0.0, 0.0]);
        // A tie for the best gives no signal; a group of one neither.
        assert_eq!(group(0, &[0.7, 0.7, 0.1], 2, raw).unwrap(), vec![0.0; 3]);
        assert_eq!(group(0, &[0.7], 9, raw).unwrap(), vec![0.0]);
        // verl's normalisation: r = (0, 2, 1), gap 2 − 1 = 1, mean 1, unbiased std
        // √((1 + 1 + 0)/2) = 1 ⇒ 1/(1 + 1e-6) at index 1.
        let norm = PassAtKReward::BestOnly { norm_by_std: true };
        let a = group(0, &[0.0, 2.0, 1.0], 2, norm).unwrap();
        assert_eq!(a, vec![0.0, 1.0 / (1.0 + 1e-6), 0.0]);
    }
}
