//! `[train]`: the optimisation loop.
//!
//! ```toml
//! [train]
//! max_epochs = 1              # passes over the training tasks (used when max_steps = 0)
//! global_batch_size = 128     # prompts (groups) per step
//! max_steps = 0               # 0 = max_epochs × tasks / global_batch_size
//! lr = 1e-6
//! warmup_steps = 0
//! lr_schedule = "constant"    # or "cosine" (to min_lr at the last step)
//! min_lr = 0.0
//! weight_decay = 0.01
//! weight_decay_exclude = []   # any of "norms", "biases", "embeddings" (HF Trainer: the first two)
//! grad_clip = 1.0             # 0 = off
//! seed = 0
//! micro_batch_tokens = 8192   # rows × longest row per forward/backward (rows grouped by
//!                             # length; the forward runs them packed, without padding)
//! activation_checkpointing = false  # keep only each layer's input; the backward recomputes
//!                             # the layer (same gradients, ~1/3 more arithmetic, far less memory)
//! attention_kernel = "auto"   # the training forward's attention core: "fused" (FlashAttention-2
//!                             # on CUDA; the CPU twin elsewhere), "spelled", or "auto" (fused
//!                             # where a binary built with `flash-attn` serves the model)
//! grad_accumulation = "f32"   # dtype micro-batch gradients are summed in; "f64" (CPU) makes the
//!                             # sum exact in any order, so N data-parallel ranks give one
//!                             # process's weights bit for bit; the NCCL all-reduce
//!                             # (GPU ranks) sums in f32 whatever this says: f64 acts within a
//!                             # rank and across host (MPI) all-reduces only
//! val_every = 0               # validation (greedy, temperature 0) every N steps; 0 = off
//! val_tasks = 0               # validation tasks per pass (the first N); 0 = all
//! val_metric = "val_ndcg@10"  # what "best" means: val_ndcg@10 | val_reward | val_fail_rate |
//!                             # val_sampled_reward
//! val_samples = 0             # > 0: also N sampled episodes per validation task (the rollout's
//!                             # temperature / top_p / top_k, the same seeds at every pass); their
//!                             # mean reward breaks ties of val_metric (or is it)
//! max_skipped_updates = 3     # the run stops with an error naming the cause once this many
//!                             # steps in a row skipped an update for a non-finite loss or
//!                             # gradient norm (each one is reported); 0 = never
//! ```

use serde::Deserialize;

use super::Ctx;
use crate::error::Result;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainSpec {
    pub max_epochs: Option<usize>,
    pub global_batch_size: Option<usize>,
    pub max_steps: Option<u64>,
    pub lr: Option<f64>,
    pub warmup_steps: Option<u64>,
    pub lr_schedule: Option<String>,
    pub min_lr: Option<f64>,
    pub weight_decay: Option<f64>,
    pub weight_decay_exclude: Option<Vec<String>>,
    pub grad_clip: Option<f64>,
    pub seed: Option<u64>,
    pub micro_batch_tokens: Option<usize>,
    pub activation_checkpointing: Option<bool>,
    pub attention_kernel: Option<String>,
    pub grad_accumulation: Option<String>,
    pub val_every: Option<u64>,
    pub val_tasks: Option<usize>,
    pub val_metric: Option<String>,
    pub val_samples: Option<usize>,
    pub max_skipped_updates: Option<u64>,
}

/// Validation metrics a best checkpoint can be chosen by (`val_fail_rate`: lower is better).
pub const VAL_METRICS: &[&str] = &[
    "val_ndcg@10",
    "val_reward",
    "val_fail_rate",
    "val_sampled_reward",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LrScheduleKind {
    Constant,
    Cosine,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TrainConfig {
    pub max_epochs: usize,
    pub global_batch_size: usize,
    pub max_steps: u64,
    pub lr: f64,
    pub warmup_steps: u64,
    pub lr_schedule: LrScheduleKind,
    pub min_lr: f64,
    pub weight_decay: f64,
    /// Parameter kinds without weight decay (`norms`, `biases`, `embeddings`).
    pub weight_decay_exclude: Vec<String>,
    /// 0 disables clipping.
    pub grad_clip: f64,
    pub seed: u64,
    pub micro_batch_tokens: usize,
    /// Per-layer activation checkpointing of every training forward of the run.
    pub activation_checkpointing: bool,
    /// `auto`, `fused` or `spelled`: the attention core of every training forward of the run.
    pub attention_kernel: String,
    /// `f32` or `f64`: the dtype micro-batch gradients are summed in.
    pub grad_accumulation: String,
    /// 0 = no validation during training.
    pub val_every: u64,
    /// 0 = every validation task.
    pub val_tasks: usize,
    pub val_metric: String,
    /// Sampled validation episodes per task (0 = greedy only): their mean reward breaks ties of
    /// `val_metric`, or is it (`val_sampled_reward`).
    pub val_samples: usize,
    /// Steps in a row that may skip an update for a non-finite loss or gradient before the run
    /// stops with an error (0 = never).
    pub max_skipped_updates: u64,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            max_epochs: 1,
            global_batch_size: 128,
            max_steps: 0,
            lr: 1e-6,
            warmup_steps: 0,
            lr_schedule: LrScheduleKind::Constant,
            min_lr: 0.0,
            weight_decay: 0.01,
            weight_decay_exclude: Vec::new(),
            grad_clip: 1.0,
            seed: 0,
            micro_batch_tokens: 8192,
            activation_checkpointing: false,
            attention_kernel: "auto".into(),
            grad_accumulation: "f32".into(),
            val_every: 0,
            val_tasks: 0,
            val_metric: "val_ndcg@10".into(),
            val_samples: 0,
            max_skipped_updates: 3,
        }
    }
}

impl TrainSpec {
    pub(crate) fn validate(self, ctx: &Ctx<'_>) -> Result<TrainConfig> {
        let d = TrainConfig::default();
        let num = |key: &str, v: Option<f64>, dv: f64, positive: bool| -> Result<f64> {
            let v = v.unwrap_or(dv);
            if !v.is_finite() || v < 0.0 || (positive && v == 0.0) {
                let want = if positive { "> 0" } else { ">= 0" };
                return Err(ctx.invalid(key, format!("{v} is not a number {want}")));
            }
            Ok(v)
        };
        let lr_schedule = match self.lr_schedule.as_deref().unwrap_or("constant") {
            "constant" => LrScheduleKind::Constant,
            "cosine" => LrScheduleKind::Cosine,
            other => {
                return Err(ctx.invalid(
                    "train.lr_schedule",
                    format!("`{other}` is not \"constant\" or \"cosine\""),
                ))
            }
        };
        let exclude = self.weight_decay_exclude.unwrap_or_default();
        if let Some(bad) = exclude
            .iter()
            .find(|e| !["norms", "biases", "embeddings"].contains(&e.as_str()))
        {
            return Err(ctx.invalid(
                "train.weight_decay_exclude",
                format!("`{bad}` is not norms, biases or embeddings"),
            ));
        }
        if !exclude.is_empty() && self.weight_decay == Some(0.0) {
            return Err(ctx.invalid(
                "train.weight_decay_exclude",
                "acts only with train.weight_decay > 0",
            ));
        }
        let val_every = self.val_every.unwrap_or(0);
        let metric_set = self.val_metric.is_some();
        let val_metric = self.val_metric.unwrap_or_else(|| d.val_metric.clone());
        if !VAL_METRICS.contains(&val_metric.as_str()) {
            return Err(ctx.invalid(
                "train.val_metric",
                format!("`{val_metric}` is not one of {}", VAL_METRICS.join(", ")),
            ));
        }
        let val_samples = ctx.range("train.val_samples", self.val_samples.unwrap_or(0), 0, 1024)?;
        if val_metric == "val_sampled_reward" && val_samples == 0 {
            return Err(ctx.invalid(
                "train.val_metric",
                "`val_sampled_reward` needs train.val_samples > 0",
            ));
        }
        for (key, set) in [
            ("train.val_tasks", self.val_tasks.is_some()),
            ("train.val_metric", metric_set),
            ("train.val_samples", self.val_samples.is_some()),
        ] {
            if set && val_every == 0 {
                return Err(ctx.invalid(key, "acts only with train.val_every > 0"));
            }
        }
        let max_skipped_updates = self.max_skipped_updates.unwrap_or(d.max_skipped_updates);
        Ok(TrainConfig {
            max_skipped_updates,
            weight_decay_exclude: exclude,
            val_every,
            val_tasks: self.val_tasks.unwrap_or(0),
            val_metric,
            val_samples,
            max_epochs: ctx.range("train.max_epochs", self.max_epochs.unwrap_or(1), 1, 1 << 20)?,
            global_batch_size: ctx.range(
                "train.global_batch_size",
                self.global_batch_size.unwrap_or(d.global_batch_size),
                1,
                1 << 20,
            )?,
            max_steps: self.max_steps.unwrap_or(0),
            lr: num("train.lr", self.lr, d.lr, true)?,
            warmup_steps: self.warmup_steps.unwrap_or(0),
            lr_schedule,
            min_lr: num("train.min_lr", self.min_lr, d.min_lr, false)?,
            weight_decay: num(
                "train.weight_decay",
                self.weight_decay,
                d.weight_decay,
                false,
            )?,
            grad_clip: num("train.grad_clip", self.grad_clip, d.grad_clip, false)?,
            seed: self.seed.unwrap_or(0),
            micro_batch_tokens: ctx.range(
                "train.micro_batch_tokens",
                self.micro_batch_tokens.unwrap_or(d.micro_batch_tokens),
                2,
                1 << 30,
            )?,
            activation_checkpointing: self
                .activation_checkpointing
                .unwrap_or(d.activation_checkpointing),
            attention_kernel: match self.attention_kernel.as_deref() {
                None => d.attention_kernel,
                Some(a @ ("auto" | "fused" | "spelled")) => a.to_string(),
                Some(other) => {
                    return Err(ctx.invalid(
                        "train.attention_kernel",
                        format!("`{other}`: expected \"auto\", \"fused\" or \"spelled\""),
                    ))
                }
            },
            grad_accumulation: match self.grad_accumulation.as_deref() {
                None => d.grad_accumulation,
                Some(a @ ("f32" | "f64")) => a.to_string(),
                Some(other) => {
                    return Err(ctx.invalid(
                        "train.grad_accumulation",
                        format!("`{other}`: expected \"f32\" or \"f64\""),
                    ))
                }
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::{EnvironmentKind, LrScheduleKind, ModelSource};
    use crate::Config;

    fn load(text: &str) -> crate::Result<Config> {
        Config::from_toml_str(text, Path::new("configs/t.toml"))
    }

    #[test]
    fn training_sections_parse_with_defaults() {
        let c = load(
            "[model]\npath = 'random:tiny'\ntokenizer = 'tok'\n[rollout]\ngroup_size = 4\n\
             environment = 'pick'\n[algorithm]\nmax_staleness = 0\nloss = 'cispo'\n\
             [train]\nglobal_batch_size = 2\nlr_schedule = 'cosine'\n[checkpoint]\nevery_steps = 5\n",
        )
        .unwrap();
        let m = c.model().unwrap();
        assert_eq!(m.source, ModelSource::RandomPreset("tiny".into()));
        assert_eq!(m.tokenizer.as_deref(), Some(Path::new("configs/tok")));
        assert_eq!((m.dtype.as_str(), m.device.as_str()), ("f32", "cpu"));
        assert_eq!(c.rollout.group_size, 4);
        assert_eq!(c.rollout.rollout_max_concurrency, 32);
        assert_eq!(c.rollout.environment, EnvironmentKind::Pick);
        assert!(c.rollout.agent.is_none());
        let a = load("[rollout]\nenvironment = 'agent'\nagent_url = 'http://127.0.0.1:9/x'\n")
            .unwrap()
            .rollout
            .agent
            .unwrap();
        assert_eq!(
            (a.url.as_str(), a.protocol.as_str(), a.listen.as_str()),
            ("http://127.0.0.1:9/x", "sagemaker", "127.0.0.1:0")
        );
        assert_eq!(
            (c.algorithm.max_staleness, c.algorithm.loss.as_str()),
            (0, "cispo")
        );
        assert_eq!(c.algorithm.tis_cap, 2.0);
        assert_eq!(c.train.global_batch_size, 2);
        assert_eq!(c.train.lr_schedule, LrScheduleKind::Cosine);
        assert_eq!(c.checkpoint.every_steps, 5);
        assert_eq!(c.checkpoint.dir, Path::new("configs/runs/t"));
        assert!(!c.logging.trajectories);
        let none = load("").unwrap();
        assert!(none.model().unwrap_err().to_string().contains("[model]"));
    }

    #[test]
    fn mistyped_keys_name_file_and_key() {
        for (text, key) in [
            ("[model]\npath = 'x'\ndtyp = 'f32'\n", "dtyp"),
            ("[rollout]\ngroup_sise = 2\n", "group_sise"),
            ("[algorithm]\nmax_stalenes = 1\n", "max_stalenes"),
            ("[train]\nglobal_batch = 1\n", "global_batch"),
            ("[checkpoint]\nkeep = 1\n", "keep"),
            ("[logging]\nprometeus = 'a'\n", "prometeus"),
        ] {
            let msg = load(text).unwrap_err().to_string();
            assert!(msg.contains(key) && msg.contains("configs/t.toml"), "{msg}");
        }
    }

    #[test]
    fn bad_values_name_the_key() {
        for (text, key) in [
            ("[model]\npath = 'random:huge'\n", "model.path"),
            ("[model]\npath = 'x'\ndtype = 'f8'\n", "model.dtype"),
            ("[model]\npath = 'x'\ndevice = 'tpu'\n", "model.device"),
            ("[rollout]\ngroup_size = 0\n", "rollout.group_size"),
            ("[rollout]\ntemperature = 0.0\n", "rollout.temperature"),
            ("[rollout]\nenvironment = 'chess'\n", "rollout.environment"),
            ("[rollout]\nenvironment = 'agent'\n", "rollout.agent_url"),
            ("[rollout]\nagent_url = 'http://a'\n", "rollout.agent_url"),
            (
                "[rollout]\nenvironment = 'agent'\nagent_url = 'ftp://a'\n",
                "rollout.agent_url",
            ),
            (
                "[rollout]\nenvironment = 'agent'\nagent_url = 'http://a'\nagent_protocol = 'x'\n",
                "rollout.agent_protocol",
            ),
            (
                "[rollout]\nenvironment = 'agent'\nagent_url = 'http://a'\nagent_listen = 'here'\n",
                "rollout.agent_listen",
            ),
            (
                "[logging]\ntrajectory_tokens = true\n",
                "logging.trajectory_tokens",
            ),
            ("[algorithm]\nloss = 'dpo'\n", "algorithm.loss"),
            ("[algorithm]\nadvantage = 'gae'\n", "algorithm.advantage"),
            ("[algorithm]\nloss_agg = 'sum'\n", "algorithm.loss_agg"),
            ("[algorithm]\ndual_clip = 0.5\n", "algorithm.dual_clip"),
            ("[algorithm]\ntis_cap = 0.5\n", "algorithm.tis_cap"),
            ("[train]\nlr = -1.0\n", "train.lr"),
            (
                "[train]\nglobal_batch_size = 0\n",
                "train.global_batch_size",
            ),
            ("[train]\nlr_schedule = 'step'\n", "train.lr_schedule"),
            (
                "[train]\nweight_decay_exclude = ['heads']\n",
                "train.weight_decay_exclude",
            ),
            (
                "[train]\nweight_decay = 0.0\nweight_decay_exclude = ['norms']\n",
                "train.weight_decay_exclude",
            ),
            ("[train]\nval_metric = 'val_reward'\n", "train.val_metric"),
            ("[train]\nval_samples = 4\n", "train.val_samples"),
            (
                "[train]\nval_every = 5\nval_metric = 'val_sampled_reward'\n",
                "train.val_metric",
            ),
            (
                "[train]\nval_every = 5\nval_samples = 5000\n",
                "train.val_samples",
            ),
            ("[checkpoint]\nkeep_last = 0\n", "checkpoint.keep_last"),
            ("[logging]\nprometheus = 'nowhere'\n", "logging.prometheus"),
        ] {
            let msg = load(text).unwrap_err().to_string();
            assert!(msg.contains(key), "{text}: {msg}");
        }
    }
}
