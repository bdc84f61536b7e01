//! The default job's control for RL: rejection-sampling fine-tuning (RFT) of the same base on the
//! teacher's good episodes, with the RL run's budget.
//!
//! RL samples `max_steps × global_batch_size × group_size` policy episodes and takes `max_steps`
//! optimizer steps. The control samples as many teacher episodes on the training tasks (a fresh
//! seed, `ceil(budget / tasks)` per task), keeps those with reward ≥ `[warm_start.rft] threshold`,
//! and fine-tunes a copy of the base on them for `max_steps` steps (one shuffled pass, the kept
//! episodes split into that many batches, a few repeated to fill the last) at `[warm_start.rft] lr` with RL's warm-up and clipping. If RL
//! beats this, it found more than "imitate the teacher's successes".
//!
//! Its checkpoint is chosen as RL's is: with `train.val_every > 0` the control runs the same
//! validation (greedy, and `train.val_samples` sampled episodes per task whose reward breaks ties)
//! every that many steps and at its last, and the best step by `train.val_metric` is what it saves
//! ([`Selection`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::DType;
use mtrl_core::config::{RftConfig, SftSettings, WarmStartConfig};
use mtrl_core::rng::hash_str;
use mtrl_core::{ChatCodec, Config, Trajectory};
use mtrl_env::Task;
use mtrl_model::{Policy, TemplateCodec, Tokenizer};
use mtrl_search::SearchIndex;
use serde_json::Value;

use crate::error::{Context, Result};
use crate::validate::{Best, Validator};
use crate::{bail, setup, sft, warm_start};

/// What the control trained on.
#[derive(Debug, Clone)]
pub struct RftOutcome {
    pub dir: PathBuf,
    /// Teacher episodes sampled.
    pub pool: usize,
    /// Episodes at or above the threshold (what it trained on).
    pub kept: usize,
    pub steps: usize,
    /// The step saved when validation chose it (else the last step was saved).
    pub best_step: Option<u64>,
}

/// Validation during the control's fine-tuning, as [`crate::run::train`] validates RL: greedy
/// episodes of the validation tasks every `train.val_every` steps and at the last, keeping a copy
/// of the best policy by `train.val_metric`.
pub struct Selection {
    validator: Validator,
    rt: tokio::runtime::Runtime,
    /// The best step's score and a copy of its policy.
    best: Option<(Best, Policy)>,
}

impl Selection {
    /// `None` when `train.val_every` is 0.
    pub fn new(cfg: &Config, codec: Arc<dyn ChatCodec>, policy: &Policy) -> Result<Option<Self>> {
        if cfg.train.val_every == 0 {
            return Ok(None);
        }
        let window = policy.config().max_position_embeddings;
        let data = setup::load_data(cfg)?;
        let envs = setup::driver(cfg, &data, codec.clone(), true, window, None)?;
        let stop = codec.stop_token_ids();
        let validator = Validator::new(
            cfg,
            &data.sets.validation,
            envs,
            setup::engine_options(cfg, policy)?,
            stop,
        )?;
        let Some(validator) = validator else {
            return Ok(None);
        };
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        Ok(Some(Selection {
            validator,
            rt,
            best: None,
        }))
    }

    /// Validates after `step` of `total` when due; keeps `policy` if it is the best so far.
    pub fn observe(&mut self, step: u64, total: u64, policy: &Policy) -> Result<()> {
        if !self.validator.due(step, total) {
            return Ok(());
        }
        let figures = self.validator.run(policy.fork()?, step, &self.rt)?;
        if let Some(best) =
            self.validator
                .choose(self.best.as_ref().map(|(b, _)| b), step, &figures)
        {
            self.best = Some((best, policy.fork()?));
        }
        Ok(())
    }

    /// The best step and its policy.
    pub fn into_best(self) -> Option<(u64, Policy)> {
        self.best.map(|(b, p)| (b.step, p))
    }
}

/// The teacher episodes of the control's budget (see the module docs).
pub fn pool(
    cfg: &Config,
    ws: &WarmStartConfig,
    index: Arc<SearchIndex>,
    train: &[Task],
    steps: usize,
) -> Result<Vec<Trajectory>> {
    let budget = steps * cfg.train.global_batch_size * cfg.rollout.group_size;
    let per_task = budget.div_ceil(train.len().max(1)).max(1);
    let ws = WarmStartConfig {
        teacher_samples: per_task,
        pseudo_queries: 0,
        ..ws.clone()
    };
    warm_start::teacher_episodes(cfg, &ws, index, train, hash_str(cfg.train.seed, "rft"))
}

/// Episodes with reward ≥ `threshold`.
pub fn select(pool: &[Trajectory], threshold: f64) -> Vec<Trajectory> {
    pool.iter()
        .filter(|t| t.failure.is_none() && t.reward >= threshold)
        .cloned()
        .collect()
}

/// Trains the control from the `base` checkpoint into `rft.output`, with the budget of an RL run
/// of `steps` steps.
#[allow(clippy::too_many_arguments)]
pub fn run(
    cfg: &Config,
    ws: &WarmStartConfig,
    rft: &RftConfig,
    index: Arc<SearchIndex>,
    tools: &[Value],
    train: &[Task],
    base: &Path,
    steps: usize,
    progress: bool,
) -> Result<RftOutcome> {
    let pool = pool(cfg, ws, index, train, steps)?;
    let kept = select(&pool, rft.threshold);
    if kept.len() < steps.max(1) {
        bail!(
            "{}: only {} of {} teacher episodes reach `warm_start.rft.threshold` = {}, fewer than \
             the {} steps of the control; lower the threshold",
            cfg.source.display(),
            kept.len(),
            pool.len(),
            rft.threshold,
            steps
        );
    }
    let tok = Arc::new(Tokenizer::from_dir(base)?);
    let codec = Arc::new(TemplateCodec::qwen(tok)?);
    let device = mtrl_model::parse_device("cpu")?;
    let mut policy = Policy::load(base, DType::F32, &device)
        .with_context(|| format!("loading the base policy from {}", base.display()))?;
    crate::setup::train_options(&mut policy, cfg);
    let mut selection = Selection::new(cfg, codec.clone(), &policy)?;
    let mut examples = sft::examples(codec.as_ref(), tools, &kept, false)?;
    // Exactly `steps` batches: the first few kept episodes repeat to fill the last one.
    let batch = examples.len().div_ceil(steps.max(1));
    let fill = batch * steps - examples.len();
    examples.extend_from_within(..fill);
    let settings = SftSettings {
        trajectories: None,
        output: Some(rft.output.clone()),
        epochs: 1,
        max_steps: 0,
        batch_size: batch,
        lr: rft.lr,
        warmup_steps: cfg.train.warmup_steps,
        min_lr: rft.lr * 0.1,
        grad_clip: cfg.train.grad_clip,
        micro_batch_tokens: cfg.sft.micro_batch_tokens,
        seed: hash_str(cfg.train.seed, "rft-order"),
    };
    let rcfg = Config {
        sft: settings,
        ..cfg.clone()
    };
    let mut on_step = |step: u64, total: u64, p: &Policy| match selection.as_mut() {
        Some(s) => s.observe(step, total, p),
        None => Ok(()),
    };
    let (records, _) = sft::fine_tune_logged_with(
        &rcfg,
        &policy,
        &examples,
        &rft.output,
        progress,
        &mut on_step,
    )?;
    let (best_step, saved) = match selection.and_then(Selection::into_best) {
        Some((step, p)) => (Some(step), p),
        None => (None, policy),
    };
    saved.save(&rft.output, DType::F32)?;
    sft::copy_tokenizer(base, &rft.output)?;
    Ok(RftOutcome {
        dir: rft.output.clone(),
        pool: pool.len(),
        kept: kept.len(),
        steps: records.len(),
        best_step,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_threshold_selects_and_failures_never_pass() {
        let t = |r: f64, failed: bool| {
            let mut t = Trajectory::new("q");
            t.reward = r;
            t.failure = failed.then_some(mtrl_core::FailureReason::TurnLimit);
            t
        };
        let pool = vec![t(0.1, false), t(0.5, false), t(0.3, false), t(0.9, true)];
        let rewards = |v: Vec<Trajectory>| v.iter().map(|t| t.reward).collect::<Vec<_>>();
        assert_eq!(rewards(select(&pool, 0.3)), vec![0.5, 0.3]);
        assert_eq!(rewards(select(&pool, 0.0)), vec![0.1, 0.5, 0.3]);
        assert!(select(&pool, 0.6).is_empty());
    }
}
