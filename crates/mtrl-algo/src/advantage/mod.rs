//! Advantage estimators, picked by name, over a batch of groups (the G samples of one prompt).
//!
//! A [`Sample`] is one trajectory as the estimators see it: one reward and one trained-token
//! count per model call (turn); its outcome reward is the sum of its turn rewards and its return
//! at turn t is Σ_{u ≥ t} r_u (γ = 1). [`batch_advantages`] gives one advantage per turn:
//!
//! | estimator | names | scope |
//! |---|---|---|
//! | [`grpo`] | `grpo`, `group_based` (default) | outcome, group |
//! | [`dr_grpo`] | `dr_grpo` | outcome, group |
//! | [`rloo`] | `rloo` | outcome, group |
//! | [`opo`] | `opo` | outcome, group (length-weighted) |
//! | [`grpo_pass_at_k`] | `grpo_pass_at_k`, `grpo_passk` | outcome, group |
//! | [`gpg`] | `gpg` | outcome, group + batch (α) |
//! | [`reinforce_pp_baseline`] | `reinforce_pp_baseline`, `reinforce_plus_plus_baseline` | outcome, group + batch |
//! | [`monte_carlo`] | `monte_carlo` | per turn, sample |
//! | [`group_based_per_turn`] | `group_based_per_turn` | per turn, group |
//! | [`reinforce_pp`] | `reinforce_pp`, `reinforce_plus_plus` | per turn, batch |
//!
//! Outcome estimators give every turn of a sample the same value. Conventions shared by all:
//! a sample with no turns gets an empty `Vec` and takes no part in any statistic (it has neither
//! a reward nor a token); a group whose rewards are all equal gets exactly 0 from the
//! mean-centred estimators; statistics are exact f64 (no 1e-8 guards in denominators that are
//! never zero; shared in `stats.rs`). Each estimator module (public for its documentation only;
//! the API is this module's) names the paper and the verl function
//! (`verl/trainer/ppo/core_algos.py`, volcengine/verl at b178a3c) it follows and where it differs.

pub mod dr_grpo;
pub mod gpg;
pub mod group_based_per_turn;
pub mod grpo;
pub mod grpo_pass_at_k;
pub mod monte_carlo;
pub mod opo;
pub mod reinforce_pp;
pub mod reinforce_pp_baseline;
pub mod rloo;
mod stats;

use serde::{Deserialize, Serialize};

use crate::error::{AlgoError, Result};

pub use grpo_pass_at_k::PassAtKReward;
use stats::{all_equal, mean_std, whiten_tokens, EPS};

/// Which standard deviation the std-normalised group estimators use.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Std {
    /// √(Σ (x − mean)² / n): this crate's historical `grpo` (and the default, so existing
    /// configs train as before).
    #[default]
    Population,
    /// √(Σ (x − mean)² / (n − 1)): `torch.std`, what verl uses. A group of one gives std 0.
    Unbiased,
}

/// An advantage estimator. Build it with [`Advantage::from_name`] or the constructors.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Advantage {
    /// GRPO with the population std ([`Std::Population`]).
    Grpo,
    /// GRPO with the unbiased std ([`Std::Unbiased`], as verl).
    GrpoUnbiased,
    DrGrpo,
    Rloo,
    MonteCarlo,
    GroupBasedPerTurn {
        std: Std,
    },
    ReinforcePp,
    ReinforcePpBaseline,
    Opo,
    Gpg,
    GrpoPassAtK {
        k: usize,
        reward: PassAtKReward,
    },
}

/// The parameters [`Advantage::from_name`] may need; nothing is invented for a missing one.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct AdvantageOptions {
    /// Std convention of `grpo` and `group_based_per_turn`.
    pub std: Std,
    /// Pass@k's k (required by `grpo_pass_at_k`).
    pub k: Option<usize>,
    /// Success threshold of binary pass@k (required unless `continuous`).
    pub threshold: Option<f64>,
    /// Pass@k on continuous rewards (the k-subset's reward is its max) instead of binary.
    pub continuous: bool,
    /// verl's variant instead: only the best sample gets r_max − r_second.
    pub best_only: bool,
    /// `best_only` only: divide by the group's unbiased std (verl's default).
    pub norm_by_std: bool,
}

impl Advantage {
    /// Every accepted name: service names and this crate's own (aliases of the same estimator
    /// are adjacent; the first of each is [`Advantage::name`]).
    pub const NAMES: &'static [&'static str] = &[
        "grpo",
        "group_based",
        "dr_grpo",
        "rloo",
        "monte_carlo",
        "group_based_per_turn",
        "reinforce_pp",
        "reinforce_plus_plus",
        "reinforce_pp_baseline",
        "reinforce_plus_plus_baseline",
        "opo",
        "gpg",
        "grpo_pass_at_k",
        "grpo_passk",
    ];

    /// The estimator called `name` (any of [`Advantage::NAMES`]) with the parameters it needs
    /// from `opts`.
    pub fn from_name(name: &str, opts: &AdvantageOptions) -> Result<Advantage> {
        Ok(match name {
            "grpo" | "group_based" => Advantage::grpo(opts.std),
            "dr_grpo" => Advantage::DrGrpo,
            "rloo" => Advantage::Rloo,
            "monte_carlo" => Advantage::MonteCarlo,
            "group_based_per_turn" => Advantage::GroupBasedPerTurn { std: opts.std },
            "reinforce_pp" | "reinforce_plus_plus" => Advantage::ReinforcePp,
            "reinforce_pp_baseline" | "reinforce_plus_plus_baseline" => {
                Advantage::ReinforcePpBaseline
            }
            "opo" => Advantage::Opo,
            "gpg" => Advantage::Gpg,
            "grpo_pass_at_k" | "grpo_passk" => {
                let k = opts.k.ok_or_else(|| {
                    AlgoError::Invalid(format!("advantage `{name}` needs k (pass@k's k)"))
                })?;
                let reward = if opts.best_only {
                    PassAtKReward::BestOnly {
                        norm_by_std: opts.norm_by_std,
                    }
                } else if opts.continuous {
                    PassAtKReward::Continuous
                } else {
                    let threshold = opts.threshold.ok_or_else(|| {
                        AlgoError::Invalid(format!(
                            "advantage `{name}` on binary rewards needs a success threshold"
                        ))
                    })?;
                    PassAtKReward::Binary { threshold }
                };
                Advantage::pass_at_k(k, reward)?
            }
            _ => {
                return Err(AlgoError::Invalid(format!(
                    "unknown advantage estimator `{name}`; expected one of {}",
                    Advantage::NAMES.join(", ")
                )))
            }
        })
    }

    /// GRPO with the given std convention.
    pub fn grpo(std: Std) -> Advantage {
        match std {
            Std::Population => Advantage::Grpo,
            Std::Unbiased => Advantage::GrpoUnbiased,
        }
    }

    /// Pass@k with k ≥ 1 (k ≤ group size is checked per group) and a finite threshold.
    pub fn pass_at_k(k: usize, reward: PassAtKReward) -> Result<Advantage> {
        if k == 0 {
            return Err(AlgoError::Invalid("pass@k needs k >= 1, got 0".into()));
        }
        if let PassAtKReward::Binary { threshold } = reward {
            if !threshold.is_finite() {
                return Err(AlgoError::Invalid(format!(
                    "pass@k threshold must be finite, got {threshold}"
                )));
            }
        }
        Ok(Advantage::GrpoPassAtK { k, reward })
    }

    /// The canonical name (`from_name(a.name(), ..)` gives back the same kind of estimator).
    pub fn name(&self) -> &'static str {
        match self {
            Advantage::Grpo | Advantage::GrpoUnbiased => "grpo",
            Advantage::DrGrpo => "dr_grpo",
            Advantage::Rloo => "rloo",
            Advantage::MonteCarlo => "monte_carlo",
            Advantage::GroupBasedPerTurn { .. } => "group_based_per_turn",
            Advantage::ReinforcePp => "reinforce_pp",
            Advantage::ReinforcePpBaseline => "reinforce_pp_baseline",
            Advantage::Opo => "opo",
            Advantage::Gpg => "gpg",
            Advantage::GrpoPassAtK { .. } => "grpo_pass_at_k",
        }
    }

    /// Whether the turns of one sample can get different advantages.
    pub fn per_turn(&self) -> bool {
        matches!(
            self,
            Advantage::MonteCarlo | Advantage::GroupBasedPerTurn { .. } | Advantage::ReinforcePp
        )
    }
}

/// One trajectory as the estimators see it: a reward and a trained-token count per model call
/// (turn). The outcome reward is the sum of the turn rewards.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    pub turn_rewards: Vec<f64>,
    pub turn_tokens: Vec<usize>,
}

impl Sample {
    /// A one-turn sample.
    pub fn outcome(reward: f64, tokens: usize) -> Sample {
        Sample {
            turn_rewards: vec![reward],
            turn_tokens: vec![tokens],
        }
    }

    /// Number of turns.
    pub fn turns(&self) -> usize {
        self.turn_rewards.len()
    }

    /// Outcome reward: Σ turn rewards.
    pub fn reward(&self) -> f64 {
        self.turn_rewards.iter().sum()
    }

    /// Trained tokens over all turns.
    pub fn tokens(&self) -> usize {
        self.turn_tokens.iter().sum()
    }

    /// Return of each turn: Σ_{u ≥ t} r_u (γ = 1).
    pub fn returns(&self) -> Vec<f64> {
        let mut acc = 0.0;
        let mut out: Vec<f64> = self
            .turn_rewards
            .iter()
            .rev()
            .map(|r| {
                acc += r;
                acc
            })
            .collect();
        out.reverse();
        out
    }
}

/// Advantages of every turn of every sample, `[group][sample][turn]`.
pub fn batch_advantages(est: Advantage, groups: &[Vec<Sample>]) -> Result<Vec<Vec<Vec<f64>>>> {
    validate(groups)?;
    match est {
        Advantage::Grpo => per_group(groups, |_, r, _| Ok(grpo::group(r, Std::Population))),
        Advantage::GrpoUnbiased => per_group(groups, |_, r, _| Ok(grpo::group(r, Std::Unbiased))),
        Advantage::DrGrpo => per_group(groups, |_, r, _| Ok(dr_grpo::group(r))),
        Advantage::Rloo => per_group(groups, rloo::group),
        Advantage::Opo => per_group(groups, |_, r, len| Ok(opo::group(r, len))),
        Advantage::Gpg => {
            let alpha = gpg::alpha(groups);
            per_group(groups, |_, r, _| Ok(gpg::group(r, alpha)))
        }
        Advantage::GrpoPassAtK { k, reward } => {
            per_group(groups, |g, r, _| grpo_pass_at_k::group(g, r, k, reward))
        }
        Advantage::MonteCarlo => Ok(groups
            .iter()
            .map(|group| group.iter().map(monte_carlo::sample).collect())
            .collect()),
        Advantage::GroupBasedPerTurn { std } => Ok(groups
            .iter()
            .map(|group| group_based_per_turn::group(group, std))
            .collect()),
        Advantage::ReinforcePp => reinforce_pp::batch(groups),
        Advantage::ReinforcePpBaseline => reinforce_pp_baseline::batch(groups),
    }
}

/// Advantages of one group of one-turn samples (one reward each), in order: a thin wrapper over
/// [`batch_advantages`] with one token per sample. Batch-level estimators see this group as the
/// whole batch.
pub fn advantages(est: Advantage, rewards: &[f64]) -> Result<Vec<f64>> {
    let group: Vec<Sample> = rewards.iter().map(|&r| Sample::outcome(r, 1)).collect();
    let mut out = batch_advantages(est, &[group])?;
    Ok(out
        .pop()
        .unwrap_or_default()
        .into_iter()
        .map(|turns| turns.first().copied().unwrap_or(0.0))
        .collect())
}

fn validate(groups: &[Vec<Sample>]) -> Result<()> {
    for (g, group) in groups.iter().enumerate() {
        for (i, s) in group.iter().enumerate() {
            if s.turn_rewards.len() != s.turn_tokens.len() {
                return Err(AlgoError::Invalid(format!(
                    "group {g} sample {i}: {} turn rewards but {} turn token counts",
                    s.turn_rewards.len(),
                    s.turn_tokens.len()
                )));
            }
            if let Some((t, r)) = s
                .turn_rewards
                .iter()
                .enumerate()
                .find(|(_, r)| !r.is_finite())
            {
                return Err(AlgoError::Invalid(format!(
                    "group {g} sample {i} turn {t}: non-finite reward {r}"
                )));
            }
        }
    }
    Ok(())
}

/// Runs an outcome estimator `f(group index, rewards, token counts)` on the samples with turns
/// of each group and broadcasts each sample's value over its turns.
fn per_group(
    groups: &[Vec<Sample>],
    mut f: impl FnMut(usize, &[f64], &[usize]) -> Result<Vec<f64>>,
) -> Result<Vec<Vec<Vec<f64>>>> {
    let mut out = Vec::with_capacity(groups.len());
    for (g, group) in groups.iter().enumerate() {
        let live: Vec<usize> = (0..group.len()).filter(|&i| group[i].turns() > 0).collect();
        let rewards: Vec<f64> = live.iter().map(|&i| group[i].reward()).collect();
        let tokens: Vec<usize> = live.iter().map(|&i| group[i].tokens()).collect();
        let mut adv = vec![Vec::new(); group.len()];
        if !live.is_empty() {
            for (&i, a) in live.iter().zip(f(g, &rewards, &tokens)?) {
                adv[i] = vec![a; group[i].turns()];
            }
        }
        out.push(adv);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(r: &[f64], n: &[usize]) -> Sample {
        Sample {
            turn_rewards: r.to_vec(),
            turn_tokens: n.to_vec(),
        }
    }

    #[test]
    fn every_name_parses_and_round_trips() {
        let opts = AdvantageOptions {
            k: Some(2),
            threshold: Some(0.5),
            ..Default::default()
        };
        for name in Advantage::NAMES {
            let a = Advantage::from_name(name, &opts).unwrap();
            let again = Advantage::from_name(a.name(), &opts).unwrap();
            assert_eq!(a, again, "{name}");
            assert!(Advantage::NAMES.contains(&a.name()));
        }
        let d = AdvantageOptions::default();
        assert_eq!(
            Advantage::from_name("group_based", &d).unwrap(),
            Advantage::Grpo
        );
        let unbiased = AdvantageOptions {
            std: Std::Unbiased,
            ..d
        };
        assert_eq!(
            Advantage::from_name("grpo", &unbiased).unwrap(),
            Advantage::GrpoUnbiased
        );
        assert_eq!(
            Advantage::from_name("grpo_passk", &opts).unwrap(),
            Advantage::GrpoPassAtK {
                k: 2,
                reward: PassAtKReward::Binary { threshold: 0.5 }
            }
        );
    }

    #[test]
    fn from_name_invents_nothing() {
        let d = AdvantageOptions::default();
        let err = Advantage::from_name("ppo", &d).unwrap_err().to_string();
        assert!(err.contains("unknown advantage estimator `ppo`") && err.contains("gpg"));
        // pass@k without k, binary pass@k without a threshold, k = 0.
        assert!(Advantage::from_name("grpo_pass_at_k", &d).is_err());
        let k2 = AdvantageOptions { k: Some(2), ..d };
        assert!(Advantage::from_name("grpo_pass_at_k", &k2).is_err());
        let cont = AdvantageOptions {
            continuous: true,
            ..k2
        };
        assert_eq!(
            Advantage::from_name("grpo_pass_at_k", &cont).unwrap(),
            Advantage::GrpoPassAtK {
                k: 2,
                reward: PassAtKReward::Continuous
            }
        );
        let k0 = AdvantageOptions { k: Some(0), ..cont };
        assert!(Advantage::from_name("grpo_passk", &k0).is_err());
        let nan = PassAtKReward::Binary {
            threshold: f64::NAN,
        };
        assert!(Advantage::pass_at_k(2, nan).is_err());
    }

    #[test]
    fn returns_are_suffix_sums() {
        // r = (1, 0, 2): G = (1 + 0 + 2, 0 + 2, 2) = (3, 2, 2).
        assert_eq!(
            s(&[1.0, 0.0, 2.0], &[1, 1, 1]).returns(),
            vec![3.0, 2.0, 2.0]
        );
        assert!(Sample::default().returns().is_empty());
    }

    #[test]
    fn bad_inputs_are_rejected() {
        let e = batch_advantages(Advantage::Grpo, &[vec![s(&[1.0, 2.0], &[3])]]);
        let msg = e.unwrap_err().to_string();
        assert!(msg.contains("group 0 sample 0: 2 turn rewards but 1 turn token counts"));
        let e = batch_advantages(
            Advantage::MonteCarlo,
            &[vec![], vec![s(&[f64::INFINITY], &[1])]],
        );
        assert!(e
            .unwrap_err()
            .to_string()
            .contains("group 1 sample 0 turn 0"));
        assert!(advantages(Advantage::Grpo, &[1.0, f64::NAN]).is_err());
        assert!(advantages(Advantage::Grpo, &[]).unwrap().is_empty());
    }

    #[test]
    fn outcome_estimators_broadcast_and_skip_empty_samples() {
        // Outcomes: 1 + 1 = 2, (no turns), 0; dr_grpo over the two with turns: mean 1 ⇒ ±1.
        let g = vec![s(&[1.0, 1.0], &[4, 2]), Sample::default(), s(&[0.0], &[5])];
        let a = batch_advantages(Advantage::DrGrpo, &[g, vec![]]).unwrap();
        assert_eq!(a, vec![vec![vec![1.0, 1.0], vec![], vec![-1.0]], vec![]]);
    }
}
