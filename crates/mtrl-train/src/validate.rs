//! Validation during training: every `train.val_every` steps, the current policy runs greedy
//! (temperature 0) on the validation tasks — the same environment, budgets and reward as the
//! training episodes — in an engine of its own, while the training rollouts go on.
//!
//! Episodes run through the evaluation runner (`mtrl_eval::runner::run_all`). Figures:
//! `val_reward_mean`, `val_ndcg@10` (as evaluation counts it: 0 for failed episodes),
//! `val_fail_rate` and `val_turns_mean`, written into the step's record (so they reach `metrics.jsonl`, MLflow,
//! Prometheus and `mtrl plot`). The best step by `train.val_metric` is kept: its checkpoint is
//! written at once, spared by `keep_last` rotation, and named by `best.json` in the run folder
//! (`mtrl eval --model best`).
//!
//! With `train.val_samples` = N > 0 each pass also runs N sampled episodes per task (the rollout's
//! temperature, top_p and top_k) and records their mean reward and failure rate
//! (`val_sampled_reward_mean`, `val_sampled_failure_rate`). Their seeds come from the run seed and
//! the task, the same at every pass, so two checkpoints are compared on the same draws. The
//! sampled reward breaks ties of `val_metric` (a small policy playing one fixed strategy ties on
//! greedy validation at most checkpoints), or is the metric itself (`val_sampled_reward`).
//!
//! Validation samples from RNGs of its own, so it does not change what training samples: a run
//! with validation trains exactly as one without.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use mtrl_core::rng::hash_str;
use mtrl_core::{Config, StepRecord, Trajectory};
use mtrl_env::Task;
use mtrl_eval::report::ndcg_at_10;
use mtrl_model::{Engine, EngineOptions, Policy, SamplingParams};
use mtrl_rollout::engine_thread::EngineThread;
use mtrl_rollout::episode::{EnvStats, EpisodeContext};
use mtrl_rollout::Driver;

use crate::bail;
use crate::error::{Context, Result, TrainError};

pub use mtrl_learner::BestCheckpoint as Best;

/// What one validation pass measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ValFigures {
    pub reward_mean: f64,
    pub ndcg_at_10: f64,
    pub fail_rate: f64,
    pub turns_mean: f64,
    /// Of the sampled episodes (`train.val_samples` > 0): mean reward and failure rate.
    pub sampled: Option<(f64, f64)>,
}

impl ValFigures {
    /// Figures of the greedy `episodes` (and the `sampled` ones, when any ran).
    pub fn of(episodes: &[Trajectory], sampled: Option<&[Trajectory]>) -> ValFigures {
        ValFigures {
            reward_mean: mean(episodes, |t| t.reward),
            ndcg_at_10: mean(episodes, ndcg_at_10),
            fail_rate: fail_rate(episodes),
            turns_mean: mean(episodes, |t| t.turns as f64),
            sampled: sampled.map(|s| (mean(s, |t| t.reward), fail_rate(s))),
        }
    }

    /// Into the step's record.
    pub fn write(&self, rec: &mut StepRecord) {
        rec.val_reward_mean = Some(self.reward_mean);
        rec.val_ndcg_at_10 = Some(self.ndcg_at_10);
        rec.val_failure_rate = Some(self.fail_rate);
        rec.val_turns_mean = Some(self.turns_mean);
        rec.val_sampled_reward_mean = self.sampled.map(|s| s.0);
        rec.val_sampled_failure_rate = self.sampled.map(|s| s.1);
    }

    /// `metric`'s value, oriented so that larger is better, and its tie-break (the sampled mean
    /// reward, when sampled episodes ran and the metric is not that already).
    pub fn score(&self, metric: &str) -> (f64, Option<f64>) {
        let sampled = self.sampled.map(|s| s.0);
        match metric {
            "val_reward" => (self.reward_mean, sampled),
            "val_fail_rate" => (-self.fail_rate, sampled),
            "val_sampled_reward" => (sampled.unwrap_or(f64::NEG_INFINITY), None),
            _ => (self.ndcg_at_10, sampled),
        }
    }
}

fn mean(episodes: &[Trajectory], f: impl Fn(&Trajectory) -> f64) -> f64 {
    episodes.iter().map(f).sum::<f64>() / episodes.len().max(1) as f64
}

fn fail_rate(episodes: &[Trajectory]) -> f64 {
    mean(episodes, |t| f64::from(u8::from(t.failure.is_some())))
}

/// The validation side of a run.
pub struct Validator {
    tasks: Vec<Task>,
    envs: Arc<dyn Driver>,
    engine: EngineOptions,
    stop_token_ids: Vec<u32>,
    max_concurrency: usize,
    every: u64,
    pub metric: String,
    /// Sampled episodes per task (0 = none), their sampling settings and seed.
    samples: usize,
    sampling: SamplingParams,
    seed: u64,
}

impl Validator {
    /// `None` when `train.val_every` is 0; an error when validation is asked for without tasks.
    pub fn new(
        cfg: &Config,
        validation: &[Task],
        envs: Arc<dyn Driver>,
        engine: EngineOptions,
        stop_token_ids: Vec<u32>,
    ) -> Result<Option<Validator>> {
        let t = &cfg.train;
        if t.val_every == 0 {
            return Ok(None);
        }
        if validation.is_empty() {
            bail!(
                "{}: train.val_every = {} but there are no validation tasks (set [data] \
                 validation or validation_fraction > 0)",
                cfg.source.display(),
                t.val_every
            );
        }
        let n = match t.val_tasks {
            0 => validation.len(),
            n => n.min(validation.len()),
        };
        Ok(Some(Validator {
            tasks: validation[..n].to_vec(),
            envs,
            engine,
            stop_token_ids,
            max_concurrency: cfg.rollout.rollout_max_concurrency,
            every: t.val_every,
            metric: t.val_metric.clone(),
            samples: t.val_samples,
            sampling: SamplingParams {
                temperature: cfg.rollout.temperature,
                top_p: cfg.rollout.top_p,
                top_k: cfg.rollout.top_k,
                seed: 0,
            },
            seed: hash_str(t.seed, "validation"),
        }))
    }

    /// The new best after `step`, or `None` when `figures` do not beat `prev` (the one rule for
    /// RL's and the RFT control's step selection: the metric, ties broken by the sampled reward).
    pub fn choose(&self, prev: Option<&Best>, step: u64, figures: &ValFigures) -> Option<Best> {
        let (value, tiebreak) = figures.score(&self.metric);
        prev.is_none_or(|b| b.beaten_by(value, tiebreak))
            .then(|| Best {
                step,
                metric: self.metric.clone(),
                value,
                tiebreak,
            })
    }

    /// Whether validation runs after `step`.
    pub fn due(&self, step: u64, last: u64) -> bool {
        step.is_multiple_of(self.every) || step == last
    }

    /// Greedy episodes of every validation task under `policy`, then the sampled ones.
    pub fn run(
        &self,
        policy: Policy,
        version: u64,
        rt: &tokio::runtime::Runtime,
    ) -> Result<ValFigures> {
        let engine = Engine::with_options(policy, None, version, self.engine.clone())?;
        let engine = EngineThread::spawn(engine)?;
        let pass = |sampling: SamplingParams, seed: u64, per_task: usize| {
            let cx = Arc::new(EpisodeContext {
                gen: engine.client.clone(),
                sampling,
                seed,
                stop_token_ids: self.stop_token_ids.clone(),
                stats: Arc::new(EnvStats::default()),
                faults: Arc::new(mtrl_rollout::faults::Faults::none()),
                sampled_logprobs: true,
            });
            let episodes = rt.block_on(mtrl_eval::runner::run_all(
                cx,
                self.envs.clone(),
                &self.tasks,
                per_task,
                0,
                0,
                self.max_concurrency,
            ));
            episodes.map(|e| e.into_iter().flatten().collect::<Vec<Trajectory>>())
        };
        let greedy = pass(SamplingParams::greedy(), 0, 1);
        let sampled = match (&greedy, self.samples) {
            (Ok(_), n) if n > 0 => Some(pass(self.sampling.clone(), self.seed, n)),
            _ => None,
        };
        let shut = engine.shutdown();
        let greedy = greedy?;
        let sampled = sampled.transpose()?;
        shut?;
        Ok(ValFigures::of(&greedy, sampled.as_deref()))
    }
}

/// `best.json` of a run folder.
pub fn best_path(run: &Path) -> PathBuf {
    run.join("best.json")
}

/// Writes `best.json` atomically (temp file, fsync, rename).
pub fn write_best(run: &Path, best: &Best) -> Result<()> {
    let p = best_path(run);
    let tmp = run.join(".best.json.tmp");
    let text = serde_json::to_string_pretty(best)?;
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&tmp).with_context(|| tmp.display())?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, &p).with_context(|| p.display())?;
    // The rename itself must survive a crash: fsync the folder that holds the entry.
    std::fs::File::open(run)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("syncing {}", run.display()))?;
    Ok(())
}

/// The step `best.json` of a run folder names.
pub fn best_step(run: &Path) -> Result<u64> {
    let p = best_path(run);
    let text = std::fs::read_to_string(&p).with_context(|| {
        format!(
            "{}: no best checkpoint (train with train.val_every > 0)",
            p.display()
        )
    })?;
    let b: Best =
        serde_json::from_str(&text).with_context(|| format!("{} is malformed", p.display()))?;
    Ok(b.step)
}

/// The policy folder `which` names in a run folder: `best` (by `best.json`) or `last` (the newest
/// valid checkpoint).
pub fn checkpoint_policy(run: &Path, which: &str) -> Result<PathBuf> {
    let step = match which {
        "best" => best_step(run)?,
        "last" => {
            let mgr = mtrl_learner::CheckpointManager::new(run, 1);
            let (latest, _) = mgr.latest_valid()?;
            let Some(latest) = latest else {
                bail!("{}: no valid checkpoint", run.display());
            };
            return Ok(latest.join("policy"));
        }
        other => bail!("`{other}` is not best or last"),
    };
    let dir = run.join(format!("step-{step:08}"));
    mtrl_learner::CheckpointManager::verify(&dir)
        .map_err(|e| TrainError::msg(format!("best checkpoint {}: {e}", dir.display())))?;
    Ok(dir.join("policy"))
}
