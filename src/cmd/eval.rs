//! `mtrl eval --config FILE --model DIR [--baseline DIR] [--policy NAME]… [--k 4]`: runs every
//! test file of `[data] test` with the training environment (tools, budgets, reward) and prints
//! the results table; JSON, CSV and the Markdown table go to `--out` (default
//! `<checkpoint.dir>/eval`). All the work is `mtrl_eval`'s (through `mtrl_train::eval`, which adds
//! the config's telemetry sinks); this file maps flags to an [`mtrl_eval::EvalJob`].

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use mtrl_env::Baseline;
use mtrl_eval::{prepare_test_sets, Contender, EvalJob, EvalSettings, PassMetric, ProgressFn};

use mtrl_train::setup::open_index;

use super::common::load_config;

#[derive(clap::Args, Debug)]
pub struct EvalArgs {
    /// The run's TOML config: `[data] test` (task files; `[data] train` is checked for leaked
    /// test prompts), `[search]`, `[env]`, `[rollout]` (sampling of the pass@k attempts,
    /// concurrency), `[model]` (dtype, device).
    #[arg(long, short)]
    pub config: PathBuf,
    /// Policy checkpoint folder (or `.gguf` file) to evaluate (e.g. `<checkpoint.dir>/step-N/policy`), or `best`
    /// (the run's best step by its validation metric, `best.json`) or `last` (its newest valid
    /// checkpoint); labelled `tuned` when --baseline is given, else `model`.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// A PEFT LoRA adapter folder (`adapter_config.json` + `adapter_model.safetensors`) to put on
    /// --model, which is then the base. A --model that is itself an adapter folder (a LoRA run's
    /// checkpoint) goes on the config's `[model] path`.
    #[arg(long)]
    pub adapter: Option<PathBuf>,
    /// Base policy checkpoint folder, labelled `base`; the table adds `tuned − base` with a
    /// paired bootstrap 95% interval of the nDCG@10 difference.
    #[arg(long)]
    pub baseline: Option<PathBuf>,
    /// Tokenizer folder for checkpoints without one, e.g. those of a `random:` policy
    /// (default: `[model] tokenizer`).
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Scripted baseline to add (repeatable): bm25-once, vector-once or hybrid-rrf.
    #[arg(long = "policy")]
    pub policies: Vec<String>,
    /// pass@k's k (0: no sampled attempts, no pass@k).
    #[arg(long, default_value_t = 4)]
    pub k: usize,
    /// Sampled attempts per task for pass@k (default: k; must be ≥ k).
    #[arg(long)]
    pub samples: Option<usize>,
    /// A task passes when the pass metric is at least this.
    #[arg(long, default_value_t = 0.5)]
    pub pass_threshold: f64,
    /// The pass metric: ndcg@10 or reward.
    #[arg(long, default_value = "ndcg@10")]
    pub pass_metric: String,
    /// Evaluate only the first N tasks of each test file.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Output folder for eval.md, eval.json and eval.csv (default: `<checkpoint.dir>/eval`).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Bootstrap resamples of the nDCG@10 difference interval.
    #[arg(long, default_value_t = 2000)]
    pub bootstrap: usize,
    /// Seed of sampling and bootstrap (default: `train.seed`).
    #[arg(long)]
    pub seed: Option<u64>,
    /// No progress lines.
    #[arg(long)]
    pub quiet: bool,
}

/// Pairs of labels whose difference the table reports (`tuned − base`).
type Comparisons = Vec<(String, String)>;

/// The models and scripted baselines the flags name, and which pairs to compare.
fn contenders(args: &EvalArgs, cfg: &mtrl_core::Config) -> Result<(Vec<Contender>, Comparisons)> {
    let mut contenders = Vec::new();
    let mut compare = Vec::new();
    if let Some(dir) = &args.baseline {
        let (dir, adapter) = adapter_on_base(dir, None, cfg)?;
        contenders.push(Contender::ModelDir {
            label: "base".into(),
            dir,
            adapter,
        });
    }
    if let Some(dir) = &args.model {
        let label = if args.baseline.is_some() {
            compare.push(("tuned".to_string(), "base".to_string()));
            "tuned"
        } else {
            "model"
        };
        let dir = match dir.to_str() {
            Some(which @ ("best" | "last")) if !dir.exists() => {
                mtrl_train::validate::checkpoint_policy(&cfg.checkpoint.dir, which)?
            }
            _ => dir.clone(),
        };
        let (dir, adapter) = adapter_on_base(&dir, args.adapter.as_deref(), cfg)?;
        contenders.push(Contender::ModelDir {
            label: label.into(),
            dir,
            adapter,
        });
    }
    for name in &args.policies {
        let b = Baseline::parse(name).with_context(|| {
            format!(
                "unknown --policy `{name}` (one of {})",
                Baseline::ALL.map(|b| b.name()).join(", ")
            )
        })?;
        contenders.push(Contender::Scripted(b));
    }
    if args.adapter.is_some() && args.model.is_none() {
        bail!("--adapter goes on --model BASE: give --model too");
    }
    if contenders.is_empty() {
        bail!("nothing to evaluate: give --model DIR (and/or --baseline DIR, --policy NAME)");
    }
    for c in &contenders {
        if let Contender::ModelDir { dir, .. } = c {
            if !mtrl_model::gguf::is_model_path(dir) {
                bail!("model folder {} does not exist", dir.display());
            }
        }
    }
    Ok((contenders, compare))
}

/// The base folder and adapter of a model flag: `--adapter` on `dir`; or, when `dir` is itself
/// an adapter folder, that adapter on the config's `[model] path`.
fn adapter_on_base(
    dir: &std::path::Path,
    adapter: Option<&std::path::Path>,
    cfg: &mtrl_core::Config,
) -> Result<(PathBuf, Option<PathBuf>)> {
    if let Some(a) = adapter {
        return Ok((dir.to_path_buf(), Some(a.to_path_buf())));
    }
    if !mtrl_model::lora::peft::is_adapter_dir(dir) {
        return Ok((dir.to_path_buf(), None));
    }
    match cfg.model.as_ref().map(|m| &m.source) {
        Some(mtrl_core::config::ModelSource::Dir(base)) => {
            Ok((base.clone(), Some(dir.to_path_buf())))
        }
        _ => bail!(
            "{} is a LoRA adapter: give its base with --model BASE --adapter {0} (the config's \
             [model] path is not a folder)",
            dir.display()
        ),
    }
}

/// The config's evaluation settings with the flags applied.
fn settings(cfg: &mtrl_core::Config, args: &EvalArgs) -> Result<EvalSettings> {
    let metric = PassMetric::parse(&args.pass_metric).with_context(|| {
        format!(
            "unknown --pass-metric `{}` (ndcg@10 or reward)",
            args.pass_metric
        )
    })?;
    let mut settings = EvalSettings::from_config(cfg, args.k)?;
    settings.samples = args.samples.unwrap_or(args.k);
    settings.pass.metric = metric;
    settings.pass.threshold = args.pass_threshold;
    settings.bootstrap_resamples = args.bootstrap;
    if let Some(t) = &args.tokenizer {
        settings.tokenizer = Some(t.clone());
    }
    if let Some(s) = args.seed {
        settings.seed = s;
    }
    Ok(settings)
}

pub fn run(args: &EvalArgs) -> Result<()> {
    let cfg = load_config(Some(&args.config))?;
    let settings = settings(&cfg, args)?;
    let (contenders, compare) = contenders(args, &cfg)?;
    let sets = prepare_test_sets(&cfg, args.limit)?;
    let (index, build) = open_index(&cfg, args.quiet)?;
    if !args.quiet {
        eprintln!("{build}");
    }
    let quiet = args.quiet;
    let job = EvalJob {
        env: cfg.env_or_default(),
        index: Arc::new(index),
        sets,
        contenders,
        compare,
        settings,
        agent: None,
        progress: (!quiet).then(|| Box::new(|m: &str| eprintln!("eval: {m}")) as ProgressFn),
    };
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| cfg.checkpoint.dir.join("eval"));
    let done = mtrl_train::eval::run(&cfg, job, &out)?;
    println!("{}", done.report.markdown());
    let names: Vec<String> = done
        .written
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    eprintln!("wrote {}", names.join(", "));
    Ok(())
}
