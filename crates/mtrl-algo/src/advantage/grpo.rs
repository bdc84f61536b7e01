//! `grpo` (service name `group_based`): GRPO, Shao et al. 2024, "DeepSeekMath: Pushing the
//! Limits of Mathematical Reasoning in Open Language Models" (arXiv:2402.03300), §4.1.2 outcome
//! supervision. Over the outcome rewards r of one group:
//!
//! A_i = (r_i − mean(r)) / (std(r) + 1e-6)
//!
//! verl: `compute_grpo_outcome_advantage` with `norm_adv_by_std_in_grpo = True`, whose
//! `torch.std` is [`Std::Unbiased`]; [`Std::Population`] is this crate's historical convention.
//! Deliberate differences: a group of one gets 0 (verl sets mean 0, std 1 for it, i.e.
//! A = r / (1 + 1e-6): the raw reward, with no baseline); an all-equal group gets exactly 0.

use super::{mean_std, Std, EPS};

/// Advantages of one group's outcome rewards (not empty).
pub(super) fn group(r: &[f64], std: Std) -> Vec<f64> {
    let (mean, sd) = mean_std(r, std);
    r.iter().map(|x| (x - mean) / (sd + EPS)).collect()
}

#[cfg(test)]
mod tests {
    use super::super::{batch_advantages, Advantage, Sample};
    use super::*;

    #[test]
    fn both_std_conventions() {
        // r = (0, 1, 2): mean 1, Σ(r − 1)² = 2; unbiased std √(2/2) = 1, population √(2/3).
        let r = [0.0, 1.0, 2.0];
        let e = 1.0 + 1e-6;
        assert_eq!(group(&r, Std::Unbiased), vec![-1.0 / e, 0.0, 1.0 / e]);
        let p = (2.0f64 / 3.0).sqrt() + 1e-6;
        assert_eq!(group(&r, Std::Population), vec![-1.0 / p, 0.0, 1.0 / p]);
    }

    #[test]
    fn unbiased_on_binary_rewards() {
        // r = (1, 0, 0, 1): mean 0.5, Σ(r − 0.5)² = 1, unbiased std √(1/3) ≈ 0.57735
        // ⇒ A = ±0.5 / (0.57735 + 1e-6) ≈ ±0.866024.
        let a = group(&[1.0, 0.0, 0.0, 1.0], Std::Unbiased);
        let want = 0.5 / ((1.0f64 / 3.0).sqrt() + 1e-6);
        assert_eq!(a, vec![want, -want, -want, want]);
        assert!((want - 0.866024).abs() < 1e-6);
    }

    #[test]
    fn degenerate_groups_give_exactly_zero() {
        // 0.1 + 0.1 + 0.1 = 0.30000000000000004, so a computed mean would not be 0.1.
        for std in [Std::Unbiased, Std::Population] {
            assert_eq!(group(&[0.1; 3], std), vec![0.0; 3]);
            assert_eq!(group(&[3.0], std), vec![0.0]);
        }
    }

    #[test]
    fn multi_turn_samples_use_their_outcome() {
        // Outcomes 0.5 + 0.5 = 1 and 0: mean 0.5, unbiased std √0.5 ≈ 0.7071 ⇒ ±0.5/(√0.5 + 1e-6)
        // on every turn.
        let g = vec![
            Sample {
                turn_rewards: vec![0.5, 0.5],
                turn_tokens: vec![3, 4],
            },
            Sample::outcome(0.0, 9),
        ];
        let a = batch_advantages(Advantage::GrpoUnbiased, &[g]).unwrap();
        let w = 0.5 / (0.5f64.sqrt() + 1e-6);
        assert_eq!(a, vec![vec![vec![w, w], vec![-w]]]);
    }
}
