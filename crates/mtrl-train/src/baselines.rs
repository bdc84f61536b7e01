//! Scripted baselines in the search environment (`mtrl rollout`): episodes of `bm25-once`,
//! `vector-once` or `hybrid-rrf` on a task split, with mean reward, nDCG@10, failure rate and
//! turns.
//!
//! Tasks come from the config's `[data]` split (default `test`), or, when the config has no
//! `[data]` or with split `search-eval`, from its `[search.eval]` queries and qrels (every judged
//! query in the query file).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use mtrl_core::{Config, FailureReason, Trajectory};
use mtrl_env::search_env::score_map;
use mtrl_env::{run_episode, tasks, Baseline, ScriptedAgent, SearchEnv, Task, TaskSets};
use mtrl_search::{queries, Qrels, SearchIndex};
use serde::Serialize;

use crate::bail;
use crate::error::{Context, Result};

/// Aggregate figures of a rollout.
#[derive(Debug, Clone, Serialize)]
pub struct RolloutSummary {
    pub name: String,
    pub policy: String,
    pub split: String,
    pub episodes: usize,
    pub mean_reward: f64,
    pub mean_ndcg_at_10: f64,
    pub failure_rate: f64,
    pub mean_turns: f64,
    pub tool_calls: u64,
    pub tool_errors: u64,
    pub failures: BTreeMap<String, usize>,
}

/// Means over trajectories (a failed episode counts 0 for nDCG@10).
pub fn summarize(name: &str, policy: &str, split: &str, trajs: &[Trajectory]) -> RolloutSummary {
    let n = trajs.len().max(1) as f64;
    let mut failures = BTreeMap::new();
    for t in trajs {
        if let Some(f) = t.failure {
            *failures.entry(f.as_str().to_string()).or_insert(0) += 1;
        }
    }
    RolloutSummary {
        name: name.to_string(),
        policy: policy.to_string(),
        split: split.to_string(),
        episodes: trajs.len(),
        mean_reward: trajs.iter().map(|t| t.reward).sum::<f64>() / n,
        mean_ndcg_at_10: trajs
            .iter()
            .map(|t| score_map(t).get("ndcg@10").copied().unwrap_or(0.0))
            .sum::<f64>()
            / n,
        failure_rate: trajs.iter().filter(|t| t.failure.is_some()).count() as f64 / n,
        mean_turns: trajs.iter().map(|t| t.turns as f64).sum::<f64>() / n,
        tool_calls: trajs.iter().map(|t| t.tools.total_calls() as u64).sum(),
        tool_errors: trajs.iter().map(|t| t.tools.errors as u64).sum(),
        failures,
    }
}

/// The tasks of `split` (see the module docs); returns the split's display name too.
pub fn load_split(cfg: &Config, split: Option<&str>) -> Result<(String, Vec<Task>)> {
    if let Some(data) = cfg.data.as_ref().filter(|_| split != Some("search-eval")) {
        let sets = TaskSets::load(data)?;
        for r in &sets.reports {
            if r.skipped > 0 {
                eprintln!(
                    "{}: skipped {} bad rows of {}",
                    r.path.display(),
                    r.skipped,
                    r.rows
                );
            }
        }
        let name = split.unwrap_or("test");
        let tasks = match name {
            "test" => sets.test,
            "validation" => sets.validation,
            "train" => sets.train.into_iter().flat_map(|d| d.tasks).collect(),
            other => bail!("unknown split `{other}` (test, validation or train)"),
        };
        if tasks.is_empty() {
            bail!(
                "split `{name}` of {} has no tasks (run `mtrl data prepare --config {}` first?)",
                cfg.source.display(),
                cfg.source.display()
            );
        }
        return Ok((name.to_string(), tasks));
    }
    if let Some(s) = split.filter(|s| *s != "search-eval") {
        bail!(
            "--split {s} needs a [data] section in {}",
            cfg.source.display()
        );
    }
    let eval = cfg.search()?.eval.as_ref().with_context(|| {
        format!(
            "{} has neither [data] nor [search.eval]: no tasks to run",
            cfg.source.display()
        )
    })?;
    let qs = queries::load(&eval.queries)?;
    let qrels = Qrels::load(&eval.qrels)?;
    Ok(("search.eval".into(), tasks::from_qrels(&qs, &qrels)))
}

/// Runs `baseline` on `tasks`; with `trajectories`, every episode is written there as a JSON line.
pub fn run_baseline(
    cfg: &Config,
    index: SearchIndex,
    baseline: Baseline,
    tasks: &[Task],
    trajectories: Option<&PathBuf>,
) -> Result<Vec<Trajectory>> {
    let env_cfg = cfg.env_or_default();
    let depth = env_cfg.max_search_k;
    let final_k = env_cfg.final_k;
    let mut env = SearchEnv::standard(env_cfg, Arc::new(index))?;
    let mut agent = ScriptedAgent::new(baseline, final_k, depth);
    let mut out = match trajectories {
        Some(p) => Some(std::io::BufWriter::new(
            std::fs::File::create(p).with_context(|| format!("cannot create {}", p.display()))?,
        )),
        None => None,
    };
    let mut trajs = Vec::with_capacity(tasks.len());
    for task in tasks {
        let t = run_episode(&mut env, &mut agent, task)
            .with_context(|| format!("episode of task {}", task.id))?;
        if let Some(w) = out.as_mut() {
            serde_json::to_writer(&mut *w, &t)?;
            writeln!(w)?;
        }
        trajs.push(t);
    }
    if let Some(mut w) = out {
        w.flush()?;
    }
    Ok(trajs)
}

impl std::fmt::Display for RolloutSummary {
    /// The summary as a one-row Markdown table, failures by reason below it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self;
        writeln!(
            f,
            "{}: policy {}, split {}, {} episodes\n",
            s.name, s.policy, s.split, s.episodes
        )?;
        writeln!(
            f,
            "| mean reward | nDCG@10 | failure rate | mean turns | tool calls | tool errors |"
        )?;
        writeln!(
            f,
            "|-------------|---------|--------------|------------|------------|-------------|"
        )?;
        writeln!(
            f,
            "| {:>11.4} | {:.4}  | {:>12.4} | {:>10.2} | {:>10} | {:>11} |",
            s.mean_reward,
            s.mean_ndcg_at_10,
            s.failure_rate,
            s.mean_turns,
            s.tool_calls,
            s.tool_errors
        )?;
        for r in FailureReason::ALL {
            if let Some(n) = s.failures.get(r.as_str()) {
                writeln!(f, "  failures ({}): {n}", r.as_str())?;
            }
        }
        Ok(())
    }
}
