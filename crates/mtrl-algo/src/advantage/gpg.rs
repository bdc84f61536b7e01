//! `gpg`: Group Policy Gradient, Chu et al. 2025, "GPG: A Simple and Strong Reinforcement
//! Learning Baseline for Model Reasoning" (arXiv:2504.02546). Follows verl's
//! `compute_gpg_outcome_advantage` exactly:
//!
//! α = B / max(M, 1),  A_i = α · (r_i − mean_g(r)) / f_norm
//!
//! with B the number of samples in the whole batch, M the number of them whose outcome reward is
//! non-zero (`torch.count_nonzero(scores)`), mean_g the mean of sample i's group and f_norm = 1
//! (verl's default; its trainer never passes another). As in verl a group of one has mean 0, so
//! its sample gets α · r, and the group std verl computes is unused. The paper motivates α as a
//! correction for the samples that carry no gradient; verl counts non-zero *rewards* rather than
//! non-zero advantages, and we follow verl. Samples without turns are not rows of the batch
//! (not in B). Only deviation: an all-equal group (of two or more) gives exactly 0.

use super::{mean_std, Sample, Std};

/// α = B / max(M, 1) over the samples with turns of the whole batch.
pub(super) fn alpha(groups: &[Vec<Sample>]) -> f64 {
    let live = || groups.iter().flatten().filter(|s| s.turns() > 0);
    let b = live().count();
    let m = live().filter(|s| s.reward() != 0.0).count();
    b as f64 / m.max(1) as f64
}

/// Advantages of one group's outcome rewards (not empty) with the batch's α.
pub(super) fn group(r: &[f64], alpha: f64) -> Vec<f64> {
    let mean = if r.len() == 1 {
        0.0
    } else {
        mean_std(r, Std::Population).0
    };
    r.iter().map(|x| alpha * (x - mean)).collect()
}

#[cfg(test)]
mod tests {
    use super::super::{batch_advantages, Advantage};
    use super::*;

    fn groups(r: &[&[f64]]) -> Vec<Vec<Sample>> {
        r.iter()
            .map(|g| g.iter().map(|&x| Sample::outcome(x, 1)).collect())
            .collect()
    }

    #[test]
    fn alpha_counts_nonzero_rewards_over_the_batch() {
        // B = 4 samples, M = 1 non-zero reward ⇒ α = 4. Group (1, 0): mean 0.5 ⇒ 4·(±0.5) = ±2;
        // group (0, 0): 0.
        let g = groups(&[&[1.0, 0.0], &[0.0, 0.0]]);
        assert_eq!(alpha(&g), 4.0);
        let a = batch_advantages(Advantage::Gpg, &g).unwrap();
        assert_eq!(
            a,
            vec![vec![vec![2.0], vec![-2.0]], vec![vec![0.0], vec![0.0]]]
        );
    }

    #[test]
    fn groups_of_one_keep_their_reward_as_in_verl() {
        // B = 3, M = 3 ⇒ α = 1. Group (1, 1): 0; group (0.5) alone: mean 0 ⇒ 1 · 0.5.
        let g = groups(&[&[1.0, 1.0], &[0.5]]);
        let a = batch_advantages(Advantage::Gpg, &g).unwrap();
        assert_eq!(a, vec![vec![vec![0.0], vec![0.0]], vec![vec![0.5]]]);
        // All rewards zero: M clamps to 1 ⇒ α = B = 2, every advantage 0.
        let z = groups(&[&[0.0, 0.0]]);
        assert_eq!(alpha(&z), 2.0);
        // A sample without turns is not a row: B = 2 (not 3), M = 1 ⇒ α = 2.
        let mut e = groups(&[&[1.0, 0.0]]);
        e[0].push(Sample::default());
        assert_eq!(alpha(&e), 2.0);
    }
}
