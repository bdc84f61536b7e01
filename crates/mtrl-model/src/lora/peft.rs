//! PEFT's adapter folder: `adapter_config.json` + `adapter_model.safetensors`, read and written
//! as PEFT 0.21 writes them.
//!
//! Writing: the config has every key `save_pretrained` writes, sorted, indent 2, no final newline;
//! the tensors are F32, sorted by name, with the header metadata `{"format": "pt"}`. Re-saving a
//! loaded adapter reproduces PEFT's two files byte for byte (tested on the fixtures), so PEFT,
//! vLLM and transformers load what mtrl saves.
//!
//! Reading: anything this implementation does not compute — DoRA, LoRA bias, per-module ranks or
//! alphas, `modules_to_save`, layer selection, `fan_in_fan_out`, a regex `target_modules`, a
//! non-LoRA `peft_type` — is an error naming the file and the field, never ignored.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use serde_json::{json, Value};

use mtrl_core::config::LoraField;

use super::LoraSpec;
use crate::error::{invalid, unsupported, ModelError, Result};

pub const CONFIG_FILE: &str = "adapter_config.json";
pub const WEIGHTS_FILE: &str = "adapter_model.safetensors";

/// An adapter folder's content.
#[derive(Debug, Clone)]
pub struct AdapterFiles {
    pub spec: LoraSpec,
    /// `base_model_name_or_path` as written.
    pub base_model: Option<String>,
    /// The tensors under their PEFT names (`dtype`, `device` of the loader).
    pub tensors: HashMap<String, Tensor>,
}

/// Whether `v` is PEFT's "off" value for a field (absent, null, false, `{}`, `[]`).
fn off(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) | Some(Value::Bool(false)) => true,
        Some(Value::Object(o)) => o.is_empty(),
        Some(Value::Array(a)) => a.is_empty(),
        _ => false,
    }
}

/// Reads `dir/adapter_config.json` into a [`LoraSpec`] (and the base model's name).
pub fn read_config(dir: &Path) -> Result<(LoraSpec, Option<String>)> {
    let path = dir.join(CONFIG_FILE);
    let text = std::fs::read_to_string(&path).map_err(|e| ModelError::io(&path, e))?;
    let v: Value = serde_json::from_str(&text).map_err(|e| ModelError::Json {
        path: path.clone(),
        msg: e.to_string(),
    })?;
    let obj = v
        .as_object()
        .ok_or_else(|| invalid(&path, "(top level)", "is not a JSON object"))?;
    let get = |k: &str| obj.get(k);
    check_plain_lora(&path, obj)?;
    let rank = get("r")
        .and_then(Value::as_u64)
        .ok_or_else(|| invalid(&path, "r", "missing or not a whole number"))?
        as usize;
    let alpha = get("lora_alpha")
        .and_then(Value::as_f64)
        .ok_or_else(|| invalid(&path, "lora_alpha", "missing or not a number"))?;
    let dropout = match get("lora_dropout") {
        None | Some(Value::Null) => 0.0,
        Some(v) => v
            .as_f64()
            .ok_or_else(|| invalid(&path, "lora_dropout", "not a number"))?,
    };
    let rslora = match get("use_rslora") {
        None | Some(Value::Null) => false,
        Some(v) => v
            .as_bool()
            .ok_or_else(|| invalid(&path, "use_rslora", "not true or false"))?,
    };
    let targets = target_modules(&path, get("target_modules"))?;
    let layers = layers_to_transform(&path, get("layers_to_transform"))?;
    let spec = LoraSpec {
        rank,
        alpha,
        targets,
        dropout,
        rslora,
        layers,
    };
    spec.check().map_err(|(field, message)| {
        let key = match field {
            LoraField::Rank => "r",
            LoraField::Alpha => "lora_alpha",
            LoraField::Dropout => "lora_dropout",
            LoraField::Targets => "target_modules",
        };
        invalid(&path, key, message)
    })?;
    let base = get("base_model_name_or_path")
        .and_then(Value::as_str)
        .map(str::to_string);
    Ok((spec, base))
}

/// `target_modules`: a list of names, or PEFT's `"all-linear"`; any other pattern is an error.
fn target_modules(path: &Path, v: Option<&Value>) -> Result<Vec<String>> {
    Ok(match v {
        Some(Value::Array(a)) => a
            .iter()
            .map(|t| {
                t.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| invalid(path, "target_modules", "holds a non-string"))
            })
            .collect::<Result<Vec<_>>>()?,
        Some(Value::String(s)) if s == "all-linear" => super::TARGETS.map(String::from).to_vec(),
        Some(Value::String(s)) => {
            return Err(unsupported(
                path,
                "target_modules",
                format!("the pattern `{s}`: list the module names instead"),
            ))
        }
        _ => return Err(invalid(path, "target_modules", "missing or not a list")),
    })
}

/// `layers_to_transform`: absent / null (every layer), one index, or a list of indices (kept
/// sorted, without repeats).
fn layers_to_transform(path: &Path, v: Option<&Value>) -> Result<Option<Vec<usize>>> {
    let one = |x: &Value| {
        x.as_u64().map(|i| i as usize).ok_or_else(|| {
            invalid(
                path,
                "layers_to_transform",
                format!("{x} is not a layer index"),
            )
        })
    };
    let mut l = match v {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(a)) => a.iter().map(one).collect::<Result<Vec<_>>>()?,
        Some(x) => vec![one(x)?],
    };
    if l.is_empty() {
        return Err(invalid(path, "layers_to_transform", "is an empty list"));
    }
    l.sort_unstable();
    l.dedup();
    Ok(Some(l))
}

/// Errors for anything of PEFT's that is not plain LoRA (naming the field).
fn check_plain_lora(path: &Path, obj: &serde_json::Map<String, Value>) -> Result<()> {
    let path = path.to_path_buf();
    let get = |k: &str| obj.get(k);
    match get("peft_type").and_then(Value::as_str) {
        Some("LORA") => {}
        other => {
            return Err(unsupported(
                &path,
                "peft_type",
                format!("{other:?}: only \"LORA\" adapters are supported"),
            ))
        }
    }
    if let Some(t) = get("task_type").and_then(Value::as_str) {
        if t != "CAUSAL_LM" {
            return Err(unsupported(
                &path,
                "task_type",
                format!("`{t}`: only CAUSAL_LM"),
            ));
        }
    }
    if let Some(b) = get("bias").and_then(Value::as_str) {
        if b != "none" {
            return Err(unsupported(&path, "bias", format!("`{b}`: only \"none\"")));
        }
    }
    for key in [
        "use_dora",
        "lora_bias",
        "fan_in_fan_out",
        "rank_pattern",
        "alpha_pattern",
        "modules_to_save",
        "layers_pattern",
        "layer_replication",
        "exclude_modules",
        "trainable_token_indices",
        "target_parameters",
        "use_qalora",
        "use_bdlora",
        "alora_invocation_tokens",
    ] {
        if !off(get(key)) {
            return Err(unsupported(
                &path,
                key,
                format!(
                    "{} is not supported (only plain LoRA)",
                    get(key).unwrap_or(&Value::Null)
                ),
            ));
        }
    }
    Ok(())
}

/// Reads an adapter folder, tensors converted to `dtype` on `device`.
pub fn load(dir: &Path, dtype: DType, device: &Device) -> Result<AdapterFiles> {
    let (spec, base_model) = read_config(dir)?;
    let path = dir.join(WEIGHTS_FILE);
    let bytes = std::fs::read(&path).map_err(|e| ModelError::io(&path, e))?;
    let raw = candle_core::safetensors::load_buffer(&bytes, device).map_err(|e| {
        ModelError::checkpoint(
            &path,
            format!("unreadable or truncated safetensors file: {e}"),
        )
    })?;
    let mut tensors = HashMap::with_capacity(raw.len());
    for (name, t) in raw {
        let t = t.to_dtype(dtype)?;
        crate::checkpoint::check_finite(&name, &t)?;
        tensors.insert(name, t);
    }
    Ok(AdapterFiles {
        spec,
        base_model,
        tensors,
    })
}

/// The `adapter_config.json` PEFT 0.21.2's `save_pretrained` writes for `spec`.
pub fn config_json(spec: &LoraSpec, base_model: &str) -> String {
    let v = json!({
        "alora_invocation_tokens": null,
        "alpha_pattern": {},
        "arrow_config": null,
        "auto_mapping": null,
        "base_model_name_or_path": base_model,
        "bias": "none",
        "corda_config": null,
        "ensure_weight_tying": false,
        "eva_config": null,
        "exclude_modules": null,
        "fan_in_fan_out": false,
        "inference_mode": true,
        "init_lora_weights": false,
        "kasa_config": null,
        "layer_replication": null,
        "layers_pattern": null,
        "layers_to_transform": spec.layers,
        "loftq_config": {},
        "lora_alpha": alpha_value(spec.alpha),
        "lora_bias": false,
        "lora_dropout": spec.dropout,
        "lora_ga_config": null,
        "megatron_config": null,
        "megatron_core": "megatron.core",
        "modules_to_save": null,
        "monteclora_config": null,
        "peft_type": "LORA",
        "peft_version": "0.21.2",
        "qalora_group_size": 16,
        "r": spec.rank,
        "rank_pattern": {},
        "revision": null,
        "target_modules": spec.targets,
        "target_parameters": null,
        "task_type": "CAUSAL_LM",
        "trainable_token_indices": null,
        "use_bdlora": null,
        "use_dora": false,
        "use_qalora": false,
        "use_rslora": spec.rslora,
        "velora_config": null,
    });
    // serde_json keeps insertion order here (preserve_order), which is the sorted order above.
    serde_json::to_string_pretty(&v).unwrap_or_default()
}

/// A whole alpha as an integer (PEFT writes `16`, not `16.0`).
fn alpha_value(a: f64) -> Value {
    if a.fract() == 0.0 && a.abs() < 1e15 {
        json!(a as i64)
    } else {
        json!(a)
    }
}

/// Writes `tensors` (PEFT names) as an adapter folder: F32, sorted, `{"format": "pt"}`. Both files
/// go through a temporary name and a rename.
pub fn save(
    dir: &Path,
    spec: &LoraSpec,
    base_model: &str,
    tensors: &BTreeMap<String, Tensor>,
) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| ModelError::io(dir, e))?;
    let mut host: Vec<(String, Tensor)> = Vec::with_capacity(tensors.len());
    for (name, t) in tensors {
        host.push((
            name.clone(),
            t.to_dtype(DType::F32)?
                .to_device(&Device::Cpu)?
                .contiguous()?,
        ));
    }
    let data: Vec<(String, Vec<u8>, Vec<usize>)> = host
        .iter()
        .map(|(n, t)| {
            let v = t.flatten_all()?.to_vec1::<f32>()?;
            let bytes = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            Ok((n.clone(), bytes, t.dims().to_vec()))
        })
        .collect::<Result<_>>()?;
    let views = data
        .iter()
        .map(|(n, b, s)| {
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), b)
                .map(|v| (n.clone(), v))
                .map_err(|e| ModelError::tensor(n, e.to_string()))
        })
        .collect::<Result<Vec<_>>>()?;
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    let bytes = safetensors::tensor::serialize(views, Some(meta))
        .map_err(|e| ModelError::checkpoint(dir, e.to_string()))?;
    write_atomic(&dir.join(WEIGHTS_FILE), &bytes)?;
    write_atomic(
        &dir.join(CONFIG_FILE),
        config_json(spec, base_model).as_bytes(),
    )
}

fn write_atomic(path: &PathBuf, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).map_err(|e| ModelError::io(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| ModelError::io(path, e))
}

/// Whether `dir` holds a PEFT adapter (its config file exists).
pub fn is_adapter_dir(dir: &Path) -> bool {
    dir.join(CONFIG_FILE).is_file()
}
