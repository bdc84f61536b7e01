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
//!                                # (default: (rollout_max_concurrency + max_batch) ×
//!                                # env.max_context_tokens)
//! kv_cache_fraction = 0.3        # or: the store may take this fraction of the device's memory
//!                                # (the GPU's; the host's on the CPU), in positions of the model
//!                                # (not with kv_cache_tokens)
//! prefill_chunk_tokens = 512     # prompt tokens prefilled per engine step, across sequences
//! engine_attention = "auto"      # the engine's attention: "paged" (every row reads the paged
//!                                # store in place: mtrl's kernel on CUDA, its CPU twin
//!                                # elsewhere), "flash-prefill" (prompt chunks through
//!                                # FlashAttention-2, the rest paged), "gathered" (keys and
//!                                # values copied to padded tensors), "auto" (the fastest the
//!                                # build and model allow; gathered on the CPU)
//! environment = "search"         # or "pick": one-token toy task for CI (see mtrl-rollout), or
//!                                # "agent": the user's agent over HTTP (mtrl-serve)
//! agent_url = "http://127.0.0.1:8080/invocations"   # environment = "agent": where tasks go
//! agent_protocol = "sagemaker"   # or "agentcore-toolkit"
//! agent_listen = "127.0.0.1:0"   # where the policy endpoint listens (0 = any free port); a
//!                                # non-loopback address needs agent_allow_remote = true
//! agent_allow_remote = false     # let agents on other machines reach the endpoint (calls are
//!                                # authenticated either way: an agent by its trajectory id)
//! agent_endpoint = "http://…"    # the endpoint's URL as the agent reaches it (default: the
//!                                # address listened on)
//! timeout_s = 600.0              # an episode running longer fails (and is retried); 0 = none
//! max_retries = 2                # attempts after the first for an episode that errored
//! max_failed_fraction = 0.1      # the run stops when more episodes than this have errored
//! weight_sync = "latest"         # or "pinned": every episode of group i runs on version
//!                                # max(v₀, ⌊i/B⌋ − η) from first token to last, so a run does
//!                                # not depend on timing (mtrl-rollout's `pin`)
//! behaviour_logprobs = "sampled"  # the behaviour log-prob trajectories record for each sampled
//!                                # token (the ratio's denominator): "sampled" = under the
//!                                # distribution it was drawn from (top-k / top-p truncated and
//!                                # renormalised), "full" = under the whole vocabulary; they differ
//!                                # only with top_k > 0 or top_p < 1
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
    pub kv_cache_fraction: Option<f64>,
    pub prefill_chunk_tokens: Option<usize>,
    pub engine_attention: Option<String>,
    pub environment: Option<String>,
    pub timeout_s: Option<f64>,
    pub max_retries: Option<usize>,
    pub max_failed_fraction: Option<f64>,
    pub agent_url: Option<String>,
    pub agent_protocol: Option<String>,
    pub agent_listen: Option<String>,
    pub agent_allow_remote: Option<bool>,
    pub agent_endpoint: Option<String>,
    pub weight_sync: Option<String>,
    pub behaviour_logprobs: Option<String>,
}

/// How rollouts take up the learner's new weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WeightSync {
    /// Between decode steps, as soon as published: fresher tokens, timing-dependent.
    #[default]
    Latest,
    /// Group i only ever sees version max(v₀, ⌊i/B⌋ − η): reproducible whatever the timing.
    Pinned,
}

/// Which log-prob of a sampled token trajectories record as its behaviour log-prob.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BehaviourLogprobs {
    /// Under the truncated, renormalised distribution the token was drawn from.
    #[default]
    Sampled,
    /// Under the full-vocabulary softmax (what the learner evaluates).
    Full,
}

/// Which environment episodes run in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EnvironmentKind {
    /// The built-in multi-turn search agent (`mtrl-env`'s `SearchEnv`).
    Search,
    /// One generated token picks a document among the judged ones (CI proof that RL learns).
    Pick,
    /// The user's agent, over HTTP: it calls the policy endpoint and reports rewards.
    Agent,
}

impl EnvironmentKind {
    pub fn as_str(&self) -> &'static str {
        match self {
            EnvironmentKind::Search => "search",
            EnvironmentKind::Pick => "pick",
            EnvironmentKind::Agent => "agent",
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
    /// The store's bound as a fraction of the device's memory (exclusive with `kv_cache_tokens`).
    pub kv_cache_fraction: Option<f64>,
    pub prefill_chunk_tokens: usize,
    /// `auto`, `paged`, `flash-prefill` or `gathered` (mtrl_model::EngineAttention).
    pub engine_attention: String,
    pub environment: EnvironmentKind,
    /// Wall-clock limit of one episode attempt; `None` = no limit.
    pub timeout_s: Option<f64>,
    pub max_retries: usize,
    /// Errored episodes (after retries) over all episodes above which the run stops.
    pub max_failed_fraction: f64,
    /// `environment = "agent"`: how to reach the agent.
    pub agent: Option<AgentConfig>,
    pub weight_sync: WeightSync,
    pub behaviour_logprobs: BehaviourLogprobs,
}

/// Where the user's agent is and how it is called.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentConfig {
    pub url: String,
    /// `sagemaker` or `agentcore-toolkit`.
    pub protocol: String,
    pub listen: String,
    /// `listen` may be a non-loopback address.
    pub allow_remote: bool,
    pub endpoint: Option<String>,
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
            kv_cache_fraction: None,
            prefill_chunk_tokens: 512,
            engine_attention: "auto".into(),
            environment: EnvironmentKind::Search,
            timeout_s: Some(600.0),
            max_retries: 2,
            max_failed_fraction: 0.1,
            agent: None,
            weight_sync: WeightSync::Latest,
            behaviour_logprobs: BehaviourLogprobs::Sampled,
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
            "agent" => EnvironmentKind::Agent,
            other => {
                return Err(ctx.invalid(
                    "rollout.environment",
                    format!("`{other}` is not \"search\", \"pick\" or \"agent\""),
                ))
            }
        };
        let agent = agent(&self, environment, ctx)?;
        let behaviour_logprobs = match self.behaviour_logprobs.as_deref().unwrap_or("sampled") {
            "sampled" => BehaviourLogprobs::Sampled,
            "full" => BehaviourLogprobs::Full,
            other => {
                return Err(ctx.invalid(
                    "rollout.behaviour_logprobs",
                    format!("`{other}`: expected \"sampled\" or \"full\""),
                ))
            }
        };
        let weight_sync = match self.weight_sync.as_deref().unwrap_or("latest") {
            "latest" => WeightSync::Latest,
            "pinned" => WeightSync::Pinned,
            other => {
                return Err(ctx.invalid(
                    "rollout.weight_sync",
                    format!("`{other}` is not \"latest\" or \"pinned\""),
                ))
            }
        };
        let timeout_s = match self.timeout_s {
            None => d.timeout_s,
            Some(0.0) => None,
            Some(t) if t.is_finite() && t > 0.0 => Some(t),
            Some(t) => return Err(ctx.invalid("rollout.timeout_s", format!("{t} is not >= 0"))),
        };
        let max_failed_fraction = self.max_failed_fraction.unwrap_or(d.max_failed_fraction);
        if !(0.0..=1.0).contains(&max_failed_fraction) {
            return Err(ctx.invalid(
                "rollout.max_failed_fraction",
                format!("{max_failed_fraction} is outside [0, 1]"),
            ));
        }
        let kv_cache_fraction = match self.kv_cache_fraction {
            Some(_) if self.kv_cache_tokens.is_some() => {
                return Err(ctx.invalid(
                    "rollout.kv_cache_fraction",
                    "set it or rollout.kv_cache_tokens, not both",
                ))
            }
            Some(f) if !(f > 0.0 && f <= 0.95) => {
                return Err(ctx.invalid(
                    "rollout.kv_cache_fraction",
                    format!("{f} is outside (0, 0.95]"),
                ))
            }
            f => f,
        };
        Ok(RolloutConfig {
            kv_cache_fraction,
            timeout_s,
            max_retries: ctx.range(
                "rollout.max_retries",
                self.max_retries.unwrap_or(d.max_retries),
                0,
                1000,
            )?,
            max_failed_fraction,
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
            engine_attention: match self.engine_attention.as_deref() {
                None => d.engine_attention,
                Some(a @ ("auto" | "paged" | "flash-prefill" | "gathered")) => a.to_string(),
                Some(other) => {
                    return Err(ctx.invalid(
                        "rollout.engine_attention",
                        format!(
                            "`{other}`: expected \"auto\", \"paged\", \"flash-prefill\" or \"gathered\""
                        ),
                    ))
                }
            },
            environment,
            agent,
            weight_sync,
            behaviour_logprobs,
        })
    }
}

/// The `agent_*` keys: required with `environment = "agent"`, errors without it.
fn agent(spec: &RolloutSpec, env: EnvironmentKind, ctx: &Ctx<'_>) -> Result<Option<AgentConfig>> {
    if env != EnvironmentKind::Agent {
        for (key, set) in [
            ("agent_url", spec.agent_url.is_some()),
            ("agent_protocol", spec.agent_protocol.is_some()),
            ("agent_listen", spec.agent_listen.is_some()),
            ("agent_allow_remote", spec.agent_allow_remote.is_some()),
            ("agent_endpoint", spec.agent_endpoint.is_some()),
        ] {
            if set {
                return Err(ctx.invalid(
                    &format!("rollout.{key}"),
                    "has no effect unless rollout.environment = \"agent\"".to_string(),
                ));
            }
        }
        return Ok(None);
    }
    let url = match &spec.agent_url {
        Some(u) if u.starts_with("http://") || u.starts_with("https://") => u.clone(),
        Some(u) => {
            return Err(ctx.invalid("rollout.agent_url", format!("`{u}` is not an http:// URL")))
        }
        None => {
            return Err(ctx.invalid(
                "rollout.agent_url",
                "is required with rollout.environment = \"agent\"".to_string(),
            ))
        }
    };
    let protocol = spec
        .agent_protocol
        .clone()
        .unwrap_or_else(|| "sagemaker".into());
    if !["sagemaker", "agentcore-toolkit"].contains(&protocol.as_str()) {
        return Err(ctx.invalid(
            "rollout.agent_protocol",
            format!("`{protocol}` is not \"sagemaker\" or \"agentcore-toolkit\""),
        ));
    }
    let listen = spec
        .agent_listen
        .clone()
        .unwrap_or_else(|| "127.0.0.1:0".into());
    let Ok(addr) = listen.parse::<std::net::SocketAddr>() else {
        return Err(ctx.invalid(
            "rollout.agent_listen",
            format!("`{listen}` is not an address like 127.0.0.1:8000"),
        ));
    };
    let allow_remote = spec.agent_allow_remote.unwrap_or(false);
    if !addr.ip().is_loopback() && !allow_remote {
        return Err(ctx.invalid(
            "rollout.agent_listen",
            format!(
                "`{listen}` is not a loopback address: set rollout.agent_allow_remote = true to \
                 let agents on other machines reach the policy endpoint"
            ),
        ));
    }
    Ok(Some(AgentConfig {
        url,
        protocol,
        listen,
        allow_remote,
        endpoint: spec.agent_endpoint.clone(),
    }))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::Config;

    fn load(text: &str) -> Result<Config> {
        Config::from_toml_str(text, Path::new("configs/r.toml"))
    }

    #[test]
    fn behaviour_logprobs_parses_and_names_a_bad_value() {
        use super::BehaviourLogprobs;
        let d = load("").unwrap().rollout.behaviour_logprobs;
        assert_eq!(d, BehaviourLogprobs::Sampled);
        let c = load("[rollout]\nbehaviour_logprobs = \"full\"\n").unwrap();
        assert_eq!(c.rollout.behaviour_logprobs, BehaviourLogprobs::Full);
        let e = load("[rollout]\nbehaviour_logprobs = \"trunc\"\n").unwrap_err();
        assert!(e.to_string().contains("rollout.behaviour_logprobs"), "{e}");
    }

    #[test]
    fn a_remote_agent_listen_needs_agent_allow_remote() {
        let agent = "[rollout]\nenvironment = \"agent\"\nagent_url = \"http://127.0.0.1:9\"\n";
        let local = load(&format!("{agent}agent_listen = \"127.0.0.1:0\"\n")).unwrap();
        assert!(!local.rollout.agent.unwrap().allow_remote);
        let msg = load(&format!("{agent}agent_listen = \"0.0.0.0:8000\"\n"))
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("rollout.agent_listen") && msg.contains("rollout.agent_allow_remote"),
            "{msg}"
        );
        let remote = load(&format!(
            "{agent}agent_listen = \"0.0.0.0:8000\"\nagent_allow_remote = true\n"
        ))
        .unwrap();
        assert!(remote.rollout.agent.unwrap().allow_remote);
        let msg = load("[rollout]\nagent_allow_remote = true\n")
            .unwrap_err()
            .to_string();
        assert!(msg.contains("rollout.agent_allow_remote"), "{msg}");
    }

    #[test]
    fn kv_cache_fraction_is_checked_and_excludes_kv_cache_tokens() {
        assert_eq!(load("").unwrap().rollout.kv_cache_fraction, None);
        let c = load("[rollout]\nkv_cache_fraction = 0.3\n").unwrap();
        assert_eq!(c.rollout.kv_cache_fraction, Some(0.3));
        for bad in ["0.0", "0.99", "-0.1"] {
            let msg = load(&format!("[rollout]\nkv_cache_fraction = {bad}\n"))
                .unwrap_err()
                .to_string();
            assert!(msg.contains("rollout.kv_cache_fraction"), "{msg}");
        }
        let msg = load("[rollout]\nkv_cache_fraction = 0.3\nkv_cache_tokens = 4096\n")
            .unwrap_err()
            .to_string();
        assert!(msg.contains("kv_cache_tokens"), "{msg}");
    }

    #[test]
    fn weight_sync_parses_and_names_a_bad_value() {
        assert_eq!(load("").unwrap().rollout.weight_sync, WeightSync::Latest);
        let c = load("[rollout]\nweight_sync = \"pinned\"\n").unwrap();
        assert_eq!(c.rollout.weight_sync, WeightSync::Pinned);
        let msg = load("[rollout]\nweight_sync = \"newest\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("rollout.weight_sync") && msg.contains("newest") && msg.contains("r.toml"),
            "{msg}"
        );
    }
}
