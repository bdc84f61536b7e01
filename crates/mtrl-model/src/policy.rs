//! The policy: a Qwen2/Qwen3 decoder whose every parameter is a `candle_core::Var` under its
//! Hugging Face name, plus load/save.
//!
//! Two views of the same storage are kept: `training()` is built from the `Var`s themselves, so
//! every op on it is recorded for backprop; `inference()` is built from detached handles of the same
//! buffers, so generation records no graph and uses the fused kernels. `set_weights` (and any
//! optimizer that calls `Var::set`) writes in place and both views see the new values at once.
//!
//! Invariant: the parameter map holds each tensor once; a tied `lm_head` is not a separate entry,
//! so its gradient is the sum of its embedding and output uses, as in PyTorch.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor, Var};

use crate::checkpoint;
use crate::config::{Config, GenerationConfig};
use crate::error::{ModelError, Result};
use crate::transformer::Transformer;

/// A loaded policy model.
#[derive(Debug, Clone)]
pub struct Policy {
    config: Config,
    generation: GenerationConfig,
    dtype: DType,
    device: Device,
    vars: BTreeMap<String, Var>,
    infer: Transformer,
    train: Transformer,
    source_dir: Option<PathBuf>,
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
    pub fn load(dir: &Path, dtype: DType, device: &Device) -> Result<Self> {
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
        let get_var = |name: &str, _shape: &[usize]| -> Result<Tensor> {
            vars.get(name)
                .map(|v| v.as_tensor().clone())
                .ok_or_else(|| ModelError::tensor(name, "missing"))
        };
        let get_detached =
            |name: &str, shape: &[usize]| -> Result<Tensor> { Ok(get_var(name, shape)?.detach()) };
        let train = Transformer::new(&config, &get_var, dtype, device, true)?;
        let infer = Transformer::new(&config, &get_detached, dtype, device, false)?;
        Ok(Self {
            config,
            generation: GenerationConfig::default(),
            dtype,
            device: device.clone(),
            vars,
            infer,
            train,
            source_dir: None,
        })
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

    /// Every parameter under its HF name (a tied `lm_head` is `model.embed_tokens.weight`).
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

    /// Hidden states of `model` for a padded batch, plus the mask as rows of 0/1.
    pub(crate) fn hidden(
        &self,
        model: &Transformer,
        ids: &Tensor,
        attention_mask: Option<&Tensor>,
        position_ids: Option<&Tensor>,
    ) -> Result<(Tensor, Vec<Vec<u8>>)> {
        let (b, t) = ids.dims2()?;
        if t > model.max_positions() {
            return Err(ModelError::ContextOverflow {
                len: t,
                max: model.max_positions(),
            });
        }
        let ids = ids.to_dtype(DType::U32)?.to_device(&self.device)?;
        let max_id = ids.max_all()?.to_scalar::<u32>()? as usize;
        if max_id >= self.config.vocab_size {
            return Err(ModelError::InvalidArgument(format!(
                "token id {max_id} is outside the vocabulary of {} ids",
                self.config.vocab_size
            )));
        }
        let mask: Vec<Vec<u8>> = match attention_mask {
            Some(m) => m
                .to_dtype(DType::U32)?
                .to_vec2::<u32>()?
                .into_iter()
                .map(|r| r.into_iter().map(|x| u8::from(x != 0)).collect())
                .collect(),
            None => vec![vec![1u8; t]; b],
        };
        let positions = match position_ids {
            Some(p) => p.to_dtype(DType::U32)?.to_device(&self.device)?,
            None => Tensor::arange(0u32, t as u32, &self.device)?
                .unsqueeze(0)?
                .repeat((b, 1))?,
        };
        let pmax = positions.max_all()?.to_scalar::<u32>()? as usize;
        if pmax >= model.max_positions() {
            return Err(ModelError::ContextOverflow {
                len: pmax + 1,
                max: model.max_positions(),
            });
        }
        let hidden = model.forward_hidden(&ids, &positions, Some(&mask))?;
        Ok((hidden, mask))
    }

    /// Overwrites parameters in place from HF-named tensors (any dtype/device). Every name must be a
    /// parameter, every shape must match and every value must be finite; nothing is written unless
    /// all tensors pass.
    pub fn set_weights(&self, tensors: &HashMap<String, Tensor>) -> Result<()> {
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
            checkpoint::check_finite(name, &t)?;
            staged.push((var, t));
        }
        for (var, t) in staged {
            var.set(&t)?;
        }
        Ok(())
    }

    /// Saves as an HF checkpoint: `model.safetensors` (HF names, `dtype`), `config.json`,
    /// `generation_config.json` and the tokenizer files of the folder the policy came from.
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
            config: self.config.raw.clone(),
            generation: self.generation.raw.clone(),
            source_dir: self.source_dir.clone(),
        })
    }
}

/// A policy's weights and metadata, ready to be saved ([`Policy::snapshot`]).
pub struct PolicySnapshot {
    tensors: BTreeMap<String, Tensor>,
    config: serde_json::Value,
    generation: Option<serde_json::Value>,
    source_dir: Option<PathBuf>,
}

impl PolicySnapshot {
    /// Writes the HF checkpoint [`Policy::save`] writes.
    pub fn save(&self, dir: &Path, dtype: DType) -> Result<()> {
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
