//! AdamW with saveable state (candle-nn's keeps its moments private, and exact resume needs them).
//!
//! Update at step t (PyTorch's formulation, so results match `torch.optim.AdamW` closely):
//! p ← p·(1 − lr·wd); m ← β1·m + (1−β1)·g; v ← β2·v + (1−β2)·g²;
//! p ← p − (lr / (1−β1ᵗ)) · m / (sqrt(v) / sqrt(1−β2ᵗ) + ε).
//! Weight decay applies to every parameter (norms and biases included), as in the fixtures.
//! A parameter without a gradient is skipped entirely (torch semantics). Parameters stored in
//! bf16/f16 get f32 master copies here: the update runs in f32 and the result is cast back, so
//! small updates are not lost to bf16 rounding.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use candle_core::{DType, Tensor, Var};
use serde::{Deserialize, Serialize};

use crate::error::{LearnerError, Result};

pub const FORMAT_VERSION: u32 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct AdamWConfig {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        AdamWConfig {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
        }
    }
}

#[derive(Serialize, Deserialize)]
struct Meta {
    format_version: u32,
    step: u64,
    config: AdamWConfig,
    params: Vec<String>,
}

pub struct AdamW {
    pub config: AdamWConfig,
    step: u64,
    m: BTreeMap<String, Tensor>,
    v: BTreeMap<String, Tensor>,
    master: BTreeMap<String, Tensor>,
}

impl AdamW {
    pub fn new(config: AdamWConfig) -> AdamW {
        AdamW {
            config,
            step: 0,
            m: BTreeMap::new(),
            v: BTreeMap::new(),
            master: BTreeMap::new(),
        }
    }

    /// Number of updates applied so far.
    pub fn step_count(&self) -> u64 {
        self.step
    }

    /// Applies one update with learning rate `lr`; `grads` maps parameter names to gradients.
    pub fn step(
        &mut self,
        params: &BTreeMap<String, Var>,
        grads: &BTreeMap<String, Tensor>,
        lr: f64,
    ) -> Result<()> {
        self.step += 1;
        let c = self.config;
        let t = self.step as i32;
        let bc1 = 1.0 - c.beta1.powi(t);
        let bc2_sqrt = (1.0 - c.beta2.powi(t)).sqrt();
        for (name, var) in params {
            let Some(g) = grads.get(name) else { continue };
            let g = g.to_dtype(DType::F32)?;
            let p = match self.master.get(name) {
                Some(p) => p.clone(),
                None => var.as_tensor().to_dtype(DType::F32)?,
            };
            let m = match self.m.get(name) {
                Some(m) => ((m * c.beta1)? + (&g * (1.0 - c.beta1))?)?,
                None => (&g * (1.0 - c.beta1))?,
            };
            let g2 = g.sqr()?;
            let v = match self.v.get(name) {
                Some(v) => ((v * c.beta2)? + (&g2 * (1.0 - c.beta2))?)?,
                None => (&g2 * (1.0 - c.beta2))?,
            };
            let p = (&p * (1.0 - lr * c.weight_decay))?;
            let denom = ((v.sqrt()? / bc2_sqrt)? + c.eps)?;
            let p = (p - (m.div(&denom)? * (lr / bc1))?)?;
            if var.dtype() == DType::F32 {
                var.set(&p)?;
            } else {
                var.set(&p.to_dtype(var.dtype())?)?;
                self.master.insert(name.clone(), p);
            }
            self.m.insert(name.clone(), m);
            self.v.insert(name.clone(), v);
        }
        Ok(())
    }

    /// Writes `optimizer.safetensors` + `optimizer.json` into `dir`.
    pub fn save(&self, dir: &Path) -> Result<()> {
        let mut tensors: HashMap<String, Tensor> = HashMap::new();
        for (k, t) in &self.m {
            tensors.insert(format!("m.{k}"), t.clone());
        }
        for (k, t) in &self.v {
            tensors.insert(format!("v.{k}"), t.clone());
        }
        for (k, t) in &self.master {
            tensors.insert(format!("master.{k}"), t.clone());
        }
        let st = dir.join("optimizer.safetensors");
        candle_core::safetensors::save(&tensors, &st)?;
        let meta = Meta {
            format_version: FORMAT_VERSION,
            step: self.step,
            config: self.config,
            params: self.m.keys().cloned().collect(),
        };
        let path = dir.join("optimizer.json");
        let text = serde_json::to_string_pretty(&meta)
            .map_err(|e| LearnerError::Invalid(e.to_string()))?;
        std::fs::write(&path, text).map_err(LearnerError::io("write", &path))
    }

    /// Reads the state written by [`AdamW::save`], onto `device`.
    pub fn load(dir: &Path, device: &candle_core::Device) -> Result<AdamW> {
        let path = dir.join("optimizer.json");
        let bad = |message: String| LearnerError::BadCheckpoint {
            path: path.clone(),
            message,
        };
        let text = std::fs::read_to_string(&path).map_err(LearnerError::io("read", &path))?;
        let meta: Meta = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        if meta.format_version != FORMAT_VERSION {
            return Err(bad(format!(
                "format_version {} (expected {FORMAT_VERSION})",
                meta.format_version
            )));
        }
        let st = dir.join("optimizer.safetensors");
        let tensors = candle_core::safetensors::load(&st, device).map_err(|e| {
            LearnerError::BadCheckpoint {
                path: st.clone(),
                message: e.to_string(),
            }
        })?;
        let mut opt = AdamW::new(meta.config);
        opt.step = meta.step;
        for (k, t) in tensors {
            if let Some(n) = k.strip_prefix("m.") {
                opt.m.insert(n.to_string(), t);
            } else if let Some(n) = k.strip_prefix("v.") {
                opt.v.insert(n.to_string(), t);
            } else if let Some(n) = k.strip_prefix("master.") {
                opt.master.insert(n.to_string(), t);
            }
        }
        for p in &meta.params {
            if !opt.m.contains_key(p) || !opt.v.contains_key(p) {
                return Err(LearnerError::BadCheckpoint {
                    path: st,
                    message: format!("no moments for `{p}`"),
                });
            }
        }
        Ok(opt)
    }
}
