//! [`Rollout`]: the scheduler that admits groups under the staleness gate, runs their episodes
//! concurrently (at most `max_concurrency` in flight, a fair [`Semaphore`]) over the shared engine
//! thread, and sends each finished group on a bounded crossbeam channel as
//! `(group index, trajectories)`.
//!
//! The learner's version reaches the scheduler through [`Rollout::publish`]: the new weights go to
//! the engine thread first, then the version is bumped on a watch channel, so a group admitted
//! because of version v + 1 is generated with version v + 1 weights (see `engine_thread`).
//!
//! Shutdown: a [`CancellationToken`] stops admission and aborts in-flight episodes; a
//! [`TaskTracker`] waits for them; then the engine thread is joined.
//!
//! Faults: an episode attempt that errors or outlives `timeout` is retried (same seeds, so a
//! retry that meets no fault is the episode it would have been) up to `max_retries` times; an
//! episode still failing fails its group, which is then *replaced* — run again on the same task
//! with fresh sampling seeds — up to `max_retries` times. Every retry, timeout, errored episode and
//! replaced group is counted ([`FaultCounters`]). The run stops — the error kept for
//! [`Rollout::failure`], naming the last cause — once errored episodes exceed
//! `max_failed_fraction` of the finished ones (and at least one), or a group runs out of
//! replacements.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use candle_core::Tensor;
use crossbeam_channel::{Receiver, Sender};
use mtrl_env::{Environment, Mixer, Task, Trajectory};
use mtrl_model::{Engine, SamplingParams};
use tokio::runtime::Handle;
use tokio::sync::{watch, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::engine_thread::{EngineStats, EngineThread, WeightUpdate};
use crate::episode::{Driver, EnvStats, EpisodeContext};
use crate::error::{Result, RolloutError};
use crate::faults::Faults;
use crate::gate::Gate;
use crate::group::GroupRun;
use crate::pin::{Pins, WeightSync};

/// A finished group: its admission index and its `group_size` trajectories in sample order.
pub type Group = (u64, Vec<Trajectory>);

/// Makes a fresh environment for one episode.
pub type EnvFactory = Arc<dyn Fn() -> mtrl_env::Result<Box<dyn Environment>> + Send + Sync>;

/// Where tasks come from, in admission order.
pub trait TaskSource: Send {
    fn next_task(&mut self) -> Task;
}

impl TaskSource for Mixer {
    fn next_task(&mut self) -> Task {
        Mixer::next_task(self).1.clone()
    }
}

/// Which groups of each step a data-parallel rank generates: group `i` is rank
/// `(i mod B) mod world`'s. Every rank still draws every task in order (the task of group `i`
/// is the single process's), and the staleness gate counts the global index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    pub rank: usize,
    pub world: usize,
}

impl Default for Shard {
    fn default() -> Shard {
        Shard { rank: 0, world: 1 }
    }
}

impl Shard {
    /// Whether group `index` (of steps of `batch` groups) is this rank's.
    pub fn owns(&self, index: u64, batch: usize) -> bool {
        let world = self.world.max(1) as u64;
        (index % batch.max(1) as u64) % world == self.rank as u64
    }
}

/// How rollouts run.
#[derive(Debug, Clone)]
pub struct RolloutSettings {
    pub group_size: usize,
    pub max_concurrency: usize,
    /// Groups per learner step (B).
    pub global_batch_size: usize,
    /// η.
    pub max_staleness: u64,
    /// Temperature, top-p, top-k (the seed is replaced per generation).
    pub sampling: SamplingParams,
    pub seed: u64,
    pub stop_token_ids: Vec<u32>,
    /// Index of the first group to admit (`step · B` on resume).
    pub first_group: u64,
    /// The learner's version at start.
    pub version: u64,
    /// Admit no group with this index or above.
    pub end_group: Option<u64>,
    /// Wall-clock limit of one episode attempt.
    pub timeout: Option<Duration>,
    /// Retries of an errored episode, and replacements of a failed group.
    pub max_retries: usize,
    /// Errored episodes over finished ones above which the run stops.
    pub max_failed_fraction: f64,
    /// Faults to inject (tests).
    pub faults: Arc<Faults>,
    /// This rank's groups (all of them for one process).
    pub shard: Shard,
    /// How episodes take up new weights ([`crate::pin`]).
    pub weight_sync: WeightSync,
    /// Behaviour log-probs under the distribution sampled from (`rollout.behaviour_logprobs`).
    pub sampled_logprobs: bool,
}

/// Fault bookkeeping, monotonic.
#[derive(Debug, Default)]
pub struct FaultCounters {
    /// Episode attempts run again after an error or a timeout.
    pub retries: AtomicU64,
    /// Attempts stopped by the timeout.
    pub timeouts: AtomicU64,
    /// Episodes that failed every attempt.
    pub errored: AtomicU64,
    /// Groups run again because one of their episodes errored.
    pub replaced: AtomicU64,
    /// Episodes finished (with a trajectory).
    pub finished: AtomicU64,
}

/// Counters for per-step metrics (monotonic; the trainer takes differences).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RolloutCounters {
    pub generate_s: f64,
    pub env_s: f64,
    pub publish_s: f64,
    pub admission_wait_s: f64,
    pub tokens: u64,
    /// Prompt tokens run through the model, and taken from resident sessions instead.
    pub prefill_tokens: u64,
    pub reused_tokens: u64,
    /// Of `generate_s`: prompt forwards, decode-only forwards, head and sampling.
    pub prefill_s: f64,
    pub decode_s: f64,
    pub sample_s: f64,
    pub admitted: u64,
    pub engine_version: u64,
    pub retries: u64,
    pub timeouts: u64,
    pub errored_episodes: u64,
    pub replaced_groups: u64,
    /// Injected faults by kind (`tool_error`, `slow_tool`, `engine_error`).
    pub faults: [u64; 3],
}

/// Running rollouts.
pub struct Rollout {
    engine: Option<EngineThread>,
    version: watch::Sender<u64>,
    cancel: CancellationToken,
    tracker: TaskTracker,
    failure: Arc<Mutex<Option<RolloutError>>>,
    engine_stats: Arc<EngineStats>,
    env_stats: Arc<EnvStats>,
    wait_ns: Arc<AtomicU64>,
    admitted: Arc<AtomicU64>,
    faults: Arc<Faults>,
    fault_counts: Arc<FaultCounters>,
}

pub(crate) fn fail(
    slot: &Mutex<Option<RolloutError>>,
    cancel: &CancellationToken,
    e: RolloutError,
) {
    if let Ok(mut s) = slot.lock() {
        if s.is_none() && !matches!(e, RolloutError::Cancelled) {
            *s = Some(e);
        }
    }
    cancel.cancel();
}

impl Rollout {
    /// Starts the engine thread and the scheduler on `rt`; returns the handle and the channel the
    /// learner reads finished groups from.
    pub fn start(
        engine: Engine,
        driver: Arc<dyn Driver>,
        tasks: Box<dyn TaskSource>,
        settings: RolloutSettings,
        rt: &Handle,
    ) -> Result<(Rollout, Receiver<Group>)> {
        let admitted = Arc::new(AtomicU64::new(settings.first_group));
        let pins = (settings.weight_sync == WeightSync::Pinned).then(|| {
            Arc::new(Pins::new(
                settings.global_batch_size as u64,
                settings.max_staleness,
                settings.version,
                settings.end_group,
                admitted.clone(),
            ))
        });
        let engine = EngineThread::spawn_pinned(engine, pins.clone())?;
        let served = engine.served.clone();
        let cap = (settings.max_staleness as usize + 1) * settings.global_batch_size.max(1);
        let (tx, rx) = crossbeam_channel::bounded(cap);
        let (version_tx, version_rx) = watch::channel(settings.version);
        let r = Rollout {
            version: version_tx,
            cancel: CancellationToken::new(),
            tracker: TaskTracker::new(),
            failure: Arc::new(Mutex::new(None)),
            engine_stats: engine.stats.clone(),
            env_stats: Arc::new(EnvStats::default()),
            wait_ns: Arc::new(AtomicU64::new(0)),
            admitted,
            engine: Some(engine),
            faults: settings.faults.clone(),
            fault_counts: Arc::new(FaultCounters::default()),
        };
        let cx = Arc::new(EpisodeContext {
            gen: r
                .engine
                .as_ref()
                .map(|e| e.client.clone())
                .ok_or(RolloutError::EngineStopped)?,
            sampling: settings.sampling.clone(),
            seed: settings.seed,
            stop_token_ids: settings.stop_token_ids.clone(),
            stats: r.env_stats.clone(),
            faults: settings.faults.clone(),
            sampled_logprobs: settings.sampled_logprobs,
        });
        let sched = Scheduler {
            settings,
            driver,
            tasks,
            cx,
            tx,
            version: version_rx,
            served,
            pins,
            sem: Arc::new(Semaphore::new(1)),
            cancel: r.cancel.clone(),
            tracker: r.tracker.clone(),
            failure: r.failure.clone(),
            wait_ns: r.wait_ns.clone(),
            admitted: r.admitted.clone(),
            counts: r.fault_counts.clone(),
        };
        r.tracker.spawn_on(sched.run(), rt);
        Ok((r, rx))
    }

    /// Sends new weights to the engine (applied between decode steps), then raises the version the
    /// admission gate sees. The queue is bounded; an engine that takes no update for `wait` is
    /// reported as stuck.
    pub fn publish(
        &self,
        version: u64,
        tensors: HashMap<String, Tensor>,
        wait: Duration,
    ) -> Result<()> {
        let engine = self.engine.as_ref().ok_or(RolloutError::EngineStopped)?;
        engine
            .weights
            .send_timeout(WeightUpdate { version, tensors }, wait)
            .map_err(|e| match e {
                crossbeam_channel::SendTimeoutError::Timeout(_) => RolloutError::Engine(format!(
                    "the engine took no weight update for {:.0} s (version {version} waits): stuck",
                    wait.as_secs_f64()
                )),
                crossbeam_channel::SendTimeoutError::Disconnected(_) => RolloutError::EngineStopped,
            })?;
        self.version.send_replace(version);
        Ok(())
    }

    /// The error that stopped rollouts, if any.
    pub fn failure(&self) -> Option<RolloutError> {
        self.failure.lock().ok().and_then(|s| s.clone())
    }

    /// Monotonic counters (seconds and totals since start).
    pub fn counters(&self) -> RolloutCounters {
        let s = |ns: u64| ns as f64 * 1e-9;
        RolloutCounters {
            generate_s: s(self.engine_stats.generate_ns.load(Ordering::Relaxed)),
            env_s: s(self.env_stats.env_ns.load(Ordering::Relaxed)),
            publish_s: s(self.engine_stats.publish_ns.load(Ordering::Relaxed)),
            admission_wait_s: s(self.wait_ns.load(Ordering::Relaxed)),
            tokens: self.engine_stats.tokens.load(Ordering::Relaxed),
            prefill_tokens: self.engine_stats.prefill_tokens.load(Ordering::Relaxed),
            reused_tokens: self.engine_stats.reused_tokens.load(Ordering::Relaxed),
            prefill_s: s(self.engine_stats.prefill_ns.load(Ordering::Relaxed)),
            decode_s: s(self.engine_stats.decode_ns.load(Ordering::Relaxed)),
            sample_s: s(self.engine_stats.sample_ns.load(Ordering::Relaxed)),
            admitted: self.admitted.load(Ordering::Relaxed),
            engine_version: self.engine_stats.version.load(Ordering::SeqCst),
            retries: self.fault_counts.retries.load(Ordering::Relaxed),
            timeouts: self.fault_counts.timeouts.load(Ordering::Relaxed),
            errored_episodes: self.fault_counts.errored.load(Ordering::Relaxed),
            replaced_groups: self.fault_counts.replaced.load(Ordering::Relaxed),
            faults: self.faults.injected().map(|(_, n)| n),
        }
    }

    /// Stops admission, aborts in-flight episodes, waits for them and joins the engine thread.
    pub async fn shutdown(mut self) -> Result<()> {
        self.cancel.cancel();
        self.tracker.close();
        self.tracker.wait().await;
        if let Some(e) = self.engine.take() {
            e.shutdown()?;
        }
        match self.failure() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

struct Scheduler {
    settings: RolloutSettings,
    driver: Arc<dyn Driver>,
    tasks: Box<dyn TaskSource>,
    cx: Arc<EpisodeContext>,
    tx: Sender<Group>,
    version: watch::Receiver<u64>,
    /// The version the engine serves (pinned rollouts wait for a group's version).
    served: watch::Receiver<u64>,
    pins: Option<Arc<Pins>>,
    sem: Arc<Semaphore>,
    cancel: CancellationToken,
    tracker: TaskTracker,
    failure: Arc<Mutex<Option<RolloutError>>>,
    wait_ns: Arc<AtomicU64>,
    admitted: Arc<AtomicU64>,
    counts: Arc<FaultCounters>,
}

impl Scheduler {
    async fn run(mut self) {
        self.sem = Arc::new(Semaphore::new(self.settings.max_concurrency.max(1)));
        let gate = Gate {
            batch: self.settings.global_batch_size as u64,
            max_staleness: self.settings.max_staleness,
        };
        let mut index = self.settings.first_group;
        loop {
            if self.settings.end_group.is_some_and(|end| index >= end) {
                return;
            }
            let t0 = Instant::now();
            loop {
                let v = *self.version.borrow_and_update();
                let served = *self.served.borrow_and_update();
                let pinned_ok = self.pins.as_ref().is_none_or(|p| served >= p.pin(index));
                if gate.may_admit(index, v) && pinned_ok {
                    break;
                }
                tokio::select! {
                    _ = self.cancel.cancelled() => return,
                    r = self.version.changed() => if r.is_err() { return },
                    r = self.served.changed() => if r.is_err() { return },
                }
            }
            let waited = t0.elapsed();
            self.wait_ns
                .fetch_add(waited.as_nanos() as u64, Ordering::Relaxed);
            metrics::histogram!("mtrl_rollout_admission_wait_seconds").record(waited.as_secs_f64());
            let task = self.tasks.next_task();
            if !self
                .settings
                .shard
                .owns(index, self.settings.global_batch_size)
            {
                // Another rank's group: its task is drawn (the cursor stays global), not run.
                index += 1;
                self.admitted.store(index, Ordering::SeqCst);
                continue;
            }
            let g = GroupRun {
                index,
                task,
                settings: self.settings.clone(),
                driver: self.driver.clone(),
                cx: self.cx.clone(),
                sem: self.sem.clone(),
                cancel: self.cancel.clone(),
                failure: self.failure.clone(),
                counts: self.counts.clone(),
            };
            match &self.pins {
                Some(pins) => {
                    // Registered before the admitted counter moves past it (see `Pins`).
                    let running = pins.start(index);
                    let tx = self.tx.clone();
                    self.tracker.spawn(async move {
                        g.run(tx).await;
                        drop(running);
                    });
                }
                None => {
                    self.tracker.spawn(g.run(self.tx.clone()));
                }
            }
            index += 1;
            // SeqCst: a pinned engine that reads this count must also see `pins.start(index)`.
            self.admitted.store(index, Ordering::SeqCst);
            metrics::counter!("mtrl_rollout_groups_admitted_total").increment(1);
        }
    }
}
