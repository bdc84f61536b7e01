//! `mtrl sft --config FILE [--trajectories FILE] [--out DIR]`: supervised fine-tuning of the
//! config's `[model]` on a trajectory file (`mtrl_train::sft`); prints a JSON summary.

use std::path::PathBuf;

use anyhow::Result;
use mtrl_train::sft::SftOptions;
use serde_json::json;

#[derive(clap::Args, Debug)]
pub struct SftArgs {
    /// The run config: [model] to fine-tune, [sft] settings, [search] and [env] for the tool schemas.
    #[arg(long, short)]
    pub config: PathBuf,
    /// Trajectory file (default: `[sft] trajectories`).
    #[arg(long)]
    pub trajectories: Option<PathBuf>,
    /// Output checkpoint folder (default: `[sft] output`).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
}

pub fn run(args: &SftArgs) -> Result<()> {
    let cfg = mtrl_core::Config::load(&args.config)?;
    let opts = SftOptions {
        trajectories: args.trajectories.clone(),
        out: args.out.clone(),
        progress: !args.quiet,
    };
    let s = mtrl_train::sft::run(&cfg, &opts)?;
    let first = s.records.first().map(|r| r.loss);
    let last = s.records.last().map(|r| r.loss);
    println!(
        "{}",
        json!({"trajectories": s.trajectories, "steps": s.records.len(), "loss_first": first,
               "loss_last": last, "output": s.output, "telemetry": s.telemetry})
    );
    Ok(())
}
