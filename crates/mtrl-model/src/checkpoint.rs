//! Hugging Face checkpoint files: find and read `model.safetensors` or the sharded
//! `model-0000N-of-0000M.safetensors` + `model.safetensors.index.json`, and write a policy back in
//! the same layout (HF tensor names, `config.json`, tokenizer and generation files) so that
//! transformers or vLLM load a fine-tuned model unchanged.
//!
//! Invariants: every error names the file at fault (missing shard, truncated shard, tensor listed in
//! the index but absent from its shard); every loaded tensor is checked for NaN/inf before it can
//! reach a forward pass.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};

use crate::error::{ModelError, Result};

/// The weight files of a checkpoint folder, in load order.
pub fn weight_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let index = dir.join("model.safetensors.index.json");
    if index.exists() {
        let text = std::fs::read_to_string(&index).map_err(|e| ModelError::io(&index, e))?;
        let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| ModelError::Json {
            path: index.clone(),
            msg: e.to_string(),
        })?;
        let map = v
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| ModelError::checkpoint(&index, "missing `weight_map` object"))?;
        let mut files: Vec<String> = map
            .values()
            .filter_map(|f| f.as_str().map(str::to_string))
            .collect();
        files.sort();
        files.dedup();
        let paths: Vec<PathBuf> = files.iter().map(|f| dir.join(f)).collect();
        for p in &paths {
            if !p.exists() {
                return Err(ModelError::checkpoint(
                    p,
                    format!("shard listed in {} is missing", index.display()),
                ));
            }
        }
        return Ok(paths);
    }
    let single = dir.join("model.safetensors");
    if single.exists() {
        return Ok(vec![single]);
    }
    Err(ModelError::checkpoint(
        dir,
        "no model.safetensors or model.safetensors.index.json in this folder",
    ))
}

/// Reads every tensor of the checkpoint in `dir`, converted to `dtype` on `device`.
pub fn load_tensors(dir: &Path, dtype: DType, device: &Device) -> Result<HashMap<String, Tensor>> {
    let mut out = HashMap::new();
    for file in weight_files(dir)? {
        let bytes = std::fs::read(&file).map_err(|e| ModelError::io(&file, e))?;
        let tensors = candle_core::safetensors::load_buffer(&bytes, device).map_err(|e| {
            ModelError::checkpoint(
                &file,
                format!("unreadable or truncated safetensors file: {e}"),
            )
        })?;
        for (name, t) in tensors {
            let t = if t.dtype() == dtype {
                t
            } else {
                t.to_dtype(dtype)?
            };
            check_finite(&name, &t)?;
            out.insert(name, t);
        }
    }
    Ok(out)
}

/// Errors if `t` holds a NaN or an infinity.
pub fn check_finite(name: &str, t: &Tensor) -> Result<()> {
    if !t.dtype().is_float() {
        return Ok(());
    }
    // x - x is 0 for finite x and NaN for NaN/inf, so one reduction decides.
    let probe = t.to_dtype(DType::F32)?;
    let s = probe.sub(&probe)?.sum_all()?.to_scalar::<f32>()?;
    if s.is_finite() {
        return Ok(());
    }
    let flat = probe.flatten_all()?.to_vec1::<f32>()?;
    let (i, v) = flat
        .iter()
        .enumerate()
        .find(|(_, v)| !v.is_finite())
        .map(|(i, v)| (i, *v))
        .unwrap_or((0, f32::NAN));
    Err(ModelError::tensor(
        name,
        format!("holds a non-finite value ({v}) at flat index {i}"),
    ))
}

/// [`check_finite`] of many tensors with one read back from the device: the probes of all of
/// them are summed there, and only when the sum is not finite is each tensor checked alone (to
/// name the first bad one).
pub fn check_all_finite<'a>(
    tensors: impl IntoIterator<Item = (&'a str, &'a Tensor)>,
) -> Result<()> {
    let tensors: Vec<(&str, &Tensor)> = tensors
        .into_iter()
        .filter(|(_, t)| t.dtype().is_float())
        .collect();
    let probes = tensors
        .iter()
        .map(|(_, t)| {
            let p = t.to_dtype(DType::F32)?;
            p.sub(&p)?.sum_all()
        })
        .collect::<candle_core::Result<Vec<_>>>()?;
    if probes.is_empty() {
        return Ok(());
    }
    let s = crate::host::scalar::<f32>(&Tensor::stack(&probes, 0)?.sum_all()?)?;
    if s.is_finite() {
        return Ok(());
    }
    for (name, t) in tensors {
        check_finite(name, t)?;
    }
    Ok(())
}

/// Files copied verbatim from the source checkpoint when a policy is saved.
pub const TOKENIZER_FILES: [&str; 5] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "merges.txt",
    "special_tokens_map.json",
];

/// Writes `tensors` as `model.safetensors` (HF names, `dtype`), `config` as `config.json`, an
/// optional `generation_config.json`, and copies the tokenizer files found in `source_dir`.
pub fn save_checkpoint(
    dir: &Path,
    tensors: &BTreeMap<String, Tensor>,
    dtype: DType,
    config: &serde_json::Value,
    generation_config: Option<&serde_json::Value>,
    source_dir: Option<&Path>,
) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| ModelError::io(dir, e))?;
    let mut out: HashMap<String, Tensor> = HashMap::with_capacity(tensors.len());
    for (name, t) in tensors {
        out.insert(
            name.clone(),
            t.to_dtype(dtype)?.to_device(&Device::Cpu)?.contiguous()?,
        );
    }
    let weights = dir.join("model.safetensors");
    // Write to a temporary name and rename, so a crash never leaves a truncated model.safetensors.
    let tmp = dir.join("model.safetensors.tmp");
    candle_core::safetensors::save(&out, &tmp)
        .map_err(|e| ModelError::checkpoint(&tmp, e.to_string()))?;
    std::fs::rename(&tmp, &weights).map_err(|e| ModelError::io(&weights, e))?;
    let mut config = config.clone();
    if let Some(obj) = config.as_object_mut() {
        let name = match dtype {
            DType::BF16 => "bfloat16",
            DType::F16 => "float16",
            _ => "float32",
        };
        for key in ["torch_dtype", "dtype"] {
            if obj.contains_key(key) || key == "torch_dtype" {
                obj.insert(key.to_string(), serde_json::Value::String(name.to_string()));
            }
        }
    }
    write_json(&dir.join("config.json"), &config)?;
    if let Some(g) = generation_config {
        write_json(&dir.join("generation_config.json"), g)?;
    }
    if let Some(src) = source_dir {
        for f in TOKENIZER_FILES {
            let from = src.join(f);
            if from.exists() && src != dir {
                let to = dir.join(f);
                std::fs::copy(&from, &to).map_err(|e| ModelError::io(&to, e))?;
            }
        }
    }
    Ok(())
}

pub(crate) fn write_json(path: &Path, v: &serde_json::Value) -> Result<()> {
    let text = serde_json::to_string_pretty(v).map_err(|e| ModelError::Json {
        path: path.to_path_buf(),
        msg: e.to_string(),
    })?;
    std::fs::write(path, text + "\n").map_err(|e| ModelError::io(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finite_check_names_tensor() {
        let t = Tensor::new(&[1f32, f32::NAN, 2.0], &Device::Cpu).unwrap();
        let e = check_finite("w", &t).unwrap_err().to_string();
        assert!(e.contains("`w`") && e.contains("index 1"), "{e}");
        let t = Tensor::new(&[1f32, 2.0], &Device::Cpu).unwrap();
        assert!(check_finite("w", &t).is_ok());
    }

    #[test]
    fn missing_weights_name_the_folder() {
        let d = tempfile::tempdir().unwrap();
        let e = weight_files(d.path()).unwrap_err().to_string();
        assert!(e.contains("model.safetensors"), "{e}");
    }
}
