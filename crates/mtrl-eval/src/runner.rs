//! Running episodes for an evaluation, through the training code paths only.
//!
//! A policy is served by `mtrl-rollout`'s engine thread ([`EngineThread`], one per policy, the
//! same batched engine as training) and every episode is `mtrl_rollout::episode::run_episode` in
//! a token-mode `SearchEnv` — the loop training uses, with its tools, budgets and reward. Only
//! the scheduling differs from training: no staleness gate and no learner, just every task's
//! episodes at once under a semaphore of `max_concurrency` permits. The greedy pass over a
//! benchmark runs first and alone (so its wall time is the `s/task` figure), then the `n` sampled
//! attempts of every task. Sampling seeds are `sample_seed(seed, group, sample, turn)` with group
//! = the task's index across all benchmarks, sample 0 = greedy and 1..=n the attempts, so results
//! do not depend on which episodes shared a decode batch (given the same logits).
//!
//! Scripted baselines (a `ScriptedAgent` or a fixed teacher strategy) run `mtrl_env::run_episode`
//! in a text-mode `SearchEnv` ([`run_agent`]), as `mtrl rollout` does.

use std::sync::Arc;
use std::time::Instant;

use mtrl_core::{ChatCodec, EnvConfig, Trajectory};
use mtrl_env::{Agent, SearchEnv, Task};
use mtrl_model::{Engine, Policy, SamplingParams};
use mtrl_rollout::engine_thread::EngineThread;
use mtrl_rollout::episode::{EnvStats, EpisodeContext, EpisodeId};
use mtrl_rollout::{in_process, Driver, EnvFactory, RolloutError};
use mtrl_search::SearchIndex;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::error::{EvalError, Result};
use crate::tasks::TestSet;

/// The episodes of one model on one benchmark.
pub struct Episodes {
    /// Per task, in file order.
    pub greedy: Vec<Trajectory>,
    /// Per task, the sampled attempts (empty when none were asked for).
    pub samples: Vec<Vec<Trajectory>>,
    /// Wall time of the greedy pass.
    pub greedy_s: f64,
}

/// The rollout driver of a policy with the given codec and context window (external agents).
pub type AgentDrivers = Arc<dyn Fn(Arc<dyn ChatCodec>, usize) -> Arc<dyn Driver> + Send + Sync>;

/// How a policy's episodes are run.
pub struct PolicyRun<'a> {
    pub label: &'a str,
    pub env: EnvConfig,
    pub index: Arc<SearchIndex>,
    pub codec: Arc<dyn ChatCodec>,
    /// Sampling of the attempts (the seed is replaced per generation).
    pub sampling: SamplingParams,
    /// Attempts per task.
    pub samples: usize,
    pub seed: u64,
    pub max_concurrency: usize,
    pub max_batch: usize,
    /// Episodes through the user's agent instead of the in-process environment.
    pub agent: Option<AgentDrivers>,
}

fn episode_error(model: &str, benchmark: &str, e: impl std::fmt::Display) -> EvalError {
    EvalError::Episode {
        model: model.to_string(),
        benchmark: benchmark.to_string(),
        message: e.to_string(),
    }
}

/// Runs `per_task` episodes of every task concurrently (at most `max_concurrency` at once);
/// returns them by task, in sample order. The first error aborts the rest. Training's validation
/// pass runs its greedy episodes through this too.
pub async fn run_all(
    cx: Arc<EpisodeContext>,
    envs: Arc<dyn Driver>,
    tasks: &[Task],
    per_task: usize,
    first_group: u64,
    first_sample: u64,
    max_concurrency: usize,
) -> std::result::Result<Vec<Vec<Trajectory>>, RolloutError> {
    let sem = Arc::new(Semaphore::new(max_concurrency.max(1)));
    let mut set = JoinSet::new();
    for (i, task) in tasks.iter().enumerate() {
        for s in 0..per_task {
            let (cx, envs, sem, task) = (cx.clone(), envs.clone(), sem.clone(), task.clone());
            let id = EpisodeId::new(first_group + i as u64, first_sample + s as u64);
            set.spawn(async move {
                let _permit = sem
                    .acquire_owned()
                    .await
                    .map_err(|_| RolloutError::Cancelled)?;
                let t = envs.episode(cx, task, id).await?;
                Ok::<_, RolloutError>((i, s, t))
            });
        }
    }
    let mut out: Vec<Vec<Option<Trajectory>>> = vec![vec![None; per_task]; tasks.len()];
    while let Some(joined) = set.join_next().await {
        let r = joined.map_err(|e| RolloutError::Internal(format!("episode task: {e}")));
        match r.and_then(|r| r) {
            Ok((i, s, t)) => out[i][s] = Some(t),
            Err(e) => {
                // Dropping the set aborts the rest.
                set.abort_all();
                return Err(e);
            }
        }
    }
    Ok(out
        .into_iter()
        .map(|v| v.into_iter().flatten().collect())
        .collect())
}

/// Runs `policy` on every benchmark: greedy pass, then the sampled attempts. `first_group` is
/// the group index of the first task of each set.
pub fn run_policy(
    run: &PolicyRun<'_>,
    policy: Policy,
    sets: &[(u64, &TestSet)],
    rt: &tokio::runtime::Runtime,
) -> Result<Vec<Episodes>> {
    let mut env = run.env.clone();
    // Beyond the model's window the engine refuses the request and the whole run would stop;
    // capped, such an episode ends as context_overflow like any other budget.
    let window = policy.config().max_position_embeddings;
    env.max_context_tokens = env.max_context_tokens.min(window);
    let engine = Engine::new(policy, None, 0, run.max_batch)
        .map_err(|e| episode_error(run.label, "-", e))?;
    let engine = EngineThread::spawn(engine).map_err(|e| episode_error(run.label, "-", e))?;
    let (index, codec) = (run.index.clone(), run.codec.clone());
    SearchEnv::standard(env.clone(), index.clone())
        .map_err(|e| episode_error(run.label, "-", e))?;
    let envs: Arc<dyn Driver> = match &run.agent {
        Some(drivers) => drivers(codec, window),
        None => {
            let envs: EnvFactory = Arc::new(move || {
                let e = SearchEnv::standard(env.clone(), index.clone())?;
                Ok(Box::new(e.with_codec(codec.clone())) as _)
            });
            in_process(envs)
        }
    };
    let context = |sampling: SamplingParams| {
        Arc::new(EpisodeContext {
            gen: engine.client.clone(),
            sampling,
            seed: run.seed,
            stop_token_ids: run.codec.stop_token_ids(),
            stats: Arc::new(EnvStats::default()),
            faults: Arc::new(mtrl_rollout::faults::Faults::none()),
            sampled_logprobs: true,
        })
    };
    let (greedy_cx, sampled_cx) = (
        context(SamplingParams::greedy()),
        context(run.sampling.clone()),
    );
    let mut out = Vec::with_capacity(sets.len());
    let result = (|| -> Result<()> {
        for (first_group, set) in sets {
            let fail = |e: RolloutError| episode_error(run.label, &set.name, e);
            let t0 = Instant::now();
            let greedy = rt
                .block_on(run_all(
                    greedy_cx.clone(),
                    envs.clone(),
                    &set.tasks,
                    1,
                    *first_group,
                    0,
                    run.max_concurrency,
                ))
                .map_err(fail)?;
            let greedy_s = t0.elapsed().as_secs_f64();
            let samples = match run.samples {
                0 => Vec::new(),
                n => rt
                    .block_on(run_all(
                        sampled_cx.clone(),
                        envs.clone(),
                        &set.tasks,
                        n,
                        *first_group,
                        1,
                        run.max_concurrency,
                    ))
                    .map_err(fail)?,
            };
            out.push(Episodes {
                greedy: greedy.into_iter().flatten().collect(),
                samples,
                greedy_s,
            });
        }
        Ok(())
    })();
    let shut = engine.shutdown();
    result?;
    shut.map_err(|e| episode_error(run.label, "-", e))?;
    Ok(out)
}

/// Runs a deterministic text-mode agent once per task.
pub fn run_agent(
    label: &str,
    agent: &mut dyn Agent,
    env: &EnvConfig,
    index: Arc<SearchIndex>,
    set: &TestSet,
) -> Result<Episodes> {
    let fail = |e: mtrl_env::EnvError| episode_error(label, &set.name, e);
    let mut senv = SearchEnv::standard(env.clone(), index).map_err(fail)?;
    let t0 = Instant::now();
    let greedy = set
        .tasks
        .iter()
        .map(|t| mtrl_env::run_episode(&mut senv, agent, t).map_err(fail))
        .collect::<Result<Vec<_>>>()?;
    Ok(Episodes {
        greedy,
        samples: Vec::new(),
        greedy_s: t0.elapsed().as_secs_f64(),
    })
}
