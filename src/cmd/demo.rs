//! The default job (`mtrl` with no command, or `mtrl train` without `--config`): on the embedded
//! `configs/demo.toml`, learn a small search agent from scratch on the CPU and show base vs
//! fine-tuned on held-out queries. Every stage is the library code a real command runs:
//! `mtrl data prepare` → `mtrl index` → teacher episodes (`[warm_start]`) → tokenizer training →
//! `mtrl sft` → `mtrl train` → `mtrl eval` → `mtrl plot`.
//!
//! Outputs (paths from the config): task files, the teacher's trajectories, the tokenizer, the
//! SFT checkpoint (the "base" policy), the RL run (checkpoints, metrics, trajectories, curves) and
//! the evaluation report. A rerun redoes every stage from the same seed (earlier RL checkpoints
//! are moved aside, never deleted).

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use mtrl_core::Config;
use mtrl_env::Baseline;
use mtrl_eval::{evaluate, prepare_test_sets, Contender, EvalJob, EvalSettings, ProgressFn};
use mtrl_model::{TemplateCodec, Tokenizer};

use super::common::{load_config, open_index, print_build_report};
use super::{data, sft, train, warm_start};

#[derive(clap::Args, Debug)]
pub struct DemoArgs {
    /// Use this config instead of the embedded demo config.
    #[arg(long, short)]
    pub config: Option<PathBuf>,
    /// Stop RL after this step (a shorter run; CI uses it).
    #[arg(long)]
    pub max_steps: Option<u64>,
    /// No progress bars.
    #[arg(long)]
    pub quiet: bool,
    /// pass@k's k (sampled attempts per test task) of the final evaluation; 0: greedy only.
    #[arg(long, default_value_t = 4)]
    pub eval_k: usize,
    /// Evaluate on at most this many test tasks.
    #[arg(long)]
    pub eval_limit: Option<usize>,
}

impl Default for DemoArgs {
    fn default() -> Self {
        DemoArgs {
            config: None,
            max_steps: None,
            quiet: false,
            eval_k: 4,
            eval_limit: None,
        }
    }
}

fn stage(t0: Instant, name: &str) {
    eprintln!("[{:>6.1}s] {name}", t0.elapsed().as_secs_f64());
}

/// Where the evaluation report goes: next to the RL run.
pub fn report_dir(cfg: &Config) -> PathBuf {
    cfg.checkpoint.dir.join("eval")
}

pub fn run(args: &DemoArgs) -> Result<()> {
    let t0 = Instant::now();
    let cfg = load_config(args.config.as_deref())?;
    let ws = cfg.warm_start.clone().with_context(|| {
        format!(
            "{} has no [warm_start] section (the default job builds its policy from scratch)",
            cfg.source.display()
        )
    })?;
    eprintln!("mtrl: default job, config {}", cfg.source.display());

    stage(t0, "1/7 task files");
    let d = cfg.data()?;
    let test = d
        .test
        .first()
        .with_context(|| format!("{}: `data.test` names no file", cfg.source.display()))?;
    let data_dir = test.parent().unwrap_or(Path::new(".")).to_path_buf();
    data::prepare_one(
        &cfg,
        &cfg.source,
        &data_dir,
        &data::PrepareArgs {
            config: vec![cfg.source.clone()],
            out: data_dir.clone(),
            test_fraction: 0.2,
            validation_fraction: 0.1,
            seed: 0,
            format: "jsonl".into(),
        },
    )?;

    stage(t0, "2/7 search indexes");
    let (index, build) = open_index(&cfg, args.quiet)?;
    print_build_report(&build);
    let index = Arc::new(index);

    stage(t0, "3/7 teacher episodes");
    let sets = mtrl_env::TaskSets::load(d)?;
    let train_tasks: Vec<_> = sets.train.iter().flat_map(|s| s.tasks.clone()).collect();
    let teacher =
        warm_start::teacher_episodes(&cfg, &ws, index.clone(), &train_tasks, cfg.train.seed)?;
    let teacher_path = cfg
        .sft
        .trajectories
        .clone()
        .with_context(|| format!("{}: `sft.trajectories` is required", cfg.source.display()))?;
    warm_start::write_jsonl(&teacher_path, &teacher)?;
    let failed = teacher.iter().filter(|t| t.failure.is_some()).count();
    eprintln!(
        "         {} teacher episodes ({} failed on purpose) → {}",
        teacher.len(),
        failed,
        teacher_path.display()
    );

    stage(t0, "4/7 tokenizer");
    let tools = sft::tool_schemas(&cfg, index.clone());
    warm_start::train_tokenizer(&ws, &index, &teacher, &tools, &ws.tokenizer)?;
    let tok = Arc::new(Tokenizer::from_dir(&ws.tokenizer)?);
    let codec = TemplateCodec::qwen(tok.clone())?;

    stage(t0, "5/7 warm start (SFT)");
    let model_cfg = mtrl_model::Config::from_file(&ws.model_config)?;
    let device = mtrl_model::parse_device("cpu")?;
    let policy =
        train::setup::seeded_random(model_cfg, candle_core::DType::F32, &device, cfg.train.seed)?;
    tok.check_vocab(policy.config().vocab_size)?;
    let records = sft::fine_tune(&policy, &codec, &tools, &teacher, &cfg.sft, args.quiet)?;
    let out = cfg
        .sft
        .output
        .clone()
        .with_context(|| format!("{}: `sft.output` is required", cfg.source.display()))?;
    policy.save(&out, candle_core::DType::F32)?;
    sft::copy_tokenizer(&ws.tokenizer, &out)?;
    if let (Some(a), Some(b)) = (records.first(), records.last()) {
        eprintln!(
            "         {} steps, loss {:.3} → {:.3} → {}",
            records.len(),
            a["loss"].as_f64().unwrap_or(f64::NAN),
            b["loss"].as_f64().unwrap_or(f64::NAN),
            out.display()
        );
    }
    drop(policy);

    stage(t0, "6/7 multi-turn RL");
    let targs = train::TrainArgs {
        config: None,
        fresh: true,
        max_steps: args.max_steps,
        quiet: args.quiet,
    };
    let s = train::train(&cfg, &targs, Arc::new(AtomicBool::new(false)))?;
    eprintln!(
        "         {} steps in {:.0} s → {}",
        s.steps_done,
        s.wall_s,
        cfg.checkpoint.dir.display()
    );

    stage(t0, "7/7 evaluation on held-out queries");
    let mgr = mtrl_learner::CheckpointManager::new(&cfg.checkpoint.dir, cfg.checkpoint.keep_last);
    let (latest, _) = mgr.latest_valid()?;
    let tuned = latest
        .with_context(|| format!("no checkpoint in {}", cfg.checkpoint.dir.display()))?
        .join("policy");
    let mut settings = EvalSettings::from_config(&cfg, args.eval_k)?;
    settings.tokenizer = Some(ws.tokenizer.clone());
    let quiet = args.quiet;
    let job = EvalJob {
        env: cfg.env_or_default(),
        index: index.clone(),
        sets: prepare_test_sets(&cfg, args.eval_limit)?,
        contenders: vec![
            Contender::ModelDir {
                label: "base".into(),
                dir: out.clone(),
            },
            Contender::ModelDir {
                label: "tuned".into(),
                dir: tuned,
            },
            Contender::Scripted(Baseline::Bm25Once),
            Contender::Scripted(Baseline::VectorOnce),
        ],
        compare: vec![("tuned".into(), "base".into())],
        settings,
        progress: (!quiet).then(|| Box::new(|m: &str| eprintln!("         {m}")) as ProgressFn),
    };
    let report = evaluate(job)?;
    let dir = report_dir(&cfg);
    report.write_all(&dir)?;
    let plots = mtrl_eval::plot::plot_run(&cfg.checkpoint.dir, &cfg.checkpoint.dir.join("plots"))?;
    println!("{}", report.markdown());
    for p in &plots {
        println!("curves: {}", p.display());
    }
    println!(
        "report: {}  (total {:.0} s)",
        dir.join("eval.md").display(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}
