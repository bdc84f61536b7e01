//! `mtrl rollout`: episodes of a scripted baseline policy in the search environment
//! (`mtrl_train::baselines`); prints mean reward, nDCG@10, failure rate and turns.

use std::path::PathBuf;

use anyhow::{Context, Result};
use mtrl_env::Baseline;
use mtrl_train::baselines::{load_split, run_baseline, summarize};
use mtrl_train::setup::open_index;

use super::common::{load_config, print_pretty};

#[derive(clap::Args, Debug)]
pub struct RolloutArgs {
    /// Scripted policy: bm25-once, vector-once or hybrid-rrf.
    #[arg(long)]
    pub policy: String,
    /// TOML config with [search] (and [data] or [search.eval] for the tasks).
    #[arg(long, short)]
    pub config: PathBuf,
    /// Task split of [data]: test, validation or train (default: test; without [data], the
    /// [search.eval] queries), or search-eval: every judged query of [search.eval].
    #[arg(long)]
    pub split: Option<String>,
    /// Run at most N tasks (the first N of the split).
    #[arg(long)]
    pub limit: Option<usize>,
    /// Write every trajectory as one JSON line to this file.
    #[arg(long)]
    pub trajectories: Option<PathBuf>,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &RolloutArgs) -> Result<()> {
    let baseline = Baseline::parse(&args.policy).with_context(|| {
        format!(
            "unknown policy `{}` (one of {})",
            args.policy,
            Baseline::ALL.map(|b| b.name()).join(", ")
        )
    })?;
    let cfg = load_config(Some(&args.config))?;
    let (split, mut tasks) = load_split(&cfg, args.split.as_deref())?;
    if let Some(n) = args.limit {
        tasks.truncate(n);
    }
    let (index, build) = open_index(&cfg, args.json)?;
    if !args.json {
        eprintln!("{build}");
    }
    let trajs = run_baseline(&cfg, index, baseline, &tasks, args.trajectories.as_ref())?;
    let s = summarize(&cfg.name, baseline.name(), &split, &trajs);
    if args.json {
        return print_pretty(&s);
    }
    print!("{s}");
    Ok(())
}
