//! Advantage estimators over one group of rewards (the G samples of one prompt).
//!
//! - `grpo`: (r − mean) / (std₀ + 1e-6), population std; an all-equal group gives exactly 0.
//! - `dr_grpo`: r − mean (Dr. GRPO drops the std normalisation).
//! - `rloo`: r_i − mean of the other G − 1 rewards.
//! - `grpo_pass_at_k`: Pass@k Training (Chen et al. 2025). Binary rewards (success = r > threshold):
//!   the analytical closed form. Continuous rewards (nDCG): only the group's best sample gets
//!   r_max − r_second (ties for the best give 0), every other sample 0 — the gradient of the
//!   group's max reward.

use serde::{Deserialize, Serialize};

use crate::error::{AlgoError, Result};

/// How `grpo_pass_at_k` reads rewards.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum PassAtKReward {
    /// success = reward > threshold, analytical Pass@k advantage.
    Binary { threshold: f64 },
    /// Only the best sample gets r_max − r_second.
    Continuous,
}

/// An advantage estimator, picked by name in the config.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Advantage {
    Grpo,
    DrGrpo,
    Rloo,
    GrpoPassAtK { k: usize, reward: PassAtKReward },
}

impl Advantage {
    /// `grpo`, `dr_grpo`, `rloo`, `grpo_pass_at_k` (k = 2, binary at 0.5 unless configured).
    pub fn from_name(name: &str) -> Option<Advantage> {
        Some(match name {
            "grpo" => Advantage::Grpo,
            "dr_grpo" => Advantage::DrGrpo,
            "rloo" => Advantage::Rloo,
            "grpo_pass_at_k" => Advantage::GrpoPassAtK {
                k: 2,
                reward: PassAtKReward::Binary { threshold: 0.5 },
            },
            _ => return None,
        })
    }
}

fn mean(r: &[f64]) -> f64 {
    r.iter().sum::<f64>() / r.len() as f64
}

/// C(n, k) as f64, 0 when k < 0 or k > n.
fn binom(n: i64, k: i64) -> f64 {
    if k < 0 || k > n || n < 0 {
        return 0.0;
    }
    let k = k.min(n - k);
    (0..k).fold(1.0, |acc, i| acc * (n - i) as f64 / (i + 1) as f64)
}

/// Advantages of one group, in order.
pub fn advantages(est: Advantage, rewards: &[f64]) -> Result<Vec<f64>> {
    let g = rewards.len();
    if g == 0 {
        return Ok(Vec::new());
    }
    if rewards.iter().any(|r| !r.is_finite()) {
        return Err(AlgoError::Invalid(format!(
            "non-finite reward in group {rewards:?}"
        )));
    }
    let m = mean(rewards);
    Ok(match est {
        Advantage::Grpo => {
            let std = (rewards.iter().map(|r| (r - m).powi(2)).sum::<f64>() / g as f64).sqrt();
            rewards.iter().map(|r| (r - m) / (std + 1e-6)).collect()
        }
        Advantage::DrGrpo => rewards.iter().map(|r| r - m).collect(),
        Advantage::Rloo => {
            if g < 2 {
                return Err(AlgoError::Invalid(
                    "rloo needs a group of at least 2".into(),
                ));
            }
            let sum: f64 = rewards.iter().sum();
            rewards
                .iter()
                .map(|r| r - (sum - r) / (g - 1) as f64)
                .collect()
        }
        Advantage::GrpoPassAtK { k, reward } => match reward {
            PassAtKReward::Binary { threshold } => pass_at_k_binary(rewards, k, threshold)?,
            PassAtKReward::Continuous => {
                let mut sorted = rewards.to_vec();
                sorted.sort_by(|a, b| b.total_cmp(a));
                let (best, second) = (sorted[0], sorted.get(1).copied().unwrap_or(sorted[0]));
                let gap = best - second;
                let mut first_best = true;
                rewards
                    .iter()
                    .map(|&r| {
                        if r == best && first_best && gap > 0.0 {
                            first_best = false;
                            gap
                        } else {
                            0.0
                        }
                    })
                    .collect()
            }
        },
    })
}

fn pass_at_k_binary(rewards: &[f64], k: usize, threshold: f64) -> Result<Vec<f64>> {
    let n = rewards.len() as i64;
    let k = k as i64;
    if k < 1 || k > n {
        return Err(AlgoError::Invalid(format!(
            "pass@k needs 1 <= k <= group size, got k = {k}, n = {n}"
        )));
    }
    let c = rewards.iter().filter(|r| **r > threshold).count() as i64;
    if c == 0 || c == n {
        return Ok(vec![0.0; n as usize]);
    }
    let rho = 1.0 - binom(n - c, k) / binom(n, k);
    let sigma = (rho * (1.0 - rho)).sqrt();
    let a_pos = (1.0 - rho) / (sigma + 1e-6);
    let a_neg = (1.0 - rho - binom(n - c - 1, k - 1) / binom(n - 1, k - 1)) / (sigma + 1e-6);
    Ok(rewards
        .iter()
        .map(|r| if *r > threshold { a_pos } else { a_neg })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binomials() {
        assert_eq!(binom(4, 2), 6.0);
        assert_eq!(binom(3, 0), 1.0);
        assert_eq!(binom(2, 3), 0.0);
        assert_eq!(binom(2, -1), 0.0);
    }

    #[test]
    fn continuous_pass_at_k_rewards_only_the_best() {
        let est = Advantage::GrpoPassAtK {
            k: 2,
            reward: PassAtKReward::Continuous,
        };
        let a = advantages(est, &[0.2, 0.9, 0.5, -1.0]).unwrap();
        assert_eq!(a, vec![0.0, 0.9 - 0.5, 0.0, 0.0]);
        // A tie for the best gives no signal.
        assert_eq!(
            advantages(est, &[0.7, 0.7, 0.1]).unwrap(),
            vec![0.0, 0.0, 0.0]
        );
    }

    #[test]
    fn bad_inputs() {
        assert!(advantages(Advantage::Grpo, &[1.0, f64::NAN]).is_err());
        assert!(advantages(Advantage::Rloo, &[1.0]).is_err());
        let est = Advantage::GrpoPassAtK {
            k: 5,
            reward: PassAtKReward::Binary { threshold: 0.5 },
        };
        assert!(advantages(est, &[1.0, 0.0]).is_err());
        assert!(advantages(Advantage::Grpo, &[]).unwrap().is_empty());
        assert_eq!(Advantage::from_name("rloo"), Some(Advantage::Rloo));
        assert_eq!(Advantage::from_name("ppo"), None);
    }
}
