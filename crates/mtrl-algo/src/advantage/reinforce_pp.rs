//! `reinforce_pp` (verl name `reinforce_plus_plus`): REINFORCE++, Hu 2025, "REINFORCE++: A
//! Simple and Efficient Approach for Aligning Large Language Models" (arXiv:2501.03262): no
//! critic and no group baseline; the returns are whitened over the whole batch. verl:
//! `compute_reinforce_plus_plus_outcome_advantage`, i.e. token returns then
//! `verl_F.masked_whiten(returns, response_mask)`.
//!
//! Here a turn's reward sits at its last token, so every token of turn t has the return
//! G_t = Σ_{u ≥ t} r_u (γ = 1) and, as in masked_whiten, every trained token is one element of
//! the statistics: a turn weighs its token count. mean = Σ n·G / N, var = Σ n·(G − mean)² /
//! (N − 1) — masked_var's default `unbiased=True`, followed here — and
//! A_t = (G_t − mean) / √(var + 1e-8). Fewer than 2 trained tokens in the batch is an error, as
//! in verl.
//!
//! Deliberate differences: γ is fixed at 1; verl resets its running return wherever
//! `response_mask` is 0 ("reset after EOS"), which in a multi-turn response also cuts the return
//! at every masked tool-output span, so there an earlier turn never sees a later turn's reward;
//! here the return runs over all later turns (identical for one-turn samples). verl's masked
//! means add 1e-8 to the token count; we divide by the exact count (at least 2), and a batch of
//! equal returns gives exactly 0.

use super::{whiten_tokens, Sample};
use crate::error::Result;

/// Advantages of the whole batch, `[group][sample][turn]`.
pub(super) fn batch(groups: &[Vec<Sample>]) -> Result<Vec<Vec<Vec<f64>>>> {
    let returns = groups
        .iter()
        .map(|g| g.iter().map(Sample::returns).collect())
        .collect();
    whiten_tokens(groups, returns)
}

#[cfg(test)]
mod tests {
    use super::super::{batch_advantages, Advantage};
    use super::*;

    #[test]
    fn returns_whitened_over_the_batch_by_tokens() {
        // Group 0: r = (2, −1), tokens (1, 1) ⇒ G = (1, −1). Group 1: r = (0), 2 tokens ⇒ G = 0.
        // Elements 1, −1, 0, 0: N = 4, mean 0, Σ n dev² = 2, var = 2/3 ⇒ A = (±1/√(2/3 + 1e-8), 0).
        // Weighing the second turn by one token instead would give var = 2/2.
        let g = vec![
            vec![Sample {
                turn_rewards: vec![2.0, -1.0],
                turn_tokens: vec![1, 1],
            }],
            vec![Sample::outcome(0.0, 2), Sample::default()],
        ];
        let a = batch_advantages(Advantage::ReinforcePp, &g).unwrap();
        let k = 1.0 / (2.0f64 / 3.0 + 1e-8).sqrt();
        assert_eq!(a, vec![vec![vec![k, -k]], vec![vec![0.0], vec![]]]);
        assert!((k - 1.224745).abs() < 1e-6);
    }

    #[test]
    fn too_few_tokens_and_equal_returns() {
        let one = vec![vec![Sample::outcome(1.0, 1)]];
        let e = batch_advantages(Advantage::ReinforcePp, &one).unwrap_err();
        assert!(e.to_string().contains("at least 2 trained tokens"));
        let same = vec![vec![Sample::outcome(0.3, 2)], vec![Sample::outcome(0.3, 5)]];
        let a = batch_advantages(Advantage::ReinforcePp, &same).unwrap();
        assert_eq!(a, vec![vec![vec![0.0]], vec![vec![0.0]]]);
    }
}
