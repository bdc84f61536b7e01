//! `mtrl bench model`: prefill, decode and training throughput of a Qwen-shaped model with random
//! weights (`--config`) or a checkpoint's own (`--model`); prints one JSON object. The training figure with optimizer runs the learner's AdamW
//! (f32 master weights and moments for a bf16 model), as a training step does.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Context;
use candle_core::Tensor;
use mtrl_learner::{AdamW, AdamWConfig};
use mtrl_model::bench::{run_bench_on, BenchOptions};
use mtrl_model::{Config, Policy};

#[derive(clap::Args, Debug)]
pub struct BenchModelArgs {
    /// A config.json giving the model shape (e.g. bench/bench-small.json); random weights.
    #[arg(long, required_unless_present = "model", conflicts_with = "model")]
    pub config: Option<PathBuf>,
    /// A checkpoint folder or `.gguf` file: its own weights (e.g. a real Qwen, docs/model.md).
    #[arg(long)]
    pub model: Option<PathBuf>,
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
    /// Rows per forward/backward (gradients accumulated); 0 = the whole batch at once. The
    /// training forward keeps O(T²) attention activations per row and layer, so long rows need
    /// small micro-batches.
    #[arg(long, default_value_t = 0)]
    pub train_micro_batch: usize,
    /// Training rows of decreasing length (right-padded; packed by the forward): see
    /// `train_ragged` in the report.
    #[arg(long)]
    pub train_ragged: bool,
    /// Per-layer activation checkpointing of the training forward (`[train]
    /// activation_checkpointing`).
    #[arg(long)]
    pub checkpointing: bool,
    /// The training forward's attention core (`[train] attention_kernel`): auto, fused
    /// (FlashAttention-2 on CUDA, the CPU twin elsewhere) or spelled.
    #[arg(long, default_value = "auto", value_parser = parse_attention)]
    pub attention: mtrl_model::AttentionKernel,
    /// Timed runs after one warm-up (the best is reported).
    #[arg(long, default_value_t = 2)]
    pub repeats: usize,
    /// cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// f32, bf16 or f16.
    #[arg(long, default_value = "f32")]
    pub dtype: String,
    /// Figures to measure: any of prefill, decode, train.
    #[arg(long, value_delimiter = ',', default_value = "prefill,decode,train")]
    pub phases: Vec<Phase>,
    /// Skip the training figure with an AdamW step (`train_step_tokens_per_s`).
    #[arg(long)]
    pub no_optimizer: bool,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Prefill,
    Decode,
    Train,
}

pub fn run(args: &BenchModelArgs) -> anyhow::Result<()> {
    let device = mtrl_model::parse_device(&args.device)?;
    let dtype = mtrl_model::parse_dtype(&args.dtype)?;
    let mut policy = match (&args.model, &args.config) {
        (Some(m), _) => {
            Policy::load(m, dtype, &device).with_context(|| format!("loading {}", m.display()))?
        }
        (None, Some(c)) => {
            let cfg = Config::from_file(c).with_context(|| format!("reading {}", c.display()))?;
            Policy::random(cfg, dtype, &device)?
        }
        (None, None) => anyhow::bail!("--config or --model is needed"),
    };
    policy.set_activation_checkpointing(args.checkpointing);
    policy.set_attention_kernel(args.attention);
    let cfg = policy.config().clone();
    anyhow::ensure!(
        args.prompt_len >= 1 && args.prompt_len + args.new_tokens <= cfg.max_position_embeddings,
        "prompt_len + new_tokens must fit max_position_embeddings ({})",
        cfg.max_position_embeddings
    );
    anyhow::ensure!(
        args.train_len >= 2 && args.train_len <= cfg.max_position_embeddings,
        "train_len out of range"
    );
    anyhow::ensure!(
        !args.batch_sizes.is_empty() && args.batch_sizes.iter().all(|&b| b >= 1),
        "batch sizes must be ≥ 1"
    );
    anyhow::ensure!(args.train_batch >= 1, "train_batch must be ≥ 1");
    let opts = BenchOptions {
        batch_sizes: args.batch_sizes.clone(),
        prompt_len: args.prompt_len,
        new_tokens: args.new_tokens,
        train_len: args.train_len,
        train_batch: args.train_batch,
        train_micro_batch: args.train_micro_batch,
        train_ragged: args.train_ragged,
        repeats: args.repeats,
        prefill: args.phases.contains(&Phase::Prefill),
        decode: args.phases.contains(&Phase::Decode),
        train: args.phases.contains(&Phase::Train),
    };
    let mut opt = AdamW::new(AdamWConfig::default());
    let mut step = |policy: &Policy, grads: &BTreeMap<String, Tensor>| -> mtrl_model::Result<()> {
        opt.step(policy.named_parameters(), grads, 1e-6)
            .map_err(|e| candle_core::Error::Msg(format!("adamw step: {e}")).into())
    };
    let hook: Option<mtrl_model::bench::OptimizerHook<'_>> =
        (!args.no_optimizer).then_some(&mut step);
    let report = run_bench_on(&policy, &device, &opts, hook)?;
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

fn parse_attention(s: &str) -> Result<mtrl_model::AttentionKernel, String> {
    mtrl_model::AttentionKernel::parse(s).ok_or_else(|| {
        format!(
            "unknown attention kernel {s:?} (one of {})",
            mtrl_model::AttentionKernel::NAMES.join(", ")
        )
    })
}
