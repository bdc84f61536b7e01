//! The evaluation job: which models, on which test sets, with which settings — and [`evaluate`],
//! which runs it and assembles the [`EvalReport`].
//!
//! Models are [`Contender`]s: a checkpoint folder (loaded when its turn comes, so one policy is
//! in memory at a time), an already-loaded policy (e.g. the demo's base and tuned policies), or a
//! scripted baseline. Each runs every test set in the same environment configuration as
//! training ([`crate::runner`]). Comparisons `(a, b)` name two contenders by label and report
//! `a − b` with a paired bootstrap interval of the nDCG@10 difference.
//!
//! [`prepare_test_sets`] is the config-level entry: it loads `[data] test`, checks judgments and
//! refuses test prompts that also appear in `[data] train` ([`crate::leak`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::{DType, Device};
use mtrl_core::{ChatCodec, Config, EnvConfig};
use mtrl_env::{Agent, Baseline, FixedStrategy, ScriptedAgent, Strategy, TeacherSpec};
use mtrl_model::{Policy, SamplingParams, TemplateCodec, Tokenizer};
use mtrl_search::SearchIndex;

use crate::bootstrap::DEFAULT_RESAMPLES;
use crate::error::{EvalError, Result};
use crate::leak::refuse_overlaps;
use crate::report::{
    Comparison, DatasetReport, EvalReport, ModelRun, PassCriterion, RunKind, SamplingInfo, Summary,
    TaskResult, REPORT_FORMAT_VERSION,
};
use crate::runner::{run_agent, run_policy, Episodes, PolicyRun};
use crate::strategy::StrategyStats;
use crate::tasks::{load_test_sets, TestSet};

/// A model to evaluate.
pub enum Contender {
    /// A Hugging Face checkpoint folder (policy, tokenizer and chat template), with a PEFT LoRA
    /// adapter folder on top when `adapter` is set.
    ModelDir {
        label: String,
        dir: PathBuf,
        adapter: Option<PathBuf>,
    },
    /// A loaded policy and its codec. The engine takes ownership: pass a copy of a policy you
    /// keep training. `source` is what the report says it is (e.g. `base after warm-start`).
    Policy {
        label: String,
        policy: Box<Policy>,
        codec: Arc<dyn ChatCodec>,
        source: String,
    },
    /// A scripted baseline (labelled by its name).
    Scripted(Baseline),
    /// A fixed strategy of the warm-start teacher (e.g. the best one on a validation split),
    /// played with `spec`'s argument conventions.
    Strategy {
        label: String,
        strategy: Strategy,
        spec: TeacherSpec,
    },
}

impl Contender {
    pub fn label(&self) -> &str {
        match self {
            Contender::ModelDir { label, .. }
            | Contender::Policy { label, .. }
            | Contender::Strategy { label, .. } => label,
            Contender::Scripted(b) => b.name(),
        }
    }
}

/// How the job runs and scores.
#[derive(Debug, Clone)]
pub struct EvalSettings {
    /// pass@k's k; 0 = no sampled attempts and no pass@k.
    pub k: usize,
    /// Sampled attempts per task (n ≥ k).
    pub samples: usize,
    pub pass: PassCriterion,
    /// Sampling of the attempts (temperature, top-p, top-k; the seed is derived per generation).
    pub sampling: SamplingParams,
    pub seed: u64,
    pub bootstrap_resamples: usize,
    /// Coverage of the bootstrap interval.
    pub confidence_level: f64,
    /// Episodes in flight per policy.
    pub max_concurrency: usize,
    /// Sequences per decode step.
    pub max_batch: usize,
    pub dtype: DType,
    pub device: Device,
    /// Tokenizer folder for checkpoints without one (`[model] tokenizer`).
    pub tokenizer: Option<PathBuf>,
}

impl EvalSettings {
    /// The training config's sampling, concurrency, seed, dtype, device (f32 on the CPU when
    /// the config has no `[model]`) and fallback tokenizer, with `k` attempts per task.
    pub fn from_config(cfg: &Config, k: usize) -> Result<EvalSettings> {
        let (dtype, device) = match &cfg.model {
            Some(m) => {
                let bad = |e: mtrl_model::ModelError| {
                    EvalError::Invalid(format!("{}: [model]: {e}", cfg.source.display()))
                };
                (
                    mtrl_model::parse_dtype(&m.dtype).map_err(bad)?,
                    mtrl_model::parse_device(&m.device).map_err(bad)?,
                )
            }
            None => (DType::F32, Device::Cpu),
        };
        let r = &cfg.rollout;
        Ok(EvalSettings {
            k,
            samples: k,
            pass: PassCriterion::default(),
            sampling: SamplingParams {
                temperature: r.temperature,
                top_p: r.top_p,
                top_k: r.top_k,
                seed: 0,
            },
            seed: cfg.train.seed,
            bootstrap_resamples: DEFAULT_RESAMPLES,
            confidence_level: 0.95,
            max_concurrency: r.rollout_max_concurrency,
            max_batch: r.max_batch,
            dtype,
            device,
            tokenizer: cfg.model.as_ref().and_then(|m| m.tokenizer.clone()),
        })
    }

    fn check(&self) -> Result<()> {
        if self.k > self.samples {
            return Err(EvalError::Invalid(format!(
                "pass@k needs at least k attempts per task: k = {}, attempts = {}",
                self.k, self.samples
            )));
        }
        if !self.pass.threshold.is_finite() {
            return Err(EvalError::Invalid(
                "the pass threshold must be finite".into(),
            ));
        }
        self.sampling
            .validate()
            .map_err(|e| EvalError::Invalid(format!("sampling of the attempts: {e}")))
    }
}

/// Receives progress lines.
pub type ProgressFn = Box<dyn Fn(&str)>;

/// What to evaluate.
pub struct EvalJob {
    /// The environment of training (`[env]`).
    pub env: EnvConfig,
    pub index: Arc<SearchIndex>,
    pub sets: Vec<TestSet>,
    pub contenders: Vec<Contender>,
    /// `(a, b)` label pairs to report as `a − b` (e.g. `("tuned", "base")`).
    pub compare: Vec<(String, String)>,
    pub settings: EvalSettings,
    /// Called with a line of progress (which model on which benchmark).
    pub progress: Option<ProgressFn>,
    /// Policies' episodes run by the user's agent (`[rollout] environment = "agent"`): the
    /// driver for a policy with this codec. `None`: the in-process environment.
    pub agent: Option<crate::runner::AgentDrivers>,
}

/// Loads the config's test files (at most `limit` tasks each), checks their judgments, and
/// refuses test tasks that also appear in the config's training files.
pub fn prepare_test_sets(cfg: &Config, limit: Option<usize>) -> Result<Vec<TestSet>> {
    let data = cfg.data.as_ref().ok_or_else(|| {
        EvalError::Invalid(format!(
            "{}: no [data] section, so no test task files to evaluate",
            cfg.source.display()
        ))
    })?;
    if data.test.is_empty() {
        return Err(EvalError::Invalid(format!(
            "{}: `data.test` names no task file",
            cfg.source.display()
        )));
    }
    let sets = load_test_sets(&data.test, data.skip_bad_rows, limit)?;
    let train: Vec<PathBuf> = data.train.iter().map(|d| d.path.clone()).collect();
    refuse_overlaps(&sets, &train, data.skip_bad_rows)?;
    Ok(sets)
}

/// Loads a checkpoint folder: policy, tokenizer (vocabulary checked) and chat-template codec.
/// The tokenizer comes from the folder, else from `tokenizer` (a checkpoint of a `random:`
/// policy has no tokenizer of its own; training took it from `[model] tokenizer`).
pub fn load_model(
    dir: &Path,
    tokenizer: Option<&Path>,
    dtype: DType,
    device: &Device,
) -> Result<(Policy, Arc<dyn ChatCodec>)> {
    load_adapted(dir, None, tokenizer, dtype, device)
}

/// [`load_model`] with the PEFT LoRA adapter in `adapter` (`adapter_config.json` +
/// `adapter_model.safetensors`) on top of the base in `dir`.
pub fn load_adapted(
    dir: &Path,
    adapter: Option<&Path>,
    tokenizer: Option<&Path>,
    dtype: DType,
    device: &Device,
) -> Result<(Policy, Arc<dyn ChatCodec>)> {
    let bad = |message: String| EvalError::Model {
        path: dir.to_path_buf(),
        message,
    };
    if !mtrl_model::gguf::is_model_path(dir) {
        return Err(EvalError::MissingModel {
            path: dir.to_path_buf(),
        });
    }
    let mut policy = Policy::load(dir, dtype, device).map_err(|e| bad(e.to_string()))?;
    if let Some(a) = adapter {
        policy = policy.load_adapter(a).map_err(|e| EvalError::Model {
            path: a.to_path_buf(),
            message: e.to_string(),
        })?;
    }
    // A `.gguf` model's tokenizer files are in the folder kept beside it.
    let files = mtrl_model::gguf::checkpoint_dir(dir).map_err(|e| bad(e.to_string()))?;
    let tok_dir = match tokenizer {
        Some(t) if !files.join("tokenizer.json").is_file() => t,
        _ => files.as_path(),
    };
    let tok = Tokenizer::from_dir(tok_dir).map_err(|e| bad(e.to_string()))?;
    tok.check_vocab(policy.config().vocab_size)
        .map_err(|e| bad(e.to_string()))?;
    let codec = TemplateCodec::qwen(Arc::new(tok)).map_err(|e| bad(e.to_string()))?;
    Ok((policy, Arc::new(codec)))
}

fn check_labels(job: &EvalJob) -> Result<()> {
    let labels: Vec<&str> = job.contenders.iter().map(Contender::label).collect();
    if labels.is_empty() {
        return Err(EvalError::Invalid(
            "nothing to evaluate: give a model or a scripted baseline".into(),
        ));
    }
    for (i, l) in labels.iter().enumerate() {
        if labels[..i].contains(l) {
            return Err(EvalError::Invalid(format!("two models are labelled `{l}`")));
        }
    }
    for (a, b) in &job.compare {
        for l in [a, b] {
            if !labels.contains(&l.as_str()) {
                return Err(EvalError::Invalid(format!(
                    "comparison names `{l}`, which is not one of the evaluated models ({})",
                    labels.join(", ")
                )));
            }
        }
    }
    for c in &job.contenders {
        if let Contender::ModelDir { dir, .. } = c {
            if !mtrl_model::gguf::is_model_path(dir) {
                return Err(EvalError::MissingModel { path: dir.clone() });
            }
        }
    }
    Ok(())
}

fn model_run(
    label: &str,
    kind: RunKind,
    source: &str,
    ep: Episodes,
    s: &EvalSettings,
) -> Result<ModelRun> {
    let deterministic = kind == RunKind::Scripted;
    let tasks = ep
        .greedy
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let samples = ep.samples.get(i).map_or(&[][..], Vec::as_slice);
            TaskResult::new(g, samples, &s.pass, s.k, deterministic)
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(ModelRun {
        label: label.to_string(),
        kind,
        source: source.to_string(),
        summary: Summary::of(&tasks, ep.greedy_s, kind == RunKind::Policy),
        tasks,
        strategy: Some(StrategyStats::of(&ep.greedy)),
        sampled_strategy: ep
            .samples
            .iter()
            .any(|s| !s.is_empty())
            .then(|| StrategyStats::of(ep.samples.iter().flatten())),
        greedy: ep.greedy,
        samples: ep.samples,
    })
}

/// Runs the job. Blocks (it drives its own tokio runtime), so call it outside any tokio runtime.
pub fn evaluate(job: EvalJob) -> Result<EvalReport> {
    if tokio::runtime::Handle::try_current().is_ok() {
        return Err(EvalError::Invalid(
            "evaluate() runs its own runtime; call it outside a tokio runtime".into(),
        ));
    }
    check_labels(&job)?;
    let s = &job.settings;
    s.check()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| EvalError::Invalid(format!("cannot start the tokio runtime: {e}")))?;
    let say = |m: String| {
        if let Some(p) = &job.progress {
            p(&m)
        }
    };
    // Group indices (sampling seeds) of each set's first task: unique across sets.
    let mut first = 0u64;
    let groups: Vec<(u64, &TestSet)> = job
        .sets
        .iter()
        .map(|set| {
            let g = first;
            first += set.tasks.len() as u64;
            (g, set)
        })
        .collect();
    // runs[set][contender]
    let mut runs: Vec<Vec<ModelRun>> = job.sets.iter().map(|_| Vec::new()).collect();
    for c in job.contenders {
        let label = c.label().to_string();
        // Deterministic text-mode agents: one episode per task.
        let text: Option<(Box<dyn Agent>, String)> = match &c {
            Contender::Scripted(b) => Some((
                Box::new(ScriptedAgent::new(
                    *b,
                    job.env.final_k,
                    job.env.max_search_k,
                )),
                b.name().to_string(),
            )),
            Contender::Strategy { strategy, spec, .. } => Some((
                Box::new(FixedStrategy::new(strategy.clone(), spec)),
                format!("fixed strategy: {}", strategy.name()),
            )),
            _ => None,
        };
        if let Some((mut agent, source)) = text {
            for (i, set) in job.sets.iter().enumerate() {
                say(format!("{label}: {} ({} tasks)", set.name, set.tasks.len()));
                let ep = run_agent(&label, agent.as_mut(), &job.env, job.index.clone(), set)?;
                runs[i].push(model_run(&label, RunKind::Scripted, &source, ep, s)?);
            }
            continue;
        }
        let (policy, codec, source) = match c {
            // Ran above as text agents.
            Contender::Scripted(_) | Contender::Strategy { .. } => continue,
            Contender::ModelDir { dir, adapter, .. } => {
                let source = match &adapter {
                    Some(a) => format!("{} + adapter {}", dir.display(), a.display()),
                    None => dir.display().to_string(),
                };
                say(format!("{label}: loading {source}"));
                let (p, codec) = load_adapted(
                    &dir,
                    adapter.as_deref(),
                    s.tokenizer.as_deref(),
                    s.dtype,
                    &s.device,
                )?;
                (p, codec, source)
            }
            Contender::Policy {
                policy,
                codec,
                source,
                ..
            } => (*policy, codec, source),
        };
        say(format!(
            "{label}: greedy pass + {} attempts per task over {} benchmark(s)",
            s.samples,
            job.sets.len()
        ));
        let run = PolicyRun {
            label: &label,
            env: job.env.clone(),
            index: job.index.clone(),
            codec,
            sampling: s.sampling.clone(),
            samples: s.samples,
            seed: s.seed,
            max_concurrency: s.max_concurrency,
            max_batch: s.max_batch,
            agent: job.agent.clone(),
        };
        let eps = run_policy(&run, policy, &groups, &rt)?;
        for (i, ep) in eps.into_iter().enumerate() {
            runs[i].push(model_run(&label, RunKind::Policy, &source, ep, s)?);
        }
    }
    let mut datasets = Vec::with_capacity(job.sets.len());
    for (set, runs) in job.sets.iter().zip(runs) {
        let mut d = DatasetReport {
            benchmark: set.name.clone(),
            path: set.path.clone(),
            size: set.tasks.len(),
            runs,
            comparisons: Vec::new(),
        };
        for (a, b) in &job.compare {
            if let (Some(ra), Some(rb)) = (d.run(a), d.run(b)) {
                let c = Comparison::new(ra, rb, s.bootstrap_resamples, s.confidence_level, s.seed)?;
                d.comparisons.push(c);
            }
        }
        datasets.push(d);
    }
    Ok(EvalReport {
        format_version: REPORT_FORMAT_VERSION,
        k: s.k,
        samples: s.samples,
        pass: s.pass,
        sampling: SamplingInfo {
            temperature: s.sampling.temperature,
            top_p: s.sampling.top_p,
            top_k: s.sampling.top_k,
        },
        bootstrap_resamples: s.bootstrap_resamples,
        confidence_level: s.confidence_level,
        seed: s.seed,
        datasets,
    })
}
