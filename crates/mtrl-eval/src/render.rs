//! Rendering an [`EvalReport`]: a Markdown table (what `mtrl eval` prints), JSON (everything but
//! the trajectories, per-task results included) and CSV (the table's rows).
//!
//! Table shape: `benchmark | size | model | ndcg@10 | fail_rate | turns | pass@k | reward |
//! tokens/task | s/task`, one row per model and benchmark, then one `Δ a − b` row per comparison
//! whose nDCG@10 cell carries the paired bootstrap interval. `-` marks a figure that does not
//! exist (pass@k with k = 0, tokens of a scripted baseline).

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::{EvalError, Result};
use crate::report::{Comparison, EvalReport, Summary};

/// File names written into the output folder.
pub const MARKDOWN_FILE: &str = "eval.md";
pub const JSON_FILE: &str = "eval.json";
pub const CSV_FILE: &str = "eval.csv";

fn opt(v: Option<f64>, prec: usize) -> String {
    v.map_or_else(|| "-".to_string(), |v| format!("{v:.prec$}"))
}

fn signed(v: Option<f64>, prec: usize) -> String {
    v.map_or_else(|| "-".to_string(), |v| format!("{v:+.prec$}"))
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> EvalError + '_ {
    move |source| EvalError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A CSV field, quoted when it needs to be.
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// One CSV/table row of numbers:
/// `[ndcg, fail_rate, turns, pass@k, reward, sampled reward, tokens, s]`.
fn summary_cells(s: &Summary) -> [Option<f64>; 8] {
    [
        Some(s.ndcg_at_10),
        Some(s.fail_rate),
        Some(s.turns),
        s.pass_at_k,
        Some(s.reward),
        s.sampled_reward,
        s.tokens_per_task,
        Some(s.s_per_task),
    ]
}

fn comparison_cells(c: &Comparison) -> [Option<f64>; 8] {
    [
        Some(c.ndcg_at_10.diff),
        Some(c.fail_rate),
        Some(c.turns),
        c.pass_at_k,
        Some(c.reward),
        c.sampled_reward,
        c.tokens_per_task,
        Some(c.s_per_task),
    ]
}

const PRECISION: [usize; 8] = [4, 3, 2, 3, 4, 4, 1, 3];

impl EvalReport {
    fn pass_column(&self) -> String {
        format!("pass@{}", self.k)
    }

    /// The results table in Markdown, with a line saying how it was measured.
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        let pass = &self.pass;
        out.push_str(&format!(
            "Greedy decoding; pass@{k}: {n} sampled attempts per task (temperature {t}, top_p {p}, \
             top_k {tk}), a task passes when {m} ≥ {th}; reward~: mean reward of those attempts; Δ rows: difference with the paired \
             bootstrap {lvl}% interval of the nDCG@10 difference ({b} resamples, seed {s}).\n\n",
            k = self.k,
            n = self.samples,
            t = self.sampling.temperature,
            p = self.sampling.top_p,
            tk = self.sampling.top_k,
            m = pass.metric.as_str(),
            th = pass.threshold,
            lvl = self.confidence_level * 100.0,
            b = self.bootstrap_resamples,
            s = self.seed,
        ));
        out.push_str(&format!(
            "| benchmark | size | model | ndcg@10 | fail_rate | turns | {} | reward | reward~ | tokens/task | s/task |\n",
            self.pass_column()
        ));
        out.push_str("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
        for d in &self.datasets {
            for r in &d.runs {
                let cells: Vec<String> = summary_cells(&r.summary)
                    .iter()
                    .zip(PRECISION)
                    .map(|(v, p)| opt(*v, p))
                    .collect();
                out.push_str(&format!(
                    "| {} | {} | {} | {} |\n",
                    d.benchmark,
                    d.size,
                    r.label,
                    cells.join(" | ")
                ));
            }
            for c in &d.comparisons {
                let mut cells: Vec<String> = comparison_cells(c)
                    .iter()
                    .zip(PRECISION)
                    .map(|(v, p)| signed(*v, p))
                    .collect();
                let i = &c.ndcg_at_10;
                cells[0] = format!("{:+.4} [{:+.4}, {:+.4}]", i.diff, i.low, i.high);
                out.push_str(&format!(
                    "| {} | {} | Δ {} − {} | {} |\n",
                    d.benchmark,
                    d.size,
                    c.a,
                    c.b,
                    cells.join(" | ")
                ));
            }
        }
        out.push_str(&self.failure_table());
        out
    }

    /// Greedy episodes by how they went wrong: the share that ended on each failure reason, and
    /// the share with at least one tool call answered with an error of each kind (the episode
    /// goes on after those).
    fn failure_table(&self) -> String {
        use mtrl_core::{CallErrorKind, FailureReason};
        let mut out = String::from(
            "\nGreedy episodes by failure (share that ended so) and by tool-call error (share with at least one):\n\n| benchmark | model |",
        );
        for f in FailureReason::ALL {
            out.push_str(&format!(" {} |", f.as_str()));
        }
        for k in CallErrorKind::ALL {
            out.push_str(&format!(" {} |", k.as_str()));
        }
        out.push('\n');
        out.push_str("|---|---|");
        out.push_str(&"---:|".repeat(FailureReason::ALL.len() + CallErrorKind::ALL.len()));
        out.push('\n');
        for d in &self.datasets {
            for r in &d.runs {
                let n = d.size.max(1) as f64;
                out.push_str(&format!("| {} | {} |", d.benchmark, r.label));
                for f in FailureReason::ALL {
                    let c = r.summary.failures.get(f.as_str()).copied().unwrap_or(0);
                    out.push_str(&format!(" {:.2} |", c as f64 / n));
                }
                for k in CallErrorKind::ALL {
                    let c = r.summary.call_errors.get(k.as_str()).copied().unwrap_or(0);
                    out.push_str(&format!(" {:.2} |", c as f64 / n));
                }
                out.push('\n');
            }
        }
        out
    }

    /// The table's rows as CSV (comparison rows have model `a - b` and the interval's ends).
    pub fn csv(&self) -> String {
        let mut out = format!(
            "benchmark,size,model,ndcg@10,fail_rate,turns,{},reward,sampled_reward,tokens/task,s/task,ndcg@10_ci_low,ndcg@10_ci_high\n",
            self.pass_column()
        );
        let num = |v: &Option<f64>| v.map_or_else(String::new, |v| format!("{v}"));
        for d in &self.datasets {
            let b = csv_field(&d.benchmark);
            for r in &d.runs {
                let cells: Vec<String> = summary_cells(&r.summary).iter().map(num).collect();
                out.push_str(&format!(
                    "{b},{},{},{},,\n",
                    d.size,
                    csv_field(&r.label),
                    cells.join(",")
                ));
            }
            for c in &d.comparisons {
                let cells: Vec<String> = comparison_cells(c).iter().map(num).collect();
                out.push_str(&format!(
                    "{b},{},{},{},{},{}\n",
                    d.size,
                    csv_field(&format!("{} - {}", c.a, c.b)),
                    cells.join(","),
                    c.ndcg_at_10.low,
                    c.ndcg_at_10.high
                ));
            }
        }
        out
    }

    /// Writes the report as pretty JSON (trajectories excluded).
    pub fn write_json(&self, path: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self)
            .map_err(|e| EvalError::Invalid(format!("serialising the report: {e}")))?;
        write_file(path, text.as_bytes())
    }

    /// Writes every policy episode as a JSON line `{"benchmark", "model", "task", "sample",
    /// "trajectory"}` (sample 0 = greedy, 1..=n the attempts) — what `[logging] trajectories`
    /// asks an evaluation to keep.
    pub fn write_trajectories(&self, path: &Path) -> Result<()> {
        let mut out = String::new();
        for d in &self.datasets {
            for r in &d.runs {
                for (i, g) in r.greedy.iter().enumerate() {
                    let attempts = r.samples.get(i).map_or(&[][..], Vec::as_slice);
                    for (s, t) in std::iter::once(g).chain(attempts).enumerate() {
                        let line = serde_json::json!({"benchmark": d.benchmark, "model": r.label,
                            "task": i, "sample": s, "trajectory": t});
                        out.push_str(&line.to_string());
                        out.push('\n');
                    }
                }
            }
        }
        write_file(path, out.as_bytes())
    }

    pub fn write_csv(&self, path: &Path) -> Result<()> {
        write_file(path, self.csv().as_bytes())
    }

    pub fn write_markdown(&self, path: &Path) -> Result<()> {
        write_file(path, self.markdown().as_bytes())
    }

    /// Writes `eval.md`, `eval.json` and `eval.csv` into `dir` (created); returns their paths.
    pub fn write_all(&self, dir: &Path) -> Result<Vec<PathBuf>> {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let paths = [MARKDOWN_FILE, JSON_FILE, CSV_FILE].map(|f| dir.join(f));
        self.write_markdown(&paths[0])?;
        self.write_json(&paths[1])?;
        self.write_csv(&paths[2])?;
        Ok(paths.to_vec())
    }
}

/// Writes through a temporary file and a rename, so a reader never sees half a report.
fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp).map_err(io(&tmp))?;
    f.write_all(bytes).map_err(io(&tmp))?;
    f.sync_all().map_err(io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io(path))
}

#[cfg(test)]
mod tests {
    use crate::bootstrap::Interval;
    use crate::report::*;

    fn run(label: &str, ndcg: f64, tokens: Option<f64>) -> ModelRun {
        ModelRun {
            label: label.into(),
            kind: RunKind::Policy,
            source: "x".into(),
            summary: Summary {
                ndcg_at_10: ndcg,
                fail_rate: 0.25,
                turns: 2.0,
                pass_at_k: Some(0.5),
                reward: ndcg,
                sampled_reward: Some(ndcg / 2.0),
                sampled_fail_rate: Some(0.5),
                tokens_per_task: tokens,
                s_per_task: 0.5,
                failures: Default::default(),
                call_errors: Default::default(),
            },
            tasks: Vec::new(),
            strategy: None,
            sampled_strategy: None,
            greedy: Vec::new(),
            samples: Vec::new(),
        }
    }

    #[test]
    fn table_and_csv_rows() {
        let interval = Interval {
            diff: 0.1,
            low: -0.05,
            high: 0.2,
            level: 0.95,
            resamples: 2000,
            seed: 0,
        };
        let report = EvalReport {
            format_version: REPORT_FORMAT_VERSION,
            k: 4,
            samples: 4,
            pass: PassCriterion::default(),
            sampling: SamplingInfo {
                temperature: 1.0,
                top_p: 1.0,
                top_k: 0,
            },
            bootstrap_resamples: 2000,
            confidence_level: 0.95,
            seed: 0,
            datasets: vec![DatasetReport {
                benchmark: "cran/test".into(),
                path: "t.jsonl".into(),
                size: 3,
                runs: vec![run("base", 0.2, Some(10.0)), run("bm25-once", 0.3, None)],
                comparisons: vec![Comparison {
                    a: "tuned".into(),
                    b: "base".into(),
                    ndcg_at_10: interval,
                    fail_rate: 0.0,
                    turns: 0.0,
                    pass_at_k: Some(0.0),
                    reward: 0.1,
                    sampled_reward: None,
                    tokens_per_task: None,
                    s_per_task: 0.0,
                }],
            }],
        };
        let md = report.markdown();
        assert!(md.contains("| benchmark | size | model | ndcg@10 | fail_rate | turns | pass@4 |"));
        assert!(
            md.contains(
                "| cran/test | 3 | base | 0.2000 | 0.250 | 2.00 | 0.500 | 0.2000 | 0.1000 | 10.0 | 0.500 |"
            ),
            "{md}"
        );
        assert!(md.contains("| cran/test | 3 | bm25-once | 0.3000 | 0.250 | 2.00 | 0.500 | 0.3000 | 0.1500 | - | 0.500 |"), "{md}");
        assert!(
            md.contains("| Δ tuned − base | +0.1000 [-0.0500, +0.2000] |"),
            "{md}"
        );
        let csv = report.csv();
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines.len(), 4);
        assert!(lines[0].starts_with("benchmark,size,model,ndcg@10"));
        assert_eq!(
            lines[2],
            "cran/test,3,bm25-once,0.3,0.25,2,0.5,0.3,0.15,,0.5,,"
        );
        assert!(
            lines[3].starts_with("cran/test,3,tuned - base,0.1,")
                && lines[3].ends_with(",-0.05,0.2")
        );

        let dir = tempfile::tempdir().unwrap();
        let paths = report.write_all(&dir.path().join("eval")).unwrap();
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&paths[1]).unwrap()).unwrap();
        assert_eq!(json["datasets"][0]["runs"][1]["label"], "bm25-once");
        assert_eq!(json["pass"]["metric"], "ndcg@10");
        assert!(json["datasets"][0]["runs"][0].get("greedy").is_none());
    }
}
