//! `group_based_per_turn`: GRPO's group normalisation applied per turn index to the turn
//! returns. For member i of the group and turn t, with G_{i,t} = Σ_{u ≥ t} r_{i,u} (γ = 1):
//!
//! A_{i,t} = (G_{i,t} − mean_t) / (std_t + 1e-6)
//!
//! where mean_t, std_t are taken over {G_{j,t} : member j has a turn t} under the chosen
//! [`Std`] convention. A turn index that only one member reaches has no peer to compare with;
//! it falls back to the group's pooled statistics over all (member, turn) returns, the
//! normalisation GRPO's process supervision uses over all steps of the group (Shao et al. 2024,
//! "DeepSeekMath", arXiv:2402.03300, §4.1.3). So a lone long trajectory's late turns are judged
//! against every return the group produced, not given a free 0 or a raw return. With one return
//! in the whole group (one member, one turn) the pooled std is 0 and the advantage 0, as `grpo`
//! gives a group of one. All-equal returns at a turn index give exactly 0.
//!
//! verl has no per-turn group estimator (its `compute_grpo_outcome_advantage` is outcome-only);
//! the name is the service's. Token counts play no part (each member counts once per turn).

use super::{mean_std, Sample, Std, EPS};

/// Advantages of one group's samples, per turn.
pub(super) fn group(group: &[Sample], std: Std) -> Vec<Vec<f64>> {
    let returns: Vec<Vec<f64>> = group.iter().map(Sample::returns).collect();
    let pooled: Vec<f64> = returns.iter().flatten().copied().collect();
    if pooled.is_empty() {
        return returns;
    }
    let pooled = mean_std(&pooled, std);
    let turns = returns.iter().map(Vec::len).max().unwrap_or(0);
    let mut out = returns.clone();
    for t in 0..turns {
        let at_t: Vec<f64> = returns.iter().filter_map(|g| g.get(t).copied()).collect();
        let (mean, sd) = if at_t.len() >= 2 {
            mean_std(&at_t, std)
        } else {
            pooled
        };
        for (o, g) in out.iter_mut().zip(&returns) {
            if let Some(x) = g.get(t) {
                o[t] = (x - mean) / (sd + EPS);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::{batch_advantages, Advantage};
    use super::*;

    fn s(r: &[f64]) -> Sample {
        Sample {
            turn_rewards: r.to_vec(),
            turn_tokens: vec![1; r.len()],
        }
    }

    #[test]
    fn per_turn_index_with_pooled_fallback() {
        // Returns: A r = (−1, 1) ⇒ G = (0, 1); B r = (1) ⇒ G = (1); C r = (−1, −2, 5) ⇒
        // G = (2, 3, 5).
        // t = 0 over {0, 1, 2}: mean 1, Σ dev² = 2, unbiased std 1 ⇒ (−1, 0, 1)/(1 + 1e-6).
        // t = 1 over A, C {1, 3}: mean 2, Σ dev² = 2, unbiased std √2 ⇒ ∓1/(√2 + 1e-6).
        // t = 2 only C: pooled {0, 1, 1, 2, 3, 5}: mean 12/6 = 2, Σ dev² = 4+1+1+0+1+9 = 16,
        // unbiased std √(16/5) ⇒ (5 − 2)/(√3.2 + 1e-6) ≈ 1.677051.
        let g = vec![
            s(&[-1.0, 1.0]),
            s(&[1.0]),
            s(&[-1.0, -2.0, 5.0]),
            Sample::default(),
        ];
        let a = group(&g, Std::Unbiased);
        let (e, r2, p) = (1.0 + 1e-6, 2f64.sqrt() + 1e-6, 3.2f64.sqrt() + 1e-6);
        assert_eq!(a[0], vec![-1.0 / e, -1.0 / r2]);
        assert_eq!(a[1], vec![0.0]);
        assert_eq!(a[2], vec![1.0 / e, 1.0 / r2, 3.0 / p]);
        assert!(a[3].is_empty());
        assert!((3.0 / p - 1.677051).abs() < 1e-6);
        // Population std at t = 0: √(2/3).
        let pop = group(&g, Std::Population);
        assert_eq!(pop[0][0], -1.0 / ((2.0f64 / 3.0).sqrt() + 1e-6));
    }

    #[test]
    fn lone_and_equal_returns() {
        // One member, one turn: pooled over a single return ⇒ 0.
        assert_eq!(group(&[s(&[0.7])], Std::Unbiased), vec![vec![0.0]]);
        // One member, two turns G = (1, 1): pooled all equal ⇒ 0.
        assert_eq!(
            group(&[s(&[0.0, 1.0])], Std::Unbiased),
            vec![vec![0.0, 0.0]]
        );
        // Two members with equal returns at every turn ⇒ exactly 0.
        let g = vec![s(&[0.1, 0.1]), s(&[0.1, 0.1])];
        let a = batch_advantages(Advantage::GroupBasedPerTurn { std: Std::Unbiased }, &[g]);
        assert_eq!(a.unwrap(), vec![vec![vec![0.0, 0.0], vec![0.0, 0.0]]]);
    }
}
