//! Typed, versioned run records: one JSON line per optimizer step of an RL run
//! (`<checkpoint.dir>/metrics.jsonl`, [`StepRecord`]) or of supervised fine-tuning
//! (`sft-metrics.jsonl` beside the SFT output, [`SftRecord`]).
//!
//! These files outlive a process (a resumed run rewrites its history from the checkpoint, `mtrl
//! plot` and `mtrl bench train` read them later), so every line carries `format_version` and a
//! reader refuses any other version with the file and line ([`read_jsonl`]). The writer is
//! `mtrl-train`; readers are `mtrl-eval` (plots) and tests. Field names are the contract: telemetry
//! sinks (MLflow metric names, Prometheus series) are derived from them.

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::Path;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::{CoreError, Result};

/// Version of [`StepRecord`] lines this build writes and reads.
pub const STEP_RECORD_FORMAT_VERSION: u32 = 1;
/// Version of [`SftRecord`] lines this build writes and reads.
pub const SFT_RECORD_FORMAT_VERSION: u32 = 1;

/// A record type stored as JSON Lines with a `format_version` in every line.
pub trait Versioned: Serialize + DeserializeOwned {
    /// The version this build writes and accepts.
    const FORMAT_VERSION: u32;
    /// What the records are (for error messages).
    const WHAT: &'static str;
}

/// One RL optimizer step: the batch's outcomes, the learner's figures and the time split.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepRecord {
    pub format_version: u32,
    pub step: u64,
    /// Policy version after the step.
    pub version: u64,
    pub reward_mean: f64,
    pub reward_std: f64,
    /// Mean nDCG@10 of the batch's episodes (0 for failed ones and for tasks without that score).
    #[serde(rename = "ndcg@10")]
    pub ndcg_at_10: f64,
    pub failure_rate: f64,
    /// Failed episodes by reason (`FailureReason::as_str`).
    pub failures: BTreeMap<String, u64>,
    pub turns_mean: f64,
    pub loss: f64,
    pub clip_fraction: f64,
    pub behaviour_weight: f64,
    /// Mean |π_θ / π_sampler − 1| over the trained tokens (how off-policy the batch was).
    #[serde(default)]
    pub sampler_gap: f64,
    /// Optimizer updates of the step (`ppo_mini_batches`, 0 when skipped).
    #[serde(default)]
    pub updates: u64,
    /// Mean entropy of the whole next-token distribution at the trained tokens (not the sampled
    /// tokens' negative log-prob).
    pub entropy: f64,
    pub kl: f64,
    pub grad_norm: f64,
    pub lr: f64,
    /// Trained (loss-masked) tokens.
    pub tokens: u64,
    pub sequences: u64,
    pub micro_batches: u64,
    /// The update was skipped (no trained token, or a non-finite gradient).
    pub skipped: bool,
    /// Optimizer updates skipped for a non-finite loss or gradient norm, and the first cause
    /// (`train.max_skipped_updates` steps in a row with one end the run).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub skipped_updates: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skip_reason: Option<String>,
    /// Trained samples by lag (`staleness_counts[lag]`, in policy versions).
    pub staleness_counts: Vec<u64>,
    /// Samples dropped for a lag over the bound.
    pub staleness_violations: u64,
    pub admission_wait_s: f64,
    pub rollout_tokens_per_s: f64,
    /// Prompt tokens the engine ran through the model during the step, and prompt tokens it took
    /// from conversations kept resident between turns instead (engine-wide, all episodes in
    /// flight): `(prefilled + reused) / prefilled` is the step's KV-reuse factor.
    #[serde(default)]
    pub prompt_tokens_prefilled: u64,
    #[serde(default)]
    pub prompt_tokens_reused: u64,
    pub learner_tokens_per_s: f64,
    /// Faults of the step (rollout-wide, all episodes in flight): attempts retried, attempts
    /// stopped by `rollout.timeout_s`, episodes that failed every attempt, groups replaced, and
    /// faults injected by kind (`MTRL_FAULTS`).
    #[serde(default)]
    pub episode_retries: u64,
    #[serde(default)]
    pub episode_timeouts: u64,
    #[serde(default)]
    pub episodes_errored: u64,
    #[serde(default)]
    pub groups_replaced: u64,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub faults_injected: BTreeMap<String, u64>,
    pub time_generate_s: f64,
    /// Of `time_generate_s`: engine forwards with prompt rows (prefill, chunked with decode rows),
    /// forwards of decode rows only, and the output head plus sampling.
    #[serde(default)]
    pub time_prefill_s: f64,
    #[serde(default)]
    pub time_decode_s: f64,
    #[serde(default)]
    pub time_sample_s: f64,
    pub time_tools_s: f64,
    pub time_learn_s: f64,
    /// Of `time_learn_s`: the training forwards, the loss and backward passes, clipping and the
    /// optimizer step.
    #[serde(default)]
    pub time_forward_s: f64,
    #[serde(default)]
    pub time_backward_s: f64,
    #[serde(default)]
    pub time_optimizer_s: f64,
    pub time_publish_s: f64,
    pub time_wait_for_batch_s: f64,
    /// Learner seconds spent on checkpoints since the previous record (copying the tensors for
    /// the background writer, or the whole write without it).
    #[serde(default)]
    pub time_checkpoint_s: f64,
    pub step_wall_s: f64,
    /// Seconds since this process started the run (a resumed run starts again from 0).
    pub elapsed_s: f64,
    /// Data-parallel ranks that ran the step (absent = 1).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub world_size: u64,
    /// Bytes each rank sent to the gradient (and update-total) all-reduces, and their calls.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub allreduce_bytes: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub allreduce_calls: u64,
    /// Seconds rank 0 spent in those all-reduces, and gathering the step's groups.
    #[serde(default, skip_serializing_if = "is_zero_f")]
    pub time_allreduce_s: f64,
    #[serde(default, skip_serializing_if = "is_zero_f")]
    pub time_gather_s: f64,
    /// Validation figures (greedy on the validation tasks) at the steps where validation ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub val_reward_mean: Option<f64>,
    #[serde(
        rename = "val_ndcg@10",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub val_ndcg_at_10: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub val_failure_rate: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub val_turns_mean: Option<f64>,
    /// With `train.val_samples` > 0: the mean reward and failure rate of the sampled validation
    /// episodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub val_sampled_reward_mean: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub val_sampled_failure_rate: Option<f64>,
}

fn one() -> u64 {
    1
}

fn is_one(v: &u64) -> bool {
    *v == 1
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

fn is_zero_f(v: &f64) -> bool {
    *v == 0.0
}

impl Default for StepRecord {
    /// An empty record of this build's version (for writers that fill in what they have).
    fn default() -> StepRecord {
        StepRecord {
            format_version: STEP_RECORD_FORMAT_VERSION,
            step: 0,
            version: 0,
            reward_mean: 0.0,
            reward_std: 0.0,
            ndcg_at_10: 0.0,
            failure_rate: 0.0,
            failures: BTreeMap::new(),
            turns_mean: 0.0,
            loss: 0.0,
            clip_fraction: 0.0,
            behaviour_weight: 0.0,
            sampler_gap: 0.0,
            updates: 0,
            entropy: 0.0,
            kl: 0.0,
            grad_norm: 0.0,
            lr: 0.0,
            tokens: 0,
            sequences: 0,
            micro_batches: 0,
            skipped: false,
            skipped_updates: 0,
            skip_reason: None,
            staleness_counts: Vec::new(),
            staleness_violations: 0,
            admission_wait_s: 0.0,
            rollout_tokens_per_s: 0.0,
            prompt_tokens_prefilled: 0,
            prompt_tokens_reused: 0,
            learner_tokens_per_s: 0.0,
            episode_retries: 0,
            episode_timeouts: 0,
            episodes_errored: 0,
            groups_replaced: 0,
            faults_injected: BTreeMap::new(),
            time_generate_s: 0.0,
            time_prefill_s: 0.0,
            time_decode_s: 0.0,
            time_sample_s: 0.0,
            time_tools_s: 0.0,
            time_learn_s: 0.0,
            time_forward_s: 0.0,
            time_backward_s: 0.0,
            time_optimizer_s: 0.0,
            time_publish_s: 0.0,
            time_wait_for_batch_s: 0.0,
            time_checkpoint_s: 0.0,
            world_size: 1,
            allreduce_bytes: 0,
            allreduce_calls: 0,
            time_allreduce_s: 0.0,
            time_gather_s: 0.0,
            step_wall_s: 0.0,
            elapsed_s: 0.0,
            val_reward_mean: None,
            val_ndcg_at_10: None,
            val_failure_rate: None,
            val_turns_mean: None,
            val_sampled_reward_mean: None,
            val_sampled_failure_rate: None,
        }
    }
}

impl Versioned for StepRecord {
    const FORMAT_VERSION: u32 = STEP_RECORD_FORMAT_VERSION;
    const WHAT: &'static str = "step record";
}

impl StepRecord {
    /// Mean and largest lag of the trained samples, when any were trained.
    pub fn lag_stats(&self) -> Option<(f64, f64)> {
        let n: u64 = self.staleness_counts.iter().sum();
        if n == 0 {
            return None;
        }
        let sum: u64 = self
            .staleness_counts
            .iter()
            .enumerate()
            .map(|(l, c)| l as u64 * c)
            .sum();
        let max = self.staleness_counts.iter().rposition(|c| *c > 0)?;
        Some((sum as f64 / n as f64, max as f64))
    }
}

/// One supervised fine-tuning step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SftRecord {
    pub format_version: u32,
    pub step: u64,
    pub epoch: usize,
    pub loss: f64,
    /// Trained (assistant) tokens of the step.
    pub tokens: u64,
    pub grad_norm: f64,
    pub lr: f64,
    pub elapsed_s: f64,
}

impl Versioned for SftRecord {
    const FORMAT_VERSION: u32 = SFT_RECORD_FORMAT_VERSION;
    const WHAT: &'static str = "sft record";
}

/// Reads a JSON Lines file of `T`, refusing a line of another `format_version` (or none), a
/// malformed line or an unknown field, with the file and line. Blank lines are skipped.
pub fn read_jsonl<T: Versioned>(path: &Path) -> Result<Vec<T>> {
    let f = std::fs::File::open(path).map_err(|source| CoreError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let mut out = Vec::new();
    for (i, line) in std::io::BufReader::new(f).lines().enumerate() {
        let line = line.map_err(|source| CoreError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        if line.trim().is_empty() {
            continue;
        }
        out.push(parse_line(&line).map_err(|message| CoreError::Record {
            path: path.to_path_buf(),
            line: i + 1,
            message,
        })?);
    }
    Ok(out)
}

/// Parses one line of a `T` file (see [`read_jsonl`]); the error says what is wrong.
pub fn parse_line<T: Versioned>(line: &str) -> std::result::Result<T, String> {
    let v: serde_json::Value = serde_json::from_str(line).map_err(|e| format!("not JSON: {e}"))?;
    parse_value(v)
}

/// A `T` from JSON already parsed (e.g. the step history inside a checkpoint's `trainer.json`),
/// refused when of another `format_version` (or none) or with an unknown field.
pub fn parse_value<T: Versioned>(v: serde_json::Value) -> std::result::Result<T, String> {
    match v.get("format_version").and_then(serde_json::Value::as_u64) {
        Some(n) if n == u64::from(T::FORMAT_VERSION) => {}
        Some(n) => {
            return Err(format!(
                "{} format_version {n}, this build reads version {}",
                T::WHAT,
                T::FORMAT_VERSION
            ))
        }
        None => {
            return Err(format!(
                "no `format_version`: not a {} of this build (version {})",
                T::WHAT,
                T::FORMAT_VERSION
            ))
        }
    }
    serde_json::from_value(v).map_err(|e| format!("not a {}: {e}", T::WHAT))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sft(step: u64) -> SftRecord {
        SftRecord {
            format_version: SFT_RECORD_FORMAT_VERSION,
            step,
            epoch: 0,
            loss: 1.5,
            tokens: 10,
            grad_norm: 0.5,
            lr: 1e-3,
            elapsed_s: 0.25,
        }
    }

    #[test]
    fn round_trips_and_refuses_other_versions_with_the_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.jsonl");
        let a = serde_json::to_string(&sft(1)).unwrap();
        let mut old = serde_json::to_value(sft(2)).unwrap();
        old["format_version"] = 99.into();
        std::fs::write(&p, format!("{a}\n\n{old}\n")).unwrap();
        let e = read_jsonl::<SftRecord>(&p).unwrap_err().to_string();
        assert!(
            e.contains("m.jsonl:3") && e.contains("format_version 99"),
            "{e}"
        );
        std::fs::write(&p, format!("{a}\n")).unwrap();
        assert_eq!(read_jsonl::<SftRecord>(&p).unwrap(), vec![sft(1)]);
        std::fs::write(&p, "{\"step\": 1}\n").unwrap();
        let e = read_jsonl::<SftRecord>(&p).unwrap_err().to_string();
        assert!(e.contains(":1") && e.contains("no `format_version`"), "{e}");
        let mut extra = serde_json::to_value(sft(1)).unwrap();
        extra["surprise"] = 1.into();
        std::fs::write(&p, format!("{extra}\n")).unwrap();
        let e = read_jsonl::<SftRecord>(&p).unwrap_err().to_string();
        assert!(e.contains("surprise"), "{e}");
    }

    #[test]
    fn lag_stats_of_a_histogram() {
        let mut r = StepRecord {
            staleness_counts: vec![2, 0, 2],
            ..StepRecord::default()
        };
        let line = serde_json::to_string(&r).unwrap();
        assert!(!line.contains("val_"), "{line}");
        assert_eq!(parse_line::<StepRecord>(&line).unwrap(), r);
        assert_eq!(r.lag_stats(), Some((1.0, 2.0)));
        r.staleness_counts = vec![0, 0];
        assert_eq!(r.lag_stats(), None);
    }
}
