//! GGUF (llama.cpp's model file) in: a Qwen2/Qwen3 GGUF becomes an ordinary Hugging Face
//! checkpoint folder (`config.json` from the metadata, dequantised `model.safetensors`,
//! `tokenizer.json` + `tokenizer_config.json` with the file's own chat template,
//! `generation_config.json`), which every command then loads like any other.
//!
//! Reading and dequantisation are candle's (`candle_core::quantized::gguf_file`, every ggml block
//! type candle knows: Q4_0…Q8_K, F16, BF16, F32); this module only maps names and metadata.
//!
//! Invariants:
//! - every metadata key is either understood (and acted on or checked) or an error naming it:
//!   nothing is silently defaulted. Only `general.*` (descriptive: name, licence, tags, file type,
//!   …) and `quantize.imatrix.*` (how the quantiser was calibrated) are read as information;
//! - every tensor maps to exactly one HF name or is an error naming it;
//! - the output head is taken from `output.weight` when the file has one; the embedding is tied
//!   only when it has none (`tie_word_embeddings` follows the file, never a guess);
//! - `head_dim` is `attention.key_length` when given, else `embedding_length / head_count`
//!   (Qwen2 files carry no `rope.dimension_count`; when present it must equal `head_dim`).
//!
//! A `.gguf` given where a checkpoint folder is expected (`[model] path`, `--model`) is loaded
//! directly: its small files are written once into `<file stem>.mtrl/` beside it
//! ([`checkpoint_dir`], stamped with the source's size and modification time, one process writing
//! while the others wait), and its weights are dequantised from the file at each load.

mod cache;
mod tokenizer;

pub use cache::{checkpoint_dir, is_gguf, is_model_path, source_of};

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{Content, Value as G};
use candle_core::{DType, Device, Tensor};
use serde_json::{json, Value};

use crate::checkpoint::{save_checkpoint, write_json};
use crate::config::Config;
use crate::error::{invalid, unsupported, ModelError, Result};
use crate::policy::parameter_shapes;

/// An opened GGUF file: its metadata and tensor directory (no tensor data read yet).
pub struct Gguf {
    path: PathBuf,
    content: Content,
    arch: Arch,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Arch {
    Qwen2,
    Qwen3,
}

impl Arch {
    fn name(self) -> &'static str {
        match self {
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
        }
    }
}

/// `{arch}.*` keys this module acts on.
const ARCH_KEYS: &[&str] = &[
    "block_count",
    "context_length",
    "embedding_length",
    "feed_forward_length",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.key_length",
    "attention.value_length",
    "attention.layer_norm_rms_epsilon",
    "rope.freq_base",
    "rope.dimension_count",
    "rope.scaling.type",
    "vocab_size",
];

/// `tokenizer.*` keys this module acts on (see `gguf/tokenizer.rs`).
const TOKENIZER_KEYS: &[&str] = &[
    "tokenizer.ggml.model",
    "tokenizer.ggml.pre",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.padding_token_id",
    "tokenizer.ggml.eot_token_id",
    "tokenizer.ggml.add_bos_token",
    "tokenizer.ggml.add_eos_token",
    "tokenizer.chat_template",
];

/// Whether `key` is descriptive only (it cannot change what the model computes).
fn informational(key: &str) -> bool {
    (key.starts_with("general.") && key != "general.architecture")
        || key.starts_with("quantize.imatrix.")
}

fn describe(v: &G) -> String {
    match v {
        G::String(s) => format!("{s:?}"),
        G::Array(a) => format!("an array of {} values", a.len()),
        G::Bool(b) => b.to_string(),
        G::F32(x) => x.to_string(),
        G::F64(x) => x.to_string(),
        other => other
            .to_u64()
            .map(|x| x.to_string())
            .or_else(|_| other.to_i64().map(|x| x.to_string()))
            .unwrap_or_else(|_| format!("{other:?}")),
    }
}

/// An integer metadata value of any width and sign, without wrapping or clamping.
fn int_of(v: &G) -> Option<i128> {
    v.to_u64()
        .map(i128::from)
        .or_else(|_| v.to_i64().map(i128::from))
        .ok()
}

impl Gguf {
    /// Reads the header of `path` and checks every metadata key.
    pub fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(|e| ModelError::io(path, e))?;
        let mut r = BufReader::new(file);
        let content = Content::read(&mut r)
            .map_err(|e| ModelError::checkpoint(path, format!("not a readable GGUF file: {e}")))?;
        let arch = match content.metadata.get("general.architecture") {
            Some(G::String(s)) if s == "qwen2" => Arch::Qwen2,
            Some(G::String(s)) if s == "qwen3" => Arch::Qwen3,
            Some(v) => {
                return Err(unsupported(
                    path,
                    "general.architecture",
                    format!("{} (only qwen2 and qwen3)", describe(v)),
                ))
            }
            None => return Err(invalid(path, "general.architecture", "missing")),
        };
        let g = Self {
            path: path.to_path_buf(),
            content,
            arch,
        };
        g.check_keys()?;
        Ok(g)
    }

    fn check_keys(&self) -> Result<()> {
        let prefix = format!("{}.", self.arch.name());
        let mut keys: Vec<&String> = self.content.metadata.keys().collect();
        keys.sort();
        for key in keys {
            let known = informational(key)
                || key == "general.architecture"
                || TOKENIZER_KEYS.contains(&key.as_str())
                || key
                    .strip_prefix(&prefix)
                    .is_some_and(|k| ARCH_KEYS.contains(&k));
            if !known {
                let v = describe(&self.content.metadata[key]);
                return Err(unsupported(
                    &self.path,
                    key,
                    format!(
                        "metadata key not supported (value {v}): mtrl does not know how it \
                         changes the model, so it refuses the file rather than ignore it"
                    ),
                ));
            }
        }
        if let Some(v) = self.get(&format!("{prefix}rope.scaling.type")) {
            if !matches!(v, G::String(s) if s == "none") {
                return Err(unsupported(
                    &self.path,
                    &format!("{prefix}rope.scaling.type"),
                    format!("rope scaling {} (only none)", describe(v)),
                ));
            }
        }
        Ok(())
    }

    fn get(&self, key: &str) -> Option<&G> {
        self.content.metadata.get(key)
    }

    fn arch_key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch.name())
    }

    fn usize_of(&self, k: &str) -> Result<Option<usize>> {
        let key = self.arch_key(k);
        match self.get(&key) {
            None => Ok(None),
            Some(v) => {
                let wide =
                    int_of(v).ok_or_else(|| invalid(&self.path, &key, "expected an integer"))?;
                usize::try_from(wide)
                    .map(Some)
                    .map_err(|_| invalid(&self.path, &key, format!("{wide} is out of range")))
            }
        }
    }

    fn need_usize(&self, k: &str) -> Result<usize> {
        self.usize_of(k)?
            .ok_or_else(|| invalid(&self.path, &self.arch_key(k), "missing"))
    }

    fn need_f32(&self, k: &str) -> Result<f32> {
        let key = self.arch_key(k);
        let v = self
            .get(&key)
            .ok_or_else(|| invalid(&self.path, &key, "missing"))?;
        v.to_f32()
            .or_else(|_| v.to_f64().map(|x| x as f32))
            .map_err(|_| invalid(&self.path, &key, "expected a float"))
    }

    /// The metadata as a Hugging Face `config.json`.
    pub fn config_json(&self) -> Result<Value> {
        let hidden = self.need_usize("embedding_length")?;
        let heads = self.need_usize("attention.head_count")?;
        let kv = self.usize_of("attention.head_count_kv")?.unwrap_or(heads);
        if heads == 0 || hidden == 0 {
            return Err(invalid(
                &self.path,
                &self.arch_key("attention.head_count"),
                "sizes must be positive",
            ));
        }
        let head_dim = self
            .usize_of("attention.key_length")?
            .unwrap_or(hidden / heads);
        for k in ["attention.value_length", "rope.dimension_count"] {
            if let Some(v) = self.usize_of(k)? {
                if v != head_dim {
                    return Err(unsupported(
                        &self.path,
                        &self.arch_key(k),
                        format!("{v} differs from the head size {head_dim} (not supported)"),
                    ));
                }
            }
        }
        let tokens = self.tokens()?;
        let vocab = match self.usize_of("vocab_size")? {
            Some(v) if v != tokens.len() => {
                return Err(invalid(
                    &self.path,
                    &self.arch_key("vocab_size"),
                    format!("{v}, but tokenizer.ggml.tokens has {}", tokens.len()),
                ))
            }
            _ => tokens.len(),
        };
        // f32 metadata printed shortest, so 1e-6 stays 1e-6 rather than 9.99999997e-7.
        let eps: f64 = self
            .need_f32("attention.layer_norm_rms_epsilon")?
            .to_string()
            .parse()
            .unwrap_or(1e-6);
        let theta: f64 = self
            .need_f32("rope.freq_base")?
            .to_string()
            .parse()
            .unwrap_or(1e4);
        let tied = !self.content.tensor_infos.contains_key("output.weight");
        let special = tokenizer::special_ids(self)?;
        let (arch_class, bias) = match self.arch {
            Arch::Qwen2 => ("Qwen2ForCausalLM", true),
            Arch::Qwen3 => ("Qwen3ForCausalLM", false),
        };
        let mut cfg = json!({
            "architectures": [arch_class],
            "model_type": self.arch.name(),
            "vocab_size": vocab,
            "hidden_size": hidden,
            "intermediate_size": self.need_usize("feed_forward_length")?,
            "num_hidden_layers": self.need_usize("block_count")?,
            "num_attention_heads": heads,
            "num_key_value_heads": kv,
            "head_dim": head_dim,
            "max_position_embeddings": self.need_usize("context_length")?,
            "rms_norm_eps": eps,
            "rope_theta": theta,
            "hidden_act": "silu",
            "attention_bias": bias,
            "attention_dropout": 0.0,
            "use_sliding_window": false,
            "tie_word_embeddings": tied,
            "torch_dtype": "float32",
        });
        let obj = cfg.as_object_mut().expect("object");
        if let Some(b) = special.bos {
            obj.insert("bos_token_id".into(), json!(b));
        }
        obj.insert("eos_token_id".into(), json!(special.eos));
        if let Some(name) = self.get("general.name").and_then(|v| v.to_string().ok()) {
            obj.insert("mtrl_gguf_name".into(), json!(name));
        }
        Ok(cfg)
    }

    fn tokens(&self) -> Result<Vec<&str>> {
        tokenizer::strings(self, "tokenizer.ggml.tokens")
    }

    /// `generation_config.json`: the end-of-turn ids (eos, and eot when the file names one).
    pub fn generation_config_json(&self) -> Result<Value> {
        let s = tokenizer::special_ids(self)?;
        let mut eos = vec![s.eos];
        eos.extend(s.eot.filter(|e| *e != s.eos));
        let mut g = json!({ "eos_token_id": eos });
        if let Some(b) = s.bos {
            g["bos_token_id"] = json!(b);
        }
        if let Some(p) = s.pad {
            g["pad_token_id"] = json!(p);
        }
        Ok(g)
    }

    /// `tokenizer.json` and `tokenizer_config.json` from the `tokenizer.*` metadata.
    pub fn tokenizer_files(&self) -> Result<(Value, Value)> {
        tokenizer::build(self)
    }

    /// Every tensor, dequantised to f32 then cast to `dtype`, under its Hugging Face name; shapes
    /// checked against `config.json`.
    pub fn tensors(&self, dtype: DType) -> Result<BTreeMap<String, Tensor>> {
        let cfg = Config::from_value(self.config_json()?, &self.path)?;
        let layers = cfg.num_hidden_layers;
        let shapes: HashMap<String, Vec<usize>> = parameter_shapes(&cfg).into_iter().collect();
        let file = File::open(&self.path).map_err(|e| ModelError::io(&self.path, e))?;
        let mut r = BufReader::new(file);
        let mut names: Vec<&String> = self.content.tensor_infos.keys().collect();
        names.sort();
        let mut out = BTreeMap::new();
        for name in names {
            let hf = hf_name(name, layers).ok_or_else(|| {
                ModelError::tensor(
                    name,
                    format!(
                        "in {}: not a tensor of a {} model (not supported)",
                        self.path.display(),
                        self.arch.name()
                    ),
                )
            })?;
            let want = shapes.get(&hf).ok_or_else(|| {
                ModelError::tensor(
                    name,
                    format!(
                        "in {}: maps to `{hf}`, which config.json does not have",
                        self.path.display()
                    ),
                )
            })?;
            let q = self
                .content
                .tensor(&mut r, name, &Device::Cpu)
                .map_err(|e| ModelError::checkpoint(&self.path, format!("tensor `{name}`: {e}")))?;
            let t = q.dequantize(&Device::Cpu)?;
            if t.dims() != want.as_slice() {
                return Err(ModelError::tensor(
                    name,
                    format!(
                        "in {}: has shape {:?}, the metadata implies {want:?}",
                        self.path.display(),
                        t.dims()
                    ),
                ));
            }
            crate::checkpoint::check_finite(&hf, &t)?;
            if out.insert(hf.clone(), t.to_dtype(dtype)?).is_some() {
                return Err(ModelError::tensor(
                    name,
                    format!("in {}: a second tensor for `{hf}`", self.path.display()),
                ));
            }
        }
        for name in shapes.keys() {
            if !out.contains_key(name) {
                return Err(ModelError::tensor(
                    name,
                    format!("missing from {}", self.path.display()),
                ));
            }
        }
        Ok(out)
    }
}

/// The Hugging Face name of a llama.cpp tensor name (`blk.3.attn_q.bias` →
/// `model.layers.3.self_attn.q_proj.bias`), or `None` for a name no Qwen2/Qwen3 model has.
fn hf_name(gguf: &str, layers: usize) -> Option<String> {
    match gguf {
        "token_embd.weight" => return Some("model.embed_tokens.weight".into()),
        "output_norm.weight" => return Some("model.norm.weight".into()),
        "output.weight" => return Some("lm_head.weight".into()),
        _ => {}
    }
    let rest = gguf.strip_prefix("blk.")?;
    let (idx, rest) = rest.split_once('.')?;
    let i: usize = idx.parse().ok()?;
    // `blk.01` or `blk.+1` would be a second name for layer 1.
    if i >= layers || idx != i.to_string() {
        return None;
    }
    let (part, kind) = rest.rsplit_once('.')?;
    if kind != "weight" && kind != "bias" {
        return None;
    }
    let module = match part {
        "attn_norm" => "input_layernorm",
        "ffn_norm" => "post_attention_layernorm",
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "attn_q_norm" => "self_attn.q_norm",
        "attn_k_norm" => "self_attn.k_norm",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        _ => return None,
    };
    Some(format!("model.layers.{i}.{module}.{kind}"))
}

/// Writes `gguf` as an HF checkpoint folder `out` with weights in `dtype`.
pub fn convert(gguf: &Path, out: &Path, dtype: DType) -> Result<()> {
    let g = Gguf::open(gguf)?;
    let files = g.small_files()?;
    let tensors = g.tensors(dtype)?;
    save_checkpoint(
        out,
        &tensors,
        dtype,
        &files.config,
        Some(&files.generation),
        None,
    )?;
    files.write_tokenizer(out)
}

/// The checkpoint files other than the weights.
struct SmallFiles {
    config: Value,
    generation: Value,
    tokenizer: Value,
    tokenizer_config: Value,
}

impl SmallFiles {
    fn write_tokenizer(&self, out: &Path) -> Result<()> {
        write_json(&out.join("tokenizer.json"), &self.tokenizer)?;
        write_json(&out.join("tokenizer_config.json"), &self.tokenizer_config)
    }

    /// `config.json`, `generation_config.json` and the tokenizer files into `out` (created).
    fn write_all(&self, out: &Path) -> Result<()> {
        std::fs::create_dir_all(out).map_err(|e| ModelError::io(out, e))?;
        write_json(&out.join("config.json"), &self.config)?;
        write_json(&out.join("generation_config.json"), &self.generation)?;
        self.write_tokenizer(out)
    }
}

impl Gguf {
    /// Everything but the weights, with the tokenizer checked to build with every token at the
    /// id the file gives it.
    fn small_files(&self) -> Result<SmallFiles> {
        let config = self.config_json()?;
        // Refused here, naming the .gguf, rather than later from the written config.json.
        Config::from_value(config.clone(), &self.path)?;
        let generation = self.generation_config_json()?;
        let (tokenizer, tokenizer_config) = self.tokenizer_files()?;
        let built = tokenizers::Tokenizer::from_bytes(tokenizer.to_string().as_bytes())
            .map_err(|e| ModelError::Tokenizer(format!("{}: {e}", self.path.display())))?;
        for (id, t) in self.tokens()?.iter().enumerate() {
            if built.token_to_id(t) != Some(id as u32) {
                return Err(ModelError::Tokenizer(format!(
                    "{}: token {id} ({t:?}) is not unique in tokenizer.ggml.tokens",
                    self.path.display()
                )));
            }
        }
        Ok(SmallFiles {
            config,
            generation,
            tokenizer,
            tokenizer_config,
        })
    }
}

#[cfg(test)]
mod tests;
