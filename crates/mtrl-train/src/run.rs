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

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mtrl_core::record::parse_value;
use mtrl_core::{Config, StepRecord};
use mtrl_learner::{AdamW, AdamWConfig, CheckpointManager, Learner, TrainerState};
use mtrl_learner::{Collective, Local, ReduceOptions};
use mtrl_model::{Engine, Policy, SamplingParams};
use mtrl_rollout::{InOrder, Rollout, RolloutError, RolloutSettings};
use serde_json::{json, Value};

use crate::agent::AgentHost;
use crate::bail;
use crate::data_parallel::{self as dp, Ranks};
use crate::error::{Context, Result, TrainError};
use crate::resume::{self, metrics_path};
use crate::setup::{self, ModelParts};
use crate::step_record::{step_record, Timing};
use crate::telemetry::{JsonlSink, MlflowSink, ProgressSink, PrometheusSink, Record, RunStatus};
use crate::telemetry::{Sink, Telemetry};
use crate::validate::{write_best, Best, Validator};
use mtrl_learner::checkpoint_writer::Then;
use mtrl_learner::{CheckpointJob, CheckpointWriter, LearnerError};
use mtrl_rollout::{Faults, FAULTS_VAR};

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

/// `[train]`'s AdamW settings.
fn adamw_config(cfg: &Config) -> AdamWConfig {
    let ex = &cfg.train.weight_decay_exclude;
    let keep = |c: &str| !ex.iter().any(|e| e == c);
    AdamWConfig {
        weight_decay: cfg.train.weight_decay,
        decay_norms: keep("norms"),
        decay_biases: keep("biases"),
        decay_embeddings: keep("embeddings"),
        ..AdamWConfig::default()
    }
}

/// Where a run starts: a fresh policy and optimizer, or a checkpoint's.
struct Start {
    state: TrainerState,
    /// The mixer that mirrors the trained batches (its cursor is checkpointed).
    shadow: mtrl_env::Mixer,
    resumed_from: Option<u64>,
}

/// What [`start`] hands the run: where it starts, the policy and optimizer to train, and the
/// mixer rollouts draw from (ahead of the shadow mixer by the batches in flight).
type Started = (Start, Policy, AdamW, mtrl_env::Mixer);

/// Refuses a checkpoint whose step history is not of this build's record format (the history
/// is written back to `metrics.jsonl` as typed records).
fn check_history(st: &TrainerState, ckpt: &Path) -> Result<()> {
    for (i, v) in st.metrics.iter().enumerate() {
        parse_value::<StepRecord>(v.clone()).map_err(|m| {
            TrainError::msg(format!(
                "{}: step record {} of trainer.json: {m}; resume with the mtrl that wrote it, \
                 or pass --fresh",
                ckpt.display(),
                i + 1
            ))
        })?;
    }
    Ok(())
}

/// The policy of a checkpoint's `policy/` folder: an HF checkpoint, or with LoRA the adapter
/// (PEFT's files, every tensor of the config's spec) written onto `initial`'s.
fn resume_policy(cfg: &Config, initial: Policy, dir: &Path, parts: &ModelParts) -> Result<Policy> {
    let Some(l) = &cfg.lora else {
        drop(initial);
        if mtrl_model::lora::peft::is_adapter_dir(dir) {
            bail!(
                "{} holds a LoRA adapter: add the [lora] section the run was trained with",
                dir.display()
            );
        }
        return Ok(Policy::load(dir, parts.dtype, &parts.device)?);
    };
    let files = mtrl_model::lora::peft::load(dir, parts.dtype, &parts.device)?;
    let want = setup::lora_spec(l);
    let mut targets = (files.spec.targets.clone(), want.targets.clone());
    targets.0.sort();
    targets.1.sort();
    let same = files.spec.rank == want.rank
        && files.spec.alpha == want.alpha
        && files.spec.rslora == want.rslora
        && targets.0 == targets.1;
    if !same {
        bail!(
            "{}: the adapter is rank {} / alpha {} / rslora {} on {}, [lora] says {} / {} / {} on {}",
            dir.display(),
            files.spec.rank,
            files.spec.alpha,
            files.spec.rslora,
            targets.0.join(","),
            want.rank,
            want.alpha,
            want.rslora,
            targets.1.join(",")
        );
    }
    mtrl_model::lora::check_tensors(initial.config(), &want, &files.tensors)
        .with_context(|| format!("the adapter in {}", dir.display()))?;
    let mut p = initial;
    p.set_weights(&files.tensors.into_iter().collect())?;
    Ok(p)
}

/// A fresh start from `initial`, or the newest valid checkpoint `latest` (then `initial` is
/// dropped: it was loaded to check that the tokenizer fits the architecture; with LoRA it is the
/// frozen base the checkpoint's adapter goes on).
fn start(
    cfg: &Config,
    data: &setup::Data,
    initial: Policy,
    latest: Option<&Path>,
    parts: &ModelParts,
    lead: bool,
) -> Result<Started> {
    let mut state = TrainerState {
        config_hash: resume::config_hash(cfg),
        resume_keys: resume::resume_keys(cfg),
        ..TrainerState::default()
    };
    let (mut shadow, mut mixer) = (data.mixer()?, data.mixer()?);
    let Some(ckpt) = latest else {
        let opt = AdamW::new(adamw_config(cfg));
        let s = Start {
            state,
            shadow,
            resumed_from: None,
        };
        return Ok((s, initial, opt, mixer));
    };
    let st = CheckpointManager::load_state(ckpt)?;
    resume::check_resume_keys(cfg, &st, ckpt)?;
    let policy = resume_policy(cfg, initial, &ckpt.join("policy"), parts)
        .with_context(|| format!("loading the policy of {}", ckpt.display()))?;
    let mut opt = AdamW::load(ckpt, &parts.device)?;
    // The config's decay settings act on a resumed run too (the moments come from the file).
    opt.config = adamw_config(cfg);
    let cursor = serde_json::from_value(st.data_cursor.clone())
        .with_context(|| format!("the dataset cursor of {}", ckpt.display()))?;
    shadow.restore(cursor)?;
    mixer.restore(shadow.cursor())?;
    if lead {
        eprintln!("resuming from {} (step {})", ckpt.display(), st.step);
    }
    check_history(&st, ckpt)?;
    state.step = st.step;
    state.policy_version = st.policy_version;
    state.metrics = st.metrics;
    // `best.json` follows the checkpoint (a kill may have come between the two writes).
    if let Some(best) = st.best.as_ref().filter(|_| lead) {
        crate::validate::write_best(&cfg.checkpoint.dir, best)?;
    }
    state.best = st.best;
    let s = Start {
        state,
        shadow,
        resumed_from: Some(st.step),
    };
    Ok((s, policy, opt, mixer))
}

/// The config's sinks (JSONL always; Prometheus and MLflow as `[logging]` says; the bar when
/// asked) plus the caller's.
fn telemetry(
    cfg: &Config,
    opts: &mut TrainOptions,
    s: &Start,
    until: u64,
    lead: bool,
) -> Result<Telemetry> {
    let mut t = Telemetry::new();
    if !lead {
        // Rank 0 writes the run's records; the other ranks keep only the caller's sinks.
        for sink in opts.sinks.drain(..) {
            t.push(sink);
        }
        return Ok(t);
    }
    t.push(Box::new(JsonlSink::create(
        &metrics_path(cfg),
        &s.state.metrics,
    )?));
    if let Some(addr) = &cfg.logging.prometheus {
        t.push(Box::new(PrometheusSink::start(addr)?));
    }
    let dir = &cfg.checkpoint.dir;
    if let Some(m) = MlflowSink::start(cfg, &cfg.name, dir, s.resumed_from.is_some())? {
        t.push(Box::new(m));
    }
    if opts.progress {
        t.push(Box::new(ProgressSink::train(until, s.state.step)));
    }
    for sink in opts.sinks.drain(..) {
        t.push(sink);
    }
    Ok(t)
}

/// Rollouts from step `step` (learner at `version`) up to `until`.
fn rollout_settings(
    cfg: &Config,
    parts: &ModelParts,
    step: u64,
    version: u64,
    until: u64,
    faults: Arc<Faults>,
    shard: mtrl_rollout::Shard,
) -> RolloutSettings {
    let b = cfg.train.global_batch_size;
    RolloutSettings {
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
        first_group: step * b as u64,
        version,
        end_group: Some(until * b as u64),
        timeout: cfg.rollout.timeout_s.map(Duration::from_secs_f64),
        max_retries: cfg.rollout.max_retries,
        max_failed_fraction: cfg.rollout.max_failed_fraction,
        faults,
        shard,
    }
}

/// Runs (or resumes) training until the planned step, `max_steps`, or `opts.stop` is raised.
pub fn train(cfg: &Config, mut opts: TrainOptions) -> Result<Summary> {
    let t_start = Instant::now();
    let ranks = Ranks::new(opts.comm.clone());
    let lead = ranks.lead();
    let cfg = &dp::rank_config(cfg, &ranks)?;
    let parts = setup::model_parts(cfg)?;
    let data = setup::load_data(cfg)?;
    let planned = setup::planned_steps(cfg, data.tasks);
    let until = opts.max_steps.map_or(planned, |m| m.min(planned));
    let mgr = CheckpointManager::new(&cfg.checkpoint.dir, cfg.checkpoint.keep_last);
    if lead {
        if opts.fresh {
            resume::clear_run(cfg, &mgr)?;
        }
        let cleaned = mgr.clean_stale()?;
        if cleaned > 0 {
            eprintln!("removed {cleaned} unfinished checkpoint folder(s) of an interrupted save");
        }
    }
    // The other ranks read the checkpoint folder once rank 0 has tidied it.
    ranks.arrive("the run's start", false)?;
    let (latest, rejected) = mgr.latest_valid()?;
    for r in rejected.iter().filter(|_| lead) {
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
    let (s, policy, opt, mixer) = start(cfg, &data, initial, latest.as_deref(), &parts, lead)?;
    std::fs::create_dir_all(&cfg.checkpoint.dir)
        .with_context(|| format!("creating {}", cfg.checkpoint.dir.display()))?;
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

/// The learner side of a running run.
struct Loop<'a> {
    cfg: &'a Config,
    parts: &'a ModelParts,
    mgr: &'a CheckpointManager,
    learner: Learner,
    start: Start,
    t_start: Instant,
    until: u64,
    records: Vec<StepRecord>,
    /// The background checkpoint writer (`[checkpoint] background`).
    writer: Option<CheckpointWriter>,
    /// Learner seconds spent on checkpoints since the last record.
    checkpoint_s: f64,
    /// This process among the data-parallel ranks.
    ranks: Ranks,
    /// An injected rank fault (`MTRL_RANK_FAULT`, tests).
    fault: Option<mtrl_dist::RankFault>,
}

impl Loop<'_> {
    /// Starts the rollouts, trains to `until`, checkpoints; `Ok(true)` when interrupted.
    fn go(
        &mut self,
        data: &setup::Data,
        mixer: mtrl_env::Mixer,
        opts: &TrainOptions,
        t: &mut Telemetry,
    ) -> Result<bool> {
        let cfg = self.cfg;
        let engine = Engine::with_options(
            setup::engine_policy(cfg, &self.learner.policy)?,
            None,
            self.learner.version(),
            setup::engine_options(cfg),
        )?;
        let window = self.learner.policy.config().max_position_embeddings;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        let host = AgentHost::start(cfg, &cfg.name, window)?;
        if let Some(h) = &host {
            eprintln!("policy endpoint for the agent: {}", h.endpoint());
        }
        let codec = self.parts.codec.clone();
        let envs = setup::driver(cfg, data, codec, !opts.progress, window, host.as_ref())?;
        // Rank 0 validates (the others wait for it at the next step's arrival).
        let validator = if self.ranks.lead() {
            Validator::new(
                cfg,
                &data.sets.validation,
                envs.clone(),
                setup::engine_options(cfg),
                self.parts.codec.stop_token_ids(),
            )?
        } else {
            None
        };
        if opts.watch_signals {
            let stop = opts.stop.clone();
            on_signal(&rt, move || stop.store(true, Ordering::SeqCst));
        }
        let (step, version) = (self.start.state.step, self.learner.version());
        let faults = Arc::new(Faults::from_env(cfg.train.seed)?);
        if faults.active() {
            eprintln!(
                "fault injection on: {}",
                std::env::var(FAULTS_VAR).unwrap_or_default()
            );
        }
        let shard = self.ranks.shard();
        let settings = rollout_settings(cfg, self.parts, step, version, self.until, faults, shard);
        let first_group = settings.first_group;
        let (rollout, rx) = Rollout::start(engine, envs, Box::new(mixer), settings, rt.handle())?;
        let mut batches = InOrder::new(rx, first_group).sharded(shard);
        let trajs = (cfg.logging.trajectories && self.ranks.lead())
            .then(|| {
                let o = mtrl_eval::LogOptions::from_config(&cfg.logging);
                let dir = cfg.checkpoint.dir.join("trajectories");
                // Records of steps after the checkpoint are written again by this run.
                mtrl_eval::trajlog::truncate_after(&dir, step)?;
                mtrl_eval::TrajectoryLog::open(&dir, o)
            })
            .transpose()?;
        let mut last_saved = self.start.state.step;
        let result = self.steps(
            &rollout,
            &mut batches,
            &opts.stop,
            t,
            &trajs,
            &mut last_saved,
            validator.as_ref().map(|v| (v, &rt)),
        );
        match trajs.map(|t| t.close()) {
            Some(Ok(s)) if s.dropped > 0 => eprintln!("trajectory log: {} dropped", s.dropped),
            Some(Err(e)) => eprintln!("warning: trajectory log: {e}"),
            _ => {}
        }
        let shut = rt.block_on(rollout.shutdown());
        if let Some(h) = host {
            h.shutdown();
        }
        let interrupted = result?;
        match shut {
            Err(RolloutError::Cancelled) | Ok(()) => {}
            Err(e) => return Err(e.into()),
        }
        let st = self.start.state.step;
        if st > last_saved || self.start.resumed_from.is_none() && st == 0 {
            self.save(None)?;
        }
        self.flush()?;
        Ok(interrupted)
    }

    /// Writes a checkpoint of the current state — on the background writer when
    /// `[checkpoint] background` (the learner only copies the tensors), else here — then runs
    /// `then` with its folder. The learner's time spent here goes into the next record.
    fn save(&mut self, then: Option<Then>) -> Result<()> {
        if !self.ranks.lead() {
            return Ok(());
        }
        let t0 = Instant::now();
        let (s, dtype) = (&mut self.start, self.parts.dtype);
        match &mut self.writer {
            Some(w) => {
                resume::fill_state(&mut s.state, &s.shadow)?;
                w.submit(CheckpointJob {
                    policy: self.learner.policy.snapshot()?,
                    dtype,
                    opt: self.learner.opt.snapshot()?,
                    state: s.state.clone(),
                    then,
                })?;
            }
            None => {
                let p = resume::save(self.mgr, &self.learner, &mut s.state, &s.shadow, dtype)?;
                if let Some(f) = then {
                    f(&p)?;
                }
            }
        }
        self.checkpoint_s += t0.elapsed().as_secs_f64();
        Ok(())
    }

    /// Waits for the background writer (end of the run).
    fn flush(&mut self) -> Result<()> {
        if let Some(w) = &mut self.writer {
            w.flush()?;
        }
        Ok(())
    }

    /// Validates after the current step when due, writing the figures into `rec`; returns the
    /// new best when this step is one.
    fn validate(
        &mut self,
        val: (&Validator, &tokio::runtime::Runtime),
        rec: &mut StepRecord,
    ) -> Result<Option<Best>> {
        let (v, rt) = val;
        let step = self.start.state.step;
        if !v.due(step, self.until) {
            return Ok(None);
        }
        let policy = setup::engine_policy(self.cfg, &self.learner.policy)?;
        let figures = v
            .run(policy, self.learner.version(), rt)
            .with_context(|| format!("validation after step {step}"))?;
        figures.write(rec);
        let score = figures.score(&v.metric);
        let better = match &self.start.state.best {
            Some(b) => score > b.value,
            None => true,
        };
        Ok(better.then(|| Best {
            step,
            metric: v.metric.clone(),
            value: score,
        }))
    }

    /// The step loop; `Ok(true)` when `stop` was raised.
    #[allow(clippy::too_many_arguments)]
    fn steps(
        &mut self,
        rollout: &Rollout,
        batches: &mut InOrder,
        stop: &AtomicBool,
        t: &mut Telemetry,
        trajs: &Option<mtrl_eval::TrajectoryLog>,
        last_saved: &mut u64,
        validator: Option<(&Validator, &tokio::runtime::Runtime)>,
    ) -> Result<bool> {
        let b = self.cfg.train.global_batch_size;
        let world = self.ranks.world();
        let mut prev: Option<Vec<mtrl_rollout::RolloutCounters>> = None;
        while self.start.state.step < self.until {
            let t_wait = Instant::now();
            // Contiguous windows: the first starts with the rollouts, so that nothing they count
            // (faults, retries, tokens) falls outside every step's record.
            let before_all = prev
                .take()
                .unwrap_or_else(|| vec![Default::default(); world]);
            let step_no = self.start.state.step + 1;
            if let Some(f) = self.fault.filter(|f| f.hits(self.ranks.rank(), step_no)) {
                f.act();
            }
            let mine = next_batch(rollout, batches, b, stop, stuck_after(self.cfg))?;
            // Every rank stops at the same step when any was asked to.
            let any_stop = self
                .ranks
                .arrive(&format!("step {step_no}"), mine.is_none())?;
            let Some(mine) = mine.filter(|_| !any_stop) else {
                return Ok(true);
            };
            let first = (step_no - 1) * b as u64;
            let (batch, gather_s) = self.ranks.gather_batch(mine, first, b)?;
            let wait_s = t_wait.elapsed().as_secs_f64();
            let m = self.learner.step(&batch)?;
            if let Some(f) = self.fault.filter(|f| f.hits(self.ranks.rank(), step_no)) {
                dp::diverge(&self.learner.policy, f)?;
            }
            let t_pub = Instant::now();
            let wait = stuck_after(self.cfg);
            rollout.publish(self.learner.version(), self.learner.weights()?, wait)?;
            let publish_s = t_pub.elapsed().as_secs_f64();
            for _ in 0..b {
                self.start.shadow.next_task();
            }
            let state = &mut self.start.state;
            state.step += 1;
            state.policy_version = self.learner.version();
            if let Some(log) = trajs {
                log.send_groups(mtrl_eval::Kind::Train, state.step, &batch);
            }
            let timing = Timing {
                step_wall_s: t_wait.elapsed().as_secs_f64(),
                elapsed_s: self.t_start.elapsed().as_secs_f64(),
                publish_s,
                learn_wait_s: wait_s,
            };
            let after_all = self.ranks.gather_counters(&rollout.counters())?;
            let (before, after) = (dp::merge(&before_all), dp::merge(&after_all));
            if world > 1 && self.ranks.lead() {
                let path = self.cfg.checkpoint.dir.join("rollout-ranks.jsonl");
                dp::log_ranks(&path, state.step, &before_all, &after_all)?;
            }
            prev = Some(after_all);
            let mut rec = step_record(state.step, &batch, &m, &before, &after, &timing);
            rec.time_checkpoint_s = std::mem::take(&mut self.checkpoint_s);
            dp::record(&mut rec, world, &m, gather_s);
            let every = self.cfg.distributed.checksum_every;
            if every > 0 && rec.step.is_multiple_of(every) {
                self.ranks
                    .check_parameters(&self.learner.policy, rec.step)?;
            }
            let best = match validator {
                Some(v) => self.validate(v, &mut rec)?,
                None => None,
            };
            self.start.state.metrics.push(serde_json::to_value(&rec)?);
            let step = self.start.state.step;
            if let Some(best) = best {
                // A new best is checkpointed at once (its history holds this record).
                self.start.state.best = Some(best.clone());
                let run = self.cfg.checkpoint.dir.clone();
                let then: Then = Box::new(move |_| {
                    write_best(&run, &best).map_err(|e| LearnerError::Invalid(e.to_string()))
                });
                self.save(Some(then))?;
                *last_saved = step;
            }
            t.record(Record::Step(&rec))?;
            self.records.push(rec);
            let every = self.cfg.checkpoint.every_steps;
            if every > 0 && step.is_multiple_of(every) && *last_saved != step {
                self.save(None)?;
                *last_saved = step;
            }
        }
        Ok(false)
    }
}

/// How long the learner waits for rollouts that make no progress at all (no generated token, no
/// finished group) before it calls them stuck: twice `rollout.timeout_s` (an episode attempt
/// outliving it is stopped by the rollouts themselves), 20 minutes without one.
fn stuck_after(cfg: &Config) -> Duration {
    Duration::from_secs_f64(cfg.rollout.timeout_s.map_or(1200.0, |t| 2.0 * t))
}

/// The next batch of `b` groups, or `None` once `stop` is raised; a rollout failure is returned,
/// and so is rollouts' making no progress for `stuck` (the engine thread is reported).
fn next_batch(
    rollout: &Rollout,
    batches: &mut InOrder,
    b: usize,
    stop: &AtomicBool,
    stuck: Duration,
) -> Result<Option<Vec<Vec<mtrl_core::Trajectory>>>> {
    let mut progress = (rollout.counters().tokens, batches.buffered());
    let mut since = Instant::now();
    loop {
        if stop.load(Ordering::SeqCst) {
            return Ok(None);
        }
        match batches.next_batch(b, Duration::from_millis(200)) {
            Ok(Some(batch)) => return Ok(Some(batch)),
            Ok(None) => {
                if let Some(e) = rollout.failure() {
                    return Err(e.into());
                }
                let now = (rollout.counters().tokens, batches.buffered());
                if now != progress {
                    (progress, since) = (now, Instant::now());
                } else if since.elapsed() >= stuck {
                    let c = rollout.counters();
                    bail!(
                        "rollouts are stuck: no token generated and no group finished for {:.0} s \
                         (engine at version {}, {} groups admitted, {} buffered of the {b} the \
                         learner waits for)",
                        stuck.as_secs_f64(),
                        c.engine_version,
                        c.admitted,
                        now.1
                    );
                }
            }
            Err(e) => return Err(rollout.failure().unwrap_or(e).into()),
        }
    }
}

/// Runs `then` on Ctrl-C or SIGTERM (training raises its stop flag and checkpoints; the servers
/// stop accepting and drain).
pub(crate) fn on_signal(rt: &tokio::runtime::Runtime, then: impl FnOnce() + Send + 'static) {
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
        then();
    });
}
