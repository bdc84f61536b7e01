//! `dr_grpo`: Dr. GRPO, Liu et al. 2025, "Understanding R1-Zero-Like Training: A Critical
//! Perspective" (arXiv:2503.20783): GRPO without the std division (and without the per-length
//! normalisation, which is the loss aggregation's business, not the advantage's):
//!
//! A_i = r_i − mean(r)
//!
//! verl: `compute_grpo_outcome_advantage` with `norm_adv_by_std_in_grpo = False`. Deliberate
//! difference: a group of one gets 0 (verl: mean 0 ⇒ A = r); an all-equal group exactly 0.

use super::{mean_std, Std};

/// Advantages of one group's outcome rewards (not empty).
pub(super) fn group(r: &[f64]) -> Vec<f64> {
    let (mean, _) = mean_std(r, Std::Population);
    r.iter().map(|x| x - mean).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn centres_on_the_group_mean() {
        // r = (1, 0, 0.5, −1): Σ = 0.5, mean 0.125 ⇒ (0.875, −0.125, 0.375, −1.125).
        assert_eq!(
            group(&[1.0, 0.0, 0.5, -1.0]),
            vec![0.875, -0.125, 0.375, -1.125]
        );
        assert_eq!(group(&[0.7; 4]), vec![0.0; 4]);
        assert_eq!(group(&[2.0]), vec![0.0]);
    }
}
