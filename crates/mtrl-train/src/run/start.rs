//! Where a run starts (fresh, or the newest valid checkpoint), its telemetry sinks and its rollout
//! settings.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use mtrl_core::record::parse_value;
use mtrl_core::{Config, StepRecord};
use mtrl_learner::{AdamW, AdamWConfig, CheckpointManager, TrainerState};
use mtrl_model::{Policy, SamplingParams};
use mtrl_rollout::{Faults, RolloutSettings};

use crate::bail;
use crate::error::{Context, Result, TrainError};
use crate::resume::{self, metrics_path};
use crate::setup::{self, ModelParts};
use crate::telemetry::{JsonlSink, MlflowSink, ProgressSink, PrometheusSink, Telemetry};

use super::TrainOptions;

/// `[train]`'s AdamW settings.
fn adamw_config(cfg: &Config) -> AdamWConfig {
    let ex = &cfg.train.weight_decay_exclude;
    let keep = |c: &str| !ex.iter().any(|e| e == c);
    AdamWConfig {
        weight_decay: cfg.train.weight_decay,
        decay_norms: keep("norms"),
        decay_biases: keep("biases"),
        decay_embeddings: keep("embeddings"),
        ..AdamWConfig::default()
    }
}

/// Where a run starts: a fresh policy and optimizer, or a checkpoint's.
pub(super) struct Start {
    pub(super) state: TrainerState,
    /// The mixer that mirrors the trained batches (its cursor is checkpointed).
    pub(super) shadow: mtrl_env::Mixer,
    pub(super) resumed_from: Option<u64>,
}

/// What [`start`] hands the run: where it starts, the policy and optimizer to train, and the
/// mixer rollouts draw from (ahead of the shadow mixer by the batches in flight).
pub(super) type Started = (Start, Policy, AdamW, mtrl_env::Mixer);

/// Refuses a checkpoint whose step history is not of this build's record format (the history
/// is written back to `metrics.jsonl` as typed records).
fn check_history(st: &TrainerState, ckpt: &Path) -> Result<()> {
    for (i, v) in st.metrics.iter().enumerate() {
        parse_value::<StepRecord>(v.clone()).map_err(|m| {
            TrainError::msg(format!(
                "{}: step record {} of trainer.json: {m}; resume with the mtrl that wrote it, \
                 or pass --fresh",
                ckpt.display(),
                i + 1
            ))
        })?;
    }
    Ok(())
}

/// The policy of a checkpoint's `policy/` folder: an HF checkpoint, or with LoRA the adapter
/// (PEFT's files, every tensor of the config's spec) written onto `initial`'s.
fn resume_policy(cfg: &Config, initial: Policy, dir: &Path, parts: &ModelParts) -> Result<Policy> {
    let Some(l) = &cfg.lora else {
        drop(initial);
        if mtrl_model::lora::peft::is_adapter_dir(dir) {
            bail!(
                "{} holds a LoRA adapter: add the [lora] section the run was trained with",
                dir.display()
            );
        }
        let mut p = Policy::load(dir, parts.dtype, &parts.device)?;
        crate::setup::train_options(&mut p, cfg);
        return Ok(p);
    };
    let files = mtrl_model::lora::peft::load(dir, parts.dtype, &parts.device)?;
    let want = setup::lora_spec(l);
    let mut targets = (files.spec.targets.clone(), want.targets.clone());
    targets.0.sort();
    targets.1.sort();
    let same = files.spec.rank == want.rank
        && files.spec.alpha == want.alpha
        && files.spec.rslora == want.rslora
        && targets.0 == targets.1;
    if !same {
        bail!(
            "{}: the adapter is rank {} / alpha {} / rslora {} on {}, [lora] says {} / {} / {} on {}",
            dir.display(),
            files.spec.rank,
            files.spec.alpha,
            files.spec.rslora,
            targets.0.join(","),
            want.rank,
            want.alpha,
            want.rslora,
            targets.1.join(",")
        );
    }
    mtrl_model::lora::check_tensors(initial.config(), &want, &files.tensors)
        .with_context(|| format!("the adapter in {}", dir.display()))?;
    let mut p = initial;
    p.set_weights(&files.tensors.into_iter().collect())?;
    Ok(p)
}

/// A fresh start from `initial`, or the newest valid checkpoint `latest` (then `initial` is
/// dropped: it was loaded to check that the tokenizer fits the architecture; with LoRA it is the
/// frozen base the checkpoint's adapter goes on).
pub(super) fn start(
    cfg: &Config,
    data: &setup::Data,
    initial: Policy,
    latest: Option<&Path>,
    parts: &ModelParts,
    lead: bool,
) -> Result<Started> {
    let mut state = TrainerState {
        config_hash: resume::config_hash(cfg),
        resume_keys: resume::resume_keys(cfg),
        ..TrainerState::default()
    };
    let (mut shadow, mut mixer) = (data.mixer()?, data.mixer()?);
    let Some(ckpt) = latest else {
        let opt = AdamW::new(adamw_config(cfg));
        let s = Start {
            state,
            shadow,
            resumed_from: None,
        };
        return Ok((s, initial, opt, mixer));
    };
    let st = CheckpointManager::load_state(ckpt)?;
    resume::check_resume_keys(cfg, &st, ckpt)?;
    let policy = resume_policy(cfg, initial, &ckpt.join("policy"), parts)
        .with_context(|| format!("loading the policy of {}", ckpt.display()))?;
    let mut opt = AdamW::load(ckpt, &parts.device)?;
    // The config's decay settings act on a resumed run too (the moments come from the file).
    opt.config = adamw_config(cfg);
    let cursor = serde_json::from_value(st.data_cursor.clone())
        .with_context(|| format!("the dataset cursor of {}", ckpt.display()))?;
    shadow.restore(cursor)?;
    mixer.restore(shadow.cursor())?;
    if lead {
        eprintln!("resuming from {} (step {})", ckpt.display(), st.step);
    }
    check_history(&st, ckpt)?;
    state.step = st.step;
    state.policy_version = st.policy_version;
    state.metrics = st.metrics;
    // `best.json` follows the checkpoint (a kill may have come between the two writes).
    if let Some(best) = st.best.as_ref().filter(|_| lead) {
        crate::validate::write_best(&cfg.checkpoint.dir, best)?;
    }
    state.best = st.best;
    let s = Start {
        state,
        shadow,
        resumed_from: Some(st.step),
    };
    Ok((s, policy, opt, mixer))
}

/// The config's sinks (JSONL always; Prometheus and MLflow as `[logging]` says; the bar when
/// asked) plus the caller's.
pub(super) fn telemetry(
    cfg: &Config,
    opts: &mut TrainOptions,
    s: &Start,
    until: u64,
    lead: bool,
) -> Result<Telemetry> {
    let mut t = Telemetry::new();
    if !lead {
        // Rank 0 writes the run's records; the other ranks keep only the caller's sinks.
        for sink in opts.sinks.drain(..) {
            t.push(sink);
        }
        return Ok(t);
    }
    t.push(Box::new(JsonlSink::create(
        &metrics_path(cfg),
        &s.state.metrics,
    )?));
    // The per-rank rollout log is cut back to the resumed step, as the records are.
    crate::data_parallel::cut_ranks_log(
        &cfg.checkpoint.dir.join("rollout-ranks.jsonl"),
        s.state.step,
    )?;
    if let Some(addr) = &cfg.logging.prometheus {
        t.push(Box::new(PrometheusSink::start(addr)?));
    }
    let dir = &cfg.checkpoint.dir;
    if let Some(m) = MlflowSink::start(cfg, &cfg.name, dir, s.resumed_from.is_some())? {
        t.push(Box::new(m));
    }
    if opts.progress {
        t.push(Box::new(ProgressSink::train(until, s.state.step)));
    }
    for sink in opts.sinks.drain(..) {
        t.push(sink);
    }
    Ok(t)
}

/// Rollouts from step `step` (learner at `version`) up to `until`.
pub(super) fn rollout_settings(
    cfg: &Config,
    parts: &ModelParts,
    step: u64,
    version: u64,
    until: u64,
    faults: Arc<Faults>,
    shard: mtrl_rollout::Shard,
) -> RolloutSettings {
    let b = cfg.train.global_batch_size;
    RolloutSettings {
        group_size: cfg.rollout.group_size,
        max_concurrency: cfg.rollout.rollout_max_concurrency,
        global_batch_size: b,
        max_staleness: cfg.algorithm.max_staleness,
        sampling: SamplingParams {
            temperature: cfg.rollout.temperature,
            top_p: cfg.rollout.top_p,
            top_k: cfg.rollout.top_k,
            seed: 0,
        },
        seed: cfg.train.seed,
        stop_token_ids: parts.codec.stop_token_ids(),
        first_group: step * b as u64,
        version,
        end_group: Some(until * b as u64),
        timeout: cfg.rollout.timeout_s.map(Duration::from_secs_f64),
        max_retries: cfg.rollout.max_retries,
        max_failed_fraction: cfg.rollout.max_failed_fraction,
        faults,
        shard,
        weight_sync: cfg.rollout.weight_sync,
        sampled_logprobs: cfg.rollout.behaviour_logprobs
            == mtrl_core::config::BehaviourLogprobs::Sampled,
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use mtrl_core::Config;

    /// A resumed full fine-tuning run reloads its policy from the checkpoint: `[train]
    /// activation_checkpointing` must reach that policy too, not only the initial one.
    #[test]
    fn a_resumed_policy_keeps_activation_checkpointing() {
        let repo = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
        let text = std::fs::read_to_string(repo.join("configs/cpu-train-smoke-bf16.toml")).unwrap();
        assert!(text.contains("activation_checkpointing = true"));
        let cfg = Config::from_toml_str(&text, &repo.join("configs/x.toml")).unwrap();
        let parts = crate::setup::model_parts(&cfg).unwrap();
        let initial = crate::setup::initial_policy(&cfg, &parts).unwrap();
        let dir = tempfile::tempdir().unwrap();
        initial.save(dir.path(), candle_core::DType::F32).unwrap();
        let resumed = super::resume_policy(&cfg, initial, dir.path(), &parts).unwrap();
        assert!(resumed.activation_checkpointing());
    }
}
