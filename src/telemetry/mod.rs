//! Telemetry of a run, wired by the commands (`mtrl train` today): the Prometheus endpoint
//! (`[logging] prometheus`) and MLflow tracking (`[logging] mlflow`, `mlflow_experiment`).
//!
//! [`Telemetry`] is the training loop's whole interface: `start` (install the exporter, start the
//! tracker), `step(&record)` (every numeric key of the step's JSON record becomes an MLflow metric
//! at that step; Prometheus already got its gauges from `report.rs`), `finish(status)` (upload
//! `metrics.jsonl`, `trajectories.jsonl`, `trajectories/**` and `eval/**` of `checkpoint.dir` as
//! artifacts, set the run's status, and return the counts for the run's JSON summary).
//!
//! Invariant: nothing here can stop or slow training once started — MLflow calls run on the
//! tracker's thread and its failures are counted, not returned. A resumed run continues the same
//! MLflow run (its id is kept in `<checkpoint.dir>/mlflow-run.json`).

mod flatten;
pub mod mlflow;
pub mod prometheus;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Result;
use mtrl_core::config::ModelSource;
use mtrl_core::Config;
use serde_json::{json, Value};

pub use flatten::{numeric_leaves, toml_params};
use mlflow::{Options, RunSpec, RunStatus, Tracker};

/// How long `finish` lets artifacts and queued metrics drain (an outage fails them fast).
const FINISH_TIMEOUT: Duration = Duration::from_secs(300);

/// The exporters of one training run.
pub struct Telemetry {
    prometheus: Option<SocketAddr>,
    tracker: Option<Tracker>,
    /// MLflow server URL and experiment (what `mlflow-run.json` is valid for).
    target: Option<(String, String)>,
    dir: PathBuf,
    run_file_written: bool,
}

fn run_file(dir: &Path) -> PathBuf {
    dir.join("mlflow-run.json")
}

/// The MLflow params of a run: the config file's keys flattened, plus the effective seed, model
/// path and config file.
fn params(cfg: &Config) -> Vec<(String, String)> {
    let mut p = std::fs::read_to_string(&cfg.source)
        .ok()
        .and_then(|text| toml::from_str::<toml::Value>(&text).ok())
        .map(|v| toml_params(&v))
        .unwrap_or_default();
    p.push(("seed".into(), cfg.train.seed.to_string()));
    if let Some(m) = &cfg.model {
        let path = match &m.source {
            ModelSource::Dir(d) | ModelSource::RandomConfig(d) => d.display().to_string(),
            ModelSource::RandomPreset(name) => format!("random:{name}"),
        };
        p.push(("model_path".into(), path));
    }
    p.push(("config_file".into(), cfg.source.display().to_string()));
    p.push(("mtrl_version".into(), env!("CARGO_PKG_VERSION").into()));
    p
}

impl Telemetry {
    /// Installs the Prometheus exporter and starts MLflow tracking, as configured. `resumed`: the
    /// run continues from a checkpoint (then its MLflow run is continued too).
    pub fn start(cfg: &Config, resumed: bool) -> Result<Telemetry> {
        let prometheus = match &cfg.logging.prometheus {
            Some(addr) => {
                let a = prometheus::install(addr)?;
                eprintln!("prometheus: serving metrics on http://{a}/metrics");
                Some(a)
            }
            None => None,
        };
        let dir = cfg.checkpoint.dir.clone();
        let target = cfg
            .logging
            .mlflow
            .clone()
            .map(|url| (url, cfg.logging.mlflow_experiment.clone()));
        let tracker = match &target {
            Some((url, experiment)) => {
                let experiment = experiment.clone();
                let resume_run_id = resumed
                    .then(|| previous_run(&dir, url, &experiment))
                    .flatten();
                let spec = RunSpec {
                    url: url.clone(),
                    experiment,
                    run_name: cfg.name.clone(),
                    resume_run_id,
                    params: params(cfg),
                    tags: vec![(
                        "mtrl.checkpoint_dir".into(),
                        cfg.checkpoint.dir.display().to_string(),
                    )],
                };
                let options = Options {
                    finish_timeout: FINISH_TIMEOUT,
                    ..Options::default()
                };
                Some(Tracker::start_with(spec, options)?)
            }
            None => None,
        };
        Ok(Telemetry {
            prometheus,
            tracker,
            target,
            dir,
            run_file_written: false,
        })
    }

    /// Logs one step record (a line of `metrics.jsonl`) to MLflow.
    pub fn step(&mut self, rec: &Value) {
        let Some(t) = &self.tracker else { return };
        let step = rec["step"].as_u64().unwrap_or(0);
        t.log_metrics(step, &numeric_leaves(rec));
        let id = t.run_id();
        self.remember(id);
    }

    /// Writes `mlflow-run.json` once the run id is known (a resume continues that run).
    fn remember(&mut self, id: Option<String>) {
        let (Some(id), Some((url, experiment))) = (id, &self.target) else {
            return;
        };
        if self.run_file_written {
            return;
        }
        let v = json!({"url": url, "experiment": experiment, "run_id": id});
        let path = run_file(&self.dir);
        if let Err(e) = std::fs::write(&path, format!("{v}\n")) {
            eprintln!("mlflow: cannot write {}: {e}", path.display());
        }
        self.run_file_written = true;
    }

    /// Uploads the run's files, sets the MLflow status and returns
    /// `{"prometheus": addr|null, "mlflow": {sent, retried, dropped, run_id, …}|null}`.
    pub fn finish(mut self, status: RunStatus) -> Value {
        let mut mlflow = Value::Null;
        if let Some(t) = self.tracker.take() {
            for (local, path) in artifacts(&self.dir) {
                t.log_artifact(local, &path);
            }
            let stats = t.finish(status);
            if stats.dropped > 0 {
                eprintln!(
                    "mlflow: {} of {} items could not be logged ({})",
                    stats.dropped,
                    stats.dropped + stats.sent,
                    stats.last_error.as_deref().unwrap_or("queue full")
                );
            }
            self.remember(stats.run_id.clone());
            mlflow = stats.to_json();
        }
        json!({
            "prometheus": self.prometheus.map(|a| a.to_string()),
            "mlflow": mlflow,
        })
    }
}

/// The run id in `mlflow-run.json` when it was logged to the same server and experiment.
fn previous_run(dir: &Path, url: &str, experiment: &str) -> Option<String> {
    let text = std::fs::read_to_string(run_file(dir)).ok()?;
    let v: Value = serde_json::from_str(&text).ok()?;
    (v["url"] == url && v["experiment"] == experiment)
        .then(|| v["run_id"].as_str().map(str::to_string))
        .flatten()
}

/// `(local file, artifact path)` of everything a run leaves for MLflow, in a stable order.
fn artifacts(dir: &Path) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    for name in ["metrics.jsonl", "trajectories.jsonl"] {
        let p = dir.join(name);
        if p.is_file() {
            out.push((p, name.to_string()));
        }
    }
    for sub in ["trajectories", "eval"] {
        walk(&dir.join(sub), sub, &mut out);
    }
    out
}

fn walk(dir: &Path, prefix: &str, out: &mut Vec<(PathBuf, String)>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = rd.filter_map(|e| e.ok()).collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let name = e.file_name().to_string_lossy().into_owned();
        let path = e.path();
        let rel = format!("{prefix}/{name}");
        if path.is_dir() {
            walk(&path, &rel, out);
        } else if path.is_file() {
            out.push((path, rel));
        }
    }
}
