//! `[hyperparameters]`: the managed service's flat names, as-is.
//!
//! A user with a SageMaker AI multi-turn RL job pastes its hyperparameter dict converted to TOML;
//! each name maps onto one key of our sections, and values may be numbers or the strings the
//! service's dicts often hold (`learning_rate = "1e-6"`):
//!
//! | service name | our key |
//! |---|---|
//! | `global_batch_size` | `train.global_batch_size` |
//! | `group_size` | `rollout.group_size` |
//! | `advantage_method` | `algorithm.advantage` (`group_based` = `grpo`, `grpo_passk` = `grpo_pass_at_k`, others by name) |
//! | `loss_fn` | `algorithm.loss` (`importance_sampling` = `is`) |
//! | `clip_low_threshold` t | `algorithm.clip_low` = 1 − t (the service bounds the ratio itself) |
//! | `clip_high_threshold` t | `algorithm.clip_high` = t − 1 |
//! | `temperature`, `sampling_top_p` | `rollout.temperature`, `rollout.top_p` |
//! | `sampling_max_tokens` | `env.max_tokens_per_turn` |
//! | `max_epochs`, `max_steps`, `learning_rate` | `train.max_epochs`, `train.max_steps`, `train.lr` |
//! | `val_every` | `train.val_every` |
//! | `async_config.max_steps_off_policy` | `algorithm.max_staleness` |
//! | `rollout_max_concurrency` | `rollout.rollout_max_concurrency` |
//! | `rollout_timeout`, `rollout_max_retries` | `rollout.timeout_s`, `rollout.max_retries` |
//! | `pass_k_values` (one k) | `algorithm.pass_k` |
//! | `success_threshold` | `algorithm.success_threshold` |
//! | `lora_rank`, `lora_alpha` | `lora.rank`, `lora.alpha` (either one turns LoRA on) |
//!
//! A key set both here and in its section is an error naming both; an unknown name or a value
//! we do not support is an error naming the key, never ignored. With this table present, the
//! service's defaults fill what neither sets: clip thresholds 0.8 / 1.2 (PPO, CISPO) and an
//! untruncated `importance_sampling` (`tis_cap = 0`).

use serde::Deserialize;

use super::{ConfigSpec, Ctx};
use crate::error::Result;

/// A number, or a string holding one.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Num {
    Int(i64),
    Float(f64),
    Text(String),
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AsyncConfig {
    pub max_steps_off_policy: Option<Num>,
}

/// What `[hyperparameters]` holds: exactly the service's names.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HyperparametersSpec {
    pub global_batch_size: Option<Num>,
    pub group_size: Option<Num>,
    pub advantage_method: Option<String>,
    pub loss_fn: Option<String>,
    pub clip_low_threshold: Option<Num>,
    pub clip_high_threshold: Option<Num>,
    pub temperature: Option<Num>,
    pub sampling_top_p: Option<Num>,
    pub sampling_max_tokens: Option<Num>,
    pub max_epochs: Option<Num>,
    pub max_steps: Option<Num>,
    pub val_every: Option<Num>,
    pub learning_rate: Option<Num>,
    pub lora_rank: Option<Num>,
    pub lora_alpha: Option<Num>,
    pub async_config: Option<AsyncConfig>,
    pub rollout_max_concurrency: Option<Num>,
    pub rollout_timeout: Option<Num>,
    pub rollout_max_retries: Option<Num>,
    pub pass_k_values: Option<PassK>,
    pub success_threshold: Option<Num>,
}

/// `pass_k_values`: a list (the service's form) or one k.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum PassK {
    One(Num),
    Many(Vec<Num>),
}

/// The service's advantage names and ours.
const ADVANTAGE_NAMES: &[(&str, &str)] =
    &[("group_based", "grpo"), ("grpo_passk", "grpo_pass_at_k")];

impl Num {
    fn float(&self, ctx: &Ctx<'_>, key: &str) -> Result<f64> {
        let v = match self {
            Num::Int(i) => *i as f64,
            Num::Float(f) => *f,
            Num::Text(s) => s
                .trim()
                .parse::<f64>()
                .map_err(|_| ctx.invalid(key, format!("`{s}` is not a number")))?,
        };
        if !v.is_finite() {
            return Err(ctx.invalid(key, format!("{v} is not a finite number")));
        }
        Ok(v)
    }

    fn uint(&self, ctx: &Ctx<'_>, key: &str) -> Result<u64> {
        let v = self.float(ctx, key)?;
        if v < 0.0 || v.fract() != 0.0 || v > u64::MAX as f64 {
            return Err(ctx.invalid(key, format!("{v} is not a whole number >= 0")));
        }
        Ok(v as u64)
    }
}

/// Moves `value` into `slot`, refusing a slot the section already set; notes the mapping.
fn put<T>(
    log: &mut Vec<(String, String)>,
    ctx: &Ctx<'_>,
    slot: &mut Option<T>,
    value: T,
    ours: &str,
    theirs: &str,
) -> Result<()> {
    let theirs = format!("hyperparameters.{theirs}");
    if slot.is_some() {
        return Err(ctx.invalid(&theirs, format!("is set here and as {ours}: keep one")));
    }
    *slot = Some(value);
    log.push((ours.to_string(), theirs));
    Ok(())
}

/// Renames our key in a validation error to the service name the value came from.
pub(crate) fn blame(err: crate::CoreError, mapped: &[(String, String)]) -> crate::CoreError {
    match err {
        crate::CoreError::Invalid { path, key, message } => {
            match mapped.iter().find(|(ours, _)| *ours == key) {
                Some((ours, theirs)) => crate::CoreError::Invalid {
                    path,
                    key: theirs.clone(),
                    message: format!("{message} (as {ours})"),
                },
                None => crate::CoreError::Invalid { path, key, message },
            }
        }
        other => other,
    }
}

impl HyperparametersSpec {
    /// Writes every name into `spec`'s sections (created when absent); returns which of our keys
    /// came from which service name.
    pub(crate) fn apply(
        self,
        ctx: &Ctx<'_>,
        spec: &mut ConfigSpec,
    ) -> Result<Vec<(String, String)>> {
        let mut log = Vec::new();
        let key = |k: &str| format!("hyperparameters.{k}");
        if self.lora_rank.is_some() || self.lora_alpha.is_some() {
            let lora = spec.lora.get_or_insert_with(Default::default);
            if let Some(v) = &self.lora_rank {
                let n = v.uint(ctx, &key("lora_rank"))? as usize;
                put(&mut log, ctx, &mut lora.rank, n, "lora.rank", "lora_rank")?;
            }
            if let Some(v) = &self.lora_alpha {
                let a = v.float(ctx, &key("lora_alpha"))?;
                put(
                    &mut log,
                    ctx,
                    &mut lora.alpha,
                    a,
                    "lora.alpha",
                    "lora_alpha",
                )?;
            }
        }
        let train = spec.train.get_or_insert_with(Default::default);
        let rollout = spec.rollout.get_or_insert_with(Default::default);
        let algo = spec.algorithm.get_or_insert_with(Default::default);
        let uint = |v: &Num, k: &str| v.uint(ctx, &key(k));
        let float = |v: &Num, k: &str| v.float(ctx, &key(k));
        if let Some(v) = &self.global_batch_size {
            let n = uint(v, "global_batch_size")? as usize;
            put(
                &mut log,
                ctx,
                &mut train.global_batch_size,
                n,
                "train.global_batch_size",
                "global_batch_size",
            )?;
        }
        if let Some(v) = &self.max_epochs {
            let n = uint(v, "max_epochs")? as usize;
            put(
                &mut log,
                ctx,
                &mut train.max_epochs,
                n,
                "train.max_epochs",
                "max_epochs",
            )?;
        }
        if let Some(v) = &self.max_steps {
            let n = uint(v, "max_steps")?;
            put(
                &mut log,
                ctx,
                &mut train.max_steps,
                n,
                "train.max_steps",
                "max_steps",
            )?;
        }
        if let Some(v) = &self.val_every {
            let n = uint(v, "val_every")?;
            put(
                &mut log,
                ctx,
                &mut train.val_every,
                n,
                "train.val_every",
                "val_every",
            )?;
        }
        if let Some(v) = &self.learning_rate {
            let x = float(v, "learning_rate")?;
            put(&mut log, ctx, &mut train.lr, x, "train.lr", "learning_rate")?;
        }
        if let Some(v) = &self.group_size {
            let n = uint(v, "group_size")? as usize;
            put(
                &mut log,
                ctx,
                &mut rollout.group_size,
                n,
                "rollout.group_size",
                "group_size",
            )?;
        }
        if let Some(v) = &self.temperature {
            let x = float(v, "temperature")?;
            put(
                &mut log,
                ctx,
                &mut rollout.temperature,
                x,
                "rollout.temperature",
                "temperature",
            )?;
        }
        if let Some(v) = &self.sampling_top_p {
            let x = float(v, "sampling_top_p")?;
            put(
                &mut log,
                ctx,
                &mut rollout.top_p,
                x,
                "rollout.top_p",
                "sampling_top_p",
            )?;
        }
        if let Some(v) = &self.rollout_max_concurrency {
            let n = uint(v, "rollout_max_concurrency")? as usize;
            let ours = "rollout.rollout_max_concurrency";
            put(
                &mut log,
                ctx,
                &mut rollout.rollout_max_concurrency,
                n,
                ours,
                "rollout_max_concurrency",
            )?;
        }
        if let Some(v) = &self.rollout_timeout {
            let x = float(v, "rollout_timeout")?;
            put(
                &mut log,
                ctx,
                &mut rollout.timeout_s,
                x,
                "rollout.timeout_s",
                "rollout_timeout",
            )?;
        }
        if let Some(v) = &self.rollout_max_retries {
            let n = uint(v, "rollout_max_retries")? as usize;
            put(
                &mut log,
                ctx,
                &mut rollout.max_retries,
                n,
                "rollout.max_retries",
                "rollout_max_retries",
            )?;
        }
        if let Some(v) = &self.sampling_max_tokens {
            let n = uint(v, "sampling_max_tokens")? as usize;
            let env = spec.env.get_or_insert_with(Default::default);
            let ours = "env.max_tokens_per_turn";
            put(
                &mut log,
                ctx,
                &mut env.max_tokens_per_turn,
                n,
                ours,
                "sampling_max_tokens",
            )?;
        }
        if let Some(name) = self.advantage_method {
            let ours = ADVANTAGE_NAMES
                .iter()
                .find(|(s, _)| *s == name)
                .map_or(name.as_str(), |(_, o)| *o);
            if !super::ADVANTAGES.contains(&ours) {
                return Err(ctx.invalid(
                    &key("advantage_method"),
                    format!("`{name}` is not one this build supports"),
                ));
            }
            let ours = ours.to_string();
            put(
                &mut log,
                ctx,
                &mut algo.advantage,
                ours,
                "algorithm.advantage",
                "advantage_method",
            )?;
        }
        if let Some(name) = self.loss_fn {
            let ours = match name.as_str() {
                "importance_sampling" => "is",
                "ppo" => "ppo",
                "cispo" => "cispo",
                _ => {
                    return Err(ctx.invalid(
                        &key("loss_fn"),
                        format!("`{name}` is not importance_sampling, ppo or cispo"),
                    ))
                }
            };
            put(
                &mut log,
                ctx,
                &mut algo.loss,
                ours.to_string(),
                "algorithm.loss",
                "loss_fn",
            )?;
        }
        if let Some(v) = &self.clip_low_threshold {
            let t = float(v, "clip_low_threshold")?;
            if !(0.0..=1.0).contains(&t) {
                return Err(ctx.invalid(
                    &key("clip_low_threshold"),
                    format!("{t} is outside [0, 1] (it bounds the ratio from below)"),
                ));
            }
            put(
                &mut log,
                ctx,
                &mut algo.clip_low,
                1.0 - t,
                "algorithm.clip_low",
                "clip_low_threshold",
            )?;
        }
        if let Some(v) = &self.clip_high_threshold {
            let t = float(v, "clip_high_threshold")?;
            if t < 1.0 {
                return Err(ctx.invalid(
                    &key("clip_high_threshold"),
                    format!("{t} is below 1 (it bounds the ratio from above)"),
                ));
            }
            put(
                &mut log,
                ctx,
                &mut algo.clip_high,
                t - 1.0,
                "algorithm.clip_high",
                "clip_high_threshold",
            )?;
        }
        if let Some(v) = self.async_config.and_then(|a| a.max_steps_off_policy) {
            let n = uint(&v, "async_config.max_steps_off_policy")?;
            let theirs = "async_config.max_steps_off_policy";
            put(
                &mut log,
                ctx,
                &mut algo.max_staleness,
                n,
                "algorithm.max_staleness",
                theirs,
            )?;
        }
        if let Some(v) = &self.pass_k_values {
            let ks = match v {
                PassK::One(k) => vec![k.clone()],
                PassK::Many(ks) => ks.clone(),
            };
            let [k] = ks.as_slice() else {
                return Err(ctx.invalid(
                    &key("pass_k_values"),
                    format!("{} values given; training takes one k", ks.len()),
                ));
            };
            let k = uint(k, "pass_k_values")? as usize;
            put(
                &mut log,
                ctx,
                &mut algo.pass_k,
                k,
                "algorithm.pass_k",
                "pass_k_values",
            )?;
        }
        if let Some(v) = &self.success_threshold {
            let x = float(v, "success_threshold")?;
            let ours = "algorithm.success_threshold";
            put(
                &mut log,
                ctx,
                &mut algo.success_threshold,
                x,
                ours,
                "success_threshold",
            )?;
        }
        // The service's defaults where its names leave a knob of ours unset: ratio bounds
        // 0.8 / 1.2, and an untruncated importance-sampling loss.
        let loss = algo.loss.clone().unwrap_or_else(|| "ppo".into());
        if loss == "is" {
            algo.tis_cap.get_or_insert(0.0);
        } else {
            algo.clip_low.get_or_insert(0.2);
            algo.clip_high.get_or_insert(0.2);
        }
        Ok(log)
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::Config;

    fn load(text: &str) -> crate::Result<Config> {
        Config::from_toml_str(text, Path::new("configs/h.toml"))
    }

    #[test]
    fn the_service_names_map_onto_our_keys() {
        let c = load(
            "[hyperparameters]\nglobal_batch_size = 4\ngroup_size = '6'\n\
             advantage_method = 'group_based'\nloss_fn = 'importance_sampling'\n\
             temperature = 0.7\nsampling_top_p = 0.9\nsampling_max_tokens = 96\n\
             max_epochs = 2\nmax_steps = 5\nval_every = 3\nlearning_rate = '1e-6'\n\
             rollout_max_concurrency = 3\nrollout_timeout = 30\nrollout_max_retries = 4\n\
             async_config = { max_steps_off_policy = 1 }\n",
        )
        .unwrap();
        assert_eq!((c.train.global_batch_size, c.rollout.group_size), (4, 6));
        assert_eq!(
            (c.algorithm.advantage.as_str(), c.algorithm.loss.as_str()),
            ("grpo", "is")
        );
        assert_eq!((c.rollout.temperature, c.rollout.top_p), (0.7, 0.9));
        assert_eq!(c.env.as_ref().unwrap().max_tokens_per_turn, 96);
        assert_eq!(
            (c.train.max_epochs, c.train.max_steps, c.train.val_every),
            (2, 5, 3)
        );
        assert_eq!(c.train.lr, 1e-6);
        assert_eq!(c.rollout.rollout_max_concurrency, 3);
        assert_eq!(
            (c.rollout.timeout_s, c.rollout.max_retries),
            (Some(30.0), 4)
        );
        assert_eq!(c.algorithm.max_staleness, 1);
        // The service's IS loss is untruncated.
        assert_eq!(c.algorithm.tis_cap, 0.0);
        // Its PPO bounds default to 0.8 / 1.2 (ours to 0.8 / 1.28).
        let c = load("[hyperparameters]\nloss_fn = 'ppo'\n").unwrap();
        assert!((c.algorithm.clip_high - 0.2).abs() < 1e-12);
        assert_eq!(load("").unwrap().algorithm.clip_high, 0.28);

        let c = load(
            "[hyperparameters]\nloss_fn = 'ppo'\nclip_low_threshold = 0.8\n\
             clip_high_threshold = 1.2\nadvantage_method = 'grpo_passk'\n\
             pass_k_values = [4]\nsuccess_threshold = 0.3\n",
        )
        .unwrap();
        let a = &c.algorithm;
        assert!((a.clip_low - 0.2).abs() < 1e-12 && (a.clip_high - 0.2).abs() < 1e-12);
        assert_eq!(
            (a.advantage.as_str(), a.pass_k, a.success_threshold),
            ("grpo_pass_at_k", 4, 0.3)
        );
    }

    #[test]
    fn a_key_set_both_ways_names_both() {
        let msg = load("[train]\nlr = 1e-5\n[hyperparameters]\nlearning_rate = 1e-6\n")
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("hyperparameters.learning_rate") && msg.contains("train.lr"),
            "{msg}"
        );
        let msg = load("[algorithm]\nmax_staleness = 0\n[hyperparameters.async_config]\nmax_steps_off_policy = 2\n")
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("async_config.max_steps_off_policy")
                && msg.contains("algorithm.max_staleness"),
            "{msg}"
        );
    }

    #[test]
    fn unknown_or_unsupported_values_name_the_key() {
        for (text, key) in [
            ("[hyperparameters]\nlearnig_rate = 1\n", "learnig_rate"),
            (
                "[hyperparameters]\nloss_fn = 'dpo'\n",
                "hyperparameters.loss_fn",
            ),
            (
                "[hyperparameters]\nadvantage_method = 'gae'\n",
                "hyperparameters.advantage_method",
            ),
            (
                "[hyperparameters]\nlora_rank = 0\n",
                "hyperparameters.lora_rank",
            ),
            (
                "[hyperparameters]\nlora_alpha = 'x'\n",
                "hyperparameters.lora_alpha",
            ),
            (
                "[lora]\nrank = 8\n[hyperparameters]\nlora_rank = 16\n",
                "hyperparameters.lora_rank",
            ),
            (
                "[hyperparameters]\nlearning_rate = 'fast'\n",
                "hyperparameters.learning_rate",
            ),
            (
                "[hyperparameters]\nclip_low_threshold = 1.3\n",
                "hyperparameters.clip_low_threshold",
            ),
            (
                "[hyperparameters]\nclip_high_threshold = 0.9\n",
                "hyperparameters.clip_high_threshold",
            ),
            (
                "[hyperparameters]\npass_k_values = [1, 4]\n",
                "hyperparameters.pass_k_values",
            ),
            (
                "[hyperparameters]\ngroup_size = 2.5\n",
                "hyperparameters.group_size",
            ),
            // Range checks of our sections name the service key the value came from.
            (
                "[hyperparameters]\nsampling_top_p = 1.5\n",
                "hyperparameters.sampling_top_p",
            ),
            (
                "[hyperparameters]\ngroup_size = 0\n",
                "hyperparameters.group_size",
            ),
            (
                "[hyperparameters]\nasync_config.max_steps_of_policy = 1\n",
                "max_steps_of_policy",
            ),
        ] {
            let msg = load(text).unwrap_err().to_string();
            assert!(msg.contains(key), "{text}: {msg}");
        }
    }

    #[test]
    fn lora_names_turn_the_adapter_on() {
        let c = crate::Config::from_toml_str(
            "[hyperparameters]\nlora_rank = '16'\nlora_alpha = 32\n",
            std::path::Path::new("h.toml"),
        )
        .unwrap();
        let l = c.lora.unwrap();
        assert_eq!((l.rank, l.alpha, l.target_modules.len()), (16, 32.0, 7));
        let c = crate::Config::from_toml_str("[lora]\n", std::path::Path::new("l.toml")).unwrap();
        let l = c.lora.unwrap();
        assert_eq!((l.rank, l.alpha, l.serving.as_str()), (32, 64.0, "auto"));
        let none = crate::Config::from_toml_str("", std::path::Path::new("n.toml")).unwrap();
        assert!(none.lora.is_none());
        for (text, key) in [
            (
                "[lora]\ntarget_modules = ['lm_head']\n",
                "lora.target_modules",
            ),
            ("[lora]\ndropout = 1.0\n", "lora.dropout"),
            ("[lora]\nserving = 'fused'\n", "lora.serving"),
            ("[lora]\nrank = 0\n", "lora.rank"),
        ] {
            let e = crate::Config::from_toml_str(text, std::path::Path::new("l.toml"))
                .unwrap_err()
                .to_string();
            assert!(e.contains(key), "{text}: {e}");
        }
    }
}
