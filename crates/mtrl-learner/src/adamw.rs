//! AdamW with saveable state (candle-nn's keeps its moments private, and exact resume needs them).
//!
//! Update at step t (PyTorch's formulation, so results match `torch.optim.AdamW` closely):
//! p ← p·(1 − lr·wd); m ← β1·m + (1−β1)·g; v ← β2·v + (1−β2)·g²;
//! p ← p − (lr / (1−β1ᵗ)) · m / (sqrt(v) / sqrt(1−β2ᵗ) + ε).
//! Weight decay applies to every parameter (norms and biases included, as `torch.optim.AdamW`
//! with one parameter group and the fixtures) unless `decay_norms` / `decay_biases` /
//! `decay_embeddings` exclude them (names holding `norm`, ending in `.bias`, or `embed_tokens` —
//! the Hugging Face Trainer's convention excludes the first two). A parameter without a gradient is
//! skipped entirely, and t counts *its own* updates (torch keeps `state["step"]` per parameter):
//! one that missed steps gets the bias correction of the steps it took.
//!
//! Mixed precision: parameters stored in bf16/f16 get an f32 master copy here (created from the
//! parameter at its first update). Moments are always f32. The update runs on the master in f32
//! and the result is cast to the parameter's dtype, so updates far below a bf16 ulp accumulate in
//! the master instead of rounding away (tested below). Memory per bf16 parameter: 2 (weight) +
//! 4 (master) + 8 (moments) bytes. Invariant: while training, the parameter equals its master
//! cast to the parameter dtype — weights are changed only through [`AdamW::step`] (a master whose
//! parameter became f32 is dropped). Masters are saved and restored with the moments.

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
    /// Decay RMSNorm weights (`…norm…`).
    #[serde(default = "yes")]
    pub decay_norms: bool,
    /// Decay biases (`….bias`).
    #[serde(default = "yes")]
    pub decay_biases: bool,
    /// Decay the token embedding (and a tied output head).
    #[serde(default = "yes")]
    pub decay_embeddings: bool,
}

fn yes() -> bool {
    true
}

impl AdamWConfig {
    /// Whether `name` is weight-decayed.
    pub fn decays(&self, name: &str) -> bool {
        if name.contains("norm") {
            self.decay_norms
        } else if name.ends_with(".bias") {
            self.decay_biases
        } else if name.contains("embed_tokens") {
            self.decay_embeddings
        } else {
            true
        }
    }
}

impl Default for AdamWConfig {
    fn default() -> Self {
        AdamWConfig {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
            decay_norms: true,
            decay_biases: true,
            decay_embeddings: true,
        }
    }
}

#[derive(Serialize, Deserialize)]
struct Meta {
    format_version: u32,
    step: u64,
    config: AdamWConfig,
    params: Vec<String>,
    /// Parameters with an f32 master copy (absent in files written before masters were listed).
    #[serde(default)]
    masters: Vec<String>,
    /// Updates per parameter (absent in older files: every parameter took `step` updates).
    #[serde(default)]
    param_steps: BTreeMap<String, u64>,
}

pub struct AdamW {
    pub config: AdamWConfig,
    step: u64,
    /// Updates of each parameter (torch's per-parameter `state["step"]`).
    steps: BTreeMap<String, u64>,
    m: BTreeMap<String, Tensor>,
    v: BTreeMap<String, Tensor>,
    master: BTreeMap<String, Tensor>,
}

impl AdamW {
    pub fn new(config: AdamWConfig) -> AdamW {
        AdamW {
            config,
            step: 0,
            steps: BTreeMap::new(),
            m: BTreeMap::new(),
            v: BTreeMap::new(),
            master: BTreeMap::new(),
        }
    }

    /// The f32 master copy of a bf16/f16 parameter, once it has been updated.
    pub fn master(&self, name: &str) -> Option<&Tensor> {
        self.master.get(name)
    }

    /// Bytes of optimizer state held: both moments and the master copies.
    pub fn state_bytes(&self) -> usize {
        [&self.m, &self.v, &self.master]
            .iter()
            .flat_map(|m| m.values())
            .map(|t| t.elem_count() * t.dtype().size_in_bytes())
            .sum()
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
        for (name, var) in params {
            let Some(g) = grads.get(name) else { continue };
            let t = {
                let n = self.steps.entry(name.clone()).or_insert(0);
                *n += 1;
                *n as i32
            };
            let bc1 = 1.0 - c.beta1.powi(t);
            let bc2_sqrt = (1.0 - c.beta2.powi(t)).sqrt();
            let wd = if c.decays(name) { c.weight_decay } else { 0.0 };
            if g.dims() != var.dims() {
                return Err(LearnerError::Invalid(format!(
                    "gradient of `{name}` has shape {:?}, the parameter {:?}",
                    g.dims(),
                    var.dims()
                )));
            }
            let g = g.to_dtype(DType::F32)?;
            if var.dtype() == DType::F32 {
                self.master.remove(name);
            }
            let p = match self.master.get(name) {
                Some(p) if p.dims() == var.dims() => p.clone(),
                Some(p) => {
                    return Err(LearnerError::Invalid(format!(
                        "master copy of `{name}` has shape {:?}, the parameter {:?}",
                        p.dims(),
                        var.dims()
                    )))
                }
                None => var.as_tensor().to_dtype(DType::F32)?,
            };
            if var.dtype() == DType::F32 {
                let k = crate::adamw_cpu::Coeffs {
                    b1: c.beta1 as f32,
                    omb1: (1.0 - c.beta1) as f32,
                    b2: c.beta2 as f32,
                    omb2: (1.0 - c.beta2) as f32,
                    decay: (1.0 - lr * wd) as f32,
                    inv_bc2: (1.0 / bc2_sqrt) as f32,
                    eps: c.eps as f32,
                    step: (lr / bc1) as f32,
                };
                let (mo, vo) = (self.m.get(name), self.v.get(name));
                if let Some((p, m, v)) = crate::adamw_cpu::update(&p, &g, mo, vo, k) {
                    var.set(&p)?;
                    self.m.insert(name.clone(), m);
                    self.v.insert(name.clone(), v);
                    continue;
                }
            }
            let m = match self.m.get(name) {
                Some(m) => ((m * c.beta1)? + (&g * (1.0 - c.beta1))?)?,
                None => (&g * (1.0 - c.beta1))?,
            };
            let g2 = g.sqr()?;
            let v = match self.v.get(name) {
                Some(v) => ((v * c.beta2)? + (&g2 * (1.0 - c.beta2))?)?,
                None => (&g2 * (1.0 - c.beta2))?,
            };
            let p = (&p * (1.0 - lr * wd))?;
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

    /// A copy whose tensors later updates do not touch, in host memory (GPU state is copied to
    /// the host, finished before this returns), for a background checkpoint writer.
    pub fn snapshot(&self) -> Result<AdamW> {
        let copy = |m: &BTreeMap<String, Tensor>| -> Result<BTreeMap<String, Tensor>> {
            m.iter()
                .map(|(k, t)| {
                    let t = match t.device() {
                        candle_core::Device::Cpu => t.copy()?,
                        _ => t.to_device(&candle_core::Device::Cpu)?,
                    };
                    Ok((k.clone(), t))
                })
                .collect()
        };
        let out = AdamW {
            config: self.config,
            step: self.step,
            steps: self.steps.clone(),
            m: copy(&self.m)?,
            v: copy(&self.v)?,
            master: copy(&self.master)?,
        };
        if let Some(t) = self.m.values().next() {
            t.device().synchronize()?;
        }
        Ok(out)
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
            masters: self.master.keys().cloned().collect(),
            param_steps: self.steps.clone(),
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
        opt.steps = if meta.param_steps.is_empty() {
            meta.params.iter().map(|p| (p.clone(), meta.step)).collect()
        } else {
            meta.param_steps.clone()
        };
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
        for p in &meta.masters {
            if !opt.master.contains_key(p) {
                return Err(LearnerError::BadCheckpoint {
                    path: st,
                    message: format!("no master weights for `{p}`"),
                });
            }
        }
        Ok(opt)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn no_decay() -> AdamWConfig {
        AdamWConfig {
            weight_decay: 0.0,
            ..AdamWConfig::default()
        }
    }

    fn scalars(t: &Tensor) -> Vec<f32> {
        t.to_dtype(DType::F32)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap()
    }

    /// One parameter `w` = [1.0, 1.0] in `dtype`, gradient 1 each step (so each Adam step moves
    /// it by ≈ lr), `steps` steps of `lr`.
    fn run(dtype: DType, lr: f64, steps: usize) -> (AdamW, BTreeMap<String, Var>) {
        let dev = Device::Cpu;
        let w = Var::from_tensor(&Tensor::ones(2, dtype, &dev).unwrap()).unwrap();
        let params = BTreeMap::from([("w".to_string(), w)]);
        let grads = BTreeMap::from([("w".to_string(), Tensor::ones(2, dtype, &dev).unwrap())]);
        let mut opt = AdamW::new(no_decay());
        for _ in 0..steps {
            opt.step(&params, &grads, lr).unwrap();
        }
        (opt, params)
    }

    #[test]
    fn decay_exclusions_and_per_parameter_steps() {
        let dev = Device::Cpu;
        let one = || Var::from_tensor(&Tensor::ones(2, DType::F32, &dev).unwrap()).unwrap();
        let names = [
            "model.norm.weight",
            "q.bias",
            "model.embed_tokens.weight",
            "w",
        ];
        let params: BTreeMap<String, Var> = names.iter().map(|n| (n.to_string(), one())).collect();
        let zero = Tensor::zeros(2, DType::F32, &dev).unwrap();
        let grads: BTreeMap<String, Tensor> = names
            .iter()
            .map(|n| (n.to_string(), zero.clone()))
            .collect();
        let cfg = AdamWConfig {
            weight_decay: 0.5,
            decay_norms: false,
            decay_biases: false,
            decay_embeddings: false,
            ..AdamWConfig::default()
        };
        // A zero gradient leaves only the decay: p·(1 − lr·wd) = 0.95 where it applies.
        let mut opt = AdamW::new(cfg);
        opt.step(&params, &grads, 0.1).unwrap();
        for n in names {
            let want = if n == "w" { 0.95 } else { 1.0 };
            assert_eq!(scalars(params[n].as_tensor()), vec![want; 2], "{n}");
        }
        // `late` first gets a gradient at update 3: its first step is a first step (moved by
        // lr · g / |g| = lr), not one bias-corrected for three.
        let late = BTreeMap::from([("late".to_string(), one())]);
        let mut opt = AdamW::new(no_decay());
        let none = BTreeMap::new();
        opt.step(&late, &none, 0.1).unwrap();
        opt.step(&late, &none, 0.1).unwrap();
        let g = BTreeMap::from([(
            "late".to_string(),
            Tensor::ones(2, DType::F32, &dev).unwrap(),
        )]);
        opt.step(&late, &g, 0.1).unwrap();
        for x in scalars(late["late"].as_tensor()) {
            assert!((x - 0.9).abs() < 1e-6, "{x}");
        }
        let d = tempfile::tempdir().unwrap();
        opt.save(d.path()).unwrap();
        let back = AdamW::load(d.path(), &dev).unwrap();
        assert_eq!((back.step, back.steps.clone()), (3, opt.steps.clone()));
        assert_eq!(back.steps["late"], 1);
    }

    #[test]
    fn tiny_bf16_updates_accumulate_in_the_master() {
        // bf16 has 8 significant bits: its ulp at 1.0 is 2^-7 ≈ 0.0078 (just below 1.0, 2^-8), so
        // a step of 1e-3 applied in bf16 rounds back to 1.0 every time.
        let bf16 = |x: f32| {
            let t = Tensor::new(&[x], &Device::Cpu).unwrap();
            scalars(&t.to_dtype(DType::BF16).unwrap())[0]
        };
        assert_eq!(bf16(1.0 - 1e-3), 1.0);
        let (lr, steps) = (1e-3, 100);
        let (opt, params) = run(DType::BF16, lr, steps);
        let master = scalars(opt.master("w").unwrap());
        let want = 1.0 - lr as f32 * steps as f32; // Adam step ≈ lr when g is constant
        for m in &master {
            assert!((m - want).abs() < 1e-4, "master {m} vs {want}");
        }
        let w = params["w"].as_tensor();
        assert_eq!(w.dtype(), DType::BF16);
        for (x, m) in scalars(w).iter().zip(&master) {
            assert_eq!(*x, bf16(*m), "weight is the master rounded to bf16");
        }
        assert!(master[0] < 0.91, "moved by ~steps·lr, not lost to rounding");
        // the f32 path agrees with the master to float precision and keeps no master copy
        let (opt32, p32) = run(DType::F32, lr, steps);
        assert!(opt32.master("w").is_none());
        for (a, b) in scalars(p32["w"].as_tensor()).iter().zip(&master) {
            assert!((a - b).abs() < 1e-6, "f32 {a} vs master {b}");
        }
    }

    #[test]
    fn masters_survive_save_and_load() {
        let (opt, params) = run(DType::BF16, 1e-3, 3);
        let dir = tempfile::tempdir().unwrap();
        opt.save(dir.path()).unwrap();
        let meta = std::fs::read_to_string(dir.path().join("optimizer.json")).unwrap();
        assert!(meta.contains("\"masters\""), "{meta}");
        let mut loaded = AdamW::load(dir.path(), &Device::Cpu).unwrap();
        let (a, b) = (opt.master("w").unwrap(), loaded.master("w").unwrap());
        assert_eq!(b.dtype(), DType::F32);
        assert_eq!(scalars(a), scalars(b));
        // continuing from the loaded state matches continuing without the round trip, bit for bit
        let mut opt = opt;
        let copy = Var::from_tensor(&params["w"].as_tensor().copy().unwrap()).unwrap();
        let other = BTreeMap::from([("w".to_string(), copy)]);
        let g = BTreeMap::from([(
            "w".to_string(),
            Tensor::ones(2, DType::BF16, &Device::Cpu).unwrap(),
        )]);
        for _ in 0..20 {
            opt.step(&params, &g, 1e-3).unwrap();
            loaded.step(&other, &g, 1e-3).unwrap();
        }
        let (x, y) = (opt.master("w").unwrap(), loaded.master("w").unwrap());
        assert_eq!(scalars(x), scalars(y));
        assert_eq!(
            scalars(params["w"].as_tensor()),
            scalars(other["w"].as_tensor())
        );
        // a state file that lists a master the tensors lack is refused, naming it
        let mut m: serde_json::Value = serde_json::from_str(&meta).unwrap();
        m["masters"] = serde_json::json!(["w", "ghost"]);
        std::fs::write(dir.path().join("optimizer.json"), m.to_string()).unwrap();
        let err = AdamW::load(dir.path(), &Device::Cpu)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("no master weights for `ghost`"), "{err}");
    }

    #[test]
    fn a_parameter_that_became_f32_drops_its_master() {
        let (mut opt, _) = run(DType::BF16, 1e-3, 2);
        assert!(opt.master("w").is_some());
        let w = Var::from_tensor(&Tensor::new(&[0.5f32, 0.5], &Device::Cpu).unwrap()).unwrap();
        let params = BTreeMap::from([("w".to_string(), w)]);
        let g = BTreeMap::from([(
            "w".to_string(),
            Tensor::new(&[1f32, 1.0], &Device::Cpu).unwrap(),
        )]);
        opt.step(&params, &g, 1e-3).unwrap();
        assert!(opt.master("w").is_none());
        // updated from its own value (0.5), not from the stale master (≈ 0.998)
        for x in scalars(params["w"].as_tensor()) {
            assert!((x - 0.499).abs() < 1e-4, "{x}");
        }
        let bad = BTreeMap::from([("w".to_string(), Tensor::new(&[1f32], &Device::Cpu).unwrap())]);
        let err = opt.step(&params, &bad, 1e-3).err().unwrap().to_string();
        assert!(err.contains("gradient of `w` has shape"), "{err}");
    }
}
