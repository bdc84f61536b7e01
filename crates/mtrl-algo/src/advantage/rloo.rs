//! `rloo`: REINFORCE Leave-One-Out, Kool et al. 2019, "Buy 4 REINFORCE Samples, Get a Baseline
//! for Free!", and Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style
//! Optimization for Learning from Human Feedback in LLMs" (arXiv:2402.14740). Each sample's
//! baseline is the mean of the other G − 1 rewards:
//!
//! A_i = r_i − (Σ_j r_j − r_i) / (G − 1)  (= G/(G − 1) · (r_i − mean(r)))
//!
//! verl: `compute_rloo_outcome_advantage`, which computes the second form. Deliberate
//! difference: a group of one is an error here (no leave-one-out baseline exists; verl passes
//! the raw reward through), as it always was in this crate; an all-equal group gives exactly 0.

use super::all_equal;
use crate::error::{AlgoError, Result};

/// Advantages of group `g`'s outcome rewards (not empty); token counts unused.
pub(super) fn group(g: usize, r: &[f64], _tokens: &[usize]) -> Result<Vec<f64>> {
    let n = r.len();
    if n < 2 {
        return Err(AlgoError::Invalid(format!(
            "rloo needs a group of at least 2, group {g} has {n}"
        )));
    }
    if all_equal(r) {
        return Ok(vec![0.0; n]);
    }
    let sum: f64 = r.iter().sum();
    Ok(r.iter().map(|x| x - (sum - x) / (n - 1) as f64).collect())
}

#[cfg(test)]
mod tests {
    use super::super::advantages;
    use super::super::Advantage;
    use super::*;

    #[test]
    fn leave_one_out() {
        // r = (1, 0, 0.5, −1), Σ = 0.5: 1 − (−0.5)/3 = 7/6, 0 − 0.5/3 = −1/6,
        // 0.5 − 0/3 = 0.5, −1 − 1.5/3 = −1.5.
        let a = group(0, &[1.0, 0.0, 0.5, -1.0], &[]).unwrap();
        let want = [7.0 / 6.0, -1.0 / 6.0, 0.5, -1.5];
        for (x, y) in a.iter().zip(want) {
            assert!((x - y).abs() < 1e-15, "{a:?}");
        }
        assert_eq!(group(0, &[0.1; 3], &[]).unwrap(), vec![0.0; 3]);
    }

    #[test]
    fn group_of_one_is_an_error() {
        let e = group(3, &[1.0], &[]).unwrap_err().to_string();
        assert!(e.contains("group 3 has 1"), "{e}");
        assert!(advantages(Advantage::Rloo, &[1.0]).is_err());
    }
}
