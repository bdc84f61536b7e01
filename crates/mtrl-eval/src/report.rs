//! What an evaluation produces: per task, per (benchmark, model) and per comparison, plus the
//! aggregation rules. Rendering (Markdown, JSON, CSV) is in [`crate::render`].
//!
//! Rules: the main figures come from the greedy episode of each task; a failed episode counts
//! nDCG@10 = 0 (and carries the failure reward); `tokens/task` counts policy-sampled tokens of the
//! greedy episode (none in text mode: scripted baselines have no tokens); `s/task` is the wall
//! time of the greedy pass over the benchmark divided by its tasks (episodes run concurrently, so
//! this is a throughput figure, not a latency). pass@k is the mean over tasks of the unbiased
//! estimator from the `n` sampled attempts; a deterministic agent (scripted baseline) passes its
//! k attempts exactly when its one episode passes.
//!
//! The report keeps every trajectory (greedy and sampled, not serialised) so that trajectory
//! logs and inspection can be written from it.

use std::collections::BTreeMap;

use mtrl_core::{FailureReason, Trajectory};
use serde::{Deserialize, Serialize};

use crate::bootstrap::{paired_bootstrap, Interval};
use crate::error::Result;
use crate::passk::pass_at_k;

/// Version of the serialised [`EvalReport`] layout.
pub const REPORT_FORMAT_VERSION: u32 = 1;

/// The figure a pass is judged on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PassMetric {
    /// nDCG@10 of the submitted ranking (0 for a failed episode).
    #[serde(rename = "ndcg@10")]
    Ndcg10,
    /// The episode's reward (the failure reward for a failed episode).
    #[serde(rename = "reward")]
    Reward,
}

impl PassMetric {
    pub fn parse(name: &str) -> Option<PassMetric> {
        match name {
            "ndcg@10" => Some(PassMetric::Ndcg10),
            "reward" => Some(PassMetric::Reward),
            _ => None,
        }
    }

    pub fn as_str(&self) -> &'static str {
        match self {
            PassMetric::Ndcg10 => "ndcg@10",
            PassMetric::Reward => "reward",
        }
    }
}

/// A task passes when `metric ≥ threshold` (default nDCG@10 ≥ 0.5).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PassCriterion {
    pub metric: PassMetric,
    pub threshold: f64,
}

impl Default for PassCriterion {
    fn default() -> Self {
        PassCriterion {
            metric: PassMetric::Ndcg10,
            threshold: 0.5,
        }
    }
}

impl PassCriterion {
    pub fn passes(&self, t: &Trajectory) -> bool {
        let v = match self.metric {
            PassMetric::Ndcg10 => ndcg_at_10(t),
            PassMetric::Reward => t.reward,
        };
        v >= self.threshold
    }
}

/// nDCG@10 of an episode; 0 when it failed or submitted nothing.
pub fn ndcg_at_10(t: &Trajectory) -> f64 {
    if t.failure.is_some() {
        return 0.0;
    }
    t.scores
        .iter()
        .find(|(n, _)| n == "ndcg@10")
        .map_or(0.0, |(_, s)| *s)
}

/// One task's figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskResult {
    pub task_id: String,
    /// Of the greedy episode (0 when it failed).
    pub ndcg_at_10: f64,
    pub reward: f64,
    pub failure: Option<FailureReason>,
    pub turns: u32,
    /// Policy-sampled tokens of the greedy episode.
    pub tokens: usize,
    /// The greedy episode passes.
    pub passed: bool,
    /// Sampled attempts and how many passed (0 and 0 when none were run).
    pub samples: usize,
    pub sample_passes: usize,
    /// pass@k of this task (absent when k = 0).
    pub pass_at_k: Option<f64>,
    /// Mean reward of the sampled attempts (the greedy reward for a deterministic agent; absent
    /// when k = 0).
    #[serde(default)]
    pub sampled_reward: Option<f64>,
    /// Fraction of the sampled attempts that failed (absent when k = 0).
    #[serde(default)]
    pub sampled_fail_rate: Option<f64>,
    /// Tool calls of the greedy episode answered with an error, by kind (`malformed_call`, …).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub call_errors: BTreeMap<String, u32>,
}

impl TaskResult {
    /// The figures of one task from its greedy episode and its sampled attempts. `k = 0`: no
    /// pass@k. `deterministic`: the agent repeats its greedy episode, so pass@k = pass.
    pub fn new(
        greedy: &Trajectory,
        samples: &[Trajectory],
        pass: &PassCriterion,
        k: usize,
        deterministic: bool,
    ) -> Result<TaskResult> {
        let passed = pass.passes(greedy);
        let sample_passes = samples.iter().filter(|t| pass.passes(t)).count();
        let pass_at_k = match (k, deterministic) {
            (0, _) => None,
            (_, true) => Some(if passed { 1.0 } else { 0.0 }),
            (k, false) => Some(pass_at_k(samples.len(), sample_passes, k)?),
        };
        let sampled_reward = match (k, deterministic) {
            (0, _) => None,
            (_, true) => Some(greedy.reward),
            (_, false) if samples.is_empty() => None,
            (_, false) => {
                Some(samples.iter().map(|t| t.reward).sum::<f64>() / samples.len() as f64)
            }
        };
        let failed = |t: &Trajectory| t.failure.is_some() as u8 as f64;
        let sampled_fail_rate = match (k, deterministic) {
            (0, _) => None,
            (_, true) => Some(failed(greedy)),
            (_, false) if samples.is_empty() => None,
            (_, false) => Some(samples.iter().map(failed).sum::<f64>() / samples.len() as f64),
        };
        Ok(TaskResult {
            task_id: greedy.task_id.clone(),
            ndcg_at_10: ndcg_at_10(greedy),
            reward: greedy.reward,
            failure: greedy.failure,
            turns: greedy.turns,
            tokens: greedy.sampled_tokens(),
            passed,
            samples: samples.len(),
            sample_passes,
            pass_at_k,
            sampled_reward,
            sampled_fail_rate,
            call_errors: greedy
                .tools
                .error_kinds
                .iter()
                .map(|(k, n)| (k.as_str().to_string(), *n))
                .collect(),
        })
    }
}

/// The figures of one model on one benchmark (the table's columns).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub ndcg_at_10: f64,
    pub fail_rate: f64,
    pub turns: f64,
    pub pass_at_k: Option<f64>,
    pub reward: f64,
    /// Mean reward of the sampled attempts (absent when none were run).
    #[serde(default)]
    pub sampled_reward: Option<f64>,
    /// Fraction of the sampled attempts that failed (absent when none were run).
    #[serde(default)]
    pub sampled_fail_rate: Option<f64>,
    /// None in text mode (scripted baselines).
    pub tokens_per_task: Option<f64>,
    pub s_per_task: f64,
    /// Failed greedy episodes by reason.
    pub failures: BTreeMap<String, usize>,
    /// Greedy episodes with at least one tool call answered with an error of this kind
    /// (`malformed_call`, `unknown_tool`, `invalid_arguments`, `too_many_calls`).
    #[serde(default)]
    pub call_errors: BTreeMap<String, usize>,
}

impl Summary {
    pub fn of(tasks: &[TaskResult], wall_s: f64, token_mode: bool) -> Summary {
        let n = tasks.len().max(1) as f64;
        let mean = |f: &dyn Fn(&TaskResult) -> f64| tasks.iter().map(f).sum::<f64>() / n;
        let mut failures = BTreeMap::new();
        for f in tasks.iter().filter_map(|t| t.failure) {
            *failures.entry(f.as_str().to_string()).or_insert(0) += 1;
        }
        let mut call_errors = BTreeMap::new();
        for kind in tasks.iter().flat_map(|t| t.call_errors.keys()) {
            *call_errors.entry(kind.clone()).or_insert(0) += 1;
        }
        let pass = tasks
            .iter()
            .map(|t| t.pass_at_k)
            .collect::<Option<Vec<f64>>>();
        Summary {
            ndcg_at_10: mean(&|t| t.ndcg_at_10),
            fail_rate: mean(&|t| t.failure.is_some() as u8 as f64),
            turns: mean(&|t| t.turns as f64),
            pass_at_k: pass
                .filter(|p| !p.is_empty())
                .map(|p| p.iter().sum::<f64>() / n),
            reward: mean(&|t| t.reward),
            sampled_reward: tasks
                .iter()
                .map(|t| t.sampled_reward)
                .collect::<Option<Vec<f64>>>()
                .filter(|v| !v.is_empty())
                .map(|v| v.iter().sum::<f64>() / n),
            sampled_fail_rate: tasks
                .iter()
                .map(|t| t.sampled_fail_rate)
                .collect::<Option<Vec<f64>>>()
                .filter(|v| !v.is_empty())
                .map(|v| v.iter().sum::<f64>() / n),
            tokens_per_task: token_mode.then(|| mean(&|t| t.tokens as f64)),
            s_per_task: wall_s / n,
            failures,
            call_errors,
        }
    }
}

/// A policy (token mode, through the generation engine) or a scripted baseline (text mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunKind {
    Policy,
    Scripted,
}

/// One model on one benchmark.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ModelRun {
    pub label: String,
    pub kind: RunKind,
    /// The model folder, `in-memory policy`, or the baseline's name.
    pub source: String,
    pub summary: Summary,
    /// Per task, in test-file order.
    pub tasks: Vec<TaskResult>,
    /// What the greedy episodes did (tools, searches, hits, turns).
    #[serde(default)]
    pub strategy: Option<crate::strategy::StrategyStats>,
    /// The same over the sampled attempts (absent when none were run).
    #[serde(default)]
    pub sampled_strategy: Option<crate::strategy::StrategyStats>,
    /// The greedy episode of each task, in test-file order.
    #[serde(skip)]
    pub greedy: Vec<Trajectory>,
    /// The sampled attempts of each task (empty when none were run).
    #[serde(skip)]
    pub samples: Vec<Vec<Trajectory>>,
}

/// `a − b` on one benchmark, with the paired bootstrap interval of the nDCG@10 difference.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    pub a: String,
    pub b: String,
    pub ndcg_at_10: Interval,
    pub fail_rate: f64,
    pub turns: f64,
    pub pass_at_k: Option<f64>,
    pub reward: f64,
    #[serde(default)]
    pub sampled_reward: Option<f64>,
    pub tokens_per_task: Option<f64>,
    pub s_per_task: f64,
}

impl Comparison {
    /// Differences of the two runs' figures; both ran the same tasks in the same order.
    pub fn new(
        a: &ModelRun,
        b: &ModelRun,
        resamples: usize,
        level: f64,
        seed: u64,
    ) -> Result<Comparison> {
        let ndcg = |r: &ModelRun| r.tasks.iter().map(|t| t.ndcg_at_10).collect::<Vec<_>>();
        let (x, y) = (&a.summary, &b.summary);
        let opt = |p: Option<f64>, q: Option<f64>| p.zip(q).map(|(p, q)| p - q);
        Ok(Comparison {
            a: a.label.clone(),
            b: b.label.clone(),
            ndcg_at_10: paired_bootstrap(&ndcg(a), &ndcg(b), resamples, level, seed)?,
            fail_rate: x.fail_rate - y.fail_rate,
            turns: x.turns - y.turns,
            pass_at_k: opt(x.pass_at_k, y.pass_at_k),
            reward: x.reward - y.reward,
            sampled_reward: opt(x.sampled_reward, y.sampled_reward),
            tokens_per_task: opt(x.tokens_per_task, y.tokens_per_task),
            s_per_task: x.s_per_task - y.s_per_task,
        })
    }
}

/// One test file.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DatasetReport {
    pub benchmark: String,
    pub path: std::path::PathBuf,
    pub size: usize,
    pub runs: Vec<ModelRun>,
    pub comparisons: Vec<Comparison>,
}

impl DatasetReport {
    /// The run labelled `label`.
    pub fn run(&self, label: &str) -> Option<&ModelRun> {
        self.runs.iter().find(|r| r.label == label)
    }
}

/// Sampling of the pass@k attempts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SamplingInfo {
    pub temperature: f64,
    pub top_p: f64,
    pub top_k: usize,
}

/// The whole evaluation.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EvalReport {
    pub format_version: u32,
    /// pass@k's k (0: not measured).
    pub k: usize,
    /// Sampled attempts per task (n ≥ k).
    pub samples: usize,
    pub pass: PassCriterion,
    pub sampling: SamplingInfo,
    pub bootstrap_resamples: usize,
    /// Coverage of the bootstrap intervals (0.95).
    pub confidence_level: f64,
    pub seed: u64,
    pub datasets: Vec<DatasetReport>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn traj(ndcg: Option<f64>, failure: Option<FailureReason>) -> Trajectory {
        let mut t = Trajectory::new("q");
        t.failure = failure;
        t.reward = if failure.is_some() {
            -1.0
        } else {
            ndcg.unwrap_or(0.0)
        };
        if let Some(s) = ndcg {
            t.scores.push(("ndcg@10".into(), s));
        }
        t.turns = 2;
        t
    }

    #[test]
    fn task_results_and_summary() {
        let pass = PassCriterion::default();
        let greedy = traj(Some(0.6), None);
        let samples = vec![
            traj(Some(0.7), None),
            traj(Some(0.2), None),
            traj(None, Some(FailureReason::TurnLimit)),
            traj(Some(0.5), None),
            traj(Some(0.1), None),
        ];
        let r = TaskResult::new(&greedy, &samples, &pass, 2, false).unwrap();
        assert!(r.passed);
        assert_eq!((r.samples, r.sample_passes), (5, 2));
        assert!((r.pass_at_k.unwrap() - 0.7).abs() < 1e-12);
        // One of the five sampled attempts failed.
        assert!((r.sampled_fail_rate.unwrap() - 0.2).abs() < 1e-12);
        let failed = TaskResult::new(
            &traj(Some(0.9), Some(FailureReason::TokenLimit)),
            &[],
            &pass,
            2,
            true,
        )
        .unwrap();
        assert_eq!((failed.ndcg_at_10, failed.pass_at_k), (0.0, Some(0.0)));
        let s = Summary::of(&[r, failed], 3.0, true);
        assert!((s.ndcg_at_10 - 0.3).abs() < 1e-12);
        assert!((s.fail_rate - 0.5).abs() < 1e-12);
        // (0.2 + the deterministic agent's failed greedy episode, 1.0) / 2.
        assert!((s.sampled_fail_rate.unwrap() - 0.6).abs() < 1e-12);
        assert!((s.pass_at_k.unwrap() - 0.35).abs() < 1e-12);
        assert!((s.reward - (-0.2)).abs() < 1e-12);
        assert_eq!((s.turns, s.s_per_task), (2.0, 1.5));
        assert_eq!(s.failures["token_limit"], 1);
        assert_eq!(s.tokens_per_task, Some(0.0));
        let by_reward = PassCriterion {
            metric: PassMetric::Reward,
            threshold: -1.0,
        };
        assert!(by_reward.passes(&traj(None, Some(FailureReason::NoAnswer))));
        assert_eq!(PassMetric::parse("ndcg@10"), Some(PassMetric::Ndcg10));
    }
}
