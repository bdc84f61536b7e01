//! `mtrl bench train --config FILE [--steps N] [--staleness 0,2]`: the same short training run
//! once per staleness bound η, side by side, as JSON — wall time per step, time split, and the
//! reward reached. Each run starts fresh in `<checkpoint.dir>/bench-eta<η>` (only the final
//! checkpoint is written).

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::Result;
use mtrl_core::Config;
use serde_json::{json, Value};

use crate::cmd::train::{train, TrainArgs};

#[derive(clap::Args, Debug)]
pub struct BenchTrainArgs {
    /// A training config (its [algorithm] max_staleness is overridden).
    #[arg(long)]
    pub config: PathBuf,
    /// Steps per run.
    #[arg(long, default_value_t = 30)]
    pub steps: u64,
    /// The bounds η to compare.
    #[arg(long, value_delimiter = ',', default_value = "0,2")]
    pub staleness: Vec<u64>,
}

fn mean(recs: &[Value], key: &str) -> f64 {
    let v: Vec<f64> = recs.iter().filter_map(|r| r[key].as_f64()).collect();
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

pub fn run(args: &BenchTrainArgs) -> Result<()> {
    let base = Config::load(&args.config)?;
    let mut out = Vec::new();
    for &eta in &args.staleness {
        let mut cfg = base.clone();
        cfg.algorithm.max_staleness = eta;
        cfg.checkpoint.dir = base.checkpoint.dir.join(format!("bench-eta{eta}"));
        cfg.checkpoint.every_steps = 0;
        let targs = TrainArgs {
            config: Some(args.config.clone()),
            fresh: true,
            max_steps: Some(args.steps),
            quiet: true,
        };
        let s = train(&cfg, &targs, Arc::new(AtomicBool::new(false)))?;
        let r = &s.records;
        let n = r.len();
        let tail = &r[n.saturating_sub(5)..];
        let violations: u64 = r
            .iter()
            .filter_map(|x| x["staleness_violations"].as_u64())
            .sum();
        let mut lags: Vec<u64> = Vec::new();
        for x in r {
            for (k, c) in x["staleness_counts"]
                .as_array()
                .into_iter()
                .flatten()
                .enumerate()
            {
                if lags.len() <= k {
                    lags.resize(k + 1, 0);
                }
                lags[k] += c.as_u64().unwrap_or(0);
            }
        }
        let train_wall = r
            .last()
            .and_then(|x| x["elapsed_s"].as_f64())
            .unwrap_or(0.0)
            - r.first().map_or(0.0, |x| {
                x["elapsed_s"].as_f64().unwrap_or(0.0) - x["step_wall_s"].as_f64().unwrap_or(0.0)
            });
        out.push(json!({
            "max_staleness": eta,
            "steps": s.steps_done,
            "wall_s": s.wall_s,
            "train_loop_s": train_wall,
            "s_per_step": train_wall / n.max(1) as f64,
            "mean_generate_s": mean(r, "time_generate_s"),
            "mean_learn_s": mean(r, "time_learn_s"),
            "mean_wait_for_batch_s": mean(r, "time_wait_for_batch_s"),
            "reward_first5": mean(&r[..n.min(5)], "reward_mean"),
            "reward_last5": mean(tail, "reward_mean"),
            "staleness_counts": lags,
            "staleness_violations": violations,
        }));
    }
    println!("{}", serde_json::to_string_pretty(&Value::Array(out))?);
    Ok(())
}
