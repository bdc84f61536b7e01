//! Building the pieces of a training run from a validated config: device, tokenizer and codec,
//! the initial (or seeded random) policy, task mixers, the search index, the environment factory
//! and the step config.

use std::path::Path;
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use mtrl_core::config::{EnvironmentKind, LrScheduleKind, ModelSource};
use mtrl_core::rng::SplitMix64;
use mtrl_core::{ChatCodec, Config};
use mtrl_env::{Mixer, SearchEnv, TaskSets};
use mtrl_learner::{Decay, LrSchedule, StepConfig};
use mtrl_model::policy::parameter_shapes;
use mtrl_model::{EngineOptions, LoraServing, LoraSpec, Policy, TemplateCodec, Tokenizer};
use mtrl_rollout::{in_process, Driver, EnvFactory, PickEnv};
use mtrl_search::index::BuildReport;
use mtrl_search::SearchIndex;

use crate::bail;
use crate::error::{Context, Result};
use crate::telemetry::IndexBar;

/// The architecture of `random:tiny` (the tiny Qwen3 of the test fixtures, vocabulary 2000).
const TINY: &str = r#"{"architectures":["Qwen3ForCausalLM"],"attention_bias":false,
"bos_token_id":1991,"eos_token_id":1993,"head_dim":16,"hidden_act":"silu","hidden_size":64,
"intermediate_size":128,"max_position_embeddings":1024,"model_type":"qwen3",
"num_attention_heads":4,"num_hidden_layers":2,"num_key_value_heads":2,"rms_norm_eps":1e-06,
"rope_theta":1000000.0,"tie_word_embeddings":true,"torch_dtype":"float32","vocab_size":2000}"#;

pub struct ModelParts {
    pub device: Device,
    pub dtype: DType,
    pub tokenizer: Arc<Tokenizer>,
    pub codec: Arc<dyn ChatCodec>,
}

/// The folder of the tokenizer files: `model.tokenizer`, else the checkpoint folder.
pub fn tokenizer_dir(cfg: &Config) -> Result<std::path::PathBuf> {
    let m = cfg.model()?;
    Ok(match (&m.tokenizer, &m.source) {
        (Some(t), _) => t.clone(),
        (None, ModelSource::Dir(d)) => d.clone(),
        (None, _) => bail!(
            "{}: `model.tokenizer` is needed when `model.path` is random",
            cfg.source.display()
        ),
    })
}

pub fn model_parts(cfg: &Config) -> Result<ModelParts> {
    let m = cfg.model()?;
    let device = mtrl_model::parse_device(&m.device)?;
    let dtype = mtrl_model::parse_dtype(&m.dtype)?;
    let tok_dir = tokenizer_dir(cfg)?;
    let tokenizer = Arc::new(
        Tokenizer::from_dir(&tok_dir)
            .with_context(|| format!("loading the tokenizer from {}", tok_dir.display()))?,
    );
    let codec: Arc<dyn ChatCodec> = Arc::new(TemplateCodec::qwen(tokenizer.clone())?);
    Ok(ModelParts {
        device,
        dtype,
        tokenizer,
        codec,
    })
}

/// Normal(0, 0.02) weights (norms at 1) from a SplitMix64 stream seeded by `seed`: the same seed
/// gives the same bits on every machine.
pub fn seeded_random(
    config: mtrl_model::Config,
    dtype: DType,
    dev: &Device,
    seed: u64,
) -> Result<Policy> {
    let mut rng = SplitMix64(seed ^ 0x5eed);
    let mut tensors = std::collections::HashMap::new();
    for (name, shape) in parameter_shapes(&config) {
        let n: usize = shape.iter().product();
        let v: Vec<f32> = if shape.len() == 1 && name.contains("norm") {
            vec![1.0; n]
        } else {
            (0..n)
                .map(|_| {
                    let (u1, u2) = (rng.next_f64().max(1e-300), rng.next_f64());
                    ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos() * 0.02) as f32
                })
                .collect()
        };
        tensors.insert(name, Tensor::from_vec(v, shape, &Device::Cpu)?);
    }
    Ok(Policy::from_tensors(config, tensors, dtype, dev)?)
}

/// The policy `[model]` names, before any training.
pub fn initial_policy(cfg: &Config, parts: &ModelParts) -> Result<Policy> {
    let m = cfg.model()?;
    let (dtype, dev, seed) = (parts.dtype, &parts.device, cfg.train.seed);
    let mut p = match &m.source {
        ModelSource::Dir(d) => Policy::load(d, dtype, dev)
            .with_context(|| format!("loading the policy from {}", d.display()))?,
        ModelSource::RandomPreset(_) => {
            let raw: serde_json::Value = serde_json::from_str(TINY)?;
            let c = mtrl_model::Config::from_value(raw, Path::new("random:tiny"))?;
            seeded_random(c, dtype, dev, seed)?
        }
        ModelSource::RandomConfig(p) => {
            let c = mtrl_model::Config::from_file(p)?;
            seeded_random(c, dtype, dev, seed)?
        }
    };
    parts.tokenizer.check_vocab(p.config().vocab_size)?;
    train_options(&mut p, cfg);
    match &cfg.lora {
        // A fresh adapter (B = 0: the policy starts as the base), drawn from the run's seed.
        Some(l) if l.init.is_none() => Ok(p.with_lora(lora_spec(l), None, seed)?),
        Some(l) => {
            let dir = l.init.as_deref().unwrap_or(Path::new(""));
            let p = p.load_adapter(dir).with_context(|| {
                format!(
                    "{}: `lora.init`: loading the adapter in {}",
                    cfg.source.display(),
                    dir.display()
                )
            })?;
            let (want, got) = (lora_spec(l), p.lora().cloned());
            if got.as_ref() != Some(&want) {
                crate::bail!(
                    "{}: `lora.init` {} is an adapter of {got:?}, but [lora] asks for {want:?}",
                    cfg.source.display(),
                    dir.display()
                );
            }
            Ok(p)
        }
        None => Ok(p),
    }
}

/// An independent copy of `p` (own storage for what trains; a LoRA policy's frozen base is
/// shared), for the generation engine or a frozen reference ([`Policy::fork`]: the copies have
/// finished on the device when this returns, as the engine thread launches on its own CUDA
/// stream).
pub fn copy_policy(p: &Policy) -> Result<Policy> {
    Ok(p.fork()?)
}

/// The copy of `p` a generation engine serves, with the adapter applied as `[lora] serving` says.
/// Full fine-tuning: on a device of its own ([`mtrl_model::engine_device`]: on a GPU its own
/// stream and cuBLAS handle). LoRA: on `p`'s device, sharing the frozen base (one stream for
/// both threads; see `mtrl_model::device` for the ordering rules).
pub fn engine_policy(cfg: &Config, p: &Policy) -> Result<Policy> {
    let mut e = if cfg.lora.is_some() {
        p.fork()?
    } else {
        p.fork_to(&mtrl_model::engine_device(p.device())?)?
    };
    if let Some(l) = &cfg.lora {
        e.set_lora_serving(lora_serving(&l.serving, p.device(), p.dtype()))?;
    }
    Ok(e)
}

/// `[lora] serving` as the model crate's enum (validated by the config): `auto` merges on the
/// CPU in f32 (decode measured 0.97–0.98× full fine-tuning's merged against 0.79–0.84× unmerged
/// on bench-small, rank 32 / 8) and stays unmerged elsewhere: on a GPU the engine then shares the
/// frozen base, and in bf16/f16 a merged copy would round the adapter's small updates away
/// (the config refuses an explicit `merged` there).
pub fn lora_serving(s: &str, device: &Device, dtype: DType) -> LoraServing {
    match s {
        "merged" => LoraServing::Merged,
        "auto" if device.is_cpu() && dtype == DType::F32 => LoraServing::Merged,
        _ => LoraServing::Unmerged,
    }
}

/// The adapter `[lora]` asks for, in the model crate's terms.
pub fn lora_spec(l: &mtrl_core::config::LoraConfig) -> LoraSpec {
    LoraSpec {
        rank: l.rank,
        alpha: l.alpha,
        targets: l.target_modules.clone(),
        dropout: l.dropout,
        rslora: l.rslora,
        layers: l.layers_to_transform.clone(),
    }
}

/// The rollout engine's batching and memory for `policy`, from `[rollout]`: by default every
/// episode in flight may keep its whole context resident between turns
/// (`rollout_max_concurrency` × `env.max_context_tokens` positions, plus a batch of joiners'
/// prompts); `kv_cache_tokens` bounds the store in positions, `kv_cache_fraction` in a share of
/// the device's memory (converted with the policy's bytes per position).
pub fn engine_options(cfg: &Config, policy: &Policy) -> Result<EngineOptions> {
    let r = &cfg.rollout;
    let default =
        (r.rollout_max_concurrency + r.max_batch) * cfg.env_or_default().max_context_tokens;
    let tokens = match (r.kv_cache_tokens, r.kv_cache_fraction) {
        (Some(n), _) => n,
        (None, Some(f)) => kv_tokens_of_fraction(policy, f)?,
        (None, None) => default,
    };
    Ok(EngineOptions {
        max_batch: r.max_batch,
        kv_cache_tokens: Some(tokens),
        prefill_chunk_tokens: r.prefill_chunk_tokens,
        attention: mtrl_model::EngineAttention::parse(&r.engine_attention).unwrap_or_default(),
    })
}

/// The positions `fraction` of `policy`'s device memory holds in its key/value store.
pub fn kv_tokens_of_fraction(policy: &Policy, fraction: f64) -> Result<usize> {
    let c = policy.config();
    let per = mtrl_model::kv_pool::KvPool::bytes_per_token(
        c.num_hidden_layers,
        c.num_key_value_heads,
        c.head_dim,
        policy.dtype(),
    );
    let total = mtrl_model::device::memory_bytes(policy.device())?;
    let tokens = ((total as f64 * fraction) / per.max(1) as f64) as usize;
    mtrl_core::trace!(
        "rollout.kv_cache_fraction {fraction}: {tokens} positions of {per} bytes ({} MB of {} MB)",
        (tokens * per) >> 20,
        total >> 20
    );
    Ok(tokens.max(2))
}

pub struct Data {
    pub sets: TaskSets,
    pub seed: u64,
    pub tasks: usize,
}

pub fn load_data(cfg: &Config) -> Result<Data> {
    let d = cfg.data()?;
    if d.train.is_empty() {
        bail!("{}: `data.train` names no task file", cfg.source.display());
    }
    let sets = TaskSets::load(d)?;
    let tasks = sets.train.iter().map(|s| s.tasks.len()).sum();
    Ok(Data {
        sets,
        seed: d.seed,
        tasks,
    })
}

impl Data {
    pub fn mixer(&self) -> Result<Mixer> {
        Ok(Mixer::new(self.sets.train.clone(), self.seed)?)
    }
}

/// How every episode runs, as `[rollout] environment` says: in-process environments, or the
/// user's agent behind `agent` (started by [`crate::agent::AgentHost::start`]).
pub fn driver(
    cfg: &Config,
    data: &Data,
    codec: Arc<dyn ChatCodec>,
    quiet: bool,
    window: usize,
    agent: Option<&crate::agent::AgentHost>,
) -> Result<Arc<dyn Driver>> {
    match (cfg.rollout.environment, agent) {
        (EnvironmentKind::Agent, Some(host)) => Ok(host.driver(codec)),
        (EnvironmentKind::Agent, None) => Err(crate::error::TrainError::msg(
            "rollout.environment = \"agent\" but no policy endpoint was started",
        )),
        _ => Ok(in_process(env_factory(cfg, data, codec, quiet, window)?)),
    }
}

/// The environment every episode gets, as `[rollout] environment` says.
pub fn env_factory(
    cfg: &Config,
    data: &Data,
    codec: Arc<dyn ChatCodec>,
    quiet: bool,
    window: usize,
) -> Result<EnvFactory> {
    let mut env_cfg = cfg.env_or_default();
    // Beyond the model's window the engine would refuse the request and the episode would error;
    // capped (as evaluation does), such an episode ends as context_overflow like any other budget.
    env_cfg.max_context_tokens = env_cfg.max_context_tokens.min(window);
    Ok(match cfg.rollout.environment {
        EnvironmentKind::Pick => {
            let all: Vec<_> = data
                .sets
                .train
                .iter()
                .flat_map(|d| d.tasks.clone())
                .collect();
            let cands = Arc::new(mtrl_rollout::pick::candidates(&all)?);
            let fail = env_cfg.failure_reward;
            PickEnv::new(codec.clone(), cands.clone(), fail)?;
            Arc::new(move || Ok(Box::new(PickEnv::new(codec.clone(), cands.clone(), fail)?) as _))
        }
        EnvironmentKind::Search | EnvironmentKind::Agent => {
            let (index, _) = open_index(cfg, quiet)?;
            let index = Arc::new(index);
            SearchEnv::standard(env_cfg.clone(), index.clone())?;
            Arc::new(move || {
                let env = SearchEnv::standard(env_cfg.clone(), index.clone())?;
                Ok(Box::new(env.with_codec(codec.clone())) as _)
            })
        }
    })
}

/// Total optimizer steps of the run as configured (`--max-steps` only stops earlier).
pub fn planned_steps(cfg: &Config, tasks: usize) -> u64 {
    let t = &cfg.train;
    if t.max_steps > 0 {
        return t.max_steps;
    }
    ((t.max_epochs * tasks) as u64)
        .div_ceil(t.global_batch_size as u64)
        .max(1)
}

pub fn step_config(cfg: &Config, total_steps: u64) -> Result<StepConfig> {
    let t = &cfg.train;
    let schedule = LrSchedule {
        lr: t.lr,
        warmup_steps: t.warmup_steps,
        decay: match t.lr_schedule {
            LrScheduleKind::Constant => Decay::Constant,
            LrScheduleKind::Cosine => Decay::Cosine {
                total_steps,
                min_lr: t.min_lr,
            },
        },
    };
    let max_len = cfg.env_or_default().max_context_tokens;
    let mut s = StepConfig::from_algorithm(
        &cfg.algorithm,
        cfg.rollout.temperature,
        t.grad_clip,
        t.micro_batch_tokens,
        schedule,
        max_len,
    )?;
    s.accumulation = match t.grad_accumulation.as_str() {
        "f64" => DType::F64,
        _ => DType::F32,
    };
    Ok(s)
}

/// Opens (building as needed) the index of the config's `[search]` section; a bar on stderr
/// unless `quiet`.
pub fn open_index(cfg: &Config, quiet: bool) -> Result<(SearchIndex, BuildReport)> {
    let search = cfg.search()?;
    let mut bar = IndexBar::new(quiet);
    SearchIndex::open_or_build(search, &mut bar)
        .with_context(|| format!("cannot open the search index for {}", cfg.source.display()))
}

/// The `[train]` settings the policy itself carries (activation checkpointing, the attention
/// core of its training forwards), for every place a run loads or builds its trainable policy.
pub(crate) fn train_options(p: &mut Policy, cfg: &Config) {
    p.set_activation_checkpointing(cfg.train.activation_checkpointing);
    p.set_attention_kernel(
        mtrl_model::AttentionKernel::parse(&cfg.train.attention_kernel).unwrap_or_default(),
    );
}
