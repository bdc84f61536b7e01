//! `mtrl export --model BASE --adapter DIR --out OUT [--merge] [--dtype bf16]`: writes a LoRA
//! run's result for other tools. With `--merge`, a Hugging Face checkpoint with the adapter merged
//! into the base (`W + s·B·A`, PEFT's `merge_and_unload`), loadable by transformers or vLLM as a
//! plain model; without it, the adapter as PEFT's two files, `base_model_name_or_path` naming BASE.

use std::path::PathBuf;

use anyhow::{bail, Context};
use mtrl_model::Policy;

#[derive(clap::Args, Debug)]
pub struct ExportArgs {
    /// The base model: a Hugging Face checkpoint folder.
    #[arg(long)]
    pub model: PathBuf,
    /// The PEFT LoRA adapter folder (e.g. a LoRA run's `<checkpoint.dir>/step-N/policy`).
    #[arg(long)]
    pub adapter: PathBuf,
    /// Output folder.
    #[arg(long)]
    pub out: PathBuf,
    /// Write the merged model instead of the adapter.
    #[arg(long)]
    pub merge: bool,
    /// dtype of the merged weights: f32, bf16 or f16 (the merge itself is computed in f32). The
    /// adapter is always written in f32.
    #[arg(long, default_value = "f32")]
    pub dtype: String,
}

pub fn run(args: &ExportArgs) -> anyhow::Result<()> {
    let dtype = mtrl_model::parse_dtype(&args.dtype)?;
    if args.out.exists() && std::fs::read_dir(&args.out)?.next().is_some() {
        bail!("--out {} is not empty", args.out.display());
    }
    let device = candle_core::Device::Cpu;
    // Loaded in f32, so the adapter is not rounded before the merge (a bf16 base takes twice its
    // size in memory here); written in --dtype.
    let mut policy = Policy::load(&args.model, candle_core::DType::F32, &device)
        .with_context(|| format!("loading the base model from {}", args.model.display()))?
        .load_adapter(&args.adapter)
        .with_context(|| format!("loading the adapter from {}", args.adapter.display()))?;
    policy.set_lora_base_name(&args.model.display().to_string());
    if args.merge {
        policy.save_merged(&args.out, dtype)?;
    } else {
        policy.save(&args.out, dtype)?;
    }
    let spec = policy.lora().context("no adapter")?;
    println!(
        "{}",
        serde_json::json!({
            "out": args.out,
            "merged": args.merge,
            "rank": spec.rank,
            "alpha": spec.alpha,
            "target_modules": spec.targets,
            "adapter_parameters": policy.named_parameters().values().map(|v| v.elem_count()).sum::<usize>(),
        })
    );
    Ok(())
}
