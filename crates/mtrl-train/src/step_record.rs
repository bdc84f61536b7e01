//! The [`StepRecord`] of one RL step, computed from the batch, the learner's [`StepMetrics`] and
//! the rollout counters. Pure: the telemetry sinks write and export it.

use std::collections::BTreeMap;

use mtrl_core::record::STEP_RECORD_FORMAT_VERSION;
use mtrl_core::{StepRecord, Trajectory};
use mtrl_learner::StepMetrics;
use mtrl_rollout::RolloutCounters;

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

/// The record of one step.
pub fn step_record(
    step: u64,
    batch: &[Vec<Trajectory>],
    m: &StepMetrics,
    before: &RolloutCounters,
    after: &RolloutCounters,
    t: &Timing,
) -> StepRecord {
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
    let mut failures: BTreeMap<String, u64> = BTreeMap::new();
    for t in &trajs {
        if let Some(f) = t.failure {
            *failures.entry(f.as_str().to_string()).or_default() += 1;
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
        m.forward_tokens as f64 / m.learn_s
    } else {
        0.0
    };
    let wait = after.admission_wait_s - before.admission_wait_s;
    let tools_s = after.env_s - before.env_s;

    StepRecord {
        format_version: STEP_RECORD_FORMAT_VERSION,
        step,
        version: m.version,
        reward_mean,
        reward_std,
        ndcg_at_10: ndcg_mean,
        failure_rate,
        failures,
        turns_mean,
        loss: m.loss,
        clip_fraction: m.clip_fraction,
        behaviour_weight: m.behaviour_weight,
        sampler_gap: m.sampler_gap,
        updates: m.updates,
        entropy: m.entropy,
        kl: m.kl,
        grad_norm: m.grad_norm,
        lr: m.lr,
        tokens: m.tokens,
        sequences: m.sequences,
        micro_batches: m.micro_batches,
        skipped: m.skipped,
        skipped_updates: m.skipped_updates,
        skip_reason: m.skip_reason.clone(),
        staleness_counts: m.lag_counts.clone(),
        staleness_violations: m.dropped_stale,
        admission_wait_s: wait,
        rollout_tokens_per_s: rollout_tps,
        prompt_tokens_prefilled: after.prefill_tokens - before.prefill_tokens,
        prompt_tokens_reused: after.reused_tokens - before.reused_tokens,
        learner_tokens_per_s: learner_tps,
        episode_retries: after.retries - before.retries,
        episode_timeouts: after.timeouts - before.timeouts,
        episodes_errored: after.errored_episodes - before.errored_episodes,
        groups_replaced: after.replaced_groups - before.replaced_groups,
        faults_injected: mtrl_rollout::FaultKind::ALL
            .iter()
            .zip(after.faults.iter().zip(before.faults))
            .filter(|(_, (a, b))| **a > *b)
            .map(|(k, (a, b))| (k.as_str().to_string(), a - b))
            .collect(),
        time_generate_s: gen_s,
        time_prefill_s: after.prefill_s - before.prefill_s,
        time_decode_s: after.decode_s - before.decode_s,
        time_sample_s: after.sample_s - before.sample_s,
        time_tools_s: tools_s,
        time_learn_s: m.learn_s,
        time_forward_s: m.forward_s,
        time_backward_s: m.backward_s,
        time_optimizer_s: m.optimizer_s,
        time_publish_s: t.publish_s,
        time_wait_for_batch_s: t.learn_wait_s,
        step_wall_s: t.step_wall_s,
        elapsed_s: t.elapsed_s,
        ..StepRecord::default()
    }
}
