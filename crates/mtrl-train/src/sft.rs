//! Supervised fine-tuning (`mtrl sft`, and the default job's warm start) of the config's `[model]`
//! on a trajectory file (JSON Lines of `Trajectory`, as `mtrl rollout --trajectories`, the
//! trajectory log or a teacher writes), for cold starts.
//!
//! Each conversation is teacher-forced into ids with the model's chat template and the
//! environment's tool schemas ([`mtrl_env::tokenize_transcript`]); the loss is the token-mean
//! cross-entropy of the assistant's ids. Episodes are shuffled per epoch with `[sft] seed`.
//! Every optimizer step is an [`SftRecord`] for the run's sinks (`<out>/sft-metrics.jsonl`, the
//! bar, Prometheus `mtrl_sft_*`, MLflow run `<name>-sft`). The result is an HF checkpoint
//! (weights, config, tokenizer files) in the output folder.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use mtrl_core::config::SftSettings;
use mtrl_core::record::SFT_RECORD_FORMAT_VERSION;
use mtrl_core::rng::SplitMix64;
use mtrl_core::{ChatCodec, Config, SftRecord, Trajectory};
use mtrl_env::tokenize_transcript;
use mtrl_learner::{AdamW, AdamWConfig, Decay, LrSchedule, SftConfig, SftExample};
use mtrl_model::Policy;
use serde_json::Value;

use crate::bail;
use crate::error::{Context, Result};
use crate::setup;
use crate::telemetry::{
    status_of, JsonlSink, MlflowSink, ProgressSink, PrometheusSink, Record, Telemetry,
};

/// Where `mtrl sft` reads and writes.
#[derive(Debug, Clone, Default)]
pub struct SftOptions {
    /// Trajectory file (default: `[sft] trajectories`).
    pub trajectories: Option<PathBuf>,
    /// Output checkpoint folder (default: `[sft] output`).
    pub out: Option<PathBuf>,
    /// Progress bars and lines on stderr.
    pub progress: bool,
}

/// What an SFT run did.
#[derive(Debug, Clone)]
pub struct SftSummary {
    pub trajectories: usize,
    pub records: Vec<SftRecord>,
    pub output: PathBuf,
    pub telemetry: Value,
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

/// The conversations as teacher-forced ids with the assistant mask; with `progress`, a line on
/// stderr about their sizes.
pub fn examples(
    codec: &dyn ChatCodec,
    tools: &[Value],
    trajs: &[Trajectory],
    progress: bool,
) -> Result<Vec<SftExample>> {
    let mut examples: Vec<SftExample> = Vec::with_capacity(trajs.len());
    for (i, t) in trajs.iter().enumerate() {
        let row = tokenize_transcript(codec, &t.messages, tools)
            .with_context(|| format!("trajectory {} (task {})", i + 1, t.task_id))?;
        examples.push(SftExample {
            tokens: row.tokens,
            loss_mask: row.loss_mask,
        });
    }
    if progress {
        let n = examples.len().max(1) as f64;
        let ids: usize = examples.iter().map(|e| e.tokens.len()).sum();
        let trained: usize = examples
            .iter()
            .map(|e| e.loss_mask.iter().map(|m| *m as usize).sum::<usize>())
            .sum();
        eprintln!(
            "         {} conversations, {:.0} ids each on average ({:.0} trained)",
            examples.len(),
            ids as f64 / n,
            trained as f64 / n
        );
    }
    Ok(examples)
}

/// Optimizer steps of fine-tuning on `n` examples (`max_steps` caps the epochs').
fn total_steps(n: usize, s: &SftSettings) -> u64 {
    let all = (n.div_ceil(s.batch_size) * s.epochs) as u64;
    match s.max_steps {
        0 => all,
        m => all.min(m),
    }
}

/// The sinks of an SFT run writing into `out`: `sft-metrics.jsonl` there, the bar when
/// `progress`, Prometheus and MLflow (`<name>-sft`) as `[logging]` says.
fn telemetry(cfg: &Config, out: &Path, total: u64, progress: bool) -> Result<Telemetry> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let mut t = Telemetry::new();
    t.push(Box::new(JsonlSink::create(
        &out.join("sft-metrics.jsonl"),
        &[],
    )?));
    if let Some(addr) = &cfg.logging.prometheus {
        t.push(Box::new(PrometheusSink::start(addr)?));
    }
    if let Some(m) = MlflowSink::start(cfg, &format!("{}-sft", cfg.name), out, false)? {
        t.push(Box::new(m));
    }
    if progress {
        t.push(Box::new(ProgressSink::sft(total)));
    }
    Ok(t)
}

/// [`fine_tune`] with the sinks of an SFT run writing into `out` (see [`telemetry`]); returns the
/// records and the sinks' summary (`{prometheus, mlflow}`).
pub fn fine_tune_logged(
    cfg: &Config,
    policy: &Policy,
    examples: &[SftExample],
    out: &Path,
    progress: bool,
) -> Result<(Vec<SftRecord>, Value)> {
    fine_tune_logged_with(cfg, policy, examples, out, progress, &mut |_, _, _| Ok(()))
}

/// Called after every optimizer step with the step number, the total and the policy.
pub type OnStep<'a> = dyn FnMut(u64, u64, &Policy) -> Result<()> + 'a;

/// [`fine_tune_logged`] calling `on_step` after every step (e.g. to validate).
pub fn fine_tune_logged_with(
    cfg: &Config,
    policy: &Policy,
    examples: &[SftExample],
    out: &Path,
    progress: bool,
    on_step: &mut OnStep<'_>,
) -> Result<(Vec<SftRecord>, Value)> {
    let total = total_steps(examples.len(), &cfg.sft);
    let mut t = telemetry(cfg, out, total, progress)?;
    let records = fine_tune(policy, examples, &cfg.sft, &mut t, on_step);
    let summary = t.finish(status_of(&records))?;
    Ok((records?, summary))
}

/// Fine-tunes `policy` in place on `examples`; every step's record goes to `telemetry`, then
/// `on_step` is called.
pub fn fine_tune(
    policy: &Policy,
    examples: &[SftExample],
    s: &SftSettings,
    telemetry: &mut Telemetry,
    on_step: &mut OnStep<'_>,
) -> Result<Vec<SftRecord>> {
    let total = total_steps(examples.len(), s);
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
    let mut rng = SplitMix64(s.seed ^ 0x5f7);
    let mut order: Vec<usize> = (0..examples.len()).collect();
    let mut records = Vec::new();
    let t0 = std::time::Instant::now();
    for epoch in 0..s.epochs {
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i + 1));
        }
        for chunk in order.chunks(s.batch_size) {
            if opt.step_count() >= total {
                break;
            }
            let batch: Vec<SftExample> = chunk.iter().map(|&i| examples[i].clone()).collect();
            let m = mtrl_learner::sft_step(policy, &mut opt, &batch, &cfg)?;
            let rec = SftRecord {
                format_version: SFT_RECORD_FORMAT_VERSION,
                step: opt.step_count(),
                epoch,
                loss: m.loss,
                tokens: m.tokens,
                grad_norm: m.grad_norm,
                lr: m.lr,
                elapsed_s: t0.elapsed().as_secs_f64(),
            };
            telemetry.record(Record::Sft(&rec))?;
            records.push(rec);
            on_step(opt.step_count(), total, policy)?;
        }
    }
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

/// `mtrl sft`: fine-tunes the config's `[model]` on a trajectory file and saves the result.
pub fn run(cfg: &Config, o: &SftOptions) -> Result<SftSummary> {
    let s = &cfg.sft;
    let Some(input) = o.trajectories.clone().or_else(|| s.trajectories.clone()) else {
        bail!(
            "no trajectory file: pass --trajectories or set `sft.trajectories` in {}",
            cfg.source.display()
        );
    };
    let Some(out) = o.out.clone().or_else(|| s.output.clone()) else {
        bail!(
            "no output folder: pass --out or set `sft.output` in {}",
            cfg.source.display()
        );
    };
    let trajs = read_trajectories(&input)?;
    let parts = setup::model_parts(cfg)?;
    let policy = setup::initial_policy(cfg, &parts)?;
    let (index, _) = setup::open_index(cfg, !o.progress)?;
    let tools = tool_schemas(cfg, Arc::new(index));
    let examples = examples(parts.codec.as_ref(), &tools, &trajs, o.progress)?;
    let (records, telemetry) = fine_tune_logged(cfg, &policy, &examples, &out, o.progress)?;
    policy
        .save(&out, parts.dtype)
        .with_context(|| format!("saving the fine-tuned policy into {}", out.display()))?;
    copy_tokenizer(&setup::tokenizer_dir(cfg)?, &out)?;
    Ok(SftSummary {
        trajectories: trajs.len(),
        records,
        output: out,
        telemetry,
    })
}
