//! `opo`: On-Policy RL with Optimal reward baseline, Hao et al. 2025, "On-Policy RL with Optimal
//! Reward Baseline" (arXiv:2505.23585). The baseline that minimises the gradient variance, under
//! the paper's approximation that a sequence's score-function norm grows with its length, is the
//! length-weighted mean reward:
//!
//! b = Σ_j len_j r_j / Σ_j len_j,  A_i = r_i − b
//!
//! with len the sample's trained-token count (all turns). verl: `compute_opo_outcome_advantage`
//! (len = `response_mask.sum(-1)`). Deliberate differences: a group of one gets 0 (its own
//! reward is the formula's baseline; verl sets b = 0 ⇒ A = r); a group without any trained token
//! uses the plain mean (verl divides 0 by 0); an all-equal group gives exactly 0.

use super::all_equal;

/// Advantages of one group's outcome rewards `r` (not empty) with token counts `len`.
pub(super) fn group(r: &[f64], len: &[usize]) -> Vec<f64> {
    if all_equal(r) {
        return vec![0.0; r.len()];
    }
    let total: usize = len.iter().sum();
    let b = if total == 0 {
        r.iter().sum::<f64>() / r.len() as f64
    } else {
        r.iter().zip(len).map(|(r, &l)| r * l as f64).sum::<f64>() / total as f64
    };
    r.iter().map(|x| x - b).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn length_weighted_baseline() {
        // r = (1, 0), len = (3, 1): b = (3·1 + 1·0)/4 = 0.75 ⇒ (0.25, −0.75); the plain mean
        // would give ±0.5.
        assert_eq!(group(&[1.0, 0.0], &[3, 1]), vec![0.25, -0.75]);
        // r = (1, 0, 0), len = (1, 2, 1): b = 1/4 ⇒ (0.75, −0.25, −0.25).
        assert_eq!(
            group(&[1.0, 0.0, 0.0], &[1, 2, 1]),
            vec![0.75, -0.25, -0.25]
        );
    }

    #[test]
    fn degenerate_groups() {
        assert_eq!(group(&[0.5], &[7]), vec![0.0]);
        assert_eq!(group(&[0.1; 3], &[1, 2, 3]), vec![0.0; 3]);
        // No trained token: plain mean 0.5.
        assert_eq!(group(&[1.0, 0.0], &[0, 0]), vec![0.5, -0.5]);
    }
}
