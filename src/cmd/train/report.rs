//! Per-step metrics: computed from the batch, the learner's [`StepMetrics`] and the rollout
//! counters; recorded through the `metrics` facade and returned as one JSON object (a line of
//! `<checkpoint.dir>/metrics.jsonl`).
//!
//! Facade names: `mtrl_train_<record key>` (`@` spelled `_at_`, seconds as `_seconds`), gauges for
//! per-step values, counters (`_total`) for sums over the run, histograms for durations and
//! per-sample staleness. The rollout crate's series are `mtrl_rollout_*`.

use std::collections::BTreeMap;

use mtrl_core::{FailureReason, Trajectory};
use mtrl_learner::StepMetrics;
use mtrl_rollout::RolloutCounters;
use serde_json::{json, Value};

/// Seconds of wall time and counter differences for one step.
pub struct Timing {
    pub step_wall_s: f64,
    pub elapsed_s: f64,
    pub publish_s: f64,
    pub learn_wait_s: f64,
}

fn mean_std(v: &[f64]) -> (f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0);
    }
    let m = v.iter().sum::<f64>() / v.len() as f64;
    let var = v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / v.len() as f64;
    (m, var.sqrt())
}

/// The JSON line of one step; also sets the `metrics` gauges and histograms.
pub fn step_record(
    step: u64,
    batch: &[Vec<Trajectory>],
    m: &StepMetrics,
    before: &RolloutCounters,
    after: &RolloutCounters,
    t: &Timing,
) -> Value {
    let trajs: Vec<&Trajectory> = batch.iter().flatten().collect();
    let rewards: Vec<f64> = trajs.iter().map(|t| t.reward).collect();
    let (reward_mean, reward_std) = mean_std(&rewards);
    let ndcg: Vec<f64> = trajs
        .iter()
        .map(|t| {
            t.scores
                .iter()
                .find(|(n, _)| n == "ndcg@10")
                .map_or(0.0, |(_, s)| *s)
        })
        .collect();
    let (ndcg_mean, _) = mean_std(&ndcg);
    let turns: Vec<f64> = trajs.iter().map(|t| t.turns as f64).collect();
    let (turns_mean, _) = mean_std(&turns);
    let mut failures: BTreeMap<&str, u64> = BTreeMap::new();
    for t in &trajs {
        if let Some(f) = t.failure {
            *failures.entry(f.as_str()).or_default() += 1;
        }
    }
    let n = trajs.len().max(1) as f64;
    let failure_rate = failures.values().sum::<u64>() as f64 / n;
    let gen_s = after.generate_s - before.generate_s;
    let tokens = after.tokens - before.tokens;
    let rollout_tps = if gen_s > 0.0 {
        tokens as f64 / gen_s
    } else {
        0.0
    };
    let learner_tps = if m.learn_s > 0.0 {
        m.padded_tokens as f64 / m.learn_s
    } else {
        0.0
    };
    let wait = after.admission_wait_s - before.admission_wait_s;
    let tools_s = after.env_s - before.env_s;

    metrics::gauge!("mtrl_train_step").set(step as f64);
    metrics::gauge!("mtrl_train_policy_version").set(m.version as f64);
    metrics::gauge!("mtrl_train_reward_mean").set(reward_mean);
    metrics::gauge!("mtrl_train_reward_std").set(reward_std);
    metrics::gauge!("mtrl_train_ndcg_at_10").set(ndcg_mean);
    metrics::gauge!("mtrl_train_failure_rate").set(failure_rate);
    for r in FailureReason::ALL {
        let c = failures.get(r.as_str()).copied().unwrap_or(0);
        metrics::counter!("mtrl_train_failures_total", "reason" => r.as_str()).increment(c);
    }
    metrics::gauge!("mtrl_train_turns_mean").set(turns_mean);
    for (lag, c) in m.lag_counts.iter().enumerate() {
        for _ in 0..*c {
            metrics::histogram!("mtrl_train_sample_staleness").record(lag as f64);
        }
    }
    metrics::counter!("mtrl_train_stale_samples_dropped_total").increment(m.dropped_stale);
    metrics::counter!("mtrl_train_sequences_total").increment(m.sequences);
    metrics::counter!("mtrl_train_tokens_total").increment(m.tokens);
    metrics::histogram!("mtrl_train_admission_wait_seconds").record(wait);
    metrics::gauge!("mtrl_train_rollout_tokens_per_second").set(rollout_tps);
    metrics::gauge!("mtrl_train_learner_tokens_per_second").set(learner_tps);
    metrics::histogram!("mtrl_train_generate_seconds").record(gen_s);
    metrics::histogram!("mtrl_train_tools_seconds").record(tools_s);
    metrics::histogram!("mtrl_train_learn_seconds").record(m.learn_s);
    metrics::histogram!("mtrl_train_publish_seconds").record(t.publish_s);
    metrics::histogram!("mtrl_train_wait_for_batch_seconds").record(t.learn_wait_s);
    metrics::histogram!("mtrl_train_step_seconds").record(t.step_wall_s);
    metrics::gauge!("mtrl_train_loss").set(m.loss);
    metrics::gauge!("mtrl_train_clip_fraction").set(m.clip_fraction);
    metrics::gauge!("mtrl_train_behaviour_weight").set(m.behaviour_weight);
    metrics::gauge!("mtrl_train_entropy").set(m.entropy);
    metrics::gauge!("mtrl_train_kl").set(m.kl);
    metrics::gauge!("mtrl_train_grad_norm").set(m.grad_norm);
    metrics::gauge!("mtrl_train_lr").set(m.lr);

    json!({
        "step": step,
        "version": m.version,
        "reward_mean": reward_mean,
        "reward_std": reward_std,
        "ndcg@10": ndcg_mean,
        "failure_rate": failure_rate,
        "failures": failures,
        "turns_mean": turns_mean,
        "loss": m.loss,
        "clip_fraction": m.clip_fraction,
        "behaviour_weight": m.behaviour_weight,
        "entropy": m.entropy,
        "kl": m.kl,
        "grad_norm": m.grad_norm,
        "lr": m.lr,
        "tokens": m.tokens,
        "sequences": m.sequences,
        "micro_batches": m.micro_batches,
        "skipped": m.skipped,
        "staleness_counts": m.lag_counts,
        "staleness_violations": m.dropped_stale,
        "admission_wait_s": wait,
        "rollout_tokens_per_s": rollout_tps,
        "learner_tokens_per_s": learner_tps,
        "time_generate_s": gen_s,
        "time_tools_s": tools_s,
        "time_learn_s": m.learn_s,
        "time_publish_s": t.publish_s,
        "time_wait_for_batch_s": t.learn_wait_s,
        "step_wall_s": t.step_wall_s,
        "elapsed_s": t.elapsed_s,
    })
}
