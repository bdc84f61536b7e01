//! The curves of a run: training metrics per step from `<run>/metrics.jsonl` (typed
//! [`StepRecord`]s), validation from their `val_*` fields, and evaluation reports from `<run>/eval/*.json` and `<run>/eval/*/eval.json`.
//!
//! An evaluation whose label or source names a step (`step-40`, `step 40`, or a bare number) is
//! a validation point at that step; one that does not (a base model, a baseline) is drawn as a
//! horizontal reference line. Reports must carry the [`REPORT_FORMAT_VERSION`] this build reads;
//! any other is an error naming the file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use mtrl_core::{read_jsonl, StepRecord};

use crate::error::{EvalError, Result};
use crate::report::REPORT_FORMAT_VERSION;

/// A figure drawn per step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Metric {
    Reward,
    Ndcg,
    FailureRate,
    Turns,
    /// Mean lag of the trained samples, in policy versions.
    Staleness,
    /// Largest lag of the trained samples.
    StalenessMax,
}

impl Metric {
    /// The key of this figure in an evaluation summary (`mtrl_eval::Summary`; step records
    /// are typed and need no keys).
    fn keys(&self) -> &'static [&'static str] {
        match self {
            Metric::Reward => &["reward"],
            Metric::Ndcg => &["ndcg_at_10"],
            Metric::FailureRate => &["fail_rate"],
            Metric::Turns => &["turns"],
            Metric::Staleness | Metric::StalenessMax => &[],
        }
    }

    const SCORES: [Metric; 4] = [
        Metric::Reward,
        Metric::Ndcg,
        Metric::FailureRate,
        Metric::Turns,
    ];
}

/// Points `(step, value)` per metric.
pub type Series = BTreeMap<Metric, Vec<(f64, f64)>>;

/// Everything `plot` draws.
#[derive(Debug, Clone, Default)]
pub struct RunCurves {
    pub run_dir: PathBuf,
    /// Training, one point per step.
    pub train: Series,
    /// Validation / evaluation curves by source (`validation`, `eval: <benchmark>`).
    pub val: BTreeMap<String, Series>,
    /// Evaluations at no step (base model, baselines): label and figures.
    pub references: Vec<(String, BTreeMap<Metric, f64>)>,
}

impl RunCurves {
    /// Whether there is nothing to draw.
    pub fn is_empty(&self) -> bool {
        self.train.values().all(Vec::is_empty) && self.val.is_empty() && self.references.is_empty()
    }
}

fn number(obj: &serde_json::Map<String, Value>, keys: &[&str]) -> Option<f64> {
    keys.iter()
        .find_map(|k| obj.get(*k).and_then(Value::as_f64))
        .filter(|v| v.is_finite())
}

/// Reads `metrics.jsonl` (typed [`StepRecord`] lines of this build's format version) into
/// training and validation series.
fn read_metrics(path: &Path, curves: &mut RunCurves) -> Result<()> {
    let mut val = Series::new();
    for r in read_jsonl::<StepRecord>(path)? {
        let step = r.step as f64;
        let train = [
            (Metric::Reward, Some(r.reward_mean)),
            (Metric::Ndcg, Some(r.ndcg_at_10)),
            (Metric::FailureRate, Some(r.failure_rate)),
            (Metric::Turns, Some(r.turns_mean)),
            (Metric::Staleness, r.lag_stats().map(|l| l.0)),
            (Metric::StalenessMax, r.lag_stats().map(|l| l.1)),
        ];
        for (m, x) in train {
            if let Some(x) = x.filter(|x| x.is_finite()) {
                curves.train.entry(m).or_default().push((step, x));
            }
        }
        let validation = [
            (Metric::Reward, r.val_reward_mean),
            (Metric::Ndcg, r.val_ndcg_at_10),
            (Metric::FailureRate, r.val_failure_rate),
            (Metric::Turns, r.val_turns_mean),
        ];
        for (m, x) in validation {
            if let Some(x) = x.filter(|x| x.is_finite()) {
                val.entry(m).or_default().push((step, x));
            }
        }
    }
    if !val.is_empty() {
        curves.val.insert("validation".into(), val);
    }
    Ok(())
}

/// The step a label or model source names: `step-40`, `step 40`, `step_40`, or `40`.
pub fn step_in(text: &str) -> Option<f64> {
    if let Ok(n) = text.trim().parse::<u64>() {
        return Some(n as f64);
    }
    let lower = text.to_ascii_lowercase();
    let at = lower.rfind("step")?;
    let rest = lower[at + 4..].trim_start_matches(['-', '_', ' ', '=']);
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse::<u64>().ok().map(|n| n as f64)
}

/// Reads one evaluation report (the `mtrl eval` JSON, or any object with `step` and figures).
fn read_eval(path: &Path, curves: &mut RunCurves) -> Result<()> {
    let text = std::fs::read_to_string(path).map_err(|source| EvalError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let bad = |what: String| EvalError::Invalid(format!("{}: {what}", path.display()));
    let v: Value = serde_json::from_str(&text).map_err(|e| bad(format!("not JSON: {e}")))?;
    let Some(obj) = v.as_object() else {
        return Err(bad("not a JSON object".into()));
    };
    let figures = |o: &serde_json::Map<String, Value>| -> BTreeMap<Metric, f64> {
        Metric::SCORES
            .iter()
            .filter_map(|m| number(o, m.keys()).map(|x| (*m, x)))
            .collect()
    };
    if let Some(datasets) = obj.get("datasets").and_then(Value::as_array) {
        match obj.get("format_version").and_then(Value::as_u64) {
            Some(v) if v == REPORT_FORMAT_VERSION as u64 => {}
            other => {
                return Err(bad(format!(
                    "evaluation report format_version {}, this mtrl reads version \
                     {REPORT_FORMAT_VERSION}",
                    other.map_or("missing".into(), |v| v.to_string())
                )))
            }
        }
        for d in datasets {
            let bench = d.get("benchmark").and_then(Value::as_str).unwrap_or("test");
            for run in d
                .get("runs")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let label = run.get("label").and_then(Value::as_str).unwrap_or("?");
                let source = run.get("source").and_then(Value::as_str).unwrap_or("");
                let Some(summary) = run.get("summary").and_then(Value::as_object) else {
                    continue;
                };
                let f = figures(summary);
                match step_in(label).or_else(|| step_in(source)) {
                    Some(step) => {
                        let series = curves.val.entry(format!("eval: {bench}")).or_default();
                        for (m, x) in f {
                            series.entry(m).or_default().push((step, x));
                        }
                    }
                    None => curves.references.push((format!("{label} ({bench})"), f)),
                }
            }
        }
    } else if let Some(step) = obj.get("step").and_then(Value::as_f64) {
        let name = path
            .file_stem()
            .map_or("eval".into(), |s| s.to_string_lossy().to_string());
        let series = curves.val.entry(format!("eval: {name}")).or_default();
        for (m, x) in figures(obj) {
            series.entry(m).or_default().push((step, x));
        }
    }
    Ok(())
}

/// The evaluation reports under `<run>/eval/`.
fn eval_files(run_dir: &Path) -> Result<Vec<PathBuf>> {
    let eval = run_dir.join("eval");
    if !eval.is_dir() {
        return Ok(Vec::new());
    }
    let entries = std::fs::read_dir(&eval).map_err(|source| EvalError::Io {
        path: eval.clone(),
        source,
    })?;
    let mut out = Vec::new();
    for e in entries.filter_map(|e| e.ok()) {
        let p = e.path();
        if p.is_dir() && p.join("eval.json").is_file() {
            out.push(p.join("eval.json"));
        } else if p.extension().is_some_and(|x| x == "json") && p.is_file() {
            out.push(p);
        }
    }
    out.sort();
    Ok(out)
}

/// Reads every curve of a run folder; an error when the folder is missing or holds nothing.
pub fn read_curves(run_dir: &Path) -> Result<RunCurves> {
    if !run_dir.is_dir() {
        return Err(EvalError::Invalid(format!(
            "{}: no such run folder",
            run_dir.display()
        )));
    }
    let mut curves = RunCurves {
        run_dir: run_dir.to_path_buf(),
        ..RunCurves::default()
    };
    let metrics = run_dir.join("metrics.jsonl");
    if metrics.is_file() {
        read_metrics(&metrics, &mut curves)?;
    }
    for f in eval_files(run_dir)? {
        read_eval(&f, &mut curves)?;
    }
    for series in curves.val.values_mut() {
        for points in series.values_mut() {
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
        }
    }
    if curves.is_empty() {
        return Err(EvalError::Invalid(format!(
            "{}: nothing to plot (no metrics.jsonl lines, no eval/*.json)",
            run_dir.display()
        )));
    }
    Ok(curves)
}
