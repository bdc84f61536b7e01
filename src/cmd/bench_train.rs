//! `mtrl bench train --config FILE [--steps N] [--staleness 0,2]`: the same short training run
//! once per staleness bound η, side by side, as JSON (`mtrl_train::bench_train`).

use std::path::PathBuf;

use anyhow::Result;

use super::common::print_pretty;

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

#[derive(clap::Args, Debug)]
pub struct BenchCheckpointArgs {
    /// A training config ([checkpoint] every_steps, keep_last and background are overridden;
    /// the runs go to `<checkpoint.dir>/bench-background-{false,true}`).
    #[arg(long)]
    pub config: PathBuf,
    /// Steps per run.
    #[arg(long, default_value_t = 8)]
    pub steps: u64,
    /// A checkpoint every this many steps.
    #[arg(long, default_value_t = 2)]
    pub every: u64,
}

/// `mtrl bench checkpoint`: the learner's stall per checkpoint, on the learner thread and with the
/// background writer, as JSON.
pub fn run_checkpoint(args: &BenchCheckpointArgs) -> Result<()> {
    let cfg = mtrl_core::Config::load(&args.config)?;
    let out = mtrl_train::bench_train::bench_checkpoint(&cfg, args.steps, args.every)?;
    print_pretty(&out)
}

pub fn run(args: &BenchTrainArgs) -> Result<()> {
    let cfg = mtrl_core::Config::load(&args.config)?;
    let out = mtrl_train::bench_train::bench_staleness(&cfg, args.steps, &args.staleness)?;
    print_pretty(&out)
}

#[derive(clap::Args, Debug)]
pub struct BenchAgentArgs {
    /// A config with `[rollout] environment = "agent"` and `agent_url` (the agent must be
    /// running, e.g. examples/agents/plain_agent.py with mtrl serve-tools); `[data] test` gives
    /// the tasks, `[rollout]` the sampling.
    #[arg(long)]
    pub config: PathBuf,
    /// The policy checkpoint folder.
    #[arg(long)]
    pub model: PathBuf,
    /// Sampled episodes per task.
    #[arg(long, default_value_t = 8)]
    pub per_task: usize,
    /// Episodes in flight.
    #[arg(long, default_value_t = 256)]
    pub concurrency: usize,
    /// Only the first N tasks of each test file.
    #[arg(long)]
    pub limit: Option<usize>,
}

/// `mtrl bench agent`: the same episodes in-process and through the agent, as JSON.
pub fn run_agent(args: &BenchAgentArgs) -> Result<()> {
    let cfg = mtrl_core::Config::load(&args.config)?;
    let b = mtrl_train::bench_agent::AgentBench {
        model: &args.model,
        per_task: args.per_task,
        concurrency: args.concurrency,
        limit: args.limit,
    };
    print_pretty(&mtrl_train::bench_agent::bench_agent(&cfg, &b)?)
}
