//! `mtrl train --config FILE [--fresh] [--max-steps N]`: RL training with asynchronous rollouts.
//!
//! Wiring (the only place rollout and learner meet): the rollout side (`mtrl-rollout`: engine
//! thread + tokio scheduler + episodes) sends finished groups on a bounded crossbeam channel;
//! this thread is the learner: it takes batch k = groups `k·B .. (k+1)·B` in admission order
//! ([`mtrl_rollout::InOrder`]), runs `mtrl_learner::Learner::step`, and hands the new weights
//! (device-side copies) back through [`mtrl_rollout::Rollout::publish`], which bumps the version
//! the admission gate sees. Every `checkpoint.every_steps` steps, at the end, and on Ctrl-C /
//! SIGTERM, the state is checkpointed (atomically); a rerun resumes from the newest valid one.
//!
//! Bitwise reproducibility (CPU, f32, η = 0): sampling seeds are derived from (seed, group,
//! sample, turn); batches are assembled in admission order; the learner step is deterministic;
//! the dataset cursor after k·B draws is saved. What can break it: decode batches whose
//! composition differs between runs (several multi-token sequences in flight at once) may change
//! logits in the last bits; `rollout_max_concurrency = 1` (or one-token episodes) rules that out.

mod report;
pub mod setup;

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use mtrl_core::Config;
use mtrl_learner::{AdamW, AdamWConfig, CheckpointManager, Learner, TrainerState};
use mtrl_model::{Engine, Policy, SamplingParams};
use mtrl_rollout::{InOrder, Rollout, RolloutError, RolloutSettings};
use serde_json::{json, Value};

use crate::telemetry::mlflow::RunStatus;
use crate::telemetry::Telemetry;

#[derive(clap::Args, Debug)]
pub struct TrainArgs {
    /// The run's TOML config ([model], [data], [rollout], [algorithm], [train], [checkpoint], …).
    /// Without it, the default job runs: the embedded `configs/demo.toml` pipeline (warm start,
    /// RL, evaluation; see `mtrl demo`).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Start from scratch instead of resuming: earlier checkpoints and metrics in
    /// `checkpoint.dir` are moved into `previous-<unix time>/`, never deleted.
    #[arg(long)]
    pub fresh: bool,
    /// Stop after this step (the LR schedule still follows the config's length).
    #[arg(long)]
    pub max_steps: Option<u64>,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
}

/// What a run did (printed as JSON at the end).
pub struct Summary {
    pub steps_done: u64,
    pub resumed_from: Option<u64>,
    pub interrupted: bool,
    pub records: Vec<Value>,
    pub wall_s: f64,
    /// `{prometheus, mlflow: {sent, retried, dropped, …}}` (see `crate::telemetry`).
    pub telemetry: Value,
}

pub fn run(args: &TrainArgs) -> Result<()> {
    let Some(path) = &args.config else {
        return super::demo::run(&super::demo::DemoArgs {
            max_steps: args.max_steps,
            quiet: args.quiet,
            ..super::demo::DemoArgs::default()
        });
    };
    let cfg = Config::load(path)?;
    let stop = Arc::new(AtomicBool::new(false));
    let s = train(&cfg, args, stop)?;
    let last: Vec<f64> = s
        .records
        .iter()
        .rev()
        .take(5)
        .filter_map(|r| r["reward_mean"].as_f64())
        .collect();
    let out = json!({
        "steps": s.steps_done,
        "resumed_from": s.resumed_from,
        "interrupted": s.interrupted,
        "wall_s": s.wall_s,
        "reward_mean_last5": last.iter().sum::<f64>() / last.len().max(1) as f64,
        "checkpoint_dir": cfg.checkpoint.dir,
        "telemetry": s.telemetry,
    });
    println!("{out}");
    Ok(())
}

fn metrics_path(cfg: &Config) -> PathBuf {
    cfg.checkpoint.dir.join("metrics.jsonl")
}

/// `--fresh`: moves the run's checkpoints and metrics into `checkpoint.dir/previous-<unix time>/`
/// (never deletes them: a mistyped flag must not lose a run).
fn clear_run(cfg: &Config, mgr: &CheckpointManager) -> Result<()> {
    let mut old: Vec<std::path::PathBuf> = mgr.list()?.into_iter().map(|(_, p)| p).collect();
    let m = metrics_path(cfg);
    if m.exists() {
        old.push(m);
    }
    let t = cfg.checkpoint.dir.join("trajectories");
    if t.exists() {
        old.push(t);
    }
    if old.is_empty() {
        return Ok(());
    }
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let aside = mgr.dir().join(format!("previous-{secs}"));
    std::fs::create_dir_all(&aside).with_context(|| format!("creating {}", aside.display()))?;
    for p in &old {
        if let Some(name) = p.file_name() {
            std::fs::rename(p, aside.join(name))
                .with_context(|| format!("moving {} into {}", p.display(), aside.display()))?;
        }
    }
    eprintln!(
        "--fresh: moved {} earlier checkpoint files into {}",
        old.len(),
        aside.display()
    );
    Ok(())
}

fn check_resume_keys(cfg: &Config, st: &TrainerState, ckpt: &std::path::Path) -> Result<()> {
    let now = setup::resume_keys(cfg);
    let mut changed = Vec::new();
    for (k, v) in &now {
        match st.resume_keys.get(k) {
            Some(old) if old != v => changed.push(format!("{k} (was `{old}`, now `{v}`)")),
            None => changed.push(format!("{k} (not in the checkpoint)")),
            _ => {}
        }
    }
    if !changed.is_empty() {
        bail!(
            "cannot resume from {}: the config changed keys that make resuming meaningless: {}; \
             restore them, pick another checkpoint.dir, or pass --fresh",
            ckpt.display(),
            changed.join(", ")
        );
    }
    Ok(())
}

/// Runs (or resumes) training until the planned step, `--max-steps`, or `stop` is raised.
pub fn train(cfg: &Config, args: &TrainArgs, stop: Arc<AtomicBool>) -> Result<Summary> {
    let t_start = Instant::now();
    let parts = setup::model_parts(cfg)?;
    let data = setup::load_data(cfg)?;
    let b = cfg.train.global_batch_size;
    let planned = setup::planned_steps(cfg, data.tasks);
    let until = args.max_steps.map_or(planned, |m| m.min(planned));
    let mgr = CheckpointManager::new(&cfg.checkpoint.dir, cfg.checkpoint.keep_last);
    if args.fresh {
        clear_run(cfg, &mgr)?;
    }
    let (latest, rejected) = mgr.latest_valid()?;
    for r in &rejected {
        eprintln!(
            "checkpoint {} is unusable ({}); trying an older one",
            r.path.display(),
            r.reason
        );
    }
    let initial = setup::initial_policy(cfg, &parts)?;
    let reference = (cfg.algorithm.kl_coef > 0.0)
        .then(|| setup::copy_policy(&initial))
        .transpose()?;
    let mut state = TrainerState {
        config_hash: setup::config_hash(cfg),
        resume_keys: setup::resume_keys(cfg),
        ..TrainerState::default()
    };
    let mut shadow = data.mixer()?;
    let mut mixer = data.mixer()?;
    let (policy, opt, resumed_from) = match &latest {
        Some(ckpt) => {
            let st = CheckpointManager::load_state(ckpt)?;
            check_resume_keys(cfg, &st, ckpt)?;
            let policy = Policy::load(&ckpt.join("policy"), parts.dtype, &parts.device)
                .with_context(|| format!("loading the policy of {}", ckpt.display()))?;
            let opt = AdamW::load(ckpt, &parts.device)?;
            let cursor = serde_json::from_value(st.data_cursor.clone())
                .with_context(|| format!("the dataset cursor of {}", ckpt.display()))?;
            shadow.restore(cursor)?;
            mixer.restore(shadow.cursor())?;
            eprintln!("resuming from {} (step {})", ckpt.display(), st.step);
            let step = st.step;
            state.step = st.step;
            state.policy_version = st.policy_version;
            state.metrics = st.metrics;
            (policy, opt, Some(step))
        }
        None => {
            let opt = AdamW::new(AdamWConfig {
                weight_decay: cfg.train.weight_decay,
                ..AdamWConfig::default()
            });
            (setup::copy_policy(&initial)?, opt, None)
        }
    };
    drop(initial);
    std::fs::create_dir_all(&cfg.checkpoint.dir)
        .with_context(|| format!("creating {}", cfg.checkpoint.dir.display()))?;
    let mut telemetry = Telemetry::start(cfg, latest.is_some())?;
    let mut log = std::fs::File::create(metrics_path(cfg))?;
    let trajs = cfg
        .logging
        .trajectories
        .then(|| {
            let opts = mtrl_eval::LogOptions::from_config(&cfg.logging);
            mtrl_eval::TrajectoryLog::open(&cfg.checkpoint.dir.join("trajectories"), opts)
        })
        .transpose()?;
    for r in &state.metrics {
        writeln!(log, "{r}")?;
    }
    let step_cfg = setup::step_config(cfg, planned)?;
    let mut learner = Learner::new(policy, reference, opt, step_cfg, state.policy_version);
    let engine = Engine::new(
        setup::copy_policy(&learner.policy)?,
        None,
        learner.version(),
        cfg.rollout.max_batch,
    );
    let envs = setup::env_factory(cfg, &data, parts.codec.clone(), args.quiet)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    watch_signals(&rt, stop.clone());
    let first_group = state.step * b as u64;
    let settings = RolloutSettings {
        group_size: cfg.rollout.group_size,
        max_concurrency: cfg.rollout.rollout_max_concurrency,
        global_batch_size: b,
        max_staleness: cfg.algorithm.max_staleness,
        sampling: SamplingParams {
            temperature: cfg.rollout.temperature,
            top_p: cfg.rollout.top_p,
            top_k: cfg.rollout.top_k,
            seed: 0,
        },
        seed: cfg.train.seed,
        stop_token_ids: parts.codec.stop_token_ids(),
        first_group,
        version: learner.version(),
        end_group: Some(until * b as u64),
    };
    let (rollout, rx) = Rollout::start(engine, envs, Box::new(mixer), settings, rt.handle())?;
    let mut batches = InOrder::new(rx, first_group);
    let bar = progress(args.quiet, until, state.step);
    let mut records = Vec::new();
    let mut last_saved = state.step;
    let mut interrupted = false;
    let result = (|| -> Result<()> {
        while state.step < until {
            let t_wait = Instant::now();
            let before = rollout.counters();
            let batch = loop {
                if stop.load(Ordering::SeqCst) {
                    break None;
                }
                match batches.next_batch(b, Duration::from_millis(200)) {
                    Ok(Some(batch)) => break Some(batch),
                    Ok(None) => {
                        if let Some(e) = rollout.failure() {
                            return Err(e.into());
                        }
                    }
                    Err(e) => return Err(rollout.failure().unwrap_or(e).into()),
                }
            };
            let Some(batch) = batch else {
                interrupted = true;
                break;
            };
            let wait_s = t_wait.elapsed().as_secs_f64();
            let m = learner.step(&batch)?;
            let t_pub = Instant::now();
            rollout.publish(learner.version(), learner.weights()?)?;
            let publish_s = t_pub.elapsed().as_secs_f64();
            for _ in 0..b {
                shadow.next_task();
            }
            state.step += 1;
            state.policy_version = learner.version();
            if let Some(t) = &trajs {
                t.send_groups(mtrl_eval::Kind::Train, state.step, &batch);
            }
            let timing = report::Timing {
                step_wall_s: t_wait.elapsed().as_secs_f64(),
                elapsed_s: t_start.elapsed().as_secs_f64(),
                publish_s,
                learn_wait_s: wait_s,
            };
            let rec = report::step_record(
                state.step,
                &batch,
                &m,
                &before,
                &rollout.counters(),
                &timing,
            );
            writeln!(log, "{rec}")?;
            telemetry.step(&rec);
            bar.set_position(state.step);
            bar.set_message(format!(
                "reward {:.3} loss {:+.4}",
                rec["reward_mean"].as_f64().unwrap_or(0.0),
                m.loss
            ));
            state.metrics.push(rec.clone());
            records.push(rec);
            let every = cfg.checkpoint.every_steps;
            if every > 0 && state.step.is_multiple_of(every) {
                save(&mgr, &learner, &mut state, &shadow, parts.dtype)?;
                last_saved = state.step;
            }
        }
        Ok(())
    })();
    bar.finish_and_clear();
    match trajs.map(|t| t.close()) {
        Some(Ok(s)) if s.dropped > 0 => eprintln!("trajectory log: {} dropped", s.dropped),
        Some(Err(e)) => eprintln!("warning: trajectory log: {e}"),
        _ => {}
    }
    let shut = rt.block_on(rollout.shutdown());
    result?;
    match shut {
        Err(RolloutError::Cancelled) | Ok(()) => {}
        Err(e) => return Err(e.into()),
    }
    if state.step > last_saved || latest.is_none() && state.step == 0 {
        save(&mgr, &learner, &mut state, &shadow, parts.dtype)?;
    }
    if interrupted {
        eprintln!("interrupted: checkpoint of step {} written", state.step);
    }
    let telemetry = telemetry.finish(if interrupted {
        RunStatus::Killed
    } else {
        RunStatus::Finished
    });
    Ok(Summary {
        steps_done: state.step,
        resumed_from,
        interrupted,
        records,
        wall_s: t_start.elapsed().as_secs_f64(),
        telemetry,
    })
}

fn save(
    mgr: &CheckpointManager,
    learner: &Learner,
    state: &mut TrainerState,
    shadow: &mtrl_env::Mixer,
    dtype: candle_core::DType,
) -> Result<()> {
    state.data_cursor = serde_json::to_value(shadow.cursor())?;
    state.rng = json!({
        "sampling": "per generation: hash(train.seed, group, sample, turn); no stateful RNG",
        "data": "dataset cursor",
    });
    mgr.save(&learner.policy, dtype, &learner.opt, state)?;
    Ok(())
}

fn progress(quiet: bool, total: u64, start: u64) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("step {pos}/{len} [{bar:30}] {msg} eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_position(start);
    bar
}

/// Ctrl-C and SIGTERM raise `stop`; the learner loop then checkpoints and returns.
fn watch_signals(rt: &tokio::runtime::Runtime, stop: Arc<AtomicBool>) {
    rt.spawn(async move {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let Ok(mut term) = signal(SignalKind::terminate()) else {
                return;
            };
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
        stop.store(true, Ordering::SeqCst);
    });
}
