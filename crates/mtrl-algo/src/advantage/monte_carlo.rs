//! `monte_carlo`: the Monte Carlo return with no baseline, REINFORCE (Williams 1992, "Simple
//! Statistical Gradient-Following Algorithms for Connectionist Reinforcement Learning"; Sutton &
//! Barto 2018, §13.3). The advantage of turn t is its return, γ = 1:
//!
//! A_t = G_t = Σ_{u ≥ t} r_u
//!
//! verl has no estimator of this name; its returns are the reverse cumulative sum of
//! `compute_remax_outcome_advantage` (`returns`, before the baseline is subtracted) and of
//! `compute_reinforce_plus_plus_outcome_advantage` (γ = 1, before whitening).

use super::Sample;

/// Advantages of one sample's turns: its returns.
pub(super) fn sample(s: &Sample) -> Vec<f64> {
    s.returns()
}

#[cfg(test)]
mod tests {
    use super::super::{batch_advantages, Advantage};
    use super::*;

    #[test]
    fn turn_advantage_is_its_return() {
        // r = (0, 0.5, 1): G = (0 + 0.5 + 1, 0.5 + 1, 1) = (1.5, 1.5, 1); no group baseline.
        let g = vec![
            Sample {
                turn_rewards: vec![0.0, 0.5, 1.0],
                turn_tokens: vec![2, 2, 2],
            },
            Sample::outcome(-1.0, 1),
            Sample::default(),
        ];
        let a = batch_advantages(Advantage::MonteCarlo, &[g]).unwrap();
        assert_eq!(a, vec![vec![vec![1.5, 1.5, 1.0], vec![-1.0], vec![]]]);
        assert!(Advantage::MonteCarlo.per_turn());
    }
}
