//! One episode: drive an [`Environment`] with generations from the shared engine.
//!
//! The context is kept here as the concatenation of every observation's new tokens and every
//! sampled id, which is exactly the environment's transcript (checked against
//! `Observation::context_len`); each turn is one generation request whose prompt is that context.
//! The requests of one episode share an engine session, so the engine keeps the conversation's
//! keys/values between turns and prefills only what the environment added (released when the
//! episode ends, however it ends). Environment calls (tool execution, tokenization, scoring) run on tokio's blocking pool.
//!
//! Seeds: the sampling seed of (group, sample, turn) is a hash of them and the run seed, so what
//! a sequence samples does not depend on which other sequences share its decode batches (given
//! the same logits).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use mtrl_env::{Action, Environment, Step, Task, Trajectory};
use mtrl_model::{GenerationRequest, SamplingParams};

use crate::engine_thread::GenClient;
use crate::error::{Result, RolloutError};
use crate::faults::{FaultKind, Faults};

pub use mtrl_core::rng::sample_seed;

/// Time spent in the environment (tools, tokenization, reward), in nanoseconds.
#[derive(Debug, Default)]
pub struct EnvStats {
    pub env_ns: AtomicU64,
}

/// Where one episode sits in the run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EpisodeId {
    pub group: u64,
    pub sample: u64,
    /// Retry of the same episode after an error (0 = first try): same seeds, so a retry that
    /// meets no fault reproduces the episode exactly; only fault injection draws by it.
    pub attempt: u32,
    /// Replacement of a failed group (0 = the original): new sampling seeds.
    pub replacement: u32,
}

impl EpisodeId {
    pub fn new(group: u64, sample: u64) -> EpisodeId {
        EpisodeId {
            group,
            sample,
            ..EpisodeId::default()
        }
    }

    /// The sample index the seeds are drawn with (a replacement group samples anew).
    pub fn seed_sample(&self) -> u64 {
        self.sample ^ (u64::from(self.replacement) << 48)
    }
}

/// What every episode shares.
pub struct EpisodeContext {
    pub gen: GenClient,
    pub sampling: SamplingParams,
    pub seed: u64,
    pub stop_token_ids: Vec<u32>,
    pub stats: Arc<EnvStats>,
    /// Faults to inject (tests of fault tolerance); [`Faults::none`] otherwise.
    pub faults: Arc<Faults>,
    /// Record each token's log-prob under the distribution it was drawn from (true) or under the
    /// full vocabulary (`rollout.behaviour_logprobs`).
    pub sampled_logprobs: bool,
}

async fn blocking<T: Send + 'static>(
    env: Box<dyn Environment>,
    task: &str,
    stats: &EnvStats,
    f: impl FnOnce(&mut dyn Environment) -> mtrl_env::Result<T> + Send + 'static,
) -> Result<(Box<dyn Environment>, T)> {
    let t0 = Instant::now();
    let (env, r) = tokio::task::spawn_blocking(move || {
        let mut env = env;
        let r = f(env.as_mut());
        (env, r)
    })
    .await
    .map_err(|e| RolloutError::Internal(format!("environment worker: {e}")))?;
    stats
        .env_ns
        .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
    let v = r.map_err(|e| RolloutError::Env {
        task: task.to_string(),
        message: e.to_string(),
    })?;
    Ok((env, v))
}

/// A boxed episode future.
pub type EpisodeFuture =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<Trajectory>> + Send>>;

/// Runs one episode attempt to its trajectory: in-process over an [`Environment`]
/// ([`in_process`]), or by dispatching the task to an external agent that calls the engine
/// itself (`mtrl-serve`'s agent driver). The scheduler, retries, timeouts and batching are the
/// same for both.
pub trait Driver: Send + Sync {
    fn episode(&self, cx: Arc<EpisodeContext>, task: Task, id: EpisodeId) -> EpisodeFuture;
}

/// Episodes in fresh environments from `envs`, driven by [`run_episode`].
pub fn in_process(envs: crate::runner::EnvFactory) -> Arc<dyn Driver> {
    Arc::new(InProcess(envs))
}

struct InProcess(crate::runner::EnvFactory);

impl Driver for InProcess {
    fn episode(&self, cx: Arc<EpisodeContext>, task: Task, id: EpisodeId) -> EpisodeFuture {
        let envs = self.0.clone();
        Box::pin(async move {
            let env = envs().map_err(|e| RolloutError::Env {
                task: task.id.clone(),
                message: e.to_string(),
            })?;
            run_episode(&cx, env, task, id).await
        })
    }
}

/// Runs `task` in `env` to the end and returns its trajectory.
pub async fn run_episode(
    cx: &EpisodeContext,
    env: Box<dyn Environment>,
    task: Task,
    id: EpisodeId,
) -> Result<Trajectory> {
    let name = task.id.clone();
    let (env, step) = blocking(env, &name, &cx.stats, move |e| e.reset(&task)).await?;
    // Dropped on every way out (done, error, cancelled): the engine may then free the session.
    let _release = Release(&cx.gen, session_key(cx.seed, id));
    let env = turns(cx, env, step, &name, id).await?;
    let (_, traj) = blocking(env, &name, &cx.stats, |e| e.finish()).await?;
    record(&traj);
    Ok(traj)
}

/// The engine session of an episode: its conversation stays resident between model calls.
pub fn session_key(seed: u64, id: EpisodeId) -> u64 {
    mtrl_core::rng::sample_seed(seed, id.group, id.seed_sample(), u64::MAX) ^ u64::from(id.attempt)
}

/// Releases an episode's engine session when dropped.
struct Release<'a>(&'a GenClient, u64);

impl Drop for Release<'_> {
    fn drop(&mut self) {
        self.0.release(self.1);
    }
}

/// The model calls of an episode, until the environment says it is done; returns the environment.
async fn turns(
    cx: &EpisodeContext,
    mut env: Box<dyn Environment>,
    mut step: Step,
    name: &str,
    id: EpisodeId,
) -> Result<Box<dyn Environment>> {
    let mut context: Vec<u32> = Vec::new();
    let mut turn = 0u64;
    while let Step::Continue(obs) = step {
        context.extend_from_slice(&obs.new_tokens);
        if obs.context_len != context.len() {
            return Err(RolloutError::Env {
                task: name.to_string(),
                message: format!(
                    "observation says the context has {} tokens, the episode holds {}",
                    obs.context_len,
                    context.len()
                ),
            });
        }
        let req = GenerationRequest {
            prompt: context.clone(),
            sampling: SamplingParams {
                seed: sample_seed(cx.seed, id.group, id.seed_sample(), turn),
                ..cx.sampling.clone()
            },
            max_new_tokens: obs.max_new_tokens,
            stop_token_ids: cx.stop_token_ids.clone(),
            stop_strings: Vec::new(),
            session: Some(session_key(cx.seed, id)),
        };
        if cx.faults.strikes(FaultKind::EngineError, id, turn) {
            return Err(RolloutError::Engine(format!(
                "injected fault engine_error (task {name}, turn {turn})"
            )));
        }
        let c = cx.gen.generate(req).await?;
        context.extend_from_slice(&c.tokens);
        let action = Action::Tokens {
            logprobs: c.behaviour_logprobs(cx.sampled_logprobs).to_vec(),
            ids: c.tokens,
            versions: c.versions,
        };
        if cx.faults.strikes(FaultKind::SlowTool, id, turn) {
            tokio::time::sleep(cx.faults.slow()).await;
        }
        if cx.faults.strikes(FaultKind::ToolError, id, turn) {
            return Err(RolloutError::Env {
                task: name.to_string(),
                message: format!("injected fault tool_error (turn {turn})"),
            });
        }
        let (e, s) = blocking(env, name, &cx.stats, move |e| e.step(action)).await?;
        env = e;
        step = s;
        turn += 1;
    }
    Ok(env)
}

/// Facade counters of a finished episode (tool names come from the environment's tool set, so
/// the label's values are bounded).
fn record(traj: &Trajectory) {
    metrics::counter!("mtrl_rollout_episodes_total").increment(1);
    metrics::counter!("mtrl_rollout_turns_total").increment(u64::from(traj.turns));
    for (tool, n) in &traj.tools.calls {
        metrics::counter!("mtrl_rollout_tool_calls_total", "tool" => tool.clone())
            .increment(u64::from(*n));
    }
    metrics::counter!("mtrl_rollout_tool_errors_total").increment(u64::from(traj.tools.errors));
}
