//! An RL run with asynchronous rollouts: [`train`] runs (or resumes) a run to its planned step.
//!
//! Wiring (the only place rollout and learner meet): the rollout side (`mtrl-rollout`: engine
//! thread + tokio scheduler + episodes) sends finished groups on a bounded crossbeam channel;
//! the calling thread is the learner: it takes batch k = groups `k·B .. (k+1)·B` in admission
//! order ([`mtrl_rollout::InOrder`]), runs `mtrl_learner::Learner::step`, and hands the new
//! weights (device-side copies) back through [`mtrl_rollout::Rollout::publish`], which bumps the
//! version the admission gate sees. Every `checkpoint.every_steps` steps, at the end, and when
//! [`TrainOptions::stop`] is raised (Ctrl-C / SIGTERM with `watch_signals`), the state is
//! checkpointed (atomically); a rerun resumes from the newest valid one.
//!
//! Bitwise reproducibility (CPU, f32, η = 0): sampling seeds are derived from (seed, group,
//! sample, turn); batches are assembled in admission order; the learner step is deterministic;
//! the dataset cursor after k·B draws is saved. What can break it: decode batches whose
//! composition differs between runs (several multi-token sequences in flight at once) may change
//! logits in the last bits; `rollout_max_concurrency = 1` (or one-token episodes, as the `pick`
//! task's) rules that out.

mod learner_loop;
mod start;

use learner_loop::Loop;
use start::{start, telemetry};

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use mtrl_core::{Config, StepRecord};
use mtrl_learner::{CheckpointManager, CheckpointWriter, Learner};
use mtrl_learner::{Collective, Local, ReduceOptions};
use serde_json::{json, Value};

use crate::data_parallel::{self as dp, Ranks};
use crate::error::{Context, Result, TrainError};
use crate::resume;
use crate::setup;
use crate::telemetry::{RunStatus, Sink};

/// How to run: what the command line says, without its types.
pub struct TrainOptions {
    /// Start from scratch: earlier checkpoints and metrics are moved aside, never deleted.
    pub fresh: bool,
    /// Stop after this step (the LR schedule still follows the config's length).
    pub max_steps: Option<u64>,
    /// Progress bars on stderr (index build, steps).
    pub progress: bool,
    /// Raised from outside to stop the run: it checkpoints and returns (interrupted).
    pub stop: Arc<AtomicBool>,
    /// Raise `stop` on Ctrl-C and SIGTERM (a front end's choice: a test process keeps its
    /// signal handling).
    pub watch_signals: bool,
    /// Sinks beyond the ones the config asks for (records in memory, a front end's display).
    pub sinks: Vec<Box<dyn Sink>>,
    /// The data-parallel ranks this process is one of (`mtrl_dist::init`; [`Local`] alone).
    pub comm: Arc<dyn Collective>,
}

impl Default for TrainOptions {
    fn default() -> TrainOptions {
        TrainOptions {
            fresh: false,
            max_steps: None,
            progress: false,
            stop: Arc::new(AtomicBool::new(false)),
            watch_signals: false,
            sinks: Vec::new(),
            comm: Arc::new(Local),
        }
    }
}

/// What a run did.
#[derive(Debug, Clone)]
pub struct Summary {
    pub steps_done: u64,
    pub resumed_from: Option<u64>,
    pub interrupted: bool,
    /// The steps this process ran.
    pub records: Vec<StepRecord>,
    pub wall_s: f64,
    /// `{prometheus, mlflow: {sent, retried, dropped, …}}` (see [`crate::telemetry`]).
    pub telemetry: Value,
    pub checkpoint_dir: PathBuf,
}

impl Summary {
    /// The JSON `mtrl train` prints.
    pub fn to_json(&self) -> Value {
        let last: Vec<f64> = self
            .records
            .iter()
            .rev()
            .take(5)
            .map(|r| r.reward_mean)
            .collect();
        json!({
            "steps": self.steps_done,
            "resumed_from": self.resumed_from,
            "interrupted": self.interrupted,
            "wall_s": self.wall_s,
            "reward_mean_last5": last.iter().sum::<f64>() / last.len().max(1) as f64,
            "checkpoint_dir": self.checkpoint_dir,
            "telemetry": self.telemetry,
        })
    }
}

/// Runs (or resumes) training until the planned step, `max_steps`, or `opts.stop` is raised.
pub fn train(cfg: &Config, mut opts: TrainOptions) -> Result<Summary> {
    let t_start = Instant::now();
    let ranks = Ranks::new(opts.comm.clone());
    let lead = ranks.lead();
    let cfg = &dp::rank_config(cfg, &ranks)?;
    mtrl_core::trace!("mtrl train: {}", cfg.source.display());
    let parts = setup::model_parts(cfg)?;
    let data = setup::load_data(cfg)?;
    mtrl_core::trace!("tokenizer and task files loaded");
    let planned = setup::planned_steps(cfg, data.tasks);
    let until = opts.max_steps.map_or(planned, |m| m.min(planned));
    let mgr = CheckpointManager::new(&cfg.checkpoint.dir, cfg.checkpoint.keep_last);
    // Rank 0 verifies (hashes) the checkpoints once, here; the others once rank 0 has tidied.
    let mut verified = None;
    if lead {
        if opts.fresh {
            resume::clear_run(cfg, &mgr)?;
        }
        let cleaned = mgr.clean_stale()?;
        if cleaned > 0 {
            eprintln!("removed {cleaned} unfinished checkpoint folder(s) of an interrupted save");
        }
        // Folders newer than the newest valid one that fail verification leave the listing, so
        // neither rotation nor a later resume meets them again.
        let (latest, rejected) = mgr.latest_valid()?;
        let moved = mgr.set_aside(&rejected)?;
        verified = Some(latest);
        for (r, to) in rejected.iter().zip(&moved) {
            eprintln!(
                "checkpoint {} is unusable ({}); moved to {}, trying an older one",
                r.path.display(),
                r.reason,
                to.display()
            );
        }
    }
    // The other ranks read the checkpoint folder once rank 0 has tidied it.
    ranks.arrive("the run's start", false)?;
    let latest = match verified {
        Some(latest) => latest,
        None => mgr.latest_valid()?.0,
    };
    let initial = setup::initial_policy(cfg, &parts)?;
    mtrl_core::trace!(
        "policy loaded on {:?} ({:?})",
        initial.device(),
        initial.dtype()
    );
    let reference = (cfg.algorithm.kl_coef > 0.0)
        .then(|| setup::copy_policy(&initial))
        .transpose()?;
    let (s, policy, opt, mixer) = start(cfg, &data, initial, latest.as_deref(), &parts, lead)?;
    std::fs::create_dir_all(&cfg.checkpoint.dir)
        .with_context(|| format!("creating {}", cfg.checkpoint.dir.display()))?;
    mtrl_core::trace!("start state ready (step {})", s.state.step);
    let mut telemetry = telemetry(cfg, &mut opts, &s, until, lead)?;
    let step_cfg = setup::step_config(cfg, planned)?;
    let reduce = ReduceOptions {
        bucket_bytes: (cfg.distributed.bucket_mb * 1048576.0) as usize,
    };
    let learner = Learner::new(policy, reference, opt, step_cfg, s.state.policy_version)
        .with_collective(ranks.comm.clone(), reduce);
    let mut run = Loop {
        cfg,
        parts: &parts,
        mgr: &mgr,
        learner,
        start: s,
        t_start,
        until,
        records: Vec::new(),
        writer: (cfg.checkpoint.background && lead)
            .then(|| CheckpointWriter::spawn(mgr.clone()))
            .transpose()?,
        checkpoint_s: 0.0,
        validation_tasks: data.sets.validation.len(),
        skipped_in_a_row: 0,
        fault: mtrl_dist::RankFault::from_env().map_err(|e| TrainError::Msg(e.to_string()))?,
        ranks,
    };
    let out = run.go(&data, mixer, &opts, &mut telemetry);
    let status = match &out {
        Ok(true) => RunStatus::Killed,
        Ok(false) => RunStatus::Finished,
        Err(_) => RunStatus::Failed,
    };
    let telemetry = telemetry.finish(status)?;
    let interrupted = out?;
    if interrupted && lead {
        eprintln!(
            "interrupted: checkpoint of step {} written",
            run.start.state.step
        );
    }
    Ok(Summary {
        steps_done: run.start.state.step,
        resumed_from: run.start.resumed_from,
        interrupted,
        records: run.records,
        wall_s: t_start.elapsed().as_secs_f64(),
        telemetry,
        checkpoint_dir: cfg.checkpoint.dir.clone(),
    })
}

/// Runs `then` on the first Ctrl-C or SIGTERM while the guard lives (see [`crate::signals`]).
pub(crate) use crate::signals::on_signal;
