//! The warm-start job's last stage: the policies before RL (from scratch: base = SFT, and the
//! RFT control; pretrained: the base model and its SFT warm start) vs tuned (RL) vs every scripted
//! baseline on a held-out split, with the strategies they play.
//!
//! Contenders: those before RL, `tuned`, `bm25-once`, `vector-once`, `hybrid-rrf` and
//! `teacher-best` — the best fixed strategy the teacher knows ([`mtrl_env::best_fixed`]), chosen
//! on the **validation** split whatever split is evaluated. Comparisons: tuned − each policy
//! before RL and tuned − teacher-best, each with the paired bootstrap interval of the nDCG@10
//! difference. The report is `eval.{md,json,csv}` plus `strategy.md` (tools, searches, k, hits
//! and turns of every contender, greedy and sampled).
//!
//! `tuned` is the RL step that validation chose (`best.json`) when the run validated
//! (`train.val_every > 0`), else the newest checkpoint; the RFT control's checkpoint was chosen
//! the same way ([`crate::rft::Selection`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use mtrl_core::config::WarmStartConfig;
use mtrl_core::Config;
use mtrl_env::{Baseline, Strategy, Task};
use mtrl_eval::{prepare_test_sets, Contender, EvalJob, EvalReport, EvalSettings};
use mtrl_search::SearchIndex;

use crate::demo::DemoOptions;
use crate::error::{Context, Result};
use crate::warm_start;

/// The held-out split of the final evaluation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    Test,
    /// For choosing settings: the test split stays unseen.
    Validation,
}

impl Split {
    pub fn name(&self) -> &'static str {
        match self {
            Split::Test => "test",
            Split::Validation => "validation",
        }
    }

    pub fn parse(s: &str) -> Option<Split> {
        match s {
            "test" => Some(Split::Test),
            "validation" => Some(Split::Validation),
            _ => None,
        }
    }
}

/// A policy to evaluate: a checkpoint folder (or `.gguf`), with a PEFT adapter on top or not.
#[derive(Debug, Clone)]
pub struct ModelRef {
    pub label: String,
    pub dir: PathBuf,
    pub adapter: Option<PathBuf>,
}

/// The policies to evaluate besides RL's (`tuned`, compared with each of them).
pub struct Models {
    pub before: Vec<ModelRef>,
    /// RL trained an adapter on this base (its checkpoints hold only the adapter).
    pub tuned_base: Option<PathBuf>,
}

/// The report and the teacher-best baseline it used.
pub struct DemoEval {
    pub report: EvalReport,
    pub teacher_best: Strategy,
    /// Its mean reward on the validation split.
    pub teacher_best_reward: f64,
    /// RL's step chosen on validation (`best.json`), when it validated.
    pub tuned_step: Option<u64>,
}

/// Runs the evaluation (see the module docs) and writes the report into `out`.
pub fn evaluate(
    cfg: &Config,
    ws: &WarmStartConfig,
    index: Arc<SearchIndex>,
    validation: &[Task],
    models: Models,
    o: &DemoOptions,
    out: &Path,
) -> Result<DemoEval> {
    let env = cfg.env_or_default();
    if validation.is_empty() {
        crate::bail!(
            "{}: the validation split is empty, and the teacher-best baseline is chosen on it",
            cfg.source.display()
        );
    }
    let spec = warm_start::teacher_spec(ws, &env);
    let (best, best_reward) = mtrl_env::best_fixed(&env, index.clone(), &spec, validation)?;
    eprintln!(
        "         teacher-best (on validation, mean reward {best_reward:.4}): {}",
        best.name()
    );
    // With validation during training, the step it chose (`best.json`); else the newest.
    let which = if cfg.train.val_every > 0 {
        "best"
    } else {
        "last"
    };
    let tuned = crate::validate::checkpoint_policy(&cfg.checkpoint.dir, which)?;
    let tuned_step = (which == "best")
        .then(|| crate::validate::best_step(&cfg.checkpoint.dir))
        .transpose()?;
    eprintln!("         tuned: {} ({which})", tuned.display());
    let mut settings = EvalSettings::from_config(cfg, o.eval_k.unwrap_or(ws.eval_k))?;
    settings.tokenizer = ws.scratch.as_ref().map(|s| s.tokenizer.clone());
    let sets = match o.split {
        Split::Test => prepare_test_sets(cfg, o.eval_limit)?,
        Split::Validation => {
            let mut v = cfg.clone();
            if let Some(d) = v.data.as_mut() {
                d.test = d.validation.clone();
            }
            prepare_test_sets(&v, o.eval_limit)?
        }
    };
    let model = |m: ModelRef| Contender::ModelDir {
        label: m.label,
        dir: m.dir,
        adapter: m.adapter,
    };
    let mut contenders = Vec::new();
    let mut compare = Vec::new();
    for m in models.before {
        compare.push(("tuned".to_string(), m.label.clone()));
        contenders.push(model(m));
    }
    contenders.push(model(match models.tuned_base {
        Some(base) => ModelRef {
            label: "tuned".into(),
            dir: base,
            adapter: Some(tuned),
        },
        None => ModelRef {
            label: "tuned".into(),
            dir: tuned,
            adapter: None,
        },
    }));
    contenders.extend(Baseline::ALL.map(Contender::Scripted));
    contenders.push(Contender::Strategy {
        label: "teacher-best".into(),
        strategy: best.clone(),
        spec,
    });
    compare.push(("tuned".into(), "teacher-best".into()));
    let job = EvalJob {
        env,
        index,
        sets,
        contenders,
        compare,
        settings,
        agent: None,
        progress: o
            .progress
            .then(|| Box::new(|m: &str| eprintln!("         {m}")) as mtrl_eval::ProgressFn),
    };
    let report = crate::eval::run(cfg, job, out)?.report;
    let path = out.join("strategy.md");
    std::fs::write(&path, report.strategy_markdown())
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(DemoEval {
        report,
        teacher_best: best,
        teacher_best_reward: best_reward,
        tuned_step,
    })
}
