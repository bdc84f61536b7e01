//! `mtrl demo-table DIR…`: the default job's results over seeds and collections, from the
//! `demo.json` + `eval.json` of each run folder (`mtrl demo --run-dir DIR --seed S`).
//!
//! Per collection and contender: mean ± sd over seeds (sample sd, n − 1) of greedy nDCG@10, the
//! mean reward of sampled attempts, the failure rate and turns. Per comparison (tuned − base,
//! tuned − rft, tuned − teacher-best, tuned − each scripted baseline): the paired bootstrap
//! interval over **queries**, each query's difference first averaged over the seeds (the seeds
//! are not independent draws of queries); per collection and pooled over every query of every
//! collection, for greedy nDCG@10 and for the sampled reward. Then the bar of the default job
//! read off those intervals (tuned − base and tuned − rft above, spanning or below zero; greedy
//! failure rates; the gap to the best scripted contender), what the policies do, and the seconds
//! of every stage of every run.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use mtrl_eval::bootstrap::{paired_bootstrap, Interval, DEFAULT_RESAMPLES};
use mtrl_eval::strategy::StrategyStats;
use mtrl_eval::{EvalReport, ModelRun};

use crate::bail;

/// `writeln!` into a `String` (which cannot fail).
macro_rules! w {
    ($($t:tt)*) => {
        let _ = writeln!($($t)*);
    };
}
use crate::demo::DemoRecord;
use crate::error::{Context, Result};

/// One run folder's record and report.
pub struct SeedRun {
    pub dir: PathBuf,
    pub record: DemoRecord,
    pub report: EvalReport,
}

/// Reads `DIR/rl/eval/{demo,eval}.json`.
pub fn read_run(dir: &Path) -> Result<SeedRun> {
    let eval = dir.join("rl/eval");
    let read = |name: &str| -> Result<String> {
        let p = eval.join(name);
        std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))
    };
    let record: DemoRecord = serde_json::from_str(&read("demo.json")?)
        .with_context(|| format!("{}: not a demo record", eval.join("demo.json").display()))?;
    let report: EvalReport = serde_json::from_str(&read("eval.json")?).with_context(|| {
        format!(
            "{}: not an evaluation report",
            eval.join("eval.json").display()
        )
    })?;
    if report.datasets.len() != 1 {
        bail!(
            "{}: expected one benchmark, found {}",
            eval.join("eval.json").display(),
            report.datasets.len()
        );
    }
    Ok(SeedRun {
        dir: dir.to_path_buf(),
        record,
        report,
    })
}

fn mean_sd(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let m = v.iter().sum::<f64>() / n.max(1.0);
    let sd = if v.len() < 2 {
        0.0
    } else {
        (v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1.0)).sqrt()
    };
    (m, sd)
}

fn pm(v: &[f64], prec: usize) -> String {
    let (m, sd) = mean_sd(v);
    format!("{m:.prec$} ± {sd:.prec$}")
}

fn interval(i: &Interval) -> String {
    format!("{:+.4} [{:+.4}, {:+.4}]", i.diff, i.low, i.high)
}

/// Per query (in file order), the seed-mean of `f` of the run labelled `label`.
fn per_query(runs: &[&SeedRun], label: &str, f: fn(&ModelRun, usize) -> f64) -> Result<Vec<f64>> {
    let mut sum: Vec<f64> = Vec::new();
    for r in runs {
        let d = &r.report.datasets[0];
        let run = d
            .run(label)
            .with_context(|| format!("{}: no `{label}` run", r.dir.display()))?;
        if sum.is_empty() {
            sum = vec![0.0; run.tasks.len()];
        }
        if run.tasks.len() != sum.len() {
            bail!(
                "{}: a different number of queries than the other seeds",
                r.dir.display()
            );
        }
        for (i, s) in sum.iter_mut().enumerate() {
            *s += f(run, i);
        }
    }
    Ok(sum.iter().map(|s| s / runs.len() as f64).collect())
}

fn ndcg(r: &ModelRun, i: usize) -> f64 {
    r.tasks[i].ndcg_at_10
}

fn sampled(r: &ModelRun, i: usize) -> f64 {
    r.tasks[i].sampled_reward.unwrap_or(r.tasks[i].reward)
}

fn failed(r: &ModelRun, i: usize) -> f64 {
    f64::from(u8::from(r.tasks[i].failure.is_some()))
}

/// Where an interval lies with respect to zero.
fn side(i: &Interval) -> &'static str {
    if i.low > 0.0 {
        "above 0"
    } else if i.high < 0.0 {
        "below 0"
    } else {
        "spans 0"
    }
}

fn mean(v: &[f64]) -> f64 {
    mean_sd(v).0
}

/// One contender's per-query figures (seed-averaged) over a group of queries.
#[derive(Default, Clone)]
struct PerQuery {
    ndcg: Vec<f64>,
    sampled: Vec<f64>,
    failed: Vec<f64>,
}

impl PerQuery {
    fn of(runs: &[&SeedRun], label: &str) -> Result<PerQuery> {
        Ok(PerQuery {
            ndcg: per_query(runs, label, ndcg)?,
            sampled: per_query(runs, label, sampled)?,
            failed: per_query(runs, label, failed)?,
        })
    }

    fn extend(&mut self, o: PerQuery) {
        self.ndcg.extend(o.ndcg);
        self.sampled.extend(o.sampled);
        self.failed.extend(o.failed);
    }
}

/// The queries of one collection, or of every collection pooled: each contender's per-query
/// figures, and tuned − each other contender's intervals (greedy nDCG@10, sampled reward).
struct Group {
    name: String,
    per: BTreeMap<String, PerQuery>,
    vs: BTreeMap<String, (Interval, Interval)>,
}

impl Group {
    fn new(name: String, per: BTreeMap<String, PerQuery>) -> Result<Group> {
        let boot = |a: &[f64], b: &[f64]| paired_bootstrap(a, b, DEFAULT_RESAMPLES, 0.95, 0);
        let t = &per["tuned"];
        let mut vs = BTreeMap::new();
        for (label, o) in per.iter().filter(|(l, _)| *l != "tuned") {
            let i = (boot(&t.ndcg, &o.ndcg)?, boot(&t.sampled, &o.sampled)?);
            vs.insert(label.clone(), i);
        }
        Ok(Group { name, per, vs })
    }

    /// Every collection in order, then all of them pooled (when there are several).
    fn all(by: &BTreeMap<String, Vec<&SeedRun>>, labels: &[String]) -> Result<Vec<Group>> {
        let mut groups = Vec::new();
        let mut pooled: BTreeMap<String, PerQuery> = BTreeMap::new();
        for (c, rs) in by {
            let mut per = BTreeMap::new();
            for label in labels {
                let q = PerQuery::of(rs, label)?;
                pooled.entry(label.clone()).or_default().extend(q.clone());
                per.insert(label.clone(), q);
            }
            groups.push(Group::new(c.clone(), per)?);
        }
        if by.len() > 1 {
            groups.push(Group::new("**pooled**".into(), pooled)?);
        }
        Ok(groups)
    }
}

/// The default job's bar, read off the groups: per collection and pooled, where the tuned − base
/// and tuned − rft intervals lie (greedy nDCG@10 / sampled reward), the greedy failure rates of
/// tuned and base, and tuned's gap to the best scripted contender (greedy nDCG@10, with its
/// interval).
fn verdicts(groups: &[Group], scripted: &[&String]) -> String {
    let mut out = String::new();
    w!(
        out,
        "\nThe bar, read off the intervals above (greedy ndcg@10 / sampled reward~; fail_rate of \
         the greedy episodes, seed-averaged):\n"
    );
    w!(
        out,
        "| collection | tuned − base | tuned − rft | fail_rate tuned vs base | best scripted | tuned − best scripted |"
    );
    w!(out, "|---|---|---|---|---|---:|");
    for g in groups {
        let vs = |label: &str| {
            let (i1, i2) = &g.vs[label];
            format!("{} / {}", side(i1), side(i2))
        };
        let (ft, fb) = (mean(&g.per["tuned"].failed), mean(&g.per["base"].failed));
        let rel = if ft <= fb { "≤" } else { ">" };
        let best = scripted
            .iter()
            .map(|s| (s.as_str(), mean(&g.per[s.as_str()].ndcg)))
            .max_by(|a, b| a.1.total_cmp(&b.1));
        let (best_cell, gap) = match best {
            Some((name, m)) => (format!("{name} {m:.4}"), interval(&g.vs[name].0)),
            None => ("-".into(), "-".into()),
        };
        w!(
            out,
            "| {} | {} | {} | {ft:.3} {rel} {fb:.3} | {best_cell} | {gap} |",
            g.name,
            vs("base"),
            vs("rft")
        );
    }
    out
}

/// Seconds per stage of each run (`demo.json`), in the order the first run lists them.
fn timings(runs: &[SeedRun]) -> String {
    let mut out = String::new();
    let stages: Vec<&str> = runs[0]
        .record
        .stage_s
        .iter()
        .map(|(s, _)| s.as_str())
        .collect();
    let short = |s: &str| s.split_once(' ').map_or(s, |(_, rest)| rest).to_string();
    w!(out, "\nSeconds per stage (`demo.json`):\n");
    let head: Vec<String> = stages.iter().map(|s| short(s)).collect();
    w!(out, "| run | seed | total | {} |", head.join(" | "));
    w!(out, "|---|---:|---:|{}", "---:|".repeat(stages.len()));
    for r in runs {
        let name = r.dir.file_name().map_or_else(
            || r.dir.display().to_string(),
            |n| n.to_string_lossy().into(),
        );
        let cells: Vec<String> = stages
            .iter()
            .map(|s| {
                r.record
                    .stage_s
                    .iter()
                    .find(|(n, _)| n == s)
                    .map_or("-".into(), |(_, t)| format!("{t:.0}"))
            })
            .collect();
        w!(
            out,
            "| {name} | {} | {:.0} | {} |",
            r.record.seed,
            r.record.total_s,
            cells.join(" | ")
        );
    }
    out
}

/// The Markdown tables (see the module docs).
pub fn table(runs: &[SeedRun]) -> Result<String> {
    if runs.is_empty() {
        bail!("no run folders given");
    }
    let mut by: BTreeMap<String, Vec<&SeedRun>> = BTreeMap::new();
    for r in runs {
        by.entry(r.record.collection.clone()).or_default().push(r);
    }
    let mut out = String::new();
    let splits: Vec<&str> = runs.iter().map(|r| r.record.split.as_str()).collect();
    w!(
        out,
        "Split: {}. Mean ± sd over seeds; ndcg@10, fail_rate and turns of the greedy episode; \
         reward~ and fail~ = mean reward and failure rate of the sampled attempts.\n",
        splits[0]
    );
    w!(
        out,
        "| collection | queries | seeds | model | ndcg@10 | reward~ | fail_rate | fail~ | turns |"
    );
    w!(out, "|---|---:|---:|---|---:|---:|---:|---:|---:|");
    let labels: Vec<String> = runs[0].report.datasets[0]
        .runs
        .iter()
        .map(|r| r.label.clone())
        .collect();
    for (c, rs) in &by {
        let n = rs[0].report.datasets[0].size;
        for label in &labels {
            let pick = |f: fn(&ModelRun) -> f64| -> Result<Vec<f64>> {
                rs.iter()
                    .map(|r| {
                        r.report.datasets[0]
                            .run(label)
                            .map(f)
                            .with_context(|| format!("{}: no `{label}` run", r.dir.display()))
                    })
                    .collect()
            };
            w!(
                out,
                "| {c} | {n} | {} | {label} | {} | {} | {} | {} | {} |",
                rs.len(),
                pm(&pick(|r| r.summary.ndcg_at_10)?, 4),
                pm(
                    &pick(|r| r.summary.sampled_reward.unwrap_or(r.summary.reward))?,
                    4
                ),
                pm(&pick(|r| r.summary.fail_rate)?, 3),
                pm(
                    &pick(|r| r.summary.sampled_fail_rate.unwrap_or(r.summary.fail_rate))?,
                    3
                ),
                pm(&pick(|r| r.summary.turns)?, 2),
            );
        }
    }
    w!(
        out,
        "\nPaired bootstrap 95 % intervals over queries (each query's difference averaged over \
         its seeds; {DEFAULT_RESAMPLES} resamples):\n"
    );
    w!(
        out,
        "| comparison | collection | queries | Δ ndcg@10 | Δ reward~ |"
    );
    w!(out, "|---|---|---:|---:|---:|");
    let others: Vec<&String> = labels.iter().filter(|l| *l != "tuned").collect();
    let groups = Group::all(&by, &labels)?;
    for &b in &others {
        for g in &groups {
            let (i1, i2) = &g.vs[b.as_str()];
            w!(
                out,
                "| tuned − {b} | {} | {} | {} | {} |",
                g.name,
                g.per["tuned"].ndcg.len(),
                interval(i1),
                interval(i2)
            );
        }
    }
    let scripted: Vec<&String> = others
        .iter()
        .copied()
        .filter(|l| !matches!(l.as_str(), "base" | "rft"))
        .collect();
    out.push_str(&verdicts(&groups, &scripted));
    w!(
        out,
        "\nWhat the policies do (means over seeds of the per-run means; greedy / sampled):\n"
    );
    w!(
        out,
        "| collection | model | searches | bm25 share | both tools | fused | mean k | hits submitted | turns |"
    );
    w!(out, "|---|---|---:|---:|---:|---:|---:|---:|---:|");
    for (c, rs) in &by {
        for label in labels
            .iter()
            .filter(|l| matches!(l.as_str(), "base" | "rft" | "tuned"))
        {
            let stats = |sampled: bool| -> Vec<StrategyStats> {
                rs.iter()
                    .filter_map(|r| r.report.datasets[0].run(label))
                    .filter_map(|m| {
                        if sampled {
                            m.sampled_strategy.clone()
                        } else {
                            m.strategy.clone()
                        }
                    })
                    .collect()
            };
            let (g, sm) = (stats(false), stats(true));
            let cell = |f: fn(&StrategyStats) -> f64, prec: usize| {
                let m = |v: &[StrategyStats]| v.iter().map(f).sum::<f64>() / v.len().max(1) as f64;
                if sm.is_empty() {
                    format!("{:.prec$}", m(&g))
                } else {
                    format!("{:.prec$} / {:.prec$}", m(&g), m(&sm))
                }
            };
            w!(
                out,
                "| {c} | {label} | {} | {} | {} | {} | {} | {} | {} |",
                cell(|s| s.searches, 2),
                cell(|s| s.bm25_share, 2),
                cell(|s| s.both_tools, 2),
                cell(|s| s.fused, 2),
                cell(|s| s.mean_k, 1),
                cell(|s| s.hits_submitted, 1),
                cell(|s| s.turns, 2)
            );
        }
    }
    out.push_str(&timings(runs));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_and_sample_sd() {
        let (m, sd) = mean_sd(&[1.0, 2.0, 3.0]);
        assert_eq!(m, 2.0);
        assert!((sd - 1.0).abs() < 1e-12);
        assert_eq!(mean_sd(&[4.0]), (4.0, 0.0));
        assert_eq!(pm(&[1.0, 3.0], 2), "2.00 ± 1.41");
    }

    #[test]
    fn an_interval_lies_above_across_or_below_zero() {
        let at = |low, high| Interval {
            diff: (low + high) / 2.0,
            low,
            high,
            level: 0.95,
            resamples: 10,
            seed: 0,
        };
        assert_eq!(side(&at(0.01, 0.2)), "above 0");
        assert_eq!(side(&at(-0.01, 0.2)), "spans 0");
        assert_eq!(side(&at(0.0, 0.2)), "spans 0");
        assert_eq!(side(&at(-0.3, -0.2)), "below 0");
    }
}
