//! `mtrl bench agent`: the same episodes in-process and through the user's agent, side by side
//! in one process — episodes/s both ways and the ratio, the policy endpoint's per-call latency
//! (p50/p99), and a check that every external episode came back (none lost) and how many equal
//! their in-process twins bit for bit (same seeds, so a faithful agent reproduces the in-process
//! trajectory up to the last bits of batch-shape-dependent kernels — the figure is printed next to
//! the in-process pass repeated, which is subject to the same effect).
//!
//! The workload: the config's test tasks, each sampled `per_task` times with the config's
//! `[rollout]` sampling, at most `concurrency` episodes in flight, on the given policy. The agent
//! is whatever `--agent-url` serves (e.g. `examples/agents/plain_agent.py`), so the external side
//! includes the agent's own cost (Python, HTTP both ways, the tool service).

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use mtrl_core::{Config, Trajectory};
use mtrl_model::Engine;
use mtrl_rollout::engine_thread::EngineThread;
use mtrl_rollout::episode::{in_process, Driver, EnvStats, EpisodeContext};
use mtrl_rollout::faults::Faults;
use serde_json::{json, Value};

use crate::agent::AgentHost;
use crate::error::{Result, TrainError};

/// What to run.
pub struct AgentBench<'a> {
    pub model: &'a Path,
    pub per_task: usize,
    pub concurrency: usize,
    pub limit: Option<usize>,
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// Runs `tasks × per_task` episodes through `driver`; (trajectories, wall seconds).
fn pass(
    driver: Arc<dyn Driver>,
    cx: &Arc<EpisodeContext>,
    tasks: &[mtrl_env::Task],
    per_task: usize,
    concurrency: usize,
    rt: &tokio::runtime::Runtime,
) -> Result<(Vec<Trajectory>, f64)> {
    let t0 = Instant::now();
    let out = rt.block_on(mtrl_eval::runner::run_all(
        cx.clone(),
        driver,
        tasks,
        per_task,
        0,
        1,
        concurrency,
    ))?;
    Ok((
        out.into_iter().flatten().collect(),
        t0.elapsed().as_secs_f64(),
    ))
}

fn figures(trajs: &[Trajectory], wall: f64) -> Value {
    let calls: u64 = trajs.iter().map(|t| u64::from(t.turns)).sum();
    json!({
        "episodes": trajs.len(),
        "wall_s": wall,
        "episodes_per_s": trajs.len() as f64 / wall,
        "model_calls": calls,
        "calls_per_s": calls as f64 / wall,
        "failed": trajs.iter().filter(|t| t.failure.is_some()).count(),
        "reward_mean": trajs.iter().map(|t| t.reward).sum::<f64>() / trajs.len().max(1) as f64,
    })
}

/// The same trajectory, as far as training is concerned.
fn same(a: &Trajectory, b: &Trajectory) -> bool {
    a.task_id == b.task_id
        && a.tokens == b.tokens
        && a.loss_mask == b.loss_mask
        && a.logprobs == b.logprobs
        && a.versions == b.versions
        && a.reward == b.reward
        && a.failure == b.failure
}

/// Runs the comparison; `cfg` must have `[rollout] environment = "agent"`.
pub fn bench_agent(cfg: &Config, b: &AgentBench<'_>) -> Result<Value> {
    if cfg.rollout.agent.is_none() {
        return Err(TrainError::msg(format!(
            "{}: mtrl bench agent needs [rollout] environment = \"agent\" and agent_url",
            cfg.source.display()
        )));
    }
    let sets = mtrl_eval::prepare_test_sets(cfg, b.limit)?;
    let tasks: Vec<mtrl_env::Task> = sets.iter().flat_map(|s| s.tasks.clone()).collect();
    let settings = mtrl_eval::EvalSettings::from_config(cfg, 0)?;
    let (policy, codec) = mtrl_eval::load_model(
        b.model,
        settings.tokenizer.as_deref(),
        settings.dtype,
        &settings.device,
    )?;
    let window = policy.config().max_position_embeddings;
    let engine = EngineThread::spawn(Engine::new(policy, None, 0, b.concurrency.max(1))?)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let data = crate::setup::load_data(cfg)?;
    let envs = crate::setup::env_factory(cfg, &data, codec.clone(), true, window)?;
    let host =
        AgentHost::start(cfg, "bench", window)?.ok_or_else(|| TrainError::msg("no agent"))?;
    let cx = Arc::new(EpisodeContext {
        gen: engine.client.clone(),
        sampling: settings.sampling.clone(),
        seed: settings.seed,
        stop_token_ids: codec.stop_token_ids(),
        stats: Arc::new(EnvStats::default()),
        faults: Arc::new(Faults::none()),
        sampled_logprobs: true,
    });
    // Warm-up (index pages, the agent's imports and connections), then the measured passes.
    let few = &tasks[..tasks.len().min(4)];
    pass(host.driver(codec.clone()), &cx, few, 1, b.concurrency, &rt)?;
    host.take_latencies();
    let (inproc, inproc_s) = pass(
        in_process(envs.clone()),
        &cx,
        &tasks,
        b.per_task,
        b.concurrency,
        &rt,
    )?;
    // The same pass again: how many episodes repeat bit for bit in-process alone (decode batches
    // of other compositions change the last bits of the logits, and a sample may flip).
    let (again, _) = pass(
        in_process(envs),
        &cx,
        &tasks,
        b.per_task,
        b.concurrency,
        &rt,
    )?;
    let (http, http_s) = pass(
        host.driver(codec.clone()),
        &cx,
        &tasks,
        b.per_task,
        b.concurrency,
        &rt,
    )?;
    let mut lat = host.take_latencies();
    let identical = inproc.iter().zip(&http).filter(|(a, b)| same(a, b)).count();
    let expected = tasks.len() * b.per_task;
    let out = json!({
        "tasks": tasks.len(),
        "per_task": b.per_task,
        "concurrency": b.concurrency,
        "in_process": figures(&inproc, inproc_s),
        "agent": figures(&http, http_s),
        "agent_over_in_process_episodes_per_s": inproc_s / http_s,
        "lost_episodes": expected - http.len(),
        "identical_to_in_process": identical,
        "in_process_repeat_identical": inproc.iter().zip(&again).filter(|(a, b)| same(a, b)).count(),
        "call_ms_p50": pct(&mut lat, 0.5),
        "call_ms_p99": pct(&mut lat, 0.99),
        "calls_timed": lat.len(),
    });
    host.shutdown();
    engine.shutdown()?;
    Ok(out)
}
