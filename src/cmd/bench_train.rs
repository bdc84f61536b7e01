//! `mtrl bench train --config FILE [--steps N] [--staleness 0,2]`: the same short training run
//! once per staleness bound η, side by side, as JSON (`mtrl_train::bench_train`).

use std::path::PathBuf;

use anyhow::Result;

use super::common::print_pretty;

#[derive(clap::Args, Debug)]
pub struct BenchTrainArgs {
    /// A training config (its [algorithm] max_staleness is overridden); with --lora, a model
    /// shape's config.json (default bench/bench-small.json).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// LoRA against full fine-tuning on the --config shape, random weights: training step,
    /// optimizer-state bytes, weight publish, engine decode unmerged and merged
    /// (`mtrl_train::bench_lora`).
    #[arg(long)]
    pub lora: bool,
    /// With --lora: adapter rank and alpha (all seven target modules).
    #[arg(long, default_value_t = 32)]
    pub rank: usize,
    /// With --lora: adapter alpha.
    #[arg(long, default_value_t = 64.0)]
    pub alpha: f64,
    /// With --lora: the training batch (rows × tokens), timed repeats, decode batch.
    #[arg(long, default_value_t = 4)]
    pub rows: usize,
    /// With --lora: tokens per training row.
    #[arg(long, default_value_t = 256)]
    pub len: usize,
    /// With --lora: timed repeats after one warm-up.
    #[arg(long, default_value_t = 3)]
    pub repeats: usize,
    /// With --lora: sequences decoded together.
    #[arg(long, default_value_t = 16)]
    pub batch: usize,
    /// With --lora: f32, bf16 or f16; cpu or cuda:N.
    #[arg(long, default_value = "f32")]
    pub dtype: String,
    /// With --lora: cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: String,
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
    if args.lora {
        return run_lora(args);
    }
    let Some(config) = &args.config else {
        anyhow::bail!("--config FILE is required (a training config), unless --lora");
    };
    let cfg = mtrl_core::Config::load(config)?;
    let out = mtrl_train::bench_train::bench_staleness(&cfg, args.steps, &args.staleness)?;
    print_pretty(&out)
}

fn run_lora(args: &BenchTrainArgs) -> Result<()> {
    let path = args
        .config
        .clone()
        .unwrap_or_else(|| PathBuf::from("bench/bench-small.json"));
    let model = mtrl_model::Config::from_file(&path)?;
    let b = mtrl_train::bench_lora::LoraBench {
        model,
        spec: mtrl_model::LoraSpec {
            rank: args.rank,
            alpha: args.alpha,
            targets: mtrl_model::lora::TARGETS.map(String::from).to_vec(),
            dropout: 0.0,
            rslora: false,
            layers: None,
        },
        dtype: mtrl_model::parse_dtype(&args.dtype)?,
        device: mtrl_model::parse_device(&args.device)?,
        rows: args.rows,
        len: args.len,
        repeats: args.repeats,
        batch: args.batch,
        prompt: 64,
        new_tokens: 32,
    };
    print_pretty(&mtrl_train::bench_lora::bench_lora(&b)?)
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
