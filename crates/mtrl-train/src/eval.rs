//! An evaluation job with the run's telemetry (`mtrl eval`, the default job's last stage): runs
//! [`mtrl_eval::evaluate`], writes the report (`eval.md`, `eval.json`, `eval.csv`) into `out`, and
//! hands every (benchmark, model) summary to the sinks `[logging]` asks for — Prometheus
//! `mtrl_eval_*{benchmark, model}` gauges, an MLflow run `<name>-eval` with the figures as
//! `<benchmark>/<model>.<figure>` and the report files as artifacts.

use std::path::{Path, PathBuf};

use mtrl_core::Config;
use mtrl_eval::{evaluate, EvalJob, EvalReport};
use serde_json::Value;

use crate::error::{Result, TrainError};
use crate::telemetry::{status_of, MlflowSink, PrometheusSink, Record, Telemetry};

/// What an evaluation produced.
pub struct EvalOutcome {
    pub report: EvalReport,
    /// The files written into the output folder.
    pub written: Vec<PathBuf>,
    /// `{prometheus, mlflow}` as in a training run's summary.
    pub telemetry: Value,
}

/// The sinks of an evaluation writing into `out`.
fn telemetry(cfg: &Config, out: &Path) -> Result<Telemetry> {
    let mut t = Telemetry::new();
    if let Some(addr) = &cfg.logging.prometheus {
        t.push(Box::new(PrometheusSink::start(addr)?));
    }
    if cfg.logging.mlflow.is_some() {
        std::fs::create_dir_all(out)?;
    }
    if let Some(m) = MlflowSink::start(cfg, &format!("{}-eval", cfg.name), out, false)? {
        t.push(Box::new(m));
    }
    Ok(t)
}

/// Runs `job`, writes its report into `out` and reports its figures to the config's sinks.
/// With `[rollout] environment = "agent"` every policy's episodes go through the user's agent,
/// served by a policy endpoint started here for the job.
pub fn run(cfg: &Config, mut job: EvalJob, out: &Path) -> Result<EvalOutcome> {
    let mut t = telemetry(cfg, out)?;
    let host = match job.agent {
        Some(_) => None,
        None => crate::agent::AgentHost::start(cfg, &format!("{}-eval", cfg.name), usize::MAX)?,
    };
    if let Some(h) = host.as_ref() {
        eprintln!("policy endpoint for the agent: {}", h.endpoint());
        let h = h.drivers();
        job.agent = Some(h);
    }
    let done = evaluate(job);
    if let Some(h) = host {
        h.shutdown();
    }
    let done = done.map_err(TrainError::from).and_then(|report| {
        let mut written = report.write_all(out)?;
        if cfg.logging.trajectories {
            let p = out.join("trajectories.jsonl");
            report.write_trajectories(&p)?;
            written.push(p);
        }
        for d in &report.datasets {
            for r in &d.runs {
                t.record(Record::Eval {
                    benchmark: &d.benchmark,
                    model: &r.label,
                    summary: &r.summary,
                })?;
            }
        }
        Ok((report, written))
    });
    let telemetry = t.finish(status_of(&done))?;
    let (report, written) = done?;
    Ok(EvalOutcome {
        report,
        written,
        telemetry,
    })
}
