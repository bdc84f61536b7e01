//! The learner side of a running run: batches in admission order, learner steps, weight
//! publication, validation and checkpoints.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mtrl_core::{Config, StepRecord};
use mtrl_learner::checkpoint_writer::Then;
use mtrl_learner::{CheckpointJob, CheckpointManager, CheckpointWriter, Learner, LearnerError};
use mtrl_model::Engine;
use mtrl_rollout::{Faults, InOrder, Rollout, RolloutError, FAULTS_VAR};

use crate::agent::AgentHost;
use crate::bail;
use crate::data_parallel::{self as dp, Ranks};
use crate::error::{Context, Result};
use crate::resume;
use crate::setup::{self, ModelParts};
use crate::step_record::{step_record, Timing};
use crate::telemetry::{Record, Telemetry};
use crate::validate::{write_best, Best, Validator};

use super::start::{rollout_settings, Start};
use super::{on_signal, TrainOptions};

/// The learner side of a running run.
pub(super) struct Loop<'a> {
    pub(super) cfg: &'a Config,
    pub(super) parts: &'a ModelParts,
    pub(super) mgr: &'a CheckpointManager,
    pub(super) learner: Learner,
    pub(super) start: Start,
    pub(super) t_start: Instant,
    pub(super) until: u64,
    pub(super) records: Vec<StepRecord>,
    /// The background checkpoint writer (`[checkpoint] background`).
    pub(super) writer: Option<CheckpointWriter>,
    /// Learner seconds spent on checkpoints since the last record.
    pub(super) checkpoint_s: f64,
    /// This process among the data-parallel ranks.
    pub(super) ranks: Ranks,
    /// Steps in a row whose update was skipped for a non-finite loss or gradient.
    pub(super) skipped_in_a_row: u64,
    /// Validation tasks of the run (for the bound of the step arrivals).
    pub(super) validation_tasks: usize,
    /// An injected rank fault (`MTRL_RANK_FAULT`, tests).
    pub(super) fault: Option<mtrl_dist::RankFault>,
}

impl Loop<'_> {
    /// Starts the rollouts, trains to `until`, checkpoints; `Ok(true)` when interrupted.
    pub(super) fn go(
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
            setup::engine_options(cfg, &self.learner.policy)?,
        )?;
        mtrl_core::trace!("rollout engine built (version {})", engine.version());
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
        mtrl_core::trace!("environments ready (search indexes open)");
        // Rank 0 validates (the others wait for it at the next step's arrival).
        let validator = if self.ranks.lead() {
            Validator::new(
                cfg,
                &data.sets.validation,
                envs.clone(),
                setup::engine_options(cfg, &self.learner.policy)?,
                self.parts.codec.stop_token_ids(),
            )?
        } else {
            None
        };
        let _signals = opts.watch_signals.then(|| {
            let stop = opts.stop.clone();
            on_signal(move || stop.store(true, Ordering::SeqCst))
        });
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
        mtrl_core::trace!("rollouts started from group {first_group}");
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
        // Bounded: an engine thread stuck in a decode step is left behind after
        // `SHUTDOWN_WAIT`, and the step loop's error (if any) is the one returned.
        match &result {
            Err(e) => mtrl_core::trace!("stopping the rollouts (the step loop failed: {e:#})"),
            Ok(_) => mtrl_core::trace!("stopping the rollouts"),
        }
        let shut = rt.block_on(rollout.shutdown());
        mtrl_core::trace!("rollouts stopped");
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
        Ok(v.choose(self.start.state.best.as_ref(), step, &figures))
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
            mtrl_core::trace!("step {step_no}: waiting for {b} groups");
            let mine = next_batch(rollout, batches, b, stop, stuck_after(self.cfg))?;
            mtrl_core::trace!("step {step_no}: batch arrived");
            // Every rank stops at the same step when any was asked to.
            let any_stop = self.ranks.arrive_within(
                &format!("step {step_no}"),
                mine.is_none(),
                dp::step_wait(self.cfg, world, self.validation_tasks),
            )?;
            let Some(mine) = mine.filter(|_| !any_stop) else {
                return Ok(true);
            };
            let first = (step_no - 1) * b as u64;
            let (batch, gather_s) = self.ranks.gather_batch(mine, first, b)?;
            let wait_s = t_wait.elapsed().as_secs_f64();
            let m = self.learner.step(&batch)?;
            mtrl_core::trace!("step {step_no}: update done");
            self.check_skips(step_no, &m)?;
            if let Some(f) = self.fault.filter(|f| f.hits(self.ranks.rank(), step_no)) {
                dp::diverge(&self.learner.policy, f)?;
            }
            let t_pub = Instant::now();
            let wait = stuck_after(self.cfg);
            rollout.publish(self.learner.version(), self.learner.weights()?, wait)?;
            let publish_s = t_pub.elapsed().as_secs_f64();
            mtrl_core::trace!("step {step_no}: weights published");
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
impl Loop<'_> {
    /// Reports a step whose update was skipped for a non-finite loss or gradient, and ends the
    /// run once `train.max_skipped_updates` steps in a row did (learning has stopped).
    fn check_skips(&mut self, step: u64, m: &mtrl_learner::StepMetrics) -> Result<()> {
        let Some(why) = &m.skip_reason else {
            if m.updates > 0 {
                self.skipped_in_a_row = 0;
            }
            return Ok(());
        };
        self.skipped_in_a_row += 1;
        let n = self.skipped_in_a_row;
        if self.ranks.lead() {
            eprintln!(
                "step {step}: {} of {} optimizer update(s) skipped: {why} ({n} step(s) in a row)",
                m.skipped_updates,
                m.skipped_updates + m.updates
            );
        }
        let max = self.cfg.train.max_skipped_updates;
        if max > 0 && n >= max {
            bail!(
                "{}: steps {}..={step} all skipped their update: {why}; learning has stopped \
                 (lower train.lr, check algorithm.tis_cap / the loss settings and the data; \
                 train.max_skipped_updates = {max} sets this bound, 0 = never stop)",
                self.cfg.source.display(),
                step + 1 - n
            );
        }
        Ok(())
    }
}

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
