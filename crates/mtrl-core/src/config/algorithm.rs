//! `[algorithm]`: advantage estimator, policy loss, clipping, staleness, KL, aggregation.
//!
//! ```toml
//! [algorithm]
//! loss = "ppo"              # "ppo" | "cispo" | "is"
//! advantage = "grpo"        # "grpo" | "grpo_pass_at_k" | "rloo" | "dr_grpo"
//! clip_low = 0.2
//! clip_high = 0.28
//! dual_clip = 3.0           # optional (PPO, A < 0)
//! tis_cap = 2.0             # cap C of the behaviour (TIS / decoupled PPO) correction; 0 = off
//! max_staleness = 2         # η: 0 = synchronous on-policy
//! kl_coef = 0.0             # k3 KL to the frozen initial policy; 0 = no reference model
//! loss_agg = "token-mean"   # | "seq-mean-token-mean" | "seq-mean-token-sum" | "seq-mean-token-sum-norm"
//! ```
//!
//! Names are checked here; `mtrl-learner` maps them onto `mtrl-algo`'s types.

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
}

pub const LOSSES: &[&str] = &["ppo", "cispo", "is"];
pub const ADVANTAGES: &[&str] = &["grpo", "grpo_pass_at_k", "rloo", "dr_grpo"];
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
        if clip_low >= 1.0 {
            return Err(ctx.invalid("algorithm.clip_low", format!("{clip_low} must be < 1")));
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
        Ok(AlgorithmConfig {
            loss: pick(ctx, "algorithm.loss", self.loss, &d.loss, LOSSES)?,
            advantage: pick(
                ctx,
                "algorithm.advantage",
                self.advantage,
                &d.advantage,
                ADVANTAGES,
            )?,
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
