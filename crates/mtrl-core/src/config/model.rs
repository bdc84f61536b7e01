//! `[model]`: the policy checkpoint, its dtype and device.
//!
//! ```toml
//! [model]
//! path = "../models/Qwen3-0.6B"    # an HF folder; or "random:tiny" / "random:path/to/config.json"
//! tokenizer = "../tests/fixtures/tokenizer"   # optional; needed when `path` is random
//! dtype = "bf16"                    # "f32", "bf16", "f16"
//! device = "cuda:0"                 # "cpu", "cuda", "cuda:N", "metal"
//! ```
//!
//! A `random:` policy is initialised from `[train] seed`, so two runs start from the same bits
//! (tests and CI use it; nothing is downloaded).

use std::path::PathBuf;

use serde::Deserialize;

use super::Ctx;
use crate::error::Result;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    pub path: String,
    pub tokenizer: Option<String>,
    pub dtype: Option<String>,
    pub device: Option<String>,
}

/// Where the initial weights come from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ModelSource {
    /// A Hugging Face checkpoint folder.
    Dir(PathBuf),
    /// Random weights of a built-in preset (`tiny`).
    RandomPreset(String),
    /// Random weights of the architecture in an HF `config.json`.
    RandomConfig(PathBuf),
}

#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub source: ModelSource,
    /// The key as written (for resume checks and reports).
    pub path_text: String,
    pub tokenizer: Option<PathBuf>,
    /// `f32`, `bf16` or `f16`.
    pub dtype: String,
    /// `cpu`, `cuda`, `cuda:N` or `metal`.
    pub device: String,
}

/// Built-in presets of `random:<preset>`.
pub const RANDOM_PRESETS: &[&str] = &["tiny"];

impl ModelSpec {
    pub(crate) fn validate(self, ctx: &Ctx<'_>) -> Result<ModelConfig> {
        ctx.non_empty("model.path", &self.path)?;
        let source = match self.path.strip_prefix("random:") {
            Some(p) if RANDOM_PRESETS.contains(&p) => ModelSource::RandomPreset(p.to_string()),
            Some(p) if p.ends_with(".json") => ModelSource::RandomConfig(ctx.resolve(p)),
            Some(p) => {
                return Err(ctx.invalid(
                    "model.path",
                    format!(
                        "`random:{p}` is neither a preset ({}) nor a config.json path",
                        RANDOM_PRESETS.join(", ")
                    ),
                ))
            }
            None => ModelSource::Dir(ctx.resolve(&self.path)),
        };
        let dtype = self
            .dtype
            .unwrap_or_else(|| "f32".into())
            .to_ascii_lowercase();
        if !["f32", "bf16", "f16"].contains(&dtype.as_str()) {
            return Err(ctx.invalid("model.dtype", format!("`{dtype}` is not f32, bf16 or f16")));
        }
        let device = self
            .device
            .unwrap_or_else(|| "cpu".into())
            .to_ascii_lowercase();
        let ok = device == "cpu"
            || device == "cuda"
            || device == "metal"
            || device
                .strip_prefix("cuda:")
                .is_some_and(|n| n.parse::<usize>().is_ok());
        if !ok {
            return Err(ctx.invalid(
                "model.device",
                format!("`{device}` is not cpu, cuda, cuda:N or metal"),
            ));
        }
        if let Some(t) = &self.tokenizer {
            ctx.non_empty("model.tokenizer", t)?;
        }
        Ok(ModelConfig {
            source,
            path_text: self.path,
            tokenizer: self.tokenizer.map(|t| ctx.resolve(&t)),
            dtype,
            device,
        })
    }
}
