//! `mpirun -np N mtrl bench allreduce [--config SHAPE.json]`: bytes all-reduced per update for
//! full fine-tuning and LoRA on one model shape, and the time of the bucketed gradient
//! all-reduce (`mtrl_train::bench_allreduce`). Rank 0 prints the JSON.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;

use super::common::print_pretty;

#[derive(clap::Args, Debug)]
pub struct BenchAllreduceArgs {
    /// The model shape's config.json.
    #[arg(long, default_value = "bench/bench-small.json")]
    pub config: PathBuf,
    /// LoRA rank and alpha (all seven target modules).
    #[arg(long, default_value_t = 32)]
    pub rank: usize,
    /// LoRA alpha.
    #[arg(long, default_value_t = 64.0)]
    pub alpha: f64,
    /// Gradient bucket size ([distributed] bucket_mb).
    #[arg(long, default_value_t = 25.0)]
    pub bucket_mb: f64,
    /// Timed repeats after one warm-up.
    #[arg(long, default_value_t = 10)]
    pub repeats: usize,
    /// cpu, or cuda:N for the NCCL reduce.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// The gradient dtype ([train] grad_accumulation): f32 or f64.
    #[arg(long, default_value = "f32")]
    pub accumulation: String,
    /// "host" (MPI) or "nccl" (device, CUDA builds).
    #[arg(long, default_value = "host")]
    pub grad_reduce: String,
}

pub fn run(args: &BenchAllreduceArgs) -> Result<()> {
    let comm = mtrl_dist::init(&mtrl_dist::InitOptions {
        grad_reduce: args.grad_reduce.clone(),
        on_cuda: args.device.starts_with("cuda"),
        lora: false,
        timeout: Duration::from_secs(600),
    })?;
    let device = if args.device == "cuda" {
        format!("cuda:{}", comm.local_rank())
    } else {
        args.device.clone()
    };
    let b = mtrl_train::bench_allreduce::AllreduceBench {
        model: mtrl_model::Config::from_file(&args.config)?,
        lora: mtrl_model::LoraSpec {
            rank: args.rank,
            alpha: args.alpha,
            targets: mtrl_model::lora::TARGETS.map(String::from).to_vec(),
            dropout: 0.0,
            rslora: false,
            layers: None,
        },
        device: mtrl_model::parse_device(&device)?,
        bucket_mb: args.bucket_mb,
        repeats: args.repeats,
        comm: comm.clone(),
        accumulation: match args.accumulation.as_str() {
            "f32" => candle_core::DType::F32,
            "f64" => candle_core::DType::F64,
            other => anyhow::bail!("--accumulation {other}: expected f32 or f64"),
        },
    };
    let out = mtrl_train::bench_allreduce::bench_allreduce(&b);
    match out {
        Ok(v) if comm.rank() == 0 => print_pretty(&v),
        Ok(_) => Ok(()),
        Err(e) if comm.world() > 1 => {
            eprintln!("error: rank {}: {e}", comm.rank());
            comm.abort(1)
        }
        Err(e) => Err(e.into()),
    }
}
