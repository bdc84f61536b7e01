//! The default job (`mtrl` with no command, or `mtrl train` without `--config`): on the embedded
//! `configs/demo.toml`, learn a small search agent from scratch on the CPU and show base vs
//! fine-tuned on held-out queries. Every stage is the library code a real command runs:
//! task splits ([`crate::data`]) → indexes → teacher episodes ([`crate::warm_start`]) → tokenizer
//! training → SFT ([`crate::sft`]) → RL ([`crate::run::train`]) → evaluation ([`crate::eval`]) →
//! curves (`mtrl_eval::plot`).
//!
//! Outputs (paths from the config): task files, the teacher's trajectories, the tokenizer, the
//! SFT checkpoint (the "base" policy), the RL run (checkpoints, metrics, trajectories, curves) and
//! the evaluation report. A rerun redoes every stage from the same seed (earlier RL checkpoints
//! are moved aside, never deleted). Stage lines go to stderr.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use mtrl_core::config::WarmStartConfig;
use mtrl_core::{Config, Trajectory};
use mtrl_env::Baseline;
use mtrl_eval::{prepare_test_sets, Contender, EvalJob, EvalReport, EvalSettings};
use mtrl_model::{TemplateCodec, Tokenizer};
use mtrl_search::SearchIndex;
use serde_json::Value;

use crate::data::{self, PrepareOptions};
use crate::error::{Context, Result};
use crate::run::{train, TrainOptions};
use crate::{setup, sft, warm_start};

/// How to run the default job.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Stop RL after this step (a shorter run; CI uses it).
    pub max_steps: Option<u64>,
    /// Progress bars and stage details on stderr.
    pub progress: bool,
    /// pass@k's k (sampled attempts per test task) of the final evaluation; 0: greedy only.
    pub eval_k: usize,
    /// Evaluate on at most this many test tasks.
    pub eval_limit: Option<usize>,
    /// Stop RL (checkpointed) when raised.
    pub stop: Arc<AtomicBool>,
    /// Raise `stop` on Ctrl-C / SIGTERM.
    pub watch_signals: bool,
}

impl Default for DemoOptions {
    fn default() -> Self {
        DemoOptions {
            max_steps: None,
            progress: true,
            eval_k: 4,
            eval_limit: None,
            stop: Arc::new(AtomicBool::new(false)),
            watch_signals: false,
        }
    }
}

/// What the default job produced.
pub struct DemoOutcome {
    pub report: EvalReport,
    /// Where `eval.md`, `eval.json`, `eval.csv` went.
    pub report_dir: PathBuf,
    pub plots: Vec<PathBuf>,
    pub total_s: f64,
}

fn stage(t0: Instant, name: &str) {
    eprintln!("[{:>6.1}s] {name}", t0.elapsed().as_secs_f64());
}

/// Where the evaluation report goes: next to the RL run.
pub fn report_dir(cfg: &Config) -> PathBuf {
    cfg.checkpoint.dir.join("eval")
}

/// Runs every stage of the default job on `cfg` (which must have `[warm_start]`).
pub fn run(cfg: &Config, o: &DemoOptions) -> Result<DemoOutcome> {
    let t0 = Instant::now();
    let ws = cfg.warm_start.clone().with_context(|| {
        format!(
            "{} has no [warm_start] section (the default job builds its policy from scratch)",
            cfg.source.display()
        )
    })?;
    if cfg.lora.is_some() {
        crate::bail!(
            "{}: the default job warm-starts every weight of a policy built from scratch, so it \
             takes no [lora] section; train an adapter with `mtrl train` on a base checkpoint",
            cfg.source.display()
        );
    }
    eprintln!("mtrl: default job, config {}", cfg.source.display());
    stage(t0, "1/7 task files");
    task_files(cfg)?;
    stage(t0, "2/7 search indexes");
    let (index, build) = setup::open_index(cfg, !o.progress)?;
    eprintln!("{build}");
    let index = Arc::new(index);
    stage(t0, "3/7 teacher episodes");
    let teacher = teacher(cfg, &ws, &index)?;
    stage(t0, "4/7 tokenizer");
    let tools = sft::tool_schemas(cfg, index.clone());
    warm_start::train_tokenizer(&ws, &index, &teacher, &tools, &ws.tokenizer)?;
    stage(t0, "5/7 warm start (SFT)");
    let base = warm_start_sft(cfg, &ws, &tools, &teacher, o.progress)?;
    stage(t0, "6/7 multi-turn RL");
    let opts = TrainOptions {
        fresh: true,
        max_steps: o.max_steps,
        progress: o.progress,
        stop: o.stop.clone(),
        watch_signals: o.watch_signals,
        sinks: Vec::new(),
    };
    let s = train(cfg, opts)?;
    eprintln!(
        "         {} steps in {:.0} s → {}",
        s.steps_done,
        s.wall_s,
        cfg.checkpoint.dir.display()
    );
    stage(t0, "7/7 evaluation on held-out queries");
    let dir = report_dir(cfg);
    let report = evaluation(cfg, &ws, index, base, o, &dir)?;
    let plots = mtrl_eval::plot::plot_run(&cfg.checkpoint.dir, &cfg.checkpoint.dir.join("plots"))?;
    Ok(DemoOutcome {
        report,
        report_dir: dir,
        plots,
        total_s: t0.elapsed().as_secs_f64(),
    })
}

/// Stage 1: train / validation / test task files beside the first test file.
fn task_files(cfg: &Config) -> Result<()> {
    let d = cfg.data()?;
    let test = d
        .test
        .first()
        .with_context(|| format!("{}: `data.test` names no file", cfg.source.display()))?;
    let dir = test.parent().unwrap_or(Path::new("."));
    let p = data::prepare(cfg, dir, &PrepareOptions::default())?;
    eprintln!("{p}");
    Ok(())
}

/// Stage 3: the teacher's episodes on the training tasks, written to `[sft] trajectories`.
fn teacher(
    cfg: &Config,
    ws: &WarmStartConfig,
    index: &Arc<SearchIndex>,
) -> Result<Vec<Trajectory>> {
    let sets = mtrl_env::TaskSets::load(cfg.data()?)?;
    let train_tasks: Vec<_> = sets.train.iter().flat_map(|s| s.tasks.clone()).collect();
    let teacher =
        warm_start::teacher_episodes(cfg, ws, index.clone(), &train_tasks, cfg.train.seed)?;
    let path = cfg
        .sft
        .trajectories
        .clone()
        .with_context(|| format!("{}: `sft.trajectories` is required", cfg.source.display()))?;
    warm_start::write_jsonl(&path, &teacher)?;
    let failed = teacher.iter().filter(|t| t.failure.is_some()).count();
    eprintln!(
        "         {} teacher episodes ({} failed on purpose) → {}",
        teacher.len(),
        failed,
        path.display()
    );
    Ok(teacher)
}

/// Stage 5: SFT of a seeded random policy of `[warm_start] model_config` on the teacher's
/// episodes; returns the checkpoint folder (the "base" policy).
fn warm_start_sft(
    cfg: &Config,
    ws: &WarmStartConfig,
    tools: &[Value],
    teacher: &[Trajectory],
    progress: bool,
) -> Result<PathBuf> {
    let tok = Arc::new(Tokenizer::from_dir(&ws.tokenizer)?);
    let codec = TemplateCodec::qwen(tok.clone())?;
    let model_cfg = mtrl_model::Config::from_file(&ws.model_config)?;
    let device = mtrl_model::parse_device("cpu")?;
    let f32 = candle_core::DType::F32;
    let policy = setup::seeded_random(model_cfg, f32, &device, cfg.train.seed)?;
    tok.check_vocab(policy.config().vocab_size)?;
    let out = cfg
        .sft
        .output
        .clone()
        .with_context(|| format!("{}: `sft.output` is required", cfg.source.display()))?;
    let examples = sft::examples(&codec, tools, teacher, progress)?;
    let (records, _) = sft::fine_tune_logged(cfg, &policy, &examples, &out, progress)?;
    policy.save(&out, f32)?;
    sft::copy_tokenizer(&ws.tokenizer, &out)?;
    if let (Some(a), Some(b)) = (records.first(), records.last()) {
        eprintln!(
            "         {} steps, loss {:.3} → {:.3} → {}",
            records.len(),
            a.loss,
            b.loss,
            out.display()
        );
    }
    Ok(out)
}

/// Stage 7: base vs tuned (the newest checkpoint) vs the scripted baselines on the test files.
fn evaluation(
    cfg: &Config,
    ws: &WarmStartConfig,
    index: Arc<SearchIndex>,
    base: PathBuf,
    o: &DemoOptions,
    out: &Path,
) -> Result<EvalReport> {
    let mgr = mtrl_learner::CheckpointManager::new(&cfg.checkpoint.dir, cfg.checkpoint.keep_last);
    let (latest, _) = mgr.latest_valid()?;
    let tuned = latest
        .with_context(|| format!("no checkpoint in {}", cfg.checkpoint.dir.display()))?
        .join("policy");
    let mut settings = EvalSettings::from_config(cfg, o.eval_k)?;
    settings.tokenizer = Some(ws.tokenizer.clone());
    let job = EvalJob {
        env: cfg.env_or_default(),
        index,
        sets: prepare_test_sets(cfg, o.eval_limit)?,
        contenders: vec![
            Contender::ModelDir {
                label: "base".into(),
                dir: base,
                adapter: None,
            },
            Contender::ModelDir {
                label: "tuned".into(),
                dir: tuned,
                adapter: None,
            },
            Contender::Scripted(Baseline::Bm25Once),
            Contender::Scripted(Baseline::VectorOnce),
        ],
        compare: vec![("tuned".into(), "base".into())],
        settings,
        agent: None,
        progress: o
            .progress
            .then(|| Box::new(|m: &str| eprintln!("         {m}")) as mtrl_eval::ProgressFn),
    };
    Ok(crate::eval::run(cfg, job, out)?.report)
}
