//! LoRA adapters: which layers, their shapes, PEFT's tensor names, the initial adapter.
//!
//! The conventions are PEFT 0.21's plain LoRA (checked against the fixtures of
//! `tests/fixtures/lora/`): every targeted `nn.Linear` `W [out, in]` gets `A [r, in]` and
//! `B [out, r]`, `y = x·Wᵀ + b + s·(x·Aᵀ)·Bᵀ` with `s = alpha / r` (`alpha / √r` with rsLoRA);
//! the tensors are named `base_model.model.<HF module name>.lora_{A,B}.weight`. A fresh adapter
//! is PEFT's default: `A` uniform in ±1/√in (`kaiming_uniform_(a = √5)`), `B = 0`, so training
//! starts from the base model exactly. Files: [`peft`].

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};

use crate::config::Config;
use crate::error::{ModelError, Result};
use mtrl_core::config::{check_lora, LoraField};

pub mod peft;

/// The modules LoRA may target, as PEFT names them (the default targets all of them).
pub use mtrl_core::config::LORA_TARGETS as TARGETS;

/// An adapter's shape and scaling.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraSpec {
    pub rank: usize,
    pub alpha: f64,
    /// Targeted module names (a subset of [`TARGETS`]), in the order they are written out.
    pub targets: Vec<String>,
    /// Dropout on the adapter's input while training (0 = none).
    pub dropout: f64,
    /// rsLoRA scaling, `alpha / √r`.
    pub rslora: bool,
    /// The decoder layers adapted (PEFT's `layers_to_transform`), ascending; `None`: all. The
    /// layers below the lowest carry no trainable weight, so backward stops there.
    pub layers: Option<Vec<usize>>,
}

impl LoraSpec {
    /// `alpha / r`, or `alpha / √r` with rsLoRA.
    pub fn scaling(&self) -> f64 {
        if self.rslora {
            self.alpha / (self.rank as f64).sqrt()
        } else {
            self.alpha / self.rank as f64
        }
    }

    /// Errors for a rank of 0, a non-finite alpha, a dropout outside [0, 1), an unknown or
    /// repeated target, or no target ([`mtrl_core::config::check_lora`]); the field that failed
    /// comes with the message.
    pub fn check(&self) -> std::result::Result<(), (LoraField, String)> {
        check_lora(self.rank, self.alpha, self.dropout, &self.targets)
    }

    /// Whether decoder layer `i` is adapted.
    pub fn adapts_layer(&self, i: usize) -> bool {
        self.layers.as_ref().is_none_or(|l| l.contains(&i))
    }

    /// An error when `layers` names a layer a model of `n` layers lacks.
    pub fn check_layers(&self, n: usize) -> std::result::Result<(), String> {
        match self
            .layers
            .as_ref()
            .and_then(|l| l.iter().find(|&&i| i >= n))
        {
            Some(i) => Err(format!(
                "layer {i} does not exist: the model has {n} (0..{n})"
            )),
            None => Ok(()),
        }
    }
}

/// One adapted layer: its HF module name and `[out, in]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Adapted {
    pub module: String,
    pub out: usize,
    pub inp: usize,
}

/// PEFT's file name of `module`'s `A` (`part = 'A'`) or `B` tensor.
pub fn peft_key(module: &str, part: char) -> String {
    format!("base_model.model.{module}.lora_{part}.weight")
}

/// The layers `spec` adapts in a model of `cfg`, layer by layer in [`TARGETS`] order (PEFT's
/// `named_parameters` order).
pub fn adapted(cfg: &Config, spec: &LoraSpec) -> Vec<Adapted> {
    let (h, inter) = (cfg.hidden_size, cfg.intermediate_size);
    let (q, kv) = (
        cfg.num_attention_heads * cfg.head_dim,
        cfg.num_key_value_heads * cfg.head_dim,
    );
    let mut out = Vec::new();
    for i in (0..cfg.num_hidden_layers).filter(|&i| spec.adapts_layer(i)) {
        for (name, block, o, inp) in [
            ("q_proj", "self_attn", q, h),
            ("k_proj", "self_attn", kv, h),
            ("v_proj", "self_attn", kv, h),
            ("o_proj", "self_attn", h, q),
            ("gate_proj", "mlp", inter, h),
            ("up_proj", "mlp", inter, h),
            ("down_proj", "mlp", h, inter),
        ] {
            if spec.targets.iter().any(|t| t == name) {
                out.push(Adapted {
                    module: format!("model.layers.{i}.{block}.{name}"),
                    out: o,
                    inp,
                });
            }
        }
    }
    out
}

/// Parameters of the adapter `spec` puts on `cfg`: Σ r·(in + out).
pub fn parameter_count(cfg: &Config, spec: &LoraSpec) -> usize {
    adapted(cfg, spec)
        .iter()
        .map(|a| spec.rank * (a.inp + a.out))
        .sum()
}

/// A fresh adapter (PEFT's default initialisation, drawn from `seed`): `A` uniform in ±1/√in,
/// `B` zeros. The stream is SplitMix64 over the layers in [`adapted`] order, so the same seed
/// gives the same adapter on every machine.
pub fn init(
    cfg: &Config,
    spec: &LoraSpec,
    seed: u64,
    dtype: DType,
    device: &Device,
) -> Result<HashMap<String, Tensor>> {
    let mut rng = mtrl_core::rng::SplitMix64(mtrl_core::rng::mix(seed ^ 0x4C6F_5241));
    let mut out = HashMap::new();
    for a in adapted(cfg, spec) {
        let bound = 1.0 / (a.inp as f64).sqrt();
        let vals: Vec<f32> = (0..spec.rank * a.inp)
            .map(|_| ((rng.next_f64() * 2.0 - 1.0) * bound) as f32)
            .collect();
        let ta = Tensor::from_vec(vals, (spec.rank, a.inp), device)?.to_dtype(dtype)?;
        let tb = Tensor::zeros((a.out, spec.rank), dtype, device)?;
        out.insert(peft_key(&a.module, 'A'), ta);
        out.insert(peft_key(&a.module, 'B'), tb);
    }
    Ok(out)
}

/// Checks that `tensors` is exactly the adapter `spec` puts on `cfg` (every name present, right
/// shape, nothing else), naming the first tensor at fault.
pub fn check_tensors(
    cfg: &Config,
    spec: &LoraSpec,
    tensors: &HashMap<String, Tensor>,
) -> Result<()> {
    let layers = adapted(cfg, spec);
    for a in &layers {
        for (part, shape) in [('A', [spec.rank, a.inp]), ('B', [a.out, spec.rank])] {
            let k = peft_key(&a.module, part);
            let t = tensors
                .get(&k)
                .ok_or_else(|| ModelError::tensor(&k, "missing from the adapter"))?;
            if t.dims() != shape {
                return Err(ModelError::tensor(
                    &k,
                    format!(
                        "has shape {:?}, rank {} on [{}, {}] implies {:?}",
                        t.dims(),
                        spec.rank,
                        a.out,
                        a.inp,
                        shape
                    ),
                ));
            }
        }
    }
    if tensors.len() != 2 * layers.len() {
        let known: std::collections::HashSet<String> = layers
            .iter()
            .flat_map(|a| [peft_key(&a.module, 'A'), peft_key(&a.module, 'B')])
            .collect();
        if let Some(extra) = tensors.keys().find(|k| !known.contains(*k)) {
            return Err(ModelError::tensor(
                extra,
                "is not a LoRA tensor of the configured target modules",
            ));
        }
    }
    Ok(())
}
