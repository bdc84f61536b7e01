//! MLflow tracking over its REST API: params, per-step metrics, artifacts and the run's status.
//!
//! `client` is a thin blocking client (`ureq`, one request per call, no retries); `tracker` runs
//! it on a background thread behind a bounded queue with retries and back-off, so training never
//! waits on — and never fails because of — the tracking server. Any command can use it:
//!
//! ```ignore
//! let t = Tracker::start("http://127.0.0.1:5000", "mtrl", "eval-1", params)?;
//! t.log_metrics(step, &[("ndcg@10".into(), 0.41)]);
//! t.log_artifact("runs/x/eval/report.json", "eval/report.json");
//! let stats = t.finish(RunStatus::Finished); // {sent, retried, dropped, run_id, …}
//! ```
//!
//! The training run logs through [`super::MlflowSink`]; `tests/mlflow.rs` drives the tracker
//! directly against a real server.

mod client;
mod tracker;

pub use client::{proxied_artifact_root, sanitize_key, Client, RunInfo, RunStatus};
pub use tracker::{Options, RunSpec, Tracker, TrackerStats};
