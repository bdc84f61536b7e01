//! `[lora]`: train a low-rank adapter on a frozen base instead of every weight.
//!
//! ```toml
//! [lora]
//! rank = 32                 # r (the managed service's `lora_rank`; default 32)
//! alpha = 64                # scaling alpha / r (`lora_alpha`; default 64)
//! target_modules = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
//! dropout = 0.0             # on the adapter's input while training
//! rslora = false            # scaling alpha / sqrt(r)
//! serving = "auto"          # how the rollout engine applies it: "auto" | "unmerged" | "merged"
//! ```
//!
//! The section's presence turns LoRA on; `[hyperparameters] lora_rank` / `lora_alpha` create it.
//! `serving = "auto"` merges on the CPU in f32 (measured faster: `mtrl bench train --lora`) and
//! keeps the adapter unmerged otherwise: on a GPU the engine then shares the frozen base instead of
//! holding a merged copy of every adapted weight, and in bf16/f16 a merged copy would round the
//! adapter's small updates away (`merged` with such a `model.dtype` is an error).
//! Checkpoints then hold the adapter (PEFT's files) and its optimizer state, never the base.

use serde::Deserialize;

use super::Ctx;
use crate::error::Result;

/// The modules an adapter may target (PEFT's names).
pub const LORA_TARGETS: [&str; 7] = [
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
];

/// How the engine applies the adapter.
pub const LORA_SERVINGS: [&str; 3] = ["auto", "unmerged", "merged"];

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoraSpec {
    pub rank: Option<usize>,
    pub alpha: Option<f64>,
    pub target_modules: Option<Vec<String>>,
    pub dropout: Option<f64>,
    pub rslora: Option<bool>,
    pub serving: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct LoraConfig {
    pub rank: usize,
    pub alpha: f64,
    pub target_modules: Vec<String>,
    pub dropout: f64,
    pub rslora: bool,
    /// `auto`, `unmerged` or `merged`.
    pub serving: String,
}

impl LoraSpec {
    pub(crate) fn validate(self, ctx: &Ctx<'_>) -> Result<LoraConfig> {
        let rank = self.rank.unwrap_or(32);
        if rank == 0 {
            return Err(ctx.invalid("lora.rank", "must be at least 1"));
        }
        let alpha = self.alpha.unwrap_or(64.0);
        if !alpha.is_finite() || alpha <= 0.0 {
            return Err(ctx.invalid("lora.alpha", format!("{alpha} is not a positive number")));
        }
        let dropout = self.dropout.unwrap_or(0.0);
        if !(0.0..1.0).contains(&dropout) {
            return Err(ctx.invalid("lora.dropout", format!("{dropout} is not in [0, 1)")));
        }
        let targets = self
            .target_modules
            .unwrap_or_else(|| LORA_TARGETS.map(String::from).to_vec());
        if targets.is_empty() {
            return Err(ctx.invalid("lora.target_modules", "is empty"));
        }
        for (i, t) in targets.iter().enumerate() {
            if !LORA_TARGETS.contains(&t.as_str()) {
                return Err(ctx.invalid(
                    "lora.target_modules",
                    format!("`{t}` is not one of {}", LORA_TARGETS.join(", ")),
                ));
            }
            if targets[..i].contains(t) {
                return Err(ctx.invalid("lora.target_modules", format!("`{t}` is listed twice")));
            }
        }
        let serving = self.serving.unwrap_or_else(|| "auto".into());
        if !LORA_SERVINGS.contains(&serving.as_str()) {
            return Err(ctx.invalid(
                "lora.serving",
                format!("`{serving}` is not one of {}", LORA_SERVINGS.join(", ")),
            ));
        }
        Ok(LoraConfig {
            rank,
            alpha,
            target_modules: targets,
            dropout,
            rslora: self.rslora.unwrap_or(false),
            serving,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    #[test]
    fn merged_serving_needs_f32() {
        let text = "[model]\npath = 'random:tiny'\ndtype = 'bf16'\n[lora]\nserving = 'merged'\n";
        let e = crate::Config::from_toml_str(text, Path::new("m.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("lora.serving") && e.contains("bf16"), "{e}");
        let ok = text.replace("'merged'", "'auto'");
        assert!(crate::Config::from_toml_str(&ok, Path::new("m.toml")).is_ok());
    }
}
