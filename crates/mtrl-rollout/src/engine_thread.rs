//! The generation engine's own thread, and the async client that episodes use to reach it.
//!
//! `mtrl-model`'s [`Engine`] is synchronous and not shareable, so one OS thread owns it and loops:
//! take every queued request → `submit`; apply the newest pending weight update
//! (`update_weights`); `step()` once; deliver finished completions to their oneshot replies. While
//! nothing is in flight it blocks on both channels, so it wakes for a request or an update at once.
//!
//! Invariant (what η = 0 relies on): weights are only replaced between decode steps, and a weight
//! update sent before a request is applied before that request's first step, because requests are
//! drained before updates and both are drained before every step.
//!
//! Pinned rollouts ([`crate::pin`]) hold an update back until [`Pins::may_apply`] allows it, and
//! then apply updates in version order (never skipping one a group is pinned to); the version the
//! engine serves is published on a watch channel ([`EngineThread::served`]) for the scheduler.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use candle_core::Tensor;
use crossbeam_channel::{select, Receiver, Sender};
use mtrl_model::{Completion, Engine, GenerationRequest, SeqId};
use tokio::sync::{oneshot, watch};

use crate::error::{Result, RolloutError};
use crate::pin::Pins;

type Reply = oneshot::Sender<std::result::Result<Completion, String>>;

enum Job {
    Generate {
        req: GenerationRequest,
        reply: Reply,
    },
    /// The episode of this session is over: drop its resident keys/values.
    Release(u64),
}

/// How long [`EngineThread::shutdown`] waits for the engine thread to stop.
pub const SHUTDOWN_WAIT: Duration = Duration::from_secs(30);

/// Weight updates that may wait for the engine at once.
pub const WEIGHTS_QUEUE: usize = 2;

/// New weights for the engine (HF names), tagged with their policy version.
pub struct WeightUpdate {
    pub version: u64,
    pub tensors: HashMap<String, Tensor>,
}

/// Counters the engine thread keeps (read by the trainer for per-step metrics).
#[derive(Debug, Default)]
pub struct EngineStats {
    /// Nanoseconds spent in `Engine::step`.
    pub generate_ns: AtomicU64,
    /// Nanoseconds spent applying weight updates.
    pub publish_ns: AtomicU64,
    /// Tokens sampled.
    pub tokens: AtomicU64,
    /// Decode steps run.
    pub steps: AtomicU64,
    /// Prompt tokens run through the model (the engine's `prefill_tokens`).
    pub prefill_tokens: AtomicU64,
    /// Prompt tokens taken from resident sessions instead (`reused_tokens`).
    pub reused_tokens: AtomicU64,
    /// Of `generate_ns`: forwards with prompt rows, forwards of decode rows only, and the output
    /// head plus sampling (the engine's counters).
    pub prefill_ns: AtomicU64,
    pub decode_ns: AtomicU64,
    pub sample_ns: AtomicU64,
    /// The version the engine serves.
    pub version: AtomicU64,
    /// The most weight updates received but not yet applied at once (held back by the pins
    /// plus queued in the channel): full weight copies besides the served ones.
    pub copies_held_max: AtomicU64,
}

/// Cloneable handle that sends generation requests to the engine thread.
#[derive(Clone)]
pub struct GenClient {
    jobs: Sender<Job>,
}

impl GenClient {
    /// Generates one completion; resolves when the sequence finishes.
    pub async fn generate(&self, req: GenerationRequest) -> Result<Completion> {
        let (tx, rx) = oneshot::channel();
        self.jobs
            .send(Job::Generate { req, reply: tx })
            .map_err(|_| RolloutError::EngineStopped)?;
        match rx.await {
            Ok(Ok(c)) => Ok(c),
            Ok(Err(e)) => Err(RolloutError::Engine(e)),
            Err(_) => Err(RolloutError::EngineStopped),
        }
    }

    /// Tells the engine that `session` will send no more requests (its keys/values may go).
    /// A stopped engine has nothing to release, so this never fails.
    pub fn release(&self, session: u64) {
        let _ = self.jobs.send(Job::Release(session));
    }
}

/// The running engine thread.
pub struct EngineThread {
    pub client: GenClient,
    pub weights: Sender<WeightUpdate>,
    pub stats: Arc<EngineStats>,
    /// The version the engine serves, raised as updates are applied.
    pub served: watch::Receiver<u64>,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<std::result::Result<(), String>>>,
}

impl EngineThread {
    /// Moves `engine` onto a new thread; updates are applied as soon as they arrive.
    pub fn spawn(engine: Engine) -> Result<EngineThread> {
        EngineThread::spawn_pinned(engine, None)
    }

    /// Moves `engine` onto a new thread; with `pins`, an update waits until they allow it.
    pub fn spawn_pinned(engine: Engine, pins: Option<Arc<Pins>>) -> Result<EngineThread> {
        let (jobs_tx, jobs_rx) = crossbeam_channel::unbounded();
        // Bounded: a learner that outruns an engine waits (see `Rollout::publish`) instead of
        // queueing full copies of the weights.
        let (w_tx, w_rx) = crossbeam_channel::bounded(WEIGHTS_QUEUE);
        let stats = Arc::new(EngineStats::default());
        stats.version.store(engine.version(), Ordering::SeqCst);
        let (served_tx, served) = watch::channel(engine.version());
        let stop = Arc::new(AtomicBool::new(false));
        let (s, st) = (stats.clone(), stop.clone());
        let updates = Updates {
            rx: w_rx,
            pins,
            served: served_tx,
            held: std::collections::VecDeque::new(),
            stats: stats.clone(),
        };
        let handle = std::thread::Builder::new()
            .name("mtrl-engine".into())
            .spawn(move || engine_loop(engine, jobs_rx, updates, s, st))
            .map_err(|e| RolloutError::Internal(format!("cannot start the engine thread: {e}")))?;
        Ok(EngineThread {
            client: GenClient { jobs: jobs_tx },
            weights: w_tx,
            stats,
            served,
            stop,
            handle: Some(handle),
        })
    }

    /// Stops the loop and joins the thread; returns the error that stopped it, if any. A thread
    /// that has not stopped after [`SHUTDOWN_WAIT`] (stuck inside a decode step) is left behind
    /// with an error, so that the caller still reports what went wrong instead of hanging.
    pub fn shutdown(mut self) -> Result<()> {
        self.stop.store(true, Ordering::SeqCst);
        let Some(handle) = self.handle.take() else {
            return Ok(());
        };
        let t0 = Instant::now();
        while !handle.is_finished() {
            if t0.elapsed() >= SHUTDOWN_WAIT {
                mtrl_core::trace!("engine thread still busy after {SHUTDOWN_WAIT:?}: left behind");
                return Err(RolloutError::Internal(format!(
                    "the engine thread did not stop within {} s: it is stuck inside a decode \
                     step (MTRL_TRACE=1 prints the phase it is in)",
                    SHUTDOWN_WAIT.as_secs()
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        match handle.join() {
            Ok(Err(e)) => Err(RolloutError::Engine(e)),
            Err(_) => Err(RolloutError::Internal("the engine thread panicked".into())),
            Ok(Ok(())) => Ok(()),
        }
    }
}

impl Drop for EngineThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// The engine's side of the weight channel.
struct Updates {
    rx: Receiver<WeightUpdate>,
    pins: Option<Arc<Pins>>,
    served: watch::Sender<u64>,
    /// Received, not yet allowed (pinned only); at most [`HELD_MAX`]. Further updates stay in
    /// the bounded channel, so a learner ahead of the pins waits in `Rollout::publish` instead
    /// of parking η + 1 full weight copies on the device (≈ 48 GB for an 8B bf16 model at η = 2).
    held: std::collections::VecDeque<WeightUpdate>,
    stats: Arc<EngineStats>,
}

/// Updates held back by the pins, taken off the channel (each a full weight copy). With the
/// channel's [`WEIGHTS_QUEUE`], the engine side never holds more than `HELD_MAX + WEIGHTS_QUEUE`
/// copies besides the weights it serves.
pub const HELD_MAX: usize = 1;

impl Updates {
    fn room(&self) -> bool {
        self.pins.is_none() || self.held.len() < HELD_MAX
    }

    /// The update to apply now, if any: the newest one received (unpinned), or the newest of the
    /// leading held ones that the pins allow, in order.
    fn next(&mut self) -> Option<WeightUpdate> {
        while self.room() {
            let Ok(w) = self.rx.try_recv() else { break };
            self.held.push_back(w);
        }
        let copies = (self.held.len() + self.rx.len()) as u64;
        self.stats
            .copies_held_max
            .fetch_max(copies, Ordering::Relaxed);
        metrics::gauge!("mtrl_rollout_weight_copies_held").set(copies as f64);
        let mut take = None;
        while let Some(w) = self.held.front() {
            if self.pins.as_ref().is_some_and(|p| !p.may_apply(w.version)) {
                break;
            }
            take = self.held.pop_front();
        }
        take
    }
}

fn engine_loop(
    mut engine: Engine,
    jobs: Receiver<Job>,
    mut updates: Updates,
    stats: Arc<EngineStats>,
    stop: Arc<AtomicBool>,
) -> std::result::Result<(), String> {
    mtrl_core::trace!("engine thread up, serving version {}", engine.version());
    let mut pending: HashMap<SeqId, Reply> = HashMap::new();
    let mut requests = 0u64;
    let mut take = |engine: &mut Engine, job: Job, pending: &mut HashMap<SeqId, Reply>| {
        let (req, reply) = match job {
            Job::Release(session) => return engine.release(session),
            Job::Generate { req, reply } => (req, reply),
        };
        requests += 1;
        if traced(requests) {
            mtrl_core::trace!(
                "request {requests}: prompt {} tokens, up to {} new",
                req.prompt.len(),
                req.max_new_tokens
            );
        }
        if req.max_new_tokens == 0 {
            // The engine drops such requests silently; answer at once instead.
            let _ = reply.send(Ok(Completion::empty(SeqId::MAX, req.prompt)));
            return;
        }
        match engine.submit(req) {
            Ok(id) => {
                pending.insert(id, reply);
            }
            Err(e) => {
                let _ = reply.send(Err(e.to_string()));
            }
        }
    };
    let apply = |engine: &mut Engine,
                 u: WeightUpdate,
                 served: &watch::Sender<u64>|
     -> std::result::Result<(), String> {
        let t0 = Instant::now();
        mtrl_core::trace!("applying weights of version {}", u.version);
        engine
            .update_weights(u.version, &u.tensors)
            .map_err(|e| format!("weight update to version {}: {e}", u.version))?;
        stats.version.store(u.version, Ordering::SeqCst);
        served.send_replace(u.version);
        metrics::gauge!("mtrl_rollout_engine_policy_version").set(u.version as f64);
        let ns = t0.elapsed().as_nanos() as u64;
        stats.publish_ns.fetch_add(ns, Ordering::Relaxed);
        Ok(())
    };
    let never = crossbeam_channel::never::<WeightUpdate>();
    let result = loop {
        if stop.load(Ordering::SeqCst) {
            break Ok(());
        }
        if engine.num_unfinished() == 0 {
            select! {
                recv(jobs) -> j => match j {
                    Ok(j) => take(&mut engine, j, &mut pending),
                    Err(_) => break Ok(()),
                },
                // Wake for an update only while there is room to hold it (pinned).
                recv(if updates.room() { &updates.rx } else { &never }) -> w => if let Ok(w) = w {
                    updates.held.push_back(w);
                },
                // Also how often a held update is looked at again while the engine is idle.
                default(Duration::from_millis(if updates.held.is_empty() { 50 } else { 2 })) => {}
            }
        }
        while let Ok(j) = jobs.try_recv() {
            take(&mut engine, j, &mut pending);
        }
        if let Some(w) = updates.next() {
            if let Err(e) = apply(&mut engine, w, &updates.served) {
                break Err(e);
            }
        }
        if engine.num_unfinished() == 0 {
            continue;
        }
        let t0 = Instant::now();
        let n = stats.steps.load(Ordering::Relaxed) + 1;
        if traced(n) {
            mtrl_core::trace!(
                "engine step {n}: start, {} unfinished",
                engine.num_unfinished()
            );
        }
        let out = match engine.step() {
            Ok(o) => o,
            Err(e) => break Err(format!("decode step: {e}")),
        };
        let ns = t0.elapsed().as_nanos() as u64;
        if traced(n) {
            mtrl_core::trace!(
                "engine step {n}: done in {:.1} ms, {} tokens, {} finished",
                ns as f64 / 1e6,
                out.tokens.len(),
                out.finished.len()
            );
        }
        stats.generate_ns.fetch_add(ns, Ordering::Relaxed);
        stats.steps.fetch_add(1, Ordering::Relaxed);
        let c = engine.counters();
        stats
            .prefill_tokens
            .store(c.prefill_tokens, Ordering::Relaxed);
        stats
            .reused_tokens
            .store(c.reused_tokens, Ordering::Relaxed);
        stats
            .prefill_ns
            .store(c.prefill_forward_ns, Ordering::Relaxed);
        stats
            .decode_ns
            .store(c.decode_forward_ns, Ordering::Relaxed);
        stats.sample_ns.store(c.sample_ns, Ordering::Relaxed);
        stats
            .tokens
            .fetch_add(out.tokens.len() as u64, Ordering::Relaxed);
        metrics::histogram!("mtrl_rollout_decode_batch_size").record(out.tokens.len() as f64);
        metrics::counter!("mtrl_rollout_engine_tokens_total").increment(out.tokens.len() as u64);
        metrics::counter!("mtrl_rollout_engine_steps_total").increment(1);
        for c in out.finished {
            if let Some(reply) = pending.remove(&c.seq) {
                let _ = reply.send(Ok(c));
            }
        }
    };
    if let Err(e) = &result {
        for (_, reply) in pending.drain() {
            let _ = reply.send(Err(e.clone()));
        }
    }
    result
}

/// Which of a run's requests and engine steps get trace lines: the first 8, then every 256th
/// (`MTRL_TRACE=all`: every one).
fn traced(n: u64) -> bool {
    mtrl_core::trace::enabled() && (n <= 8 || n.is_multiple_of(256) || mtrl_core::trace::all())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 43, item 10: pinned updates the pins do not allow yet are not drained into an
    /// unbounded queue: at most `HELD_MAX` are taken off the channel, so the channel fills and the
    /// learner's publish waits; the copies held are reported.
    #[test]
    fn held_updates_are_bounded() {
        let (tx, rx) = crossbeam_channel::bounded(WEIGHTS_QUEUE);
        let admitted = Arc::new(AtomicU64::new(0));
        let pins = Arc::new(Pins::new(1, 0, 0, None, admitted));
        let stats = Arc::new(EngineStats::default());
        let (served, _) = watch::channel(0);
        let mut u = Updates {
            rx,
            pins: Some(pins),
            served,
            held: std::collections::VecDeque::new(),
            stats: stats.clone(),
        };
        let w = |version| WeightUpdate {
            version,
            tensors: HashMap::new(),
        };
        let mut sent = 0;
        for v in 1..=10 {
            if tx.try_send(w(v)).is_err() {
                break;
            }
            sent += 1;
            assert!(u.next().is_none(), "no group of version {v} may start yet");
        }
        assert_eq!(u.held.len(), HELD_MAX);
        assert_eq!(
            sent,
            HELD_MAX + WEIGHTS_QUEUE,
            "the learner waits after this many"
        );
        let held = stats.copies_held_max.load(Ordering::Relaxed) as usize;
        assert!((1..=HELD_MAX + WEIGHTS_QUEUE).contains(&held), "{held}");
    }
}
