//! `mtrl bench engine`: the multi-turn rollout workload on the paged engine and the legacy one,
//! side by side in one process; prints one JSON object (see `mtrl_model::bench_engine`).

use std::path::PathBuf;

use anyhow::Context;
use mtrl_model::bench_engine::{run as run_bench, EngineBenchOptions};
use mtrl_model::Config;

#[derive(clap::Args, Debug)]
pub struct BenchEngineArgs {
    /// A config.json giving the model shape (e.g. bench/bench-small.json).
    #[arg(long)]
    pub config: PathBuf,
    /// Concurrent episodes.
    #[arg(long, default_value_t = 64)]
    pub episodes: usize,
    /// Model calls per episode.
    #[arg(long, default_value_t = 4)]
    pub calls: usize,
    /// First prompt of an episode (system prompt, tools, question).
    #[arg(long, default_value_t = 256)]
    pub prompt_tokens: usize,
    /// Tool response appended between calls.
    #[arg(long, default_value_t = 150)]
    pub tool_tokens: usize,
    /// Tokens generated per call.
    #[arg(long, default_value_t = 32)]
    pub new_tokens: usize,
    /// Sequences per engine step (default: episodes).
    #[arg(long)]
    pub max_batch: Option<usize>,
    /// The paged engine's prompt tokens per step.
    #[arg(long, default_value_t = 512)]
    pub prefill_chunk_tokens: usize,
    /// The paged engine's attention (`[rollout] engine_attention`): auto, paged, flash-prefill or
    /// gathered.
    #[arg(long, default_value = "auto", value_parser = parse_attention)]
    pub attention: mtrl_model::EngineAttention,
    /// Timed runs per engine after one warm-up (the best is reported).
    #[arg(long, default_value_t = 2)]
    pub repeats: usize,
    /// cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// f32, bf16 or f16.
    #[arg(long, default_value = "f32")]
    pub dtype: String,
}

pub fn run(args: &BenchEngineArgs) -> anyhow::Result<()> {
    let device = mtrl_model::parse_device(&args.device)?;
    let dtype = mtrl_model::parse_dtype(&args.dtype)?;
    let cfg = Config::from_file(&args.config)
        .with_context(|| format!("reading {}", args.config.display()))?;
    let longest = args.prompt_tokens + args.calls * (args.new_tokens + args.tool_tokens);
    anyhow::ensure!(
        longest < cfg.max_position_embeddings,
        "an episode reaches {longest} tokens, beyond max_position_embeddings ({})",
        cfg.max_position_embeddings
    );
    anyhow::ensure!(
        args.episodes >= 1 && args.calls >= 1 && args.prompt_tokens >= 1 && args.new_tokens >= 1,
        "--episodes, --calls, --prompt-tokens and --new-tokens must be ≥ 1"
    );
    let opts = EngineBenchOptions {
        episodes: args.episodes,
        calls: args.calls,
        prompt_tokens: args.prompt_tokens,
        tool_tokens: args.tool_tokens,
        new_tokens: args.new_tokens,
        max_batch: args.max_batch.unwrap_or(args.episodes).max(1),
        prefill_chunk_tokens: args.prefill_chunk_tokens.max(1),
        attention: args.attention,
        repeats: args.repeats,
    };
    let report = run_bench(cfg, dtype, &device, &opts)?;
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

fn parse_attention(s: &str) -> Result<mtrl_model::EngineAttention, String> {
    mtrl_model::EngineAttention::parse(s).ok_or_else(|| {
        format!(
            "unknown engine attention {s:?} (one of {})",
            mtrl_model::EngineAttention::NAMES.join(", ")
        )
    })
}
