//! The policy: a Qwen2/Qwen3 decoder whose every trainable parameter is a `candle_core::Var`
//! under its Hugging Face name, plus load/save.
//!
//! Two views of the same storage are kept: `training()` is built from the `Var`s themselves, so
//! every op on it is recorded for backprop; `inference()` is built from detached handles of the same
//! buffers, so generation records no graph and uses the fused kernels. `set_weights` (and any
//! optimizer that calls `Var::set`) writes in place and both views see the new values at once —
//! except a merged-served adapter's inference view, a working copy that only `set_weights`
//! rebuilds (merged serving is for the engine's fork, which only `set_weights` updates).
//!
//! With LoRA the `Var`s are the adapter's `A`/`B` (PEFT names) and the base weights are plain
//! tensors (`policy/adapter.rs`).
//!
//! Invariant: the parameter map holds each tensor once; a tied `lm_head` is not a separate entry,
//! so its gradient is the sum of its embedding and output uses, as in PyTorch.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor, Var};

use crate::checkpoint;
use crate::config::{Config, GenerationConfig};
use crate::error::{ModelError, Result};
use crate::transformer::{Transformer, Weights};

mod adapter;
mod inputs;
pub use adapter::LoraServing;

/// A loaded policy model.
#[derive(Debug, Clone)]
pub struct Policy {
    config: Config,
    generation: GenerationConfig,
    dtype: DType,
    device: Device,
    /// The trainable parameters: every base weight in full fine-tuning, the adapter's `A`/`B`
    /// (PEFT names) with LoRA.
    vars: BTreeMap<String, Var>,
    /// With LoRA, the frozen base weights (plain tensors: no gradient, no optimizer state).
    frozen: BTreeMap<String, Tensor>,
    lora: Option<adapter::LoraState>,
    infer: Transformer,
    train: Transformer,
    source_dir: Option<PathBuf>,
    /// Activation checkpointing of the packed training forward (see `transformer::recompute`).
    checkpoint_layers: bool,
    /// The attention core of packed forwards.
    attention: crate::AttentionKernel,
}

/// The HF names and shapes of every parameter of `cfg`.
pub fn parameter_shapes(cfg: &Config) -> Vec<(String, Vec<usize>)> {
    let (h, inter) = (cfg.hidden_size, cfg.intermediate_size);
    let (nh, nkv, hd) = (
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.head_dim,
    );
    let mut out = vec![(
        "model.embed_tokens.weight".to_string(),
        vec![cfg.vocab_size, h],
    )];
    for i in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{i}");
        for (n, o, inp) in [
            ("q_proj", nh * hd, h),
            ("k_proj", nkv * hd, h),
            ("v_proj", nkv * hd, h),
            ("o_proj", h, nh * hd),
        ] {
            out.push((format!("{p}.self_attn.{n}.weight"), vec![o, inp]));
            if cfg.attention_bias && n != "o_proj" {
                out.push((format!("{p}.self_attn.{n}.bias"), vec![o]));
            }
        }
        if cfg.family == crate::config::Family::Qwen3 {
            out.push((format!("{p}.self_attn.q_norm.weight"), vec![hd]));
            out.push((format!("{p}.self_attn.k_norm.weight"), vec![hd]));
        }
        out.push((format!("{p}.input_layernorm.weight"), vec![h]));
        out.push((format!("{p}.post_attention_layernorm.weight"), vec![h]));
        out.push((format!("{p}.mlp.gate_proj.weight"), vec![inter, h]));
        out.push((format!("{p}.mlp.up_proj.weight"), vec![inter, h]));
        out.push((format!("{p}.mlp.down_proj.weight"), vec![h, inter]));
    }
    out.push(("model.norm.weight".to_string(), vec![h]));
    if !cfg.tie_word_embeddings {
        out.push(("lm_head.weight".to_string(), vec![cfg.vocab_size, h]));
    }
    out
}

impl Policy {
    /// Loads `config.json`, `generation_config.json` and the weights of an HF checkpoint folder.
    /// A Qwen2/Qwen3 `.gguf` file is accepted too: its weights are dequantised from the file, its
    /// config and tokenizer files come from the folder [`crate::gguf::checkpoint_dir`] keeps beside
    /// it (the policy's `source_dir`, whose tokenizer files a saved checkpoint copies).
    pub fn load(dir: &Path, dtype: DType, device: &Device) -> Result<Self> {
        if crate::gguf::is_gguf(dir) && dir.is_file() {
            let meta = crate::gguf::checkpoint_dir(dir)?;
            let config = Config::from_file(&meta.join("config.json"))?;
            let generation = GenerationConfig::from_dir(&meta)?;
            let tensors = crate::gguf::Gguf::open(dir)?.tensors(dtype)?;
            let mut p = Self::from_tensors(config, tensors.into_iter().collect(), dtype, device)?;
            p.generation = generation;
            p.source_dir = Some(meta);
            return Ok(p);
        }
        if crate::lora::peft::is_adapter_dir(dir) && !dir.join("config.json").is_file() {
            return Err(ModelError::checkpoint(
                dir,
                "is a LoRA adapter folder, not a model: load its base model and put the adapter \
                 on it (`--adapter`, `Policy::load_adapter`)",
            ));
        }
        let config = Config::from_file(&dir.join("config.json"))?;
        let generation = GenerationConfig::from_dir(dir)?;
        let tensors = checkpoint::load_tensors(dir, dtype, device)?;
        let mut p = Self::from_tensors(config, tensors, dtype, device)?;
        p.generation = generation;
        p.source_dir = Some(dir.to_path_buf());
        Ok(p)
    }

    /// Builds a policy from named tensors (HF names). Missing tensors and shape mismatches are errors;
    /// tensors the model does not use are ignored.
    pub fn from_tensors(
        config: Config,
        tensors: HashMap<String, Tensor>,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let mut vars = BTreeMap::new();
        for (name, shape) in parameter_shapes(&config) {
            let t = tensors
                .get(&name)
                .ok_or_else(|| ModelError::tensor(&name, "missing from the checkpoint"))?;
            if t.dims() != shape.as_slice() {
                return Err(ModelError::tensor(
                    &name,
                    format!("has shape {:?}, config.json implies {:?}", t.dims(), shape),
                ));
            }
            let t = t.to_dtype(dtype)?.to_device(device)?;
            vars.insert(name, Var::from_tensor(&t)?);
        }
        Self::from_vars(config, vars, dtype, device)
    }

    /// A policy with random weights of `config`'s shape (normal, std 0.02; norms at 1), for benches.
    pub fn random(config: Config, dtype: DType, device: &Device) -> Result<Self> {
        let mut vars = BTreeMap::new();
        for (name, shape) in parameter_shapes(&config) {
            let t = if shape.len() == 1 && name.contains("norm") {
                Tensor::ones(shape, DType::F32, device)?
            } else {
                Tensor::randn(0f32, 0.02f32, shape, device)?
            };
            vars.insert(name, Var::from_tensor(&t.to_dtype(dtype)?)?);
        }
        Self::from_vars(config, vars, dtype, device)
    }

    fn from_vars(
        config: Config,
        vars: BTreeMap<String, Var>,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let parts = Parts {
            config: &config,
            vars: &vars,
            frozen: &BTreeMap::new(),
            lora: None,
            dtype,
            device,
        };
        let (train, infer) = parts.views()?;
        Ok(Self {
            config,
            generation: GenerationConfig::default(),
            dtype,
            device: device.clone(),
            vars,
            frozen: BTreeMap::new(),
            lora: None,
            infer,
            train,
            source_dir: None,
            checkpoint_layers: false,
            attention: crate::AttentionKernel::Auto,
        })
    }

    fn parts(&self) -> Parts<'_> {
        Parts {
            config: &self.config,
            vars: &self.vars,
            frozen: &self.frozen,
            lora: self.lora.as_ref(),
            dtype: self.dtype,
            device: &self.device,
        }
    }

    /// Rebuilds both views from the current parameters (after the adapter or its serving changed).
    fn build_views(&mut self) -> Result<()> {
        let (train, infer) = self.parts().views()?;
        self.train = train;
        self.infer = infer;
        Ok(())
    }
    pub fn config(&self) -> &Config {
        &self.config
    }
    pub fn generation_config(&self) -> &GenerationConfig {
        &self.generation
    }
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    pub fn device(&self) -> &Device {
        &self.device
    }
    /// The folder the policy was loaded from, if any.
    pub fn source_dir(&self) -> Option<&Path> {
        self.source_dir.as_deref()
    }

    /// Every trainable parameter: with full fine-tuning every weight under its HF name (a tied
    /// `lm_head` is `model.embed_tokens.weight`); with LoRA the adapter's `A` and `B` under their
    /// PEFT names. This is what the optimizer updates, checkpoints hold and publishing sends.
    pub fn named_parameters(&self) -> &BTreeMap<String, Var> {
        &self.vars
    }

    /// The graph-recording view (training).
    pub fn training(&self) -> &Transformer {
        &self.train
    }

    /// The graph-free view (generation, evaluation).
    pub fn inference(&self) -> &Transformer {
        &self.infer
    }

    /// The output projection as a tensor of its `Var` (the embedding when tied).
    pub fn lm_head(&self) -> &Tensor {
        self.train.lm_head()
    }

    /// Activation checkpointing per layer for training forwards of packed rows (transformers'
    /// `gradient_checkpointing_enable`): only each layer's input is kept, and the backward
    /// recomputes one layer at a time. Same gradients, less memory, one more decoder forward.
    pub fn set_activation_checkpointing(&mut self, on: bool) {
        self.checkpoint_layers = on;
    }

    /// The attention core of packed forwards (the learner's, scoring's): fused (FlashAttention-2
    /// on a GPU) or spelled; `Auto` fuses where the compiled kernel serves.
    pub fn set_attention_kernel(&mut self, k: crate::AttentionKernel) {
        self.attention = k;
    }

    /// What [`Self::set_attention_kernel`] chose.
    pub fn attention_kernel(&self) -> crate::AttentionKernel {
        self.attention
    }

    /// Whether packed forwards of this policy attend fused.
    pub fn attends_fused(&self) -> bool {
        self.attention
            .fused_for(&self.device, self.dtype, self.config.head_dim)
    }

    /// Whether [`Self::set_activation_checkpointing`] is on.
    pub fn activation_checkpointing(&self) -> bool {
        self.checkpoint_layers
    }

    /// Logits for every position of a padded batch: `ids` `[b, t]`; `attention_mask` `[b, t]`
    /// (1 = token) or `None`; `position_ids` `[b, t]` or `None` for `0..t` (right padding).
    /// Left-padded batches pass [`left_padding_positions`]. Graph-free.
    pub fn forward(
        &self,
        ids: &Tensor,
        attention_mask: Option<&Tensor>,
        position_ids: Option<&Tensor>,
    ) -> Result<Tensor> {
        let (hidden, _) = self.hidden(&self.infer, ids, attention_mask, position_ids)?;
        Ok(self.infer.logits(&hidden)?)
    }

    /// Overwrites trainable parameters in place from named tensors (any dtype/device; HF names, or
    /// PEFT names with LoRA). Every name must be a parameter, every shape must match and every
    /// value must be finite; nothing is written unless all tensors pass. A merged-served adapter
    /// is merged again.
    pub fn set_weights(&mut self, tensors: &HashMap<String, Tensor>) -> Result<()> {
        let mut staged = Vec::with_capacity(tensors.len());
        for (name, t) in tensors {
            let var = self
                .vars
                .get(name)
                .ok_or_else(|| ModelError::tensor(name, "is not a parameter of this model"))?;
            if t.dims() != var.dims() {
                return Err(ModelError::tensor(
                    name,
                    format!(
                        "new value has shape {:?}, parameter has {:?}",
                        t.dims(),
                        var.dims()
                    ),
                ));
            }
            let t = t
                .to_dtype(self.dtype)?
                .to_device(&self.device)?
                .contiguous()?;
            staged.push((name, var, t));
        }
        // One read for the whole update, not one wait per tensor.
        checkpoint::check_all_finite(staged.iter().map(|(n, _, t)| (n.as_str(), t)))?;
        for (_, var, t) in staged {
            var.set(&t)?;
        }
        if self.lora.as_ref().is_some_and(|l| l.merged) {
            self.build_views()?;
        }
        Ok(())
    }

    /// Saves as an HF checkpoint: `model.safetensors` (HF names, `dtype`), `config.json`,
    /// `generation_config.json` and the tokenizer files of the folder the policy came from. With
    /// LoRA, saves the adapter as PEFT does ([`crate::lora::peft::save`]); [`Policy::save_merged`]
    /// writes the merged model.
    pub fn save(&self, dir: &Path, dtype: DType) -> Result<()> {
        self.view(false)?.save(dir, dtype)
    }

    /// What [`Policy::save`] writes, as a copy the policy's later updates do not touch, in host
    /// memory (a GPU policy's weights are copied to the host, so a checkpoint in flight costs no
    /// device memory; finished before this returns): a background writer saves it while
    /// training goes on.
    pub fn snapshot(&self) -> Result<PolicySnapshot> {
        let s = self.view(true)?;
        self.device.synchronize()?;
        Ok(s)
    }

    /// A snapshot sharing the policy's tensors (no copy): valid only until the next update.
    pub fn snapshot_view(&self) -> Result<PolicySnapshot> {
        self.view(false)
    }

    fn view(&self, copy: bool) -> Result<PolicySnapshot> {
        let mut tensors = BTreeMap::new();
        let adapter = self
            .lora
            .as_ref()
            .map(|l| (l.spec.clone(), self.base_name()));
        for (n, v) in &self.vars {
            let t = v.as_tensor().detach();
            let t = match (copy, &self.device) {
                (false, _) => t,
                (true, Device::Cpu) => t.copy()?,
                (true, _) => t.to_device(&Device::Cpu)?,
            };
            tensors.insert(n.clone(), t);
        }
        Ok(PolicySnapshot {
            tensors,
            adapter,
            config: self.config.raw.clone(),
            generation: self.generation.raw.clone(),
            source_dir: self.source_dir.clone(),
        })
    }
}

/// What the two views are built from.
struct Parts<'a> {
    config: &'a Config,
    vars: &'a BTreeMap<String, Var>,
    frozen: &'a BTreeMap<String, Tensor>,
    lora: Option<&'a adapter::LoraState>,
    dtype: DType,
    device: &'a Device,
}

impl Parts<'_> {
    /// A base weight: its `Var`'s tensor (full fine-tuning) or the frozen tensor (LoRA).
    fn base(&self, name: &str) -> Result<Tensor> {
        if let Some(v) = self.vars.get(name) {
            return Ok(v.as_tensor().clone());
        }
        self.frozen
            .get(name)
            .cloned()
            .ok_or_else(|| ModelError::tensor(name, "missing"))
    }

    /// A base weight, detached, with the adapter merged in where it adapts that layer
    /// (`W + s·B·A`, PEFT's `merge_and_unload`).
    fn merged_weight(&self, name: &str) -> Result<Tensor> {
        let w = self.base(name)?.detach();
        let Some(module) = name.strip_suffix(".weight") else {
            return Ok(w);
        };
        match adapter::pair(self.lora, self.vars, module, false)? {
            Some(p) => Ok(crate::transformer::lora::merged(&w, &p)?),
            None => Ok(w),
        }
    }

    /// Both views of the parameters: base weights from `vars` or `frozen`, adapters (training:
    /// the `Var`s; inference: detached handles, or merged into a working copy when the adapter is
    /// served merged).
    fn views(&self) -> Result<(Transformer, Transformer)> {
        let get_var = |name: &str, _shape: &[usize]| self.base(name);
        let lora = self.lora;
        let pair = |module: &str, train: bool| adapter::pair(lora, self.vars, module, train);
        let train_lora = |m: &str, _o: usize, _i: usize| pair(m, true);
        let merged = lora.is_some_and(|l| l.merged);
        let infer_lora = |m: &str, _o: usize, _i: usize| {
            if merged {
                Ok(None)
            } else {
                pair(m, false)
            }
        };
        let get_merged = |name: &str, _shape: &[usize]| -> Result<Tensor> {
            if merged {
                self.merged_weight(name)
            } else {
                Ok(self.base(name)?.detach())
            }
        };
        let train = Transformer::new(
            self.config,
            &Weights {
                get: &get_var,
                lora: &train_lora,
            },
            self.dtype,
            self.device,
            true,
        )?;
        let infer = Transformer::new(
            self.config,
            &Weights {
                get: &get_merged,
                lora: &infer_lora,
            },
            self.dtype,
            self.device,
            false,
        )?;
        Ok((train, infer))
    }
}

/// A policy's weights and metadata, ready to be saved ([`Policy::snapshot`]).
pub struct PolicySnapshot {
    tensors: BTreeMap<String, Tensor>,
    /// With LoRA: the adapter's spec and base model name (the snapshot holds the adapter only).
    adapter: Option<(crate::lora::LoraSpec, String)>,
    config: serde_json::Value,
    generation: Option<serde_json::Value>,
    source_dir: Option<PathBuf>,
}

impl PolicySnapshot {
    /// Writes the HF checkpoint [`Policy::save`] writes (a PEFT adapter folder with LoRA; the
    /// adapter is written in F32, as PEFT does, whatever `dtype`).
    pub fn save(&self, dir: &Path, dtype: DType) -> Result<()> {
        if let Some((spec, base)) = &self.adapter {
            return crate::lora::peft::save(dir, spec, base, &self.tensors);
        }
        checkpoint::save_checkpoint(
            dir,
            &self.tensors,
            dtype,
            &self.config,
            self.generation.as_ref(),
            self.source_dir.as_deref(),
        )
    }
}

/// `position_ids = clamp(cumsum(mask) - 1, 0)` for a left-padded batch (what generation uses).
pub fn left_padding_positions(attention_mask: &Tensor) -> Result<Tensor> {
    let rows = attention_mask.to_dtype(DType::U32)?.to_vec2::<u32>()?;
    let (b, t) = (rows.len(), rows.first().map_or(0, Vec::len));
    let mut out = Vec::with_capacity(b * t);
    for r in rows {
        let mut c = 0u32;
        for m in r {
            c += u32::from(m != 0);
            out.push(c.saturating_sub(1));
        }
    }
    Ok(Tensor::from_vec(out, (b, t), attention_mask.device())?)
}
