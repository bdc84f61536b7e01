//! A policy with a LoRA adapter: attaching one (fresh or from PEFT files), serving it merged or
//! not, copies for the engine, the merged model.
//!
//! Invariant: with an adapter the base weights are plain tensors in `Policy::frozen`, in the
//! stored dtype, never `Var`s: nothing records or keeps a gradient for them, the optimizer never
//! sees them, and a fork for the engine shares them (only the adapter is copied).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use candle_core::{DType, Device, Tensor, Var};

use super::{parameter_shapes, Policy};
use crate::checkpoint;
use crate::error::{ModelError, Result};
use crate::lora::{self, peft, LoraSpec};
use crate::transformer::lora::Dropout;
use crate::transformer::LoraPair;

/// How the inference view applies the adapter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoraServing {
    /// Two extra low-rank products per adapted layer; the base weights are shared, no copy.
    Unmerged,
    /// `W + s·B·A` computed into a working copy of every adapted weight at each weight update.
    Merged,
}

/// The adapter's settings, kept with the policy.
#[derive(Debug, Clone)]
pub(crate) struct LoraState {
    pub spec: LoraSpec,
    pub merged: bool,
    /// `base_model_name_or_path` for the adapter files.
    pub base_name: String,
    dropout_seed: Arc<AtomicU64>,
    dropout_calls: Arc<AtomicU64>,
}

impl LoraState {
    fn new(spec: LoraSpec, base_name: String) -> Self {
        Self {
            spec,
            merged: false,
            base_name,
            dropout_seed: Arc::new(AtomicU64::new(0)),
            dropout_calls: Arc::new(AtomicU64::new(0)),
        }
    }
}

/// The LoRA pair of `module` (HF module name), if the adapter targets it: the `Var`s' tensors for
/// the training view, detached handles for inference.
pub(crate) fn pair(
    lora: Option<&LoraState>,
    vars: &BTreeMap<String, Var>,
    module: &str,
    train: bool,
) -> Result<Option<LoraPair>> {
    let Some(l) = lora else { return Ok(None) };
    let short = module.rsplit('.').next().unwrap_or(module);
    let layer = module
        .strip_prefix("model.layers.")
        .and_then(|r| r.split('.').next())
        .and_then(|i| i.parse::<usize>().ok());
    let Some(layer) = layer else { return Ok(None) };
    if !l.spec.adapts_layer(layer) || !l.spec.targets.iter().any(|t| t == short) {
        return Ok(None);
    }
    let get = |part: char| -> Result<Tensor> {
        let k = lora::peft_key(module, part);
        let v = vars
            .get(&k)
            .ok_or_else(|| ModelError::tensor(&k, "missing from the adapter"))?;
        Ok(if train {
            v.as_tensor().clone()
        } else {
            v.as_tensor().detach()
        })
    };
    let dropout = (train && l.spec.dropout > 0.0).then(|| Dropout {
        p: l.spec.dropout as f32,
        seed: l.dropout_seed.clone(),
        layer: mtrl_core::rng::hash_str(0, module),
        calls: l.dropout_calls.clone(),
    });
    Ok(Some(LoraPair {
        a: get('A')?,
        b: get('B')?,
        scale: l.spec.scaling(),
        dropout,
    }))
}

impl Policy {
    /// Freezes the base and attaches an adapter of `spec`: `tensors` (PEFT names), or a fresh one
    /// drawn from `seed` when `None`. Only the adapter is trainable afterwards.
    pub fn with_lora(
        mut self,
        spec: LoraSpec,
        tensors: Option<HashMap<String, Tensor>>,
        seed: u64,
    ) -> Result<Self> {
        if self.lora.is_some() {
            return Err(ModelError::InvalidArgument(
                "the policy already has a LoRA adapter".into(),
            ));
        }
        spec.check().map_err(|(field, m)| {
            ModelError::InvalidArgument(format!("lora {}: {m}", field.name()))
        })?;
        spec.check_layers(self.config.num_hidden_layers)
            .map_err(|m| ModelError::InvalidArgument(format!("lora layers_to_transform: {m}")))?;
        let tensors = match tensors {
            Some(t) => t,
            None => lora::init(&self.config, &spec, seed, self.dtype, &self.device)?,
        };
        lora::check_tensors(&self.config, &spec, &tensors)?;
        let mut vars = BTreeMap::new();
        for (name, t) in tensors {
            let t = t.to_dtype(self.dtype)?.to_device(&self.device)?;
            vars.insert(name, Var::from_tensor(&t)?);
        }
        let base = std::mem::replace(&mut self.vars, vars);
        self.frozen = base
            .into_iter()
            .map(|(n, v)| (n, v.as_tensor().detach()))
            .collect();
        let name = self.source_dir.as_ref().map_or_else(
            || "random".to_string(),
            // A policy loaded from a `.gguf` names the file, not its small-files folder.
            |d| {
                crate::gguf::source_of(d)
                    .unwrap_or_else(|| d.clone())
                    .display()
                    .to_string()
            },
        );
        self.lora = Some(LoraState::new(spec, name));
        self.build_views()?;
        Ok(self)
    }

    /// Attaches the PEFT adapter in `dir` (`adapter_config.json` + `adapter_model.safetensors`).
    pub fn load_adapter(self, dir: &Path) -> Result<Self> {
        let files = peft::load(dir, self.dtype, &self.device)?;
        let weights = dir.join(peft::WEIGHTS_FILE);
        let mut p = self
            .with_lora(files.spec, Some(files.tensors), 0)
            .map_err(|e| match e {
                ModelError::Tensor { .. } | ModelError::InvalidArgument(_) => {
                    ModelError::checkpoint(&weights, e.to_string())
                }
                other => other,
            })?;
        if let (Some(l), Some(b)) = (p.lora.as_mut(), files.base_model) {
            l.base_name = b;
        }
        Ok(p)
    }

    /// The adapter's spec, when the policy has one.
    pub fn lora(&self) -> Option<&LoraSpec> {
        self.lora.as_ref().map(|l| &l.spec)
    }

    /// Sets how the inference view applies the adapter (no-op without one).
    pub fn set_lora_serving(&mut self, serving: LoraServing) -> Result<()> {
        let Some(l) = self.lora.as_mut() else {
            return Ok(());
        };
        let merged = serving == LoraServing::Merged;
        if l.merged != merged {
            l.merged = merged;
            self.build_views()?;
        }
        Ok(())
    }

    /// Seeds the adapter's dropout masks for the next training forwards (the learner calls this
    /// per micro-batch, so masks are a pure function of the run's seed and position).
    pub fn set_dropout_seed(&self, seed: u64) {
        if let Some(l) = &self.lora {
            l.dropout_seed.store(seed, Ordering::Relaxed);
            l.dropout_calls.store(0, Ordering::Relaxed);
        }
    }

    /// Sets the `base_model_name_or_path` the adapter files will name (no-op without an adapter).
    pub fn set_lora_base_name(&mut self, name: &str) {
        if let Some(l) = self.lora.as_mut() {
            l.base_name = name.to_string();
        }
    }

    /// The `base_model_name_or_path` adapter files name.
    pub(crate) fn base_name(&self) -> String {
        self.lora
            .as_ref()
            .map(|l| l.base_name.clone())
            .unwrap_or_default()
    }

    /// An independent copy for the generation engine or a frozen reference: the trainable
    /// parameters copied (own storage), frozen base weights shared. The copies have finished on
    /// the device when this returns (the engine thread launches on its own CUDA stream).
    pub fn fork(&self) -> Result<Policy> {
        let p = self.forked(|t| Ok(t.copy()?), None)?;
        self.device.synchronize()?;
        Ok(p)
    }

    /// [`Self::fork`] onto `device`: every tensor copied there, frozen base weights included (a
    /// device-side copy between two CUDA devices, enqueued on `device`'s stream and ordered after
    /// the writes to the source by the buffers' events; see [`crate::device`]). On the policy's
    /// own device it is [`Self::fork`].
    pub fn fork_to(&self, device: &Device) -> Result<Policy> {
        if device.same_device(&self.device) {
            return self.fork();
        }
        let p = self.forked(|t| Ok(t.to_device(device)?), Some(device))?;
        device.synchronize()?;
        Ok(p)
    }

    /// A copy whose trainable parameters are `copy` of this one's, with a fresh adapter state;
    /// with `device`, on that device (the frozen base weights copied there too), else sharing
    /// the frozen base.
    fn forked(
        &self,
        copy: impl Fn(&Tensor) -> Result<Tensor>,
        device: Option<&Device>,
    ) -> Result<Policy> {
        let mut p = self.clone();
        p.vars = self
            .vars
            .iter()
            .map(|(n, v)| {
                Ok((
                    n.clone(),
                    Var::from_tensor(&copy(&v.as_tensor().detach())?)?,
                ))
            })
            .collect::<Result<_>>()?;
        if let Some(device) = device {
            p.device = device.clone();
            p.frozen = self
                .frozen
                .iter()
                .map(|(n, t)| Ok((n.clone(), t.to_device(device)?)))
                .collect::<Result<_>>()?;
        }
        if let Some(l) = &self.lora {
            let mut fresh = LoraState::new(l.spec.clone(), l.base_name.clone());
            fresh.merged = l.merged;
            p.lora = Some(fresh);
        }
        p.build_views()?;
        Ok(p)
    }

    /// Every base weight under its HF name with the adapter merged in (`W + s·B·A` in f32, PEFT's
    /// `merge_and_unload`); the base weights themselves without an adapter.
    pub fn merged_tensors(&self) -> Result<BTreeMap<String, Tensor>> {
        let parts = self.parts();
        let mut out = BTreeMap::new();
        for (name, _) in parameter_shapes(&self.config) {
            let w = parts.merged_weight(&name)?;
            out.insert(name, w);
        }
        Ok(out)
    }

    /// Saves the merged model as an HF checkpoint (what `mtrl export --merge` writes).
    pub fn save_merged(&self, dir: &Path, dtype: DType) -> Result<()> {
        checkpoint::save_checkpoint(
            dir,
            &self.merged_tensors()?,
            dtype,
            &self.config.raw,
            self.generation.raw.as_ref(),
            self.source_dir.as_deref(),
        )
    }
}
