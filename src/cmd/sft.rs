//! `mtrl sft --config FILE [--trajectories FILE] [--out DIR]`: supervised fine-tuning of the
//! config's `[model]` on a trajectory file (JSON Lines of `Trajectory`, as `mtrl rollout
//! --trajectories`, the trajectory log or a teacher writes), for cold starts.
//!
//! Each conversation is teacher-forced into ids with the model's chat template and the
//! environment's tool schemas ([`mtrl_env::tokenize_transcript`]); the loss is the token-mean
//! cross-entropy of the assistant's ids. Episodes are shuffled per epoch with `[sft] seed`.
//! The result is an HF checkpoint (weights, config, tokenizer files) in `--out` / `[sft] output`.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use mtrl_core::config::SftSettings;
use mtrl_core::{ChatCodec, Config, Trajectory};
use mtrl_env::rng::SplitMix64;
use mtrl_env::tokenize_transcript;
use mtrl_learner::{AdamW, AdamWConfig, Decay, LrSchedule, SftConfig, SftExample};
use mtrl_model::Policy;
use serde_json::{json, Value};

use super::train::setup;

#[derive(clap::Args, Debug)]
pub struct SftArgs {
    #[arg(long, short)]
    pub config: PathBuf,
    /// Trajectory file (default: `[sft] trajectories`).
    #[arg(long)]
    pub trajectories: Option<PathBuf>,
    /// Output checkpoint folder (default: `[sft] output`).
    #[arg(long)]
    pub out: Option<PathBuf>,
    #[arg(long)]
    pub quiet: bool,
}

/// Reads a trajectory JSONL file; a bad line names the file and line.
pub fn read_trajectories(path: &Path) -> Result<Vec<Trajectory>> {
    let f = std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in std::io::BufReader::new(f).lines().enumerate() {
        let line = line.with_context(|| format!("{}:{}: cannot read", path.display(), i + 1))?;
        if line.trim().is_empty() {
            continue;
        }
        let t: Trajectory = serde_json::from_str(&line)
            .with_context(|| format!("{}:{}: not a trajectory", path.display(), i + 1))?;
        out.push(t);
    }
    if out.is_empty() {
        bail!("{} holds no trajectories", path.display());
    }
    Ok(out)
}

/// Fine-tunes `policy` in place; returns one JSON record per optimizer step.
pub fn fine_tune(
    policy: &Policy,
    codec: &dyn ChatCodec,
    tools: &[Value],
    trajs: &[Trajectory],
    s: &SftSettings,
    quiet: bool,
) -> Result<Vec<Value>> {
    let mut examples: Vec<SftExample> = Vec::with_capacity(trajs.len());
    for (i, t) in trajs.iter().enumerate() {
        let row = tokenize_transcript(codec, &t.messages, tools)
            .with_context(|| format!("trajectory {} (task {})", i + 1, t.task_id))?;
        examples.push(SftExample {
            tokens: row.tokens,
            loss_mask: row.loss_mask,
        });
    }
    if !quiet {
        let ids: usize = examples.iter().map(|e| e.tokens.len()).sum();
        let trained: usize = examples
            .iter()
            .map(|e| e.loss_mask.iter().map(|m| *m as usize).sum::<usize>())
            .sum();
        eprintln!(
            "         {} conversations, {:.0} ids each on average ({:.0} trained)",
            examples.len(),
            ids as f64 / examples.len().max(1) as f64,
            trained as f64 / examples.len().max(1) as f64
        );
    }
    let steps_per_epoch = examples.len().div_ceil(s.batch_size);
    let total = (steps_per_epoch * s.epochs) as u64;
    let cfg = SftConfig {
        schedule: LrSchedule {
            lr: s.lr,
            warmup_steps: s.warmup_steps,
            decay: Decay::Cosine {
                total_steps: total,
                min_lr: s.min_lr,
            },
        },
        grad_clip: s.grad_clip,
        micro_batch_tokens: s.micro_batch_tokens,
    };
    let mut opt = AdamW::new(AdamWConfig {
        weight_decay: 0.0,
        ..AdamWConfig::default()
    });
    let bar = if quiet {
        indicatif::ProgressBar::hidden()
    } else {
        indicatif::ProgressBar::new(total)
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template("sft {pos}/{len} [{bar:30}] {msg} eta {eta}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    let mut rng = SplitMix64(s.seed ^ 0x5f7);
    let mut order: Vec<usize> = (0..examples.len()).collect();
    let mut records = Vec::new();
    let t0 = std::time::Instant::now();
    for epoch in 0..s.epochs {
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i + 1));
        }
        for chunk in order.chunks(s.batch_size) {
            let batch: Vec<SftExample> = chunk.iter().map(|&i| examples[i].clone()).collect();
            let m = mtrl_learner::sft_step(policy, &mut opt, &batch, &cfg)?;
            let rec = json!({
                "step": opt.step_count(), "epoch": epoch, "loss": m.loss,
                "tokens": m.tokens, "grad_norm": m.grad_norm, "lr": m.lr,
                "elapsed_s": t0.elapsed().as_secs_f64(),
            });
            metrics::gauge!("mtrl_sft_loss").set(m.loss);
            if bar.is_hidden() && !quiet && opt.step_count().is_multiple_of(10) {
                eprintln!(
                    "         sft step {}/{total}: loss {:.3} ({:.0} s)",
                    opt.step_count(),
                    m.loss,
                    t0.elapsed().as_secs_f64()
                );
            }
            bar.inc(1);
            bar.set_message(format!("loss {:.3}", m.loss));
            records.push(rec);
        }
    }
    bar.finish_and_clear();
    Ok(records)
}

/// The tool schemas of the config's search environment (what the chat template lists).
pub fn tool_schemas(cfg: &Config, index: Arc<mtrl_search::SearchIndex>) -> Vec<Value> {
    mtrl_env::standard_tools(&cfg.env_or_default(), index)
        .iter()
        .map(|t| t.schema())
        .collect()
}

/// Copies the tokenizer files of `from` into `to` (a checkpoint of a random-init policy has none).
pub fn copy_tokenizer(from: &Path, to: &Path) -> Result<()> {
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        let src = from.join(f);
        if src.exists() {
            std::fs::copy(&src, to.join(f))
                .with_context(|| format!("copying {} into {}", src.display(), to.display()))?;
        }
    }
    Ok(())
}

pub fn run(args: &SftArgs) -> Result<()> {
    let cfg = Config::load(&args.config)?;
    let s = &cfg.sft;
    let input = args
        .trajectories
        .clone()
        .or_else(|| s.trajectories.clone())
        .with_context(|| {
            format!(
                "no trajectory file: pass --trajectories or set `sft.trajectories` in {}",
                cfg.source.display()
            )
        })?;
    let out = args
        .out
        .clone()
        .or_else(|| s.output.clone())
        .with_context(|| {
            format!(
                "no output folder: pass --out or set `sft.output` in {}",
                cfg.source.display()
            )
        })?;
    let trajs = read_trajectories(&input)?;
    let parts = setup::model_parts(&cfg)?;
    let policy = setup::initial_policy(&cfg, &parts)?;
    let (index, _) = super::common::open_index(&cfg, args.quiet)?;
    let tools = tool_schemas(&cfg, Arc::new(index));
    let records = fine_tune(&policy, parts.codec.as_ref(), &tools, &trajs, s, args.quiet)?;
    policy
        .save(&out, parts.dtype)
        .with_context(|| format!("saving the fine-tuned policy into {}", out.display()))?;
    copy_tokenizer(&setup::tokenizer_dir(&cfg)?, &out)?;
    let first = records.first().and_then(|r| r["loss"].as_f64());
    let last = records.last().and_then(|r| r["loss"].as_f64());
    println!(
        "{}",
        json!({"trajectories": trajs.len(), "steps": records.len(), "loss_first": first,
               "loss_last": last, "output": out})
    );
    Ok(())
}
