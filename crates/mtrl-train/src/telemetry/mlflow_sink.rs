//! [`MlflowSink`]: MLflow tracking of a run (`[logging] mlflow`, `mlflow_experiment`).
//!
//! `start` starts the tracker, `record` makes every numeric field of a record an MLflow metric at
//! that step (an evaluation's as `<benchmark>/<model>.<figure>`), `finish` uploads the run
//! folder's record files (`metrics.jsonl`, `sft-metrics.jsonl`, `trajectories.jsonl`,
//! `trajectories/**`, an evaluation's `eval.{md,json,csv}` and `eval/**`) as artifacts, sets the run's status and returns the counts for the
//! run's JSON summary.
//!
//! Invariant: nothing here can stop or slow training once started — MLflow calls run on the
//! tracker's thread and its failures are counted, not returned. A resumed run continues the same
//! MLflow run (its id is kept in `<run folder>/mlflow-run.json`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use mtrl_core::config::ModelSource;
use mtrl_core::Config;
use serde_json::{json, Value};

use super::flatten::{numeric_leaves, toml_params};
use super::mlflow::{Options, RunSpec, RunStatus, Tracker};
use super::{Record, Sink};
use crate::error::Result;

/// How long `finish` lets artifacts and queued metrics drain (an outage fails them fast).
const FINISH_TIMEOUT: Duration = Duration::from_secs(300);

/// MLflow tracking of one run.
pub struct MlflowSink {
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

impl MlflowSink {
    /// Starts tracking the run `run_name` of `cfg` into the experiment of `[logging]`, when
    /// `[logging] mlflow` is set (`None` otherwise). `dir`: the run's folder (artifacts,
    /// `mlflow-run.json`); `resumed`: the run continues from a checkpoint, and so does its
    /// MLflow run.
    pub fn start(cfg: &Config, run_name: &str, dir: &Path, resumed: bool) -> Result<Option<Self>> {
        let Some(url) = cfg.logging.mlflow.clone() else {
            return Ok(None);
        };
        let experiment = cfg.logging.mlflow_experiment.clone();
        let resume_run_id = resumed
            .then(|| previous_run(dir, &url, &experiment))
            .flatten();
        let spec = RunSpec {
            url: url.clone(),
            experiment: experiment.clone(),
            run_name: run_name.to_string(),
            resume_run_id,
            params: params(cfg),
            tags: vec![("mtrl.checkpoint_dir".into(), dir.display().to_string())],
        };
        let options = Options {
            finish_timeout: FINISH_TIMEOUT,
            ..Options::default()
        };
        Ok(Some(MlflowSink {
            tracker: Some(Tracker::start_with(spec, options)?),
            target: Some((url, experiment)),
            dir: dir.to_path_buf(),
            run_file_written: false,
        }))
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
}

impl Sink for MlflowSink {
    fn record(&mut self, r: Record<'_>) -> Result<()> {
        let Some(t) = &self.tracker else {
            return Ok(());
        };
        t.log_metrics(r.step(), &numeric_leaves(&r.to_json()));
        let id = t.run_id();
        self.remember(id);
        Ok(())
    }

    /// Uploads the run's files, sets the MLflow status and returns
    /// `("mlflow", {sent, retried, dropped, run_id, …})`.
    fn finish(&mut self, status: RunStatus) -> Result<Option<(&'static str, Value)>> {
        let Some(t) = self.tracker.take() else {
            return Ok(None);
        };
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
        Ok(Some(("mlflow", stats.to_json())))
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
    for name in [
        "metrics.jsonl",
        "sft-metrics.jsonl",
        "trajectories.jsonl",
        "eval.md",
        "eval.json",
        "eval.csv",
    ] {
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
