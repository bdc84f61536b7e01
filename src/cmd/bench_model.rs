//! `mtrl bench model`: prefill, decode and training throughput of a Qwen-shaped model with random
//! weights; prints one JSON object.

use std::path::PathBuf;

use anyhow::Context;
use mtrl_model::bench::{run_bench, BenchOptions};
use mtrl_model::Config;

#[derive(clap::Args, Debug)]
pub struct BenchModelArgs {
    /// A config.json giving the model shape (e.g. bench/bench-small.json).
    #[arg(long)]
    pub config: PathBuf,
    /// Decode batch sizes.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    pub batch_sizes: Vec<usize>,
    /// Prompt length of every sequence.
    #[arg(long, default_value_t = 64)]
    pub prompt_len: usize,
    /// New tokens per sequence.
    #[arg(long, default_value_t = 64)]
    pub new_tokens: usize,
    /// Sequence length of the training batch.
    #[arg(long, default_value_t = 256)]
    pub train_len: usize,
    /// Rows of the training batch.
    #[arg(long, default_value_t = 8)]
    pub train_batch: usize,
    /// Timed runs after one warm-up (the best is reported).
    #[arg(long, default_value_t = 2)]
    pub repeats: usize,
    /// cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// f32, bf16 or f16.
    #[arg(long, default_value = "f32")]
    pub dtype: String,
}

pub fn run(args: &BenchModelArgs) -> anyhow::Result<()> {
    let device = mtrl_model::parse_device(&args.device)?;
    let dtype = mtrl_model::parse_dtype(&args.dtype)?;
    let cfg = Config::from_file(&args.config)
        .with_context(|| format!("reading {}", args.config.display()))?;
    anyhow::ensure!(
        args.prompt_len >= 1 && args.prompt_len + args.new_tokens <= cfg.max_position_embeddings,
        "prompt_len + new_tokens must fit max_position_embeddings ({})",
        cfg.max_position_embeddings
    );
    anyhow::ensure!(
        args.train_len >= 2 && args.train_len <= cfg.max_position_embeddings,
        "train_len out of range"
    );
    let opts = BenchOptions {
        batch_sizes: args.batch_sizes.clone(),
        prompt_len: args.prompt_len,
        new_tokens: args.new_tokens,
        train_len: args.train_len,
        train_batch: args.train_batch,
        repeats: args.repeats,
    };
    let report = run_bench(cfg, dtype, &device, &opts)?;
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}
