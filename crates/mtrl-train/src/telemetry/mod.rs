//! Telemetry of a run through one seam, the [`Sink`] trait: every command that produces run
//! records (RL steps, SFT steps, evaluation figures) hands each record to a [`Telemetry`], which fans it out to its
//! sinks — the `metrics.jsonl` writer ([`JsonlSink`]), the progress bar ([`ProgressSink`]), the
//! Prometheus endpoint ([`PrometheusSink`], `[logging] prometheus`) and MLflow tracking
//! ([`MlflowSink`], `[logging] mlflow`). Front ends and tests add their own sinks with
//! [`Telemetry::push`] (e.g. to collect records in memory).
//!
//! Invariants: a sink that writes the run's own files (JSONL) returns its IO errors — a run never
//! loses its record silently; sinks that talk to the network (MLflow) never stop or slow the run:
//! their failures are counted and reported at `finish`. Records are typed
//! ([`mtrl_core::StepRecord`], [`mtrl_core::SftRecord`]); sinks derive names from their fields.

mod flatten;
mod jsonl;
pub mod mlflow;
mod mlflow_sink;
mod progress;
pub mod prometheus;

use mtrl_core::{SftRecord, StepRecord};
use serde_json::{json, Value};

use crate::error::Result;

pub use flatten::{numeric_leaves, toml_params};
pub use jsonl::JsonlSink;
pub use mlflow::RunStatus;
pub use mlflow_sink::MlflowSink;
pub use progress::{IndexBar, ProgressSink};
pub use prometheus::PrometheusSink;

/// One record of a run.
#[derive(Debug, Clone, Copy)]
pub enum Record<'a> {
    Step(&'a StepRecord),
    Sft(&'a SftRecord),
    /// One model's figures on one benchmark of an evaluation (`mtrl eval`, the default job).
    Eval {
        benchmark: &'a str,
        model: &'a str,
        summary: &'a mtrl_eval::report::Summary,
    },
}

impl Record<'_> {
    /// The step the record belongs to (0 for an evaluation).
    pub fn step(&self) -> u64 {
        match self {
            Record::Step(r) => r.step,
            Record::Sft(r) => r.step,
            Record::Eval { .. } => 0,
        }
    }

    /// The record as JSON: its serialised form (`format_version` included); an evaluation's
    /// figures under `"<benchmark>/<model>"`.
    pub fn to_json(&self) -> Value {
        match self {
            Record::Step(r) => serde_json::to_value(r),
            Record::Sft(r) => serde_json::to_value(r),
            Record::Eval {
                benchmark,
                model,
                summary,
            } => {
                serde_json::to_value(summary).map(|v| json!({ format!("{benchmark}/{model}"): v }))
            }
        }
        .unwrap_or(Value::Null)
    }
}

/// A destination for run records.
pub trait Sink: Send {
    /// Takes one record. Only sinks that own the run's files return errors.
    fn record(&mut self, r: Record<'_>) -> Result<()>;

    /// The run ended with `status`: flush, upload, close. Returns `(key, summary)` for the run's
    /// JSON summary (`"telemetry": {key: summary}`), if the sink has one.
    fn finish(&mut self, _status: RunStatus) -> Result<Option<(&'static str, Value)>> {
        Ok(None)
    }
}

/// How a run that returned `r` ended: finished, or failed on its error.
pub fn status_of<T, E>(r: &std::result::Result<T, E>) -> RunStatus {
    match r {
        Ok(_) => RunStatus::Finished,
        Err(_) => RunStatus::Failed,
    }
}

/// The sinks of one run.
#[derive(Default)]
pub struct Telemetry {
    sinks: Vec<Box<dyn Sink>>,
}

impl Telemetry {
    pub fn new() -> Telemetry {
        Telemetry::default()
    }

    /// Adds a sink; records reach sinks in the order they were added.
    pub fn push(&mut self, sink: Box<dyn Sink>) {
        self.sinks.push(sink);
    }

    /// Hands `r` to every sink; the first error (a run file that cannot be written) is returned
    /// after every sink has seen the record.
    pub fn record(&mut self, r: Record<'_>) -> Result<()> {
        let mut first = None;
        for s in &mut self.sinks {
            if let Err(e) = s.record(r) {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Finishes every sink; returns `{"prometheus": …, "mlflow": …}` (null where not configured).
    pub fn finish(self, status: RunStatus) -> Result<Value> {
        let mut out = json!({"prometheus": null, "mlflow": null});
        let mut first = None;
        for mut s in self.sinks {
            match s.finish(status) {
                Ok(Some((k, v))) => out[k] = v,
                Ok(None) => {}
                Err(e) => {
                    first.get_or_insert(e);
                }
            }
        }
        first.map_or(Ok(out), Err)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    struct Collect(Arc<Mutex<Vec<u64>>>);

    impl Sink for Collect {
        fn record(&mut self, r: Record<'_>) -> Result<()> {
            self.0.lock().unwrap().push(r.step());
            Ok(())
        }
    }

    #[test]
    fn records_reach_every_sink_and_the_summary_has_both_keys() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let mut t = Telemetry::new();
        t.push(Box::new(Collect(seen.clone())));
        t.push(Box::new(Collect(seen.clone())));
        let r = StepRecord {
            step: 7,
            ..StepRecord::default()
        };
        t.record(Record::Step(&r)).unwrap();
        assert_eq!(*seen.lock().unwrap(), vec![7, 7]);
        let v = t.finish(RunStatus::Finished).unwrap();
        assert_eq!(v, json!({"prometheus": null, "mlflow": null}));
    }
}
