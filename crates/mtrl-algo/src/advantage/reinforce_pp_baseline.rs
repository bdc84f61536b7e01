//! `reinforce_pp_baseline` (verl name `reinforce_plus_plus_baseline`): REINFORCE++ with a group
//! baseline, Hu 2025, "REINFORCE++" (arXiv:2501.03262). verl:
//! `compute_reinforce_plus_plus_baseline_outcome_advantage`: subtract the group's mean outcome
//! reward, broadcast the result over the sample's tokens, then `masked_whiten` over the whole
//! batch. Every trained token is one element of the whitening, so a sample weighs its token
//! count; the variance is unbiased (masked_var's default), as in verl:
//!
//! c_i = r_i − mean_g(r),  A_i = (c_i − mean) / √(var + 1e-8),
//! mean = Σ n_i c_i / N, var = Σ n_i (c_i − mean)² / (N − 1)
//!
//! Deliberate differences: a group of one is centred on its own reward (c = 0; verl uses mean 0
//! there, c = r); verl's masked means add 1e-8 to the token count, we divide by the exact count;
//! all-equal groups centre to exactly 0. Fewer than 2 trained tokens in the batch is an error,
//! as in verl.

use super::{dr_grpo, per_group, whiten_tokens, Sample};
use crate::error::Result;

/// Advantages of the whole batch, `[group][sample][turn]`.
pub(super) fn batch(groups: &[Vec<Sample>]) -> Result<Vec<Vec<Vec<f64>>>> {
    let centred = per_group(groups, |_, r, _| Ok(dr_grpo::group(r)))?;
    whiten_tokens(groups, centred)
}

#[cfg(test)]
mod tests {
    use super::super::{batch_advantages, Advantage};
    use super::*;

    #[test]
    fn group_centred_then_token_weighted_whitening() {
        // Group 0: outcomes 0.5 + 0.5 = 1 (tokens 1 + 1) and 0 (2 tokens): mean 0.5 ⇒ c = ±0.5.
        // Group 1: 3 and 1 (1 token each): mean 2 ⇒ c = ±1.
        // Tokens: 0.5×2, −0.5×2, 1, −1: N = 6, mean 0, Σ n c² = 0.5 + 0.5 + 1 + 1 = 3,
        // var = 3/5 = 0.6 ⇒ A = c/√(0.6 + 1e-8).
        let g = vec![
            vec![
                Sample {
                    turn_rewards: vec![0.5, 0.5],
                    turn_tokens: vec![1, 1],
                },
                Sample::outcome(0.0, 2),
            ],
            vec![Sample::outcome(3.0, 1), Sample::outcome(1.0, 1)],
        ];
        let a = batch_advantages(Advantage::ReinforcePpBaseline, &g).unwrap();
        let k = 1.0 / (0.6f64 + 1e-8).sqrt();
        let h = 0.5 * k;
        assert_eq!(a, vec![vec![vec![h, h], vec![-h]], vec![vec![k], vec![-k]]]);
    }

    #[test]
    fn groups_of_one_centre_to_zero() {
        // (1) alone ⇒ c = 0; group (1, 0) ⇒ ±0.5, 1 token each: N = 3, mean 0,
        // Σ n c² = 0.5, var = 0.25 ⇒ (0, ±0.5/√(0.25 + 1e-8)).
        let g = vec![
            vec![Sample::outcome(1.0, 1)],
            vec![Sample::outcome(1.0, 1), Sample::outcome(0.0, 1)],
        ];
        let a = batch_advantages(Advantage::ReinforcePpBaseline, &g).unwrap();
        let h = 0.5 / (0.25f64 + 1e-8).sqrt();
        assert_eq!(a, vec![vec![vec![0.0]], vec![vec![h], vec![-h]]]);
    }
}
