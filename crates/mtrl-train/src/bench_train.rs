//! `mtrl bench train`: the same short training run once per staleness bound η, side by side —
//! wall time per step, time split, and the reward reached. Each run starts fresh in
//! `<checkpoint.dir>/bench-eta<η>` (only the final checkpoint is written).
//!
//! `mtrl bench checkpoint`: the same short run with a checkpoint every `every` steps, written on
//! the learner thread and by the background writer, side by side: the learner's stall per
//! checkpoint (`time_checkpoint_s` of the step after it) and the run's wall time.

use mtrl_core::{Config, StepRecord};
use serde_json::{json, Value};

use crate::error::Result;
use crate::run::{train, TrainOptions};

fn mean(recs: &[StepRecord], f: impl Fn(&StepRecord) -> f64) -> f64 {
    recs.iter().map(f).sum::<f64>() / recs.len().max(1) as f64
}

/// Samples trained by lag, summed over the records.
fn lag_histogram(r: &[StepRecord]) -> Vec<u64> {
    let mut lags: Vec<u64> = Vec::new();
    for x in r {
        for (k, c) in x.staleness_counts.iter().enumerate() {
            if lags.len() <= k {
                lags.resize(k + 1, 0);
            }
            lags[k] += c;
        }
    }
    lags
}

/// One JSON object per η in `staleness`, each a fresh run of `steps` steps of `base`.
pub fn bench_staleness(base: &Config, steps: u64, staleness: &[u64]) -> Result<Vec<Value>> {
    let mut out = Vec::new();
    for &eta in staleness {
        let mut cfg = base.clone();
        cfg.algorithm.max_staleness = eta;
        cfg.checkpoint.dir = base.checkpoint.dir.join(format!("bench-eta{eta}"));
        cfg.checkpoint.every_steps = 0;
        let opts = TrainOptions {
            fresh: true,
            max_steps: Some(steps),
            ..TrainOptions::default()
        };
        let s = train(&cfg, opts)?;
        let r = &s.records;
        let n = r.len();
        let train_wall = r.last().map_or(0.0, |x| x.elapsed_s)
            - r.first().map_or(0.0, |x| x.elapsed_s - x.step_wall_s);
        out.push(json!({
            "max_staleness": eta,
            "steps": s.steps_done,
            "wall_s": s.wall_s,
            "train_loop_s": train_wall,
            "s_per_step": train_wall / n.max(1) as f64,
            "mean_generate_s": mean(r, |x| x.time_generate_s),
            "mean_learn_s": mean(r, |x| x.time_learn_s),
            "mean_wait_for_batch_s": mean(r, |x| x.time_wait_for_batch_s),
            "reward_first5": mean(&r[..n.min(5)], |x| x.reward_mean),
            "reward_last5": mean(&r[n.saturating_sub(5)..], |x| x.reward_mean),
            "staleness_counts": lag_histogram(r),
            "staleness_violations": r.iter().map(|x| x.staleness_violations).sum::<u64>(),
        }));
    }
    Ok(out)
}

/// One JSON object per writer mode (`background` false, then true), each a fresh run of `steps`
/// steps of `base` with a checkpoint every `every` steps.
pub fn bench_checkpoint(base: &Config, steps: u64, every: u64) -> Result<Vec<Value>> {
    let mut out = Vec::new();
    for background in [false, true] {
        let mut cfg = base.clone();
        cfg.checkpoint.dir = base
            .checkpoint
            .dir
            .join(format!("bench-background-{background}"));
        cfg.checkpoint.every_steps = every.max(1);
        cfg.checkpoint.keep_last = 1;
        cfg.checkpoint.background = background;
        let opts = TrainOptions {
            fresh: true,
            max_steps: Some(steps),
            ..TrainOptions::default()
        };
        let s = train(&cfg, opts)?;
        // A checkpoint after step k is charged to the record of step k + 1.
        let stall: Vec<f64> = s
            .records
            .iter()
            .filter(|r| r.step > 1 && (r.step - 1).is_multiple_of(every.max(1)))
            .map(|r| r.time_checkpoint_s)
            .collect();
        let ckpt = std::fs::read_dir(&cfg.checkpoint.dir)?
            .filter_map(|e| e.ok())
            .find(|e| e.file_name().to_string_lossy().starts_with("step-"))
            .map(|e| dir_bytes(&e.path()))
            .transpose()?
            .unwrap_or(0);
        out.push(json!({
            "background": background,
            "steps": s.steps_done,
            "every_steps": every,
            "checkpoint_bytes": ckpt,
            "stall_s": stall,
            "mean_stall_s": stall.iter().sum::<f64>() / stall.len().max(1) as f64,
            "max_stall_s": stall.iter().copied().fold(0.0, f64::max),
            "wall_s": s.wall_s,
        }));
    }
    Ok(out)
}

fn dir_bytes(dir: &std::path::Path) -> Result<u64> {
    let mut n = 0;
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        n += if p.is_dir() {
            dir_bytes(&p)?
        } else {
            std::fs::metadata(&p)?.len()
        };
    }
    Ok(n)
}
