//! `mtrl convert --gguf FILE --out DIR [--dtype f32|bf16|f16]`: a Qwen2/Qwen3 GGUF (llama.cpp's
//! format, any block quantisation candle reads) as a Hugging Face checkpoint folder: `config.json`
//! from the metadata, dequantised `model.safetensors`, `tokenizer.json` + `tokenizer_config.json`
//! with the file's own chat template, `generation_config.json`. Every command, transformers and
//! vLLM load the result. Metadata the converter does not understand is refused, by name.

use std::path::PathBuf;

use anyhow::{bail, Context};

#[derive(clap::Args, Debug)]
pub struct ConvertArgs {
    /// The GGUF file.
    #[arg(long)]
    pub gguf: PathBuf,
    /// Output folder (created; must be empty if it exists).
    #[arg(long)]
    pub out: PathBuf,
    /// dtype of the written weights: f32 (lossless from the dequantised blocks), bf16 or f16.
    #[arg(long, default_value = "f32")]
    pub dtype: String,
}

pub fn run(args: &ConvertArgs) -> anyhow::Result<()> {
    let dtype = mtrl_model::parse_dtype(&args.dtype)?;
    if args.out.exists() && !args.out.is_dir() {
        bail!("--out {} is a file, not a folder", args.out.display());
    }
    if args.out.exists() && std::fs::read_dir(&args.out)?.next().is_some() {
        bail!("--out {} is not empty", args.out.display());
    }
    let started = std::time::Instant::now();
    mtrl_model::gguf::convert(&args.gguf, &args.out, dtype)
        .with_context(|| format!("converting {}", args.gguf.display()))?;
    let cfg = mtrl_model::Config::from_file(&args.out.join("config.json"))?;
    println!(
        "{}",
        serde_json::json!({
            "gguf": args.gguf,
            "out": args.out,
            "dtype": args.dtype,
            "model_type": cfg.raw["model_type"],
            "layers": cfg.num_hidden_layers,
            "hidden": cfg.hidden_size,
            "vocab": cfg.vocab_size,
            "tie_word_embeddings": cfg.tie_word_embeddings,
            "seconds": (started.elapsed().as_secs_f64() * 100.0).round() / 100.0,
        })
    );
    Ok(())
}
