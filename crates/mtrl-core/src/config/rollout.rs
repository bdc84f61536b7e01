//! `[rollout]`: how episodes are generated.
//!
//! ```toml
//! [rollout]
//! rollout_max_concurrency = 32   # episodes in flight
//! group_size = 8                 # samples per task (G)
//! temperature = 1.0
//! top_p = 1.0
//! top_k = 0                      # 0 = off
//! max_batch = 32                 # sequences per decode step (default: rollout_max_concurrency)
//! kv_cache_tokens = 65536        # positions the engine keeps resident, all episodes together
//!                                # (default: rollout_max_concurrency × env.max_context_tokens)
//! prefill_chunk_tokens = 512     # prompt tokens prefilled per engine step, across sequences
//! environment = "search"         # or "pick": one-token toy task for CI (see mtrl-rollout)
//! ```

use serde::Deserialize;

use super::Ctx;
use crate::error::Result;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RolloutSpec {
    pub rollout_max_concurrency: Option<usize>,
    pub group_size: Option<usize>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<usize>,
    pub max_batch: Option<usize>,
    pub kv_cache_tokens: Option<usize>,
    pub prefill_chunk_tokens: Option<usize>,
    pub environment: Option<String>,
}

/// Which environment episodes run in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EnvironmentKind {
    /// The built-in multi-turn search agent (`mtrl-env`'s `SearchEnv`).
    Search,
    /// One generated token picks a document among the judged ones (CI proof that RL learns).
    Pick,
}

impl EnvironmentKind {
    pub fn as_str(&self) -> &'static str {
        match self {
            EnvironmentKind::Search => "search",
            EnvironmentKind::Pick => "pick",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct RolloutConfig {
    pub rollout_max_concurrency: usize,
    pub group_size: usize,
    pub temperature: f64,
    pub top_p: f64,
    pub top_k: usize,
    pub max_batch: usize,
    /// `None`: every episode in flight can keep its whole context resident.
    pub kv_cache_tokens: Option<usize>,
    pub prefill_chunk_tokens: usize,
    pub environment: EnvironmentKind,
}

impl Default for RolloutConfig {
    fn default() -> Self {
        RolloutConfig {
            rollout_max_concurrency: 32,
            group_size: 8,
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            max_batch: 32,
            kv_cache_tokens: None,
            prefill_chunk_tokens: 512,
            environment: EnvironmentKind::Search,
        }
    }
}

impl RolloutSpec {
    pub(crate) fn validate(self, ctx: &Ctx<'_>) -> Result<RolloutConfig> {
        let d = RolloutConfig::default();
        let conc = ctx.range(
            "rollout.rollout_max_concurrency",
            self.rollout_max_concurrency
                .unwrap_or(d.rollout_max_concurrency),
            1,
            1 << 16,
        )?;
        let temperature = self.temperature.unwrap_or(d.temperature);
        if !(temperature.is_finite() && temperature > 0.0) {
            return Err(ctx.invalid("rollout.temperature", format!("{temperature} is not > 0")));
        }
        let top_p = self.top_p.unwrap_or(d.top_p);
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(ctx.invalid("rollout.top_p", format!("{top_p} is outside (0, 1]")));
        }
        let environment = match self.environment.as_deref().unwrap_or("search") {
            "search" => EnvironmentKind::Search,
            "pick" => EnvironmentKind::Pick,
            other => {
                return Err(ctx.invalid(
                    "rollout.environment",
                    format!("`{other}` is not \"search\" or \"pick\""),
                ))
            }
        };
        Ok(RolloutConfig {
            rollout_max_concurrency: conc,
            group_size: ctx.range(
                "rollout.group_size",
                self.group_size.unwrap_or(d.group_size),
                1,
                4096,
            )?,
            temperature,
            top_p,
            top_k: self.top_k.unwrap_or(0),
            max_batch: ctx.range(
                "rollout.max_batch",
                self.max_batch.unwrap_or(conc),
                1,
                1 << 16,
            )?,
            kv_cache_tokens: self
                .kv_cache_tokens
                .map(|n| ctx.range("rollout.kv_cache_tokens", n, 2, 1 << 32))
                .transpose()?,
            prefill_chunk_tokens: ctx.range(
                "rollout.prefill_chunk_tokens",
                self.prefill_chunk_tokens.unwrap_or(d.prefill_chunk_tokens),
                1,
                1 << 20,
            )?,
            environment,
        })
    }
}
