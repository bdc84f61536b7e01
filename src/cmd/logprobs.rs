//! `mtrl logprobs`: per-token log-probs of a given token sequence, as JSON
//! (`logprobs[i] = log p(ids[i+1] | ids[..=i])` under `log_softmax(logits / T)`).

use std::path::PathBuf;

use anyhow::Context;
use candle_core::Tensor;
use mtrl_model::{token_logprobs, Policy};

#[derive(clap::Args, Debug)]
pub struct LogprobsArgs {
    /// Hugging Face checkpoint folder, or a Qwen2/Qwen3 `.gguf` file.
    #[arg(long)]
    pub model: PathBuf,
    /// Comma-separated token ids (at least two).
    #[arg(long, value_delimiter = ',', required = true)]
    pub ids: Vec<u32>,
    /// Temperature of the distribution (1 = the model's own).
    #[arg(long, default_value_t = 1.0)]
    pub temperature: f64,
    /// cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// f32, bf16 or f16.
    #[arg(long, default_value = "f32")]
    pub dtype: String,
}

pub fn run(args: &LogprobsArgs) -> anyhow::Result<()> {
    let device = mtrl_model::parse_device(&args.device)?;
    let dtype = mtrl_model::parse_dtype(&args.dtype)?;
    let policy = Policy::load(&args.model, dtype, &device)
        .with_context(|| format!("loading model from {}", args.model.display()))?;
    let ids = Tensor::from_slice(&args.ids, (1, args.ids.len()), &device)?;
    let lp = token_logprobs(
        &policy,
        &ids,
        None,
        args.temperature,
        false,
        mtrl_model::logprobs::DEFAULT_CHUNK_ELEMS,
    )?;
    let values: Vec<f32> = lp.logprobs.squeeze(0)?.to_vec1()?;
    println!(
        "{}",
        serde_json::json!({ "ids": args.ids, "logprobs": values })
    );
    Ok(())
}
