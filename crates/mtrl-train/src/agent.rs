//! `[rollout] environment = "agent"`: the policy endpoint a run (or an evaluation) serves its
//! user's agent on, and the rollout drivers that dispatch tasks to that agent.
//!
//! One [`AgentHost`] per process: one listening endpoint (`rollout.agent_listen`) whose
//! trajectories each carry the engine, codec and budgets they are served by, so the training
//! engine, the validation engine and each evaluated policy share it.
//!
//! The endpoint always requires credentials: a token generated per process (never written
//! anywhere; the run's own handle) or, what agents use, a live trajectory's id — sent to each
//! agent in the API-key slot and good for that trajectory's calls only. A non-loopback
//! `agent_listen` needs `rollout.agent_allow_remote = true` (config validation). Shutdown is
//! bounded: in-flight calls get the server's grace (10 s), then the endpoint's runtime is
//! dropped without waiting further.

use std::sync::Arc;
use std::time::Duration;

use mtrl_core::config::AgentConfig;
use mtrl_core::{ChatCodec, Config};
use mtrl_rollout::Driver;
use mtrl_serve::{AgentDriver, AgentSettings, Budgets, Gateway, HttpOptions, Protocol, Server};

use crate::error::{Result, TrainError};

/// The running endpoint and what every external episode shares.
pub struct AgentHost {
    /// The endpoint's own runtime (the run's and the evaluation's runtimes come and go).
    rt: tokio::runtime::Runtime,
    gateway: Arc<Gateway>,
    server: Option<Server>,
    settings: AgentSettings,
}

impl AgentHost {
    /// Starts the endpoint on `rt` when `cfg` runs its episodes in an external agent; `None`
    /// otherwise. `window` caps the context budget at the model's.
    pub fn start(cfg: &Config, model: &str, window: usize) -> Result<Option<AgentHost>> {
        let Some(a) = &cfg.rollout.agent else {
            return Ok(None);
        };
        let protocol = Protocol::parse(&a.protocol)
            .ok_or_else(|| TrainError::msg(format!("rollout.agent_protocol: `{}`", a.protocol)))?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("mtrl-endpoint")
            .enable_all()
            .build()?;
        let gateway = Arc::new(Gateway::new(None));
        let server = rt
            .block_on(Server::start(&a.listen, gateway.clone(), http_options(a)))
            .map_err(|e| TrainError::msg(format!("rollout.agent_listen: {e}")))?;
        let endpoint = a
            .endpoint
            .clone()
            .unwrap_or_else(|| format!("http://{}", server.addr));
        let env = cfg.env_or_default();
        let settings = AgentSettings {
            url: a.url.clone(),
            protocol,
            endpoint,
            model: model.to_string(),
            budgets: Budgets {
                max_turns: env.max_turns,
                max_tokens_per_turn: env.max_tokens_per_turn,
                max_context_tokens: env.max_context_tokens.min(window),
            },
            failure_reward: env.failure_reward,
            job: format!("mtrl:{}", cfg.name),
            timeout: Duration::from_secs_f64(cfg.rollout.timeout_s.unwrap_or(3600.0)),
        };
        Ok(Some(AgentHost {
            rt,
            gateway,
            server: Some(server),
            settings,
        }))
    }

    /// The endpoint's base URL as agents are told it.
    pub fn endpoint(&self) -> &str {
        &self.settings.endpoint
    }

    /// Episodes of a policy with `codec`, run by the agent.
    pub fn driver(&self, codec: Arc<dyn ChatCodec>) -> Arc<dyn Driver> {
        Arc::new(AgentDriver::new(
            self.gateway.clone(),
            codec,
            self.settings.clone(),
        ))
    }

    /// Drivers for evaluated policies (one per policy: its codec, and its window capping the
    /// context budget as in-process).
    pub fn drivers(&self) -> mtrl_eval::runner::AgentDrivers {
        let (gateway, settings) = (self.gateway.clone(), self.settings.clone());
        Arc::new(move |codec, window| {
            let mut s = settings.clone();
            s.budgets.max_context_tokens = s.budgets.max_context_tokens.min(window);
            Arc::new(AgentDriver::new(gateway.clone(), codec, s)) as Arc<dyn Driver>
        })
    }

    /// The endpoint's per-call latencies since the last take, in ms.
    pub fn take_latencies(&self) -> Vec<f64> {
        self.gateway.take_latencies()
    }

    /// Stops the endpoint: in-flight calls get the server's shutdown grace to finish, then
    /// whatever is left is dropped (bounded, whatever the agents do).
    pub fn shutdown(mut self) {
        if let Some(s) = self.server.take() {
            if let Err(e) = self.rt.block_on(s.shutdown()) {
                eprintln!("warning: policy endpoint: {e}");
            }
        }
        self.rt.shutdown_timeout(Duration::from_secs(1));
    }
}

/// The endpoint's HTTP options: a fresh run token always, a remote bind only when allowed.
fn http_options(a: &AgentConfig) -> HttpOptions {
    HttpOptions {
        token: Some(mtrl_serve::http::new_token()),
        allow_remote: a.allow_remote,
        ..HttpOptions::default()
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn host(extra: &str) -> AgentHost {
        let text = format!(
            "[rollout]\nenvironment = 'agent'\nagent_url = 'http://127.0.0.1:9/invocations'\n{extra}"
        );
        let cfg = Config::from_toml_str(&text, Path::new("configs/a.toml")).unwrap();
        AgentHost::start(&cfg, "m", 512).unwrap().unwrap()
    }

    #[test]
    fn agents_are_told_the_listened_address_or_agent_endpoint() {
        let h = host("");
        let told = h.endpoint().to_string();
        assert!(
            told.starts_with("http://127.0.0.1:") && !told.ends_with(":0"),
            "{told}"
        );
        h.shutdown();
        let h = host("agent_endpoint = 'http://trainer.internal:8000'\n");
        assert_eq!(h.endpoint(), "http://trainer.internal:8000");
        h.shutdown();
    }

    #[test]
    fn the_endpoint_requires_credentials_and_remote_binds_are_opt_in() {
        let h = host("");
        // Nothing is served to a caller with neither the run token nor a live trajectory id.
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .into();
        let resp = agent
            .get(format!("{}/v1/models", h.endpoint()))
            .call()
            .unwrap();
        assert_eq!(resp.status().as_u16(), 401);
        h.shutdown();
        let cfg = |extra: &str| {
            let text = format!(
                "[rollout]\nenvironment = 'agent'\nagent_url = 'http://127.0.0.1:9/'\n{extra}"
            );
            Config::from_toml_str(&text, Path::new("configs/a.toml"))
                .unwrap()
                .rollout
                .agent
                .unwrap()
        };
        let local = http_options(&cfg(""));
        assert!(local.token.is_some() && !local.allow_remote);
        assert_ne!(
            local.token,
            http_options(&cfg("")).token,
            "a fresh token per run"
        );
        let remote = http_options(&cfg(
            "agent_listen = '0.0.0.0:8000'\nagent_allow_remote = true\n",
        ));
        assert!(remote.token.is_some() && remote.allow_remote);
    }
}
