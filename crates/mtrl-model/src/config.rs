//! `config.json` of a Qwen2/Qwen3 checkpoint, as Hugging Face writes it, plus dtype/device parsing.
//!
//! Both RoPE spellings are accepted: the Hub's top-level `rope_theta` and transformers 5's
//! `rope_parameters: {rope_theta, rope_type}`. Anything that would change the maths without this
//! implementation knowing it (rope scaling, sliding windows, mixture-of-experts, another
//! architecture, another activation) is refused at load time with an error naming the key: a model
//! that silently computes something else is worse than one that does not load.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device};
use serde::Deserialize;
use serde_json::Value;

use crate::error::{invalid, unsupported, ModelError, Result};

/// Which decoder family: they differ only in q/k/v bias (Qwen2) and per-head q/k RMSNorm (Qwen3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Qwen2,
    Qwen3,
}

/// The subset of `config.json` the model needs, validated.
#[derive(Debug, Clone)]
pub struct Config {
    pub family: Family,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub max_position_embeddings: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub tie_word_embeddings: bool,
    /// q/k/v projections carry a bias (Qwen2 always; Qwen3 when `attention_bias` is true).
    pub attention_bias: bool,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    /// The file as read, so that a saved checkpoint keeps every key (and its order) it came with.
    pub raw: Value,
}

#[derive(Deserialize)]
struct RawConfig {
    model_type: Option<String>,
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    max_position_embeddings: usize,
    rms_norm_eps: f64,
    rope_theta: Option<f64>,
    rope_parameters: Option<Value>,
    #[serde(default)]
    tie_word_embeddings: bool,
    attention_bias: Option<bool>,
    hidden_act: Option<String>,
    bos_token_id: Option<Value>,
    eos_token_id: Option<Value>,
}

/// `rope_scaling` / `rope_parameters` may only be absent, null or of the plain `default` kind.
fn check_rope_kind(path: &Path, key: &str, v: Option<&Value>) -> Result<()> {
    let Some(v) = v else { return Ok(()) };
    if v.is_null() {
        return Ok(());
    }
    let Some(obj) = v.as_object() else {
        return Err(unsupported(
            path,
            key,
            format!("expected an object or null, got {v}"),
        ));
    };
    for kind_key in ["rope_type", "type"] {
        if let Some(kind) = obj.get(kind_key) {
            if kind.as_str() != Some("default") {
                return Err(unsupported(
                    path,
                    &format!("{key}.{kind_key}"),
                    format!("rope scaling kind {kind} is not supported (only \"default\")"),
                ));
            }
        }
    }
    Ok(())
}

fn token_ids(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|x| x.as_u64())
            .map(|x| x as u32)
            .collect(),
        _ => Vec::new(),
    }
}

impl Config {
    /// Reads and validates `config.json`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| ModelError::io(path, e))?;
        let raw: Value = serde_json::from_str(&text).map_err(|e| ModelError::Json {
            path: path.to_path_buf(),
            msg: e.to_string(),
        })?;
        Self::from_value(raw, path)
    }

    /// Validates an already parsed `config.json` (`path` is only used in messages).
    pub fn from_value(raw: Value, path: &Path) -> Result<Self> {
        let obj = raw
            .as_object()
            .ok_or_else(|| invalid(path, "<root>", "expected a json object"))?;
        let family = match obj.get("model_type").and_then(Value::as_str) {
            Some("qwen2") => Family::Qwen2,
            Some("qwen3") => Family::Qwen3,
            Some(other) => {
                return Err(unsupported(
                    path,
                    "model_type",
                    format!("architecture `{other}` is not supported (expected qwen2 or qwen3)"),
                ))
            }
            None => return Err(invalid(path, "model_type", "missing")),
        };
        for key in [
            "num_experts",
            "num_experts_per_tok",
            "moe_intermediate_size",
            "num_local_experts",
        ] {
            if obj
                .get(key)
                .is_some_and(|v| !v.is_null() && v.as_u64() != Some(0))
            {
                return Err(unsupported(
                    path,
                    key,
                    "mixture-of-experts models are not supported",
                ));
            }
        }
        if obj.get("use_sliding_window").and_then(Value::as_bool) == Some(true) {
            return Err(unsupported(
                path,
                "use_sliding_window",
                "sliding-window attention is not supported",
            ));
        }
        if let Some(types) = obj.get("layer_types").and_then(Value::as_array) {
            if let Some(t) = types.iter().find(|t| t.as_str() != Some("full_attention")) {
                return Err(unsupported(
                    path,
                    "layer_types",
                    format!("layer type {t} is not supported"),
                ));
            }
        }
        check_rope_kind(path, "rope_scaling", obj.get("rope_scaling"))?;
        check_rope_kind(path, "rope_parameters", obj.get("rope_parameters"))?;
        let r: RawConfig = serde_json::from_value(raw.clone()).map_err(|e| ModelError::Json {
            path: path.to_path_buf(),
            msg: e.to_string(),
        })?;
        debug_assert!(r.model_type.is_some());
        if let Some(act) = r.hidden_act.as_deref() {
            if act != "silu" {
                return Err(unsupported(
                    path,
                    "hidden_act",
                    format!("activation `{act}` (only silu)"),
                ));
            }
        }
        let from_params = r
            .rope_parameters
            .as_ref()
            .and_then(|p| p.get("rope_theta"))
            .and_then(Value::as_f64);
        let rope_theta = r.rope_theta.or(from_params).ok_or_else(|| {
            invalid(
                path,
                "rope_theta",
                "missing (neither `rope_theta` nor `rope_parameters.rope_theta`)",
            )
        })?;
        let heads = r.num_attention_heads;
        if heads == 0 || r.hidden_size == 0 || r.vocab_size == 0 || r.num_hidden_layers == 0 {
            return Err(invalid(
                path,
                "num_attention_heads",
                "sizes must be positive",
            ));
        }
        let kv = r.num_key_value_heads.unwrap_or(heads);
        if kv == 0 || !heads.is_multiple_of(kv) {
            return Err(invalid(
                path,
                "num_key_value_heads",
                format!("{kv} does not divide num_attention_heads {heads}"),
            ));
        }
        let head_dim = r.head_dim.unwrap_or(r.hidden_size / heads);
        if head_dim == 0 || !head_dim.is_multiple_of(2) {
            return Err(invalid(
                path,
                "head_dim",
                format!("{head_dim} must be positive and even"),
            ));
        }
        let attention_bias = match family {
            Family::Qwen2 => r.attention_bias.unwrap_or(true),
            Family::Qwen3 => r.attention_bias.unwrap_or(false),
        };
        Ok(Self {
            family,
            vocab_size: r.vocab_size,
            hidden_size: r.hidden_size,
            intermediate_size: r.intermediate_size,
            num_hidden_layers: r.num_hidden_layers,
            num_attention_heads: heads,
            num_key_value_heads: kv,
            head_dim,
            max_position_embeddings: r.max_position_embeddings,
            rms_norm_eps: r.rms_norm_eps,
            rope_theta,
            tie_word_embeddings: r.tie_word_embeddings,
            attention_bias,
            bos_token_id: token_ids(r.bos_token_id.as_ref()).first().copied(),
            eos_token_ids: token_ids(r.eos_token_id.as_ref()),
            raw,
        })
    }
}

/// Parses "f32" / "float32", "bf16" / "bfloat16", "f16" / "float16".
pub fn parse_dtype(s: &str) -> Result<DType> {
    match s.to_ascii_lowercase().as_str() {
        "f32" | "float32" => Ok(DType::F32),
        "bf16" | "bfloat16" => Ok(DType::BF16),
        "f16" | "float16" | "half" => Ok(DType::F16),
        _ => Err(ModelError::InvalidArgument(format!(
            "unknown dtype `{s}` (expected f32, bf16 or f16)"
        ))),
    }
}

/// Parses "cpu", "cuda" or "cuda:N". A cuda device needs a binary built with the `cuda` feature
/// and a machine whose driver reports device N; otherwise the error says which of the two is
/// missing (never a panic: a cuda binary on a machine without a GPU must fail cleanly).
pub fn parse_device(s: &str) -> Result<Device> {
    let s = s.trim();
    if s == "cpu" {
        return Ok(Device::Cpu);
    }
    let ordinal = if s == "cuda" {
        0
    } else if let Some(n) = s.strip_prefix("cuda:") {
        n.parse::<usize>().map_err(|_| {
            ModelError::InvalidArgument(format!("bad device `{s}` (expected cpu, cuda or cuda:N)"))
        })?
    } else {
        return Err(ModelError::InvalidArgument(format!(
            "unknown device `{s}` (expected cpu, cuda or cuda:N)"
        )));
    };
    cuda_device(s, ordinal)
}

#[cfg(not(feature = "cuda"))]
fn cuda_device(s: &str, _ordinal: usize) -> Result<Device> {
    Err(ModelError::InvalidArgument(format!(
        "device `{s}` needs a binary built with the `cuda` feature \
         (cargo build --release --features cuda); this one is CPU-only"
    )))
}

#[cfg(feature = "cuda")]
fn cuda_device(s: &str, ordinal: usize) -> Result<Device> {
    use candle_core::cuda_backend::cudarc::driver::{CudaContext, DriverError};
    let why = |e: DriverError| match e.error_string() {
        Ok(text) => format!("{} ({:?})", text.to_string_lossy(), e.0),
        Err(_) => format!("{:?}", e.0),
    };
    let count = CudaContext::device_count().map_err(|e| {
        ModelError::InvalidArgument(format!(
            "device `{s}` is not available: {}; is there an NVIDIA GPU and driver (`nvidia-smi`)?",
            why(e)
        ))
    })?;
    let count = usize::try_from(count).unwrap_or(0);
    if ordinal >= count {
        return Err(ModelError::InvalidArgument(format!(
            "device `{s}` does not exist: the driver reports {count} CUDA device(s){}",
            if count > 0 {
                format!(" (cuda:0..cuda:{})", count - 1)
            } else {
                String::new()
            }
        )));
    }
    crate::device::open_cuda(ordinal)
        .map_err(|e| ModelError::InvalidArgument(format!("device `{s}` could not be opened: {e}")))
}

/// `generation_config.json` defaults (EOS ids and sampling defaults), all optional.
#[derive(Debug, Clone, Default)]
pub struct GenerationConfig {
    pub eos_token_ids: Vec<u32>,
    pub pad_token_id: Option<u32>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<usize>,
    /// The file as read (saved back unchanged).
    pub raw: Option<Value>,
}

impl GenerationConfig {
    /// Reads `generation_config.json` if it exists; a missing file gives the empty default.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let path: PathBuf = dir.join("generation_config.json");
        if !path.exists() {
            return Ok(Self::default());
        }
        let text = std::fs::read_to_string(&path).map_err(|e| ModelError::io(&path, e))?;
        let raw: Value = serde_json::from_str(&text).map_err(|e| ModelError::Json {
            path: path.clone(),
            msg: e.to_string(),
        })?;
        Ok(Self {
            eos_token_ids: token_ids(raw.get("eos_token_id")),
            pad_token_id: token_ids(raw.get("pad_token_id")).first().copied(),
            temperature: raw.get("temperature").and_then(Value::as_f64),
            top_p: raw.get("top_p").and_then(Value::as_f64),
            top_k: raw.get("top_k").and_then(Value::as_u64).map(|k| k as usize),
            raw: Some(raw),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn base() -> Value {
        json!({"model_type": "qwen3", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
               "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
               "max_position_embeddings": 32, "rms_norm_eps": 1e-6, "rope_theta": 10000.0})
    }

    fn err_of(mut extra: Value) -> String {
        let mut v = base();
        v.as_object_mut()
            .unwrap()
            .append(extra.as_object_mut().unwrap());
        Config::from_value(v, Path::new("config.json"))
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn both_rope_forms() {
        let c = Config::from_value(base(), Path::new("c")).unwrap();
        assert_eq!(c.rope_theta, 10000.0);
        assert_eq!(c.head_dim, 4);
        let mut v = base();
        v.as_object_mut().unwrap().remove("rope_theta");
        v["rope_parameters"] = json!({"rope_theta": 5.0, "rope_type": "default"});
        assert_eq!(
            Config::from_value(v, Path::new("c")).unwrap().rope_theta,
            5.0
        );
    }

    #[test]
    fn refusals_name_the_key() {
        assert!(
            err_of(json!({"rope_scaling": {"type": "yarn", "factor": 4.0}}))
                .contains("rope_scaling.type")
        );
        assert!(err_of(json!({"rope_parameters": {"rope_type": "llama3"}}))
            .contains("rope_parameters.rope_type"));
        assert!(err_of(json!({"use_sliding_window": true})).contains("use_sliding_window"));
        assert!(err_of(json!({"num_experts": 8})).contains("num_experts"));
        assert!(err_of(json!({"model_type": "llama"})).contains("model_type"));
        assert!(err_of(json!({"hidden_act": "gelu"})).contains("hidden_act"));
    }

    #[test]
    fn dtype_and_device_strings() {
        assert_eq!(parse_dtype("bf16").unwrap(), DType::BF16);
        assert!(parse_dtype("f8").unwrap_err().to_string().contains("f8"));
        assert!(parse_device("cpu").is_ok());
        assert!(parse_device("tpu").is_err());
        assert!(parse_device("cuda:x")
            .unwrap_err()
            .to_string()
            .contains("bad device `cuda:x`"));
        #[cfg(not(feature = "cuda"))]
        for d in ["cuda", "cuda:0", "cuda:3"] {
            let e = parse_device(d).unwrap_err().to_string();
            assert!(
                e.contains(&format!(
                    "device `{d}` needs a binary built with the `cuda` feature"
                )),
                "{e}"
            );
        }
    }

    /// With the `cuda` feature: a device the machine does not have is an error naming it, on a
    /// machine without GPU or driver (no device at all) and on a GPU machine (ordinal too high).
    #[cfg(feature = "cuda")]
    #[test]
    fn missing_cuda_device_is_a_clear_error() {
        let e = parse_device("cuda:999").unwrap_err().to_string();
        assert!(e.contains("device `cuda:999`"), "{e}");
        assert!(
            e.contains("does not exist") || e.contains("is not available"),
            "{e}"
        );
    }
}
