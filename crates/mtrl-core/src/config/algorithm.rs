//! `[algorithm]`: advantage estimator, policy loss, clipping, staleness, KL, aggregation.
//!
//! ```toml
//! [algorithm]
//! loss = "ppo"              # "ppo" | "cispo" | "is"
//! advantage = "grpo"        # grpo (= group_based) | dr_grpo | rloo | opo | gpg | monte_carlo
//!                           # | group_based_per_turn | reinforce_pp | reinforce_pp_baseline
//!                           # | grpo_pass_at_k (= grpo_passk)   (see mtrl-algo's `advantage`)
//! grpo_std = "population"   # | "unbiased" (torch.std, verl): grpo, group_based_per_turn
//! pass_k = 2                # grpo_pass_at_k's k
//! pass_at_k_reward = "binary" # success = reward > success_threshold | "continuous" (the max of
//!                           # a k-subset) | "best_only" (verl: only the best sample, k unused)
//! success_threshold = 0.5
//! ratio = "sampler"         # what π_θ is divided by: "sampler" (the rollout's log-probs, the
//!                           # managed service's definition) | "proximal" (recomputed by the
//!                           # learner before `ppo_mini_batches` updates: decoupled PPO)
//! ppo_mini_batches = 1      # optimizer updates per batch (≥ 2 with ratio = "proximal")
//! clip_low = 0.2            # ratio bounds [1 − clip_low, 1 + clip_high] (PPO, CISPO)
//! clip_high = 0.28
//! dual_clip = 3.0           # optional (PPO, A < 0)
//! tis_cap = 2.0             # cap C of the IS weights: the sampler correction of ratio =
//!                           # "proximal" (always applied), and the truncation of loss = "is";
//!                           # 0 = no cap (the weight is used untruncated), in both uses
//! max_staleness = 2         # η: 0 = synchronous on-policy
//! kl_coef = 0.0             # k3 KL to the frozen initial policy; 0 = no reference model
//! loss_agg = "token-mean"   # | "seq-mean-token-mean" | "seq-mean-token-sum" | "seq-mean-token-sum-norm"
//! ```
//!
//! Names are checked here; `mtrl-learner` maps them onto `mtrl-algo`'s types. A key set
//! explicitly that cannot act under the chosen loss and ratio (say `dual_clip` with CISPO, or
//! `clip_low` with `is`) is an error naming it rather than a silent no-op.

use serde::Deserialize;

use super::Ctx;
use crate::error::Result;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlgorithmSpec {
    pub loss: Option<String>,
    pub advantage: Option<String>,
    pub clip_low: Option<f64>,
    pub clip_high: Option<f64>,
    pub dual_clip: Option<f64>,
    pub tis_cap: Option<f64>,
    pub max_staleness: Option<u64>,
    pub kl_coef: Option<f64>,
    pub loss_agg: Option<String>,
    pub ratio: Option<String>,
    pub ppo_mini_batches: Option<usize>,
    pub pass_k: Option<usize>,
    pub success_threshold: Option<f64>,
    pub pass_at_k_reward: Option<String>,
    pub grpo_std: Option<String>,
}

pub const LOSSES: &[&str] = &["ppo", "cispo", "is"];
/// Every estimator name (ours and the managed service's; `mtrl-algo`'s `Advantage::NAMES`, which
/// a learner test keeps equal to this list).
pub const ADVANTAGES: &[&str] = &[
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
/// The estimators that divide by a group's std (where `grpo_std` acts).
pub const STD_ADVANTAGES: &[&str] = &["grpo", "group_based", "group_based_per_turn"];
pub const RATIOS: &[&str] = &["sampler", "proximal"];
pub const PASS_AT_K_REWARDS: &[&str] = &["binary", "continuous", "best_only"];
pub const GRPO_STDS: &[&str] = &["population", "unbiased"];
pub const LOSS_AGGS: &[&str] = &[
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
];

#[derive(Debug, Clone, PartialEq)]
pub struct AlgorithmConfig {
    pub loss: String,
    pub advantage: String,
    pub clip_low: f64,
    pub clip_high: f64,
    pub dual_clip: Option<f64>,
    /// 0 disables the behaviour correction.
    pub tis_cap: f64,
    pub max_staleness: u64,
    pub kl_coef: f64,
    pub loss_agg: String,
    /// `"sampler"` or `"proximal"`.
    pub ratio: String,
    pub ppo_mini_batches: usize,
    /// k of `grpo_pass_at_k`.
    pub pass_k: usize,
    /// Success = reward > this, for the binary `grpo_pass_at_k`.
    pub success_threshold: f64,
    /// `"binary"` or `"continuous"` (`grpo_pass_at_k`).
    pub pass_at_k_reward: String,
    /// GRPO's std: `"population"` (n) or `"unbiased"` (n − 1, torch.std and verl).
    pub grpo_std: String,
}

impl Default for AlgorithmConfig {
    fn default() -> Self {
        AlgorithmConfig {
            loss: "ppo".into(),
            advantage: "grpo".into(),
            clip_low: 0.2,
            clip_high: 0.28,
            dual_clip: None,
            tis_cap: 2.0,
            max_staleness: 2,
            kl_coef: 0.0,
            loss_agg: "token-mean".into(),
            ratio: "sampler".into(),
            ppo_mini_batches: 1,
            pass_k: 2,
            success_threshold: 0.5,
            pass_at_k_reward: "binary".into(),
            grpo_std: "population".into(),
        }
    }
}

fn pick(ctx: &Ctx<'_>, key: &str, v: Option<String>, d: &str, allowed: &[&str]) -> Result<String> {
    let v = v.unwrap_or_else(|| d.to_string());
    if !allowed.contains(&v.as_str()) {
        return Err(ctx.invalid(key, format!("`{v}` is not one of {}", allowed.join(", "))));
    }
    Ok(v)
}

impl AlgorithmSpec {
    pub(crate) fn validate(self, ctx: &Ctx<'_>) -> Result<AlgorithmConfig> {
        let d = AlgorithmConfig::default();
        let nonneg = |key: &str, v: Option<f64>, dv: f64| -> Result<f64> {
            let v = v.unwrap_or(dv);
            if !(v.is_finite() && v >= 0.0) {
                return Err(ctx.invalid(key, format!("{v} is not a number >= 0")));
            }
            Ok(v)
        };
        let clip_low = nonneg("algorithm.clip_low", self.clip_low, d.clip_low)?;
        if clip_low > 1.0 {
            return Err(ctx.invalid("algorithm.clip_low", format!("{clip_low} must be <= 1")));
        }
        if let Some(c) = self.dual_clip {
            if !(c.is_finite() && c > 1.0) {
                return Err(ctx.invalid("algorithm.dual_clip", format!("{c} must be > 1")));
            }
        }
        let tis_cap = nonneg("algorithm.tis_cap", self.tis_cap, d.tis_cap)?;
        if tis_cap > 0.0 && tis_cap < 1.0 {
            return Err(ctx.invalid("algorithm.tis_cap", format!("{tis_cap} must be 0 or >= 1")));
        }
        let loss = pick(ctx, "algorithm.loss", self.loss, &d.loss, LOSSES)?;
        let ratio = pick(ctx, "algorithm.ratio", self.ratio, &d.ratio, RATIOS)?;
        let ppo_mini_batches = ctx.range(
            "algorithm.ppo_mini_batches",
            self.ppo_mini_batches.unwrap_or(d.ppo_mini_batches),
            1,
            1 << 16,
        )?;
        if ratio == "proximal" && ppo_mini_batches < 2 {
            return Err(ctx.invalid(
                "algorithm.ratio",
                "\"proximal\" needs algorithm.ppo_mini_batches >= 2: with one update per batch the \
                 proximal policy is the current one, the ratio is 1 and no clip acts",
            ));
        }
        let advantage = pick(
            ctx,
            "algorithm.advantage",
            self.advantage,
            &d.advantage,
            ADVANTAGES,
        )?;
        let pass_at_k_reward = pick(
            ctx,
            "algorithm.pass_at_k_reward",
            self.pass_at_k_reward.clone(),
            &d.pass_at_k_reward,
            PASS_AT_K_REWARDS,
        )?;
        let grpo_std = pick(
            ctx,
            "algorithm.grpo_std",
            self.grpo_std.clone(),
            &d.grpo_std,
            GRPO_STDS,
        )?;
        let pass_k = ctx.range(
            "algorithm.pass_k",
            self.pass_k.unwrap_or(d.pass_k),
            1,
            1 << 16,
        )?;
        let success_threshold = self.success_threshold.unwrap_or(d.success_threshold);
        if !success_threshold.is_finite() {
            return Err(ctx.invalid(
                "algorithm.success_threshold",
                format!("{success_threshold} is not a number"),
            ));
        }
        let passk = advantage == "grpo_pass_at_k" || advantage == "grpo_passk";
        let uses_std = STD_ADVANTAGES.contains(&advantage.as_str());
        // Keys set explicitly that would change nothing.
        let inert = [
            (
                "algorithm.pass_k",
                self.pass_k.is_some() && !(passk && pass_at_k_reward != "best_only"),
                "acts only with advantage = \"grpo_pass_at_k\" and pass_at_k_reward \"binary\" or \"continuous\"",
            ),
            (
                "algorithm.pass_at_k_reward",
                self.pass_at_k_reward.is_some() && !passk,
                "acts only with advantage = \"grpo_pass_at_k\"",
            ),
            (
                "algorithm.success_threshold",
                self.success_threshold.is_some() && !(passk && pass_at_k_reward == "binary"),
                "acts only with advantage = \"grpo_pass_at_k\" and pass_at_k_reward = \"binary\"",
            ),
            (
                "algorithm.grpo_std",
                self.grpo_std.is_some() && !uses_std,
                "acts only with an estimator that divides by the group's std",
            ),
            (
                "algorithm.tis_cap",
                self.tis_cap.is_some() && ratio == "sampler" && loss != "is",
                "acts only with ratio = \"proximal\" or loss = \"is\"",
            ),
            (
                "algorithm.dual_clip",
                self.dual_clip.is_some() && loss != "ppo",
                "acts only with loss = \"ppo\"",
            ),
            (
                "algorithm.clip_low",
                self.clip_low.is_some() && loss == "is",
                "does not act with loss = \"is\" (its cap is algorithm.tis_cap)",
            ),
            (
                "algorithm.clip_high",
                self.clip_high.is_some() && loss == "is",
                "does not act with loss = \"is\" (its cap is algorithm.tis_cap)",
            ),
        ];
        if let Some((key, _, why)) = inert.iter().find(|(_, bad, _)| *bad) {
            return Err(ctx.invalid(key, *why));
        }
        Ok(AlgorithmConfig {
            loss,
            ratio,
            ppo_mini_batches,
            pass_k,
            success_threshold,
            pass_at_k_reward,
            grpo_std,
            advantage,
            clip_low,
            clip_high: nonneg("algorithm.clip_high", self.clip_high, d.clip_high)?,
            dual_clip: self.dual_clip,
            tis_cap,
            max_staleness: self.max_staleness.unwrap_or(d.max_staleness).min(1 << 20),
            kl_coef: nonneg("algorithm.kl_coef", self.kl_coef, d.kl_coef)?,
            loss_agg: pick(
                ctx,
                "algorithm.loss_agg",
                self.loss_agg,
                &d.loss_agg,
                LOSS_AGGS,
            )?,
        })
    }
}
