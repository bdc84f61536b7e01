//! The default job (`mtrl` with no command, or `mtrl train` without `--config`): on the embedded
//! `configs/demo.toml`, learn a small search agent from scratch on the CPU and compare it on
//! held-out queries with its warm start, a rejection-sampling control and every scripted
//! baseline. Every stage is the library code a real command runs: task splits ([`crate::data`])
//! → indexes → teacher episodes ([`crate::warm_start`]) → tokenizer training → SFT
//! ([`crate::sft`]) → the RFT control ([`crate::rft`]) → RL ([`crate::run::train`]) → evaluation
//! ([`crate::demo_eval`]) → curves (`mtrl_eval::plot`).
//!
//! Outputs (paths from the config, or under `--run-dir`): task files, the teacher's trajectories,
//! the tokenizer, the SFT checkpoint (the "base" policy), the RFT checkpoint, the RL run
//! (checkpoints, metrics, trajectories, curves), the evaluation report and `demo.json` (what ran,
//! for `mtrl demo-table`). A rerun redoes every stage from the same seed (earlier RL checkpoints
//! are moved aside, never deleted). Stage lines go to stderr.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use mtrl_core::config::{Scratch, WarmStartConfig};
use mtrl_core::{Config, Trajectory};
use mtrl_eval::EvalReport;
use mtrl_model::{TemplateCodec, Tokenizer};
use mtrl_search::SearchIndex;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::data::{self, PrepareOptions};
use crate::demo_eval::{self, ModelRef, Split};
use crate::error::{Context, Result};
use crate::run::{train, TrainOptions};
use crate::{rft, setup, sft, warm_start};

/// How to run the default job.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Stop RL after this step (a shorter run; CI uses it).
    pub max_steps: Option<u64>,
    /// Progress bars and stage details on stderr.
    pub progress: bool,
    /// pass@k's k (sampled attempts per task) of the final evaluation; 0: greedy only. `None`:
    /// `warm_start.eval_k`.
    pub eval_k: Option<usize>,
    /// Evaluate on at most this many tasks.
    pub eval_limit: Option<usize>,
    /// Replaces `[train] seed` and `[sft] seed` (teacher, initialisation, sampling, shuffling).
    pub seed: Option<u64>,
    /// Writes every output of the run (not the task files or indexes) under this folder.
    pub run_dir: Option<PathBuf>,
    /// Which held-out split the final evaluation runs on.
    pub split: Split,
    /// Stop RL (checkpointed) when raised.
    pub stop: Arc<AtomicBool>,
    /// Raise `stop` on Ctrl-C / SIGTERM.
    pub watch_signals: bool,
    /// Redo every stage (the job from scratch always does); `false` lets the pretrained job keep
    /// a finished SFT stage and resume RL ([`crate::pretrained_job`]).
    pub fresh: bool,
}

impl Default for DemoOptions {
    fn default() -> Self {
        DemoOptions {
            max_steps: None,
            progress: true,
            eval_k: None,
            eval_limit: None,
            seed: None,
            run_dir: None,
            split: Split::Test,
            stop: Arc::new(AtomicBool::new(false)),
            watch_signals: false,
            fresh: true,
        }
    }
}

/// What ran (written as `demo.json` beside the report).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DemoRecord {
    /// The config's `name` (the collection).
    pub collection: String,
    pub seed: u64,
    pub split: String,
    /// The best fixed teacher strategy on the validation split, and its mean reward there.
    pub teacher_best: String,
    pub teacher_best_validation_reward: f64,
    pub rft_pool: usize,
    pub rft_kept: usize,
    /// The steps evaluated when validation chose them (`train.val_every > 0`): the control's
    /// and RL's (`best.json`); absent: the last step.
    #[serde(default)]
    pub rft_step: Option<u64>,
    #[serde(default)]
    pub tuned_step: Option<u64>,
    /// Seconds per stage, and in all.
    pub stage_s: Vec<(String, f64)>,
    pub total_s: f64,
}

/// What the default job produced.
pub struct DemoOutcome {
    pub report: EvalReport,
    pub record: DemoRecord,
    /// Where `eval.md`, `eval.json`, `eval.csv` and `demo.json` went.
    pub report_dir: PathBuf,
    pub plots: Vec<PathBuf>,
    pub total_s: f64,
}

/// Stage lines and timings.
pub(crate) struct Stages {
    pub(crate) t0: Instant,
    /// The stage running, and since when.
    current: Option<(String, Instant)>,
    pub(crate) done: Vec<(String, f64)>,
}

impl Stages {
    pub(crate) fn new() -> Stages {
        Stages {
            t0: Instant::now(),
            current: None,
            done: Vec::new(),
        }
    }

    pub(crate) fn start(&mut self, name: &str) {
        self.close();
        eprintln!("[{:>6.1}s] {name}", self.t0.elapsed().as_secs_f64());
        self.current = Some((name.to_string(), Instant::now()));
    }

    pub(crate) fn close(&mut self) {
        if let Some((name, t)) = self.current.take() {
            self.done.push((name, t.elapsed().as_secs_f64()));
        }
    }
}

/// Where the evaluation report goes: next to the RL run.
/// The RL stage a job runs: trains `cfg`, refuses an interrupted run (its checkpoint is named;
/// `after` says what that means for the job) and prints the steps and time.
pub(crate) fn rl_stage(
    cfg: &Config,
    opts: TrainOptions,
    after: &str,
) -> Result<crate::run::Summary> {
    let s = train(cfg, opts)?;
    if s.interrupted {
        crate::bail!(
            "interrupted during the RL stage: checkpoint of step {} written under {}; {after}",
            s.steps_done,
            cfg.checkpoint.dir.display()
        );
    }
    eprintln!(
        "         {} steps in {:.0} s → {}",
        s.steps_done,
        s.wall_s,
        cfg.checkpoint.dir.display()
    );
    Ok(s)
}

pub fn report_dir(cfg: &Config) -> PathBuf {
    cfg.checkpoint.dir.join("eval")
}

/// `cfg` with the run's seed and output folder applied (see [`DemoOptions`]).
pub fn configure(cfg: &Config, o: &DemoOptions) -> Config {
    let mut cfg = cfg.clone();
    if let Some(s) = o.seed {
        cfg.train.seed = s;
        cfg.sft.seed = s;
    }
    if let Some(dir) = &o.run_dir {
        cfg.sft.trajectories = Some(dir.join("teacher.jsonl"));
        cfg.sft.output = Some(dir.join("sft"));
        cfg.checkpoint.dir = dir.join("rl");
        if let Some(ws) = cfg.warm_start.as_mut() {
            if let Some(s) = ws.scratch.as_mut() {
                s.tokenizer = dir.join("tokenizer");
            }
            if let Some(r) = ws.rft.as_mut() {
                r.output = dir.join("rft");
            }
        }
        // RL starts from the SFT checkpoint (a pretrained model stays the base: RL's start is
        // set by the job).
        let scratch = cfg.warm_start.as_ref().is_some_and(|w| w.scratch.is_some());
        if let Some(m) = cfg.model.as_mut().filter(|_| scratch) {
            m.source = mtrl_core::config::ModelSource::Dir(dir.join("sft"));
            m.path_text = dir.join("sft").display().to_string();
        }
    }
    cfg
}

/// Runs every stage of the default job on `cfg` (which must have `[warm_start]`).
pub fn run(cfg: &Config, o: &DemoOptions) -> Result<DemoOutcome> {
    let cfg = &configure(cfg, o);
    let mut st = Stages::new();
    let ws = cfg.warm_start.clone().with_context(|| {
        format!(
            "{} has no [warm_start] section (the default job builds its policy from scratch)",
            cfg.source.display()
        )
    })?;
    let Some(scratch) = ws.scratch.clone() else {
        return crate::pretrained_job::run(cfg, &ws, o);
    };
    if cfg.lora.is_some() {
        crate::bail!(
            "{}: the default job warm-starts every weight of a policy built from scratch, so it \
             takes no [lora] section; train an adapter with `mtrl train` on a base checkpoint",
            cfg.source.display()
        );
    }
    eprintln!(
        "mtrl: default job, config {} (seed {})",
        cfg.source.display(),
        cfg.train.seed
    );
    st.start("1/8 task files");
    task_files(cfg)?;
    st.start("2/8 search indexes");
    let (index, build) = setup::open_index(cfg, !o.progress)?;
    eprintln!("{build}");
    let index = Arc::new(index);
    st.start("3/8 teacher episodes");
    let sets = mtrl_env::TaskSets::load(cfg.data()?)?;
    let train_tasks: Vec<_> = sets.train.iter().flat_map(|s| s.tasks.clone()).collect();
    let teacher = teacher(cfg, &ws, &index, &train_tasks)?;
    st.start("4/8 tokenizer");
    let tools = sft::tool_schemas(cfg, index.clone());
    warm_start::train_tokenizer(&ws, &index, &teacher, &tools, &scratch.tokenizer)?;
    st.start("5/8 warm start (SFT)");
    let base = warm_start_sft(cfg, &scratch, &tools, &teacher, o.progress)?;
    st.start("6/8 RFT control");
    let (rft_dir, rft_pool, rft_kept, rft_step) = match &ws.rft {
        Some(r) => {
            let out = rft::run(
                cfg,
                &ws,
                r,
                index.clone(),
                &tools,
                &train_tasks,
                &base,
                rl_steps(cfg, o),
                o.progress,
            )?;
            let chosen = out.best_step.map_or(String::new(), |s| {
                format!(" (step {s} chosen on validation)")
            });
            eprintln!(
                "         {} of {} teacher episodes reach reward {} → {} steps{chosen} → {}",
                out.kept,
                out.pool,
                r.threshold,
                out.steps,
                out.dir.display()
            );
            (Some(out.dir), out.pool, out.kept, out.best_step)
        }
        None => {
            eprintln!("         no [warm_start.rft] section: skipped");
            (None, 0, 0, None)
        }
    };
    st.start("7/8 multi-turn RL");
    let opts = TrainOptions {
        fresh: true,
        max_steps: o.max_steps,
        progress: o.progress,
        stop: o.stop.clone(),
        watch_signals: o.watch_signals,
        ..TrainOptions::default()
    };
    rl_stage(cfg, opts, "the evaluation stage did not run")?;
    st.start(&format!("8/8 evaluation on the {} split", o.split.name()));
    let dir = report_dir(cfg);
    let model = |label: &str, dir: PathBuf| ModelRef {
        label: label.into(),
        dir,
        adapter: None,
    };
    let mut before = vec![model("base", base)];
    before.extend(rft_dir.map(|d| model("rft", d)));
    let models = demo_eval::Models {
        before,
        tuned_base: None,
    };
    let eval = demo_eval::evaluate(cfg, &ws, index, &sets.validation, models, o, &dir)?;
    finish(cfg, o, st, eval, dir, (rft_pool, rft_kept, rft_step))
}

/// The last step of both warm-start jobs: RL's curves, then `demo.json` (what ran; the RFT
/// control's pool, kept episodes and chosen step) beside the report.
pub(crate) fn finish(
    cfg: &Config,
    o: &DemoOptions,
    mut st: Stages,
    eval: demo_eval::DemoEval,
    dir: PathBuf,
    (rft_pool, rft_kept, rft_step): (usize, usize, Option<u64>),
) -> Result<DemoOutcome> {
    let plots = mtrl_eval::plot::plot_run(&cfg.checkpoint.dir, &cfg.checkpoint.dir.join("plots"))?;
    st.close();
    let total_s = st.t0.elapsed().as_secs_f64();
    let record = DemoRecord {
        collection: cfg.name.clone(),
        seed: cfg.train.seed,
        split: o.split.name().to_string(),
        teacher_best: eval.teacher_best.name(),
        teacher_best_validation_reward: eval.teacher_best_reward,
        rft_pool,
        rft_kept,
        rft_step,
        tuned_step: eval.tuned_step,
        stage_s: st.done,
        total_s,
    };
    let path = dir.join("demo.json");
    std::fs::write(&path, serde_json::to_string_pretty(&record)?)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(DemoOutcome {
        report: eval.report,
        record,
        report_dir: dir,
        plots,
        total_s,
    })
}

/// RL's optimizer steps in this run (the RFT control gets the same budget).
pub(crate) fn rl_steps(cfg: &Config, o: &DemoOptions) -> usize {
    o.max_steps
        .map_or(cfg.train.max_steps, |m| m.min(cfg.train.max_steps))
        .max(1) as usize
}

/// Stage 1: train / validation / test task files beside the first test file.
pub(crate) fn task_files(cfg: &Config) -> Result<()> {
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
pub(crate) fn teacher(
    cfg: &Config,
    ws: &WarmStartConfig,
    index: &Arc<SearchIndex>,
    train_tasks: &[mtrl_env::Task],
) -> Result<Vec<Trajectory>> {
    let teacher =
        warm_start::teacher_episodes(cfg, ws, index.clone(), train_tasks, cfg.train.seed)?;
    let path = cfg
        .sft
        .trajectories
        .clone()
        .with_context(|| format!("{}: `sft.trajectories` is required", cfg.source.display()))?;
    warm_start::write_jsonl(&path, &teacher)?;
    let failed = teacher.iter().filter(|t| t.failure.is_some()).count();
    let mean = teacher.iter().map(|t| t.reward).sum::<f64>() / teacher.len().max(1) as f64;
    eprintln!(
        "         {} teacher episodes (mean reward {mean:.4}, {failed} failed) → {}",
        teacher.len(),
        path.display()
    );
    Ok(teacher)
}

/// Stage 5: SFT of a seeded random policy of `[warm_start] model_config` on the teacher's
/// episodes; returns the checkpoint folder (the "base" policy). The model's vocabulary grows to
/// the trained tokenizer's (rounded up to 64) when the config's is smaller: the tokenizer holds
/// one id per document, so its size follows the collection.
fn warm_start_sft(
    cfg: &Config,
    ws: &Scratch,
    tools: &[Value],
    teacher: &[Trajectory],
    progress: bool,
) -> Result<PathBuf> {
    let tok = Arc::new(Tokenizer::from_dir(&ws.tokenizer)?);
    let codec = TemplateCodec::qwen(tok.clone())?;
    let mut model_cfg = mtrl_model::Config::from_file(&ws.model_config)?;
    model_cfg.vocab_size = model_cfg.vocab_size.max(tok.vocab_size().div_ceil(64) * 64);
    // The saved config.json is written from `raw`.
    model_cfg.raw["vocab_size"] = model_cfg.vocab_size.into();
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

#[cfg(test)]
mod tests {
    use std::path::Path;

    /// The lines of a config that are neither comments, nor paths, nor the name.
    fn recipe(file: &str) -> Vec<String> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs");
        let text = std::fs::read_to_string(root.join(file)).unwrap();
        let cfg = mtrl_core::Config::from_toml_str(&text, &root.join(file));
        assert!(cfg.is_ok(), "{file}: {:?}", cfg.err());
        text.lines()
            .map(|l| l.split('#').next().unwrap().trim().to_string())
            .filter(|l| !l.is_empty() && !l.contains("\"../") && !l.starts_with("name ="))
            .collect()
    }

    #[test]
    fn the_three_collections_run_one_recipe() {
        let cranfield = recipe("demo.toml");
        assert!(cranfield.len() > 40, "{cranfield:?}");
        for other in ["demo-vaswani.toml", "demo-musique.toml"] {
            assert_eq!(recipe(other), cranfield, "{other} differs beyond paths");
        }
    }
}
