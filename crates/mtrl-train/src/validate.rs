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
//! Greedy decoding has no randomness, so validation takes nothing from the run's seeds and does
//! not change what training samples: a run with validation trains exactly as one without.

use std::path::{Path, PathBuf};
use std::sync::Arc;

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
}

impl ValFigures {
    pub fn of(episodes: &[Trajectory]) -> ValFigures {
        let n = episodes.len().max(1) as f64;
        ValFigures {
            reward_mean: episodes.iter().map(|t| t.reward).sum::<f64>() / n,
            ndcg_at_10: episodes.iter().map(ndcg_at_10).sum::<f64>() / n,
            fail_rate: episodes.iter().filter(|t| t.failure.is_some()).count() as f64 / n,
            turns_mean: episodes.iter().map(|t| t.turns as f64).sum::<f64>() / n,
        }
    }

    /// Into the step's record.
    pub fn write(&self, rec: &mut StepRecord) {
        rec.val_reward_mean = Some(self.reward_mean);
        rec.val_ndcg_at_10 = Some(self.ndcg_at_10);
        rec.val_failure_rate = Some(self.fail_rate);
        rec.val_turns_mean = Some(self.turns_mean);
    }

    /// `metric`'s value, oriented so that larger is better.
    pub fn score(&self, metric: &str) -> f64 {
        match metric {
            "val_reward" => self.reward_mean,
            "val_fail_rate" => -self.fail_rate,
            _ => self.ndcg_at_10,
        }
    }
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
        }))
    }

    /// Whether validation runs after `step`.
    pub fn due(&self, step: u64, last: u64) -> bool {
        step.is_multiple_of(self.every) || step == last
    }

    /// Greedy episodes of every validation task under `policy`.
    pub fn run(
        &self,
        policy: Policy,
        version: u64,
        rt: &tokio::runtime::Runtime,
    ) -> Result<ValFigures> {
        let engine = Engine::with_options(policy, None, version, self.engine.clone())?;
        let engine = EngineThread::spawn(engine)?;
        let cx = Arc::new(EpisodeContext {
            gen: engine.client.clone(),
            sampling: SamplingParams::greedy(),
            seed: 0,
            stop_token_ids: self.stop_token_ids.clone(),
            stats: Arc::new(EnvStats::default()),
            faults: Arc::new(mtrl_rollout::faults::Faults::none()),
        });
        let episodes = rt.block_on(mtrl_eval::runner::run_all(
            cx,
            self.envs.clone(),
            &self.tasks,
            1,
            0,
            0,
            self.max_concurrency,
        ));
        let shut = engine.shutdown();
        let episodes: Vec<Trajectory> = episodes?.into_iter().flatten().collect();
        shut?;
        Ok(ValFigures::of(&episodes))
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
