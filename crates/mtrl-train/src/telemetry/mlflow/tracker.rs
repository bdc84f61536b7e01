//! [`Tracker`]: logs one MLflow run from a background thread, so the caller (the learner) never
//! waits on the network.
//!
//! Invariants:
//! - Every `log_*` call returns at once: items go on a bounded queue (`Options::queue`); when it
//!   is full the item is dropped and counted, never blocked on.
//! - Each item is tried at most `Options::max_attempts` times, with exponential back-off between
//!   attempts (`backoff`, doubling, capped at `max_backoff`); errors a retry cannot fix (4xx) are
//!   not retried. An item that fails for good is dropped and counted; later items still go.
//! - The run is created lazily by the worker (so an unreachable server at start is an outage like
//!   any other); until it exists, each item first tries to create it.
//! - [`Tracker::finish`] returns within about `finish_timeout + request_timeout`: after the
//!   deadline queued items are dropped without further attempts, and a worker stuck in a call is
//!   left behind (reported as `abandoned`). During an outage (the last item failed for good on a
//!   retryable error), items left at `finish` get a single attempt each, so a dead server costs
//!   the caller little. Nothing a server does propagates as an error.
//! - Counters: `mtrl_mlflow_sent_total`, `mtrl_mlflow_retries_total`,
//!   `mtrl_mlflow_dropped_total{reason}` on the `metrics` facade, and [`TrackerStats`].

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TrySendError};
use serde_json::{json, Value};

use super::client::{
    now_ms, sanitize_key, CallError, Client, RunInfo, RunStatus, MAX_METRICS_PER_BATCH,
    MAX_PARAMS_PER_BATCH, MAX_PARAM_CHARS,
};

/// Queue size, retry policy and time limits.
#[derive(Debug, Clone)]
pub struct Options {
    pub queue: usize,
    pub max_attempts: u32,
    pub backoff: Duration,
    pub max_backoff: Duration,
    /// Bounds one JSON call (artifact uploads get 10 minutes).
    pub request_timeout: Duration,
    /// How long [`Tracker::finish`] lets queued items drain.
    pub finish_timeout: Duration,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            queue: 1024,
            max_attempts: 5,
            backoff: Duration::from_millis(250),
            max_backoff: Duration::from_secs(8),
            request_timeout: Duration::from_secs(30),
            finish_timeout: Duration::from_secs(60),
        }
    }
}

/// Which run to log to.
#[derive(Debug, Clone, Default)]
pub struct RunSpec {
    /// Tracking server, `http://host:port`.
    pub url: String,
    pub experiment: String,
    pub run_name: String,
    /// Continue this run (set back to RUNNING) instead of creating one; a new run is created if
    /// the server does not know it.
    pub resume_run_id: Option<String>,
    /// Logged once, first (`log-batch`, 100 per request; values cut to 6000 characters).
    pub params: Vec<(String, String)>,
    /// Run tags set at creation (`mlflow.runName` and `mlflow.source.name` are added).
    pub tags: Vec<(String, String)>,
}

/// What happened to the items (reported in the run's final JSON).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TrackerStats {
    pub url: String,
    pub experiment_id: Option<String>,
    pub run_id: Option<String>,
    /// Items delivered (one item = one request: a params or metrics batch, an artifact, the status).
    pub sent: u64,
    /// Attempts beyond the first.
    pub retried: u64,
    /// Items given up (failed every attempt, refused by the server, queue full, or past the deadline).
    pub dropped: u64,
    pub last_error: Option<String>,
    /// The worker was still inside a call when `finish` stopped waiting.
    pub abandoned: bool,
}

impl TrackerStats {
    pub fn to_json(&self) -> Value {
        json!({
            "url": self.url,
            "experiment_id": self.experiment_id,
            "run_id": self.run_id,
            "sent": self.sent,
            "retried": self.retried,
            "dropped": self.dropped,
            "last_error": self.last_error,
            "abandoned": self.abandoned,
        })
    }
}

enum Item {
    Params(Vec<(String, String)>),
    Metrics {
        step: i64,
        ts: i64,
        values: Vec<(String, f64)>,
    },
    Artifact {
        local: PathBuf,
        path: String,
    },
    Status(RunStatus),
}

#[derive(Default)]
struct Shared {
    sent: AtomicU64,
    retried: AtomicU64,
    dropped: AtomicU64,
    /// Set by `finish`: after it no new attempts start.
    deadline: Mutex<Option<Instant>>,
    run: Mutex<Option<RunInfo>>,
    /// Params the run already had when it was resumed (MLflow params cannot change).
    existing_params: Mutex<Vec<(String, String)>>,
    last_error: Mutex<Option<String>>,
    reported: AtomicBool,
    /// The last item failed for good on a retryable error and nothing succeeded since.
    outage: AtomicBool,
}

impl Shared {
    fn drop_item(&self, reason: &'static str, err: Option<&str>) {
        self.dropped.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("mtrl_mlflow_dropped_total", "reason" => reason).increment(1);
        if let Some(e) = err {
            // One line per outage, not one per item.
            if !self.reported.swap(true, Ordering::Relaxed) {
                eprintln!("mlflow: {e} (dropping items; training goes on)");
            }
            if let Ok(mut l) = self.last_error.lock() {
                *l = Some(e.to_string());
            }
        }
    }

    fn past_deadline(&self) -> bool {
        self.deadline
            .lock()
            .ok()
            .and_then(|d| *d)
            .is_some_and(|d| Instant::now() >= d)
    }

    fn time_left(&self) -> Option<Duration> {
        let d = self.deadline.lock().ok().and_then(|d| *d)?;
        Some(d.saturating_duration_since(Instant::now()))
    }
}

/// A run being logged in the background.
pub struct Tracker {
    tx: Option<Sender<Item>>,
    done: Receiver<()>,
    worker: Option<JoinHandle<()>>,
    shared: Arc<Shared>,
    options: Options,
    url: String,
    finished: bool,
}

impl Tracker {
    /// Starts logging a new run of `experiment` with default [`Options`]; errors only for a URL
    /// that cannot work (not http/https).
    pub fn start(
        url: &str,
        experiment: &str,
        run_name: &str,
        params: Vec<(String, String)>,
    ) -> crate::Result<Tracker> {
        let spec = RunSpec {
            url: url.to_string(),
            experiment: experiment.to_string(),
            run_name: run_name.to_string(),
            params,
            ..RunSpec::default()
        };
        Tracker::start_with(spec, Options::default())
    }

    pub fn start_with(spec: RunSpec, options: Options) -> crate::Result<Tracker> {
        let client = Client::new(&spec.url, options.request_timeout)?;
        let (tx, rx) = crossbeam_channel::bounded(options.queue.max(1));
        let (done_tx, done) = crossbeam_channel::bounded(1);
        let shared = Arc::new(Shared::default());
        let worker = Worker {
            client,
            spec: spec.clone(),
            options: options.clone(),
            shared: shared.clone(),
        };
        let handle = std::thread::Builder::new()
            .name("mlflow".into())
            .spawn(move || {
                while let Ok(item) = rx.recv() {
                    worker.handle(item);
                }
                let _ = done_tx.send(());
            })?;
        let t = Tracker {
            tx: Some(tx),
            done,
            worker: Some(handle),
            shared,
            options,
            url: spec.url.clone(),
            finished: false,
        };
        if !spec.params.is_empty() {
            t.push(Item::Params(spec.params));
        }
        Ok(t)
    }

    fn push(&self, item: Item) {
        let Some(tx) = &self.tx else { return };
        match tx.try_send(item) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => self.shared.drop_item("queue_full", None),
            Err(TrySendError::Disconnected(_)) => self.shared.drop_item("stopped", None),
        }
    }

    /// Params (logged once per key; MLflow refuses a changed value).
    #[allow(dead_code)] // API for other commands; tests/mlflow.rs uses it
    pub fn log_params(&self, params: Vec<(String, String)>) {
        self.push(Item::Params(params));
    }

    /// Metrics of `step`, timestamped now; keys are made valid ([`sanitize_key`]), non-finite
    /// values are skipped (JSON has no NaN).
    pub fn log_metrics(&self, step: u64, values: &[(String, f64)]) {
        let values: Vec<(String, f64)> = values
            .iter()
            .filter(|(_, v)| v.is_finite())
            .map(|(k, v)| (sanitize_key(k), *v))
            .collect();
        if values.is_empty() {
            return;
        }
        self.push(Item::Metrics {
            step: step as i64,
            ts: now_ms(),
            values,
        });
    }

    /// Uploads the file `local` as `artifact_path` (relative, `/`-separated) when its turn comes.
    pub fn log_artifact(&self, local: impl Into<PathBuf>, artifact_path: &str) {
        self.push(Item::Artifact {
            local: local.into(),
            path: artifact_path.to_string(),
        });
    }

    /// The run id once the worker has created (or resumed) the run.
    pub fn run_id(&self) -> Option<String> {
        let run = self.shared.run.lock().ok()?;
        run.as_ref().map(|r| r.run_id.clone())
    }

    /// Sets the final status, lets queued items drain for at most `finish_timeout`, and returns
    /// the counts. Never fails; never waits much longer than `finish_timeout + request_timeout`.
    pub fn finish(mut self, status: RunStatus) -> TrackerStats {
        self.finish_inner(status, self.options.finish_timeout)
    }

    fn finish_inner(&mut self, status: RunStatus, timeout: Duration) -> TrackerStats {
        self.finished = true;
        if let Ok(mut d) = self.shared.deadline.lock() {
            *d = Some(Instant::now() + timeout);
        }
        if let Some(tx) = self.tx.take() {
            // The queue may be full: the status is worth a short wait.
            let status_item = Item::Status(status);
            if tx.send_timeout(status_item, timeout).is_err() {
                self.shared.drop_item("queue_full", None);
            }
        }
        let grace = timeout + self.options.request_timeout + Duration::from_secs(1);
        let abandoned = self.done.recv_timeout(grace).is_err();
        if !abandoned {
            if let Some(h) = self.worker.take() {
                let _ = h.join();
            }
        }
        let s = &self.shared;
        TrackerStats {
            url: self.url.clone(),
            experiment_id: s
                .run
                .lock()
                .ok()
                .and_then(|r| r.as_ref().map(|r| r.experiment_id.clone())),
            run_id: self.run_id(),
            sent: s.sent.load(Ordering::Relaxed),
            retried: s.retried.load(Ordering::Relaxed),
            dropped: s.dropped.load(Ordering::Relaxed),
            last_error: s.last_error.lock().ok().and_then(|l| l.clone()),
            abandoned,
        }
    }
}

impl Drop for Tracker {
    /// A tracker dropped without `finish` (the caller failed) marks its run FAILED, briefly.
    fn drop(&mut self) {
        if !self.finished {
            self.finish_inner(RunStatus::Failed, Duration::from_secs(5));
        }
    }
}

struct Worker {
    client: Client,
    spec: RunSpec,
    options: Options,
    shared: Arc<Shared>,
}

impl Worker {
    fn handle(&self, item: Item) {
        // The final status gets one attempt even past the deadline.
        let is_status = matches!(item, Item::Status(_));
        if self.shared.past_deadline() && !is_status {
            return self.shared.drop_item("deadline", None);
        }
        let run = match self.ensure_run() {
            Ok(r) => r,
            Err(e) => return self.fail(&e),
        };
        let r = match item {
            Item::Params(p) => self.send_params(&run, &p),
            Item::Metrics { step, ts, values } => self.send_metrics(&run, step, ts, &values),
            Item::Artifact { local, path } => {
                self.retry(|c| c.upload_artifact(&run, &local, &path))
            }
            Item::Status(s) => self.retry(|c| c.update_run(&run.run_id, s)),
        };
        match r {
            Ok(()) => {
                // A server that came back: report the next outage again.
                self.shared.reported.store(false, Ordering::Relaxed);
                self.shared.outage.store(false, Ordering::Relaxed);
                self.shared.sent.fetch_add(1, Ordering::Relaxed);
                metrics::counter!("mtrl_mlflow_sent_total").increment(1);
            }
            Err(e) => self.fail(&e),
        }
    }

    fn fail(&self, e: &CallError) {
        if e.retryable {
            self.shared.outage.store(true, Ordering::Relaxed);
        }
        self.shared.drop_item("failed", Some(&e.message));
    }

    /// Logs params; on a resumed run, keys it already has keep their first value (MLflow refuses
    /// a change) and changed ones are named once on stderr.
    fn send_params(&self, run: &RunInfo, params: &[(String, String)]) -> Result<(), CallError> {
        let existing = self
            .shared
            .existing_params
            .lock()
            .map(|e| e.clone())
            .unwrap_or_default();
        let mut changed = Vec::new();
        let mut all = Vec::new();
        for (k, v) in params {
            let (k, v) = (
                sanitize_key(k),
                v.chars().take(MAX_PARAM_CHARS).collect::<String>(),
            );
            match existing.iter().find(|(ek, _)| *ek == k) {
                Some((_, ev)) if *ev != v => changed.push(k),
                Some(_) => {}
                None => all.push(json!({"key": k, "value": v})),
            }
        }
        if !changed.is_empty() {
            eprintln!(
                "mlflow: run {} keeps the first values of params changed since: {}",
                run.run_id,
                changed.join(", ")
            );
        }
        for chunk in all.chunks(MAX_PARAMS_PER_BATCH) {
            self.retry(|c| c.log_batch(&run.run_id, &[], chunk))?;
        }
        Ok(())
    }

    fn send_metrics(
        &self,
        run: &RunInfo,
        step: i64,
        ts: i64,
        values: &[(String, f64)],
    ) -> Result<(), CallError> {
        let all: Vec<Value> = values
            .iter()
            .map(|(k, v)| json!({"key": k, "value": v, "timestamp": ts, "step": step}))
            .collect();
        for chunk in all.chunks(MAX_METRICS_PER_BATCH) {
            self.retry(|c| c.log_batch(&run.run_id, chunk, &[]))?;
        }
        Ok(())
    }

    fn ensure_run(&self) -> Result<RunInfo, CallError> {
        if let Some(r) = self.shared.run.lock().ok().and_then(|r| r.clone()) {
            return Ok(r);
        }
        let run = self.retry(|c| {
            if let Some(id) = &self.spec.resume_run_id {
                match c.get_run(id) {
                    Ok((r, params)) => {
                        c.update_run(&r.run_id, RunStatus::Running)?;
                        if let Ok(mut e) = self.shared.existing_params.lock() {
                            *e = params;
                        }
                        return Ok(r);
                    }
                    Err(e) if e.retryable => return Err(e),
                    Err(_) => {} // unknown run: start a new one
                }
            }
            let exp = c.experiment_id(&self.spec.experiment)?;
            let mut tags = self.spec.tags.clone();
            tags.push(("mlflow.runName".into(), self.spec.run_name.clone()));
            tags.push(("mlflow.source.name".into(), "mtrl".into()));
            c.create_run(&exp, &self.spec.run_name, &tags)
        })?;
        if let Ok(mut slot) = self.shared.run.lock() {
            *slot = Some(run.clone());
        }
        Ok(run)
    }

    /// Calls `f` until it succeeds, fails for good, runs out of attempts or passes the deadline.
    /// While finishing during an outage, one attempt per item: the server is known to be down and
    /// the caller is waiting.
    fn retry<T>(&self, f: impl Fn(&Client) -> Result<T, CallError>) -> Result<T, CallError> {
        let finishing = self.shared.time_left().is_some();
        let max_attempts = if finishing && self.shared.outage.load(Ordering::Relaxed) {
            1
        } else {
            self.options.max_attempts.max(1)
        };
        let mut wait = self.options.backoff;
        let mut attempt = 1;
        loop {
            let err = match f(&self.client) {
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            if !err.retryable || attempt >= max_attempts {
                return Err(err);
            }
            let nap = match self.shared.time_left() {
                Some(left) if left <= wait => return Err(err),
                _ => wait,
            };
            std::thread::sleep(nap);
            attempt += 1;
            wait = (wait * 2).min(self.options.max_backoff);
            self.shared.retried.fetch_add(1, Ordering::Relaxed);
            metrics::counter!("mtrl_mlflow_retries_total").increment(1);
        }
    }
}
