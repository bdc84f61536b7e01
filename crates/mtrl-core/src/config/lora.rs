//! `[lora]`: train a low-rank adapter on a frozen base instead of every weight.
//!
//! ```toml
//! [lora]
//! rank = 32                 # r (the managed service's `lora_rank`; default 32)
//! alpha = 64                # scaling alpha / r (`lora_alpha`; default 64)
//! target_modules = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
//! dropout = 0.0             # on the adapter's input while training; the rollout engine samples
//!                           # without dropout, so with dropout > 0 the learner's log-probs (and
//!                           # the PPO ratio) differ from the sampler's even on-policy (the
//!                           # `sampler_gap` record shows by how much): keep 0 for RL
//! rslora = false            # scaling alpha / sqrt(r)
//! serving = "auto"          # how the rollout engine applies it: "auto" | "unmerged" | "merged"
//! layers_to_transform = [20, 21, 22, 23]  # PEFT's key: adapt only these decoder layers (default:
//!                           # all); backward stops below the lowest, so adapting the last few
//!                           # layers makes a learner step cheaper as well as the adapter smaller
//! init = "runs/sft"         # start from this PEFT adapter folder (e.g. an SFT warm start)
//!                           # instead of a fresh one (B = 0); its rank, alpha, targets, layers
//!                           # and scaling must be this section's
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

/// The adapter value a [`check_lora`] failure is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoraField {
    Rank,
    Alpha,
    Dropout,
    Targets,
}

impl LoraField {
    /// The field's key in `[lora]`.
    pub fn name(self) -> &'static str {
        match self {
            LoraField::Rank => "rank",
            LoraField::Alpha => "alpha",
            LoraField::Dropout => "dropout",
            LoraField::Targets => "target_modules",
        }
    }
}

/// The range checks of an adapter's values, shared by `[lora]`, PEFT's `adapter_config.json`
/// (`mtrl-model`, which names its own keys) and adapters built through the model API: a rank of
/// at least 1, a positive finite alpha, a dropout in [0, 1), and targets that are a non-empty set
/// of [`LORA_TARGETS`].
pub fn check_lora(
    rank: usize,
    alpha: f64,
    dropout: f64,
    targets: &[String],
) -> std::result::Result<(), (LoraField, String)> {
    if rank == 0 {
        return Err((LoraField::Rank, "must be at least 1".into()));
    }
    if !alpha.is_finite() || alpha <= 0.0 {
        return Err((
            LoraField::Alpha,
            format!("{alpha} is not a positive number"),
        ));
    }
    if !(0.0..1.0).contains(&dropout) {
        return Err((LoraField::Dropout, format!("{dropout} is not in [0, 1)")));
    }
    if targets.is_empty() {
        return Err((LoraField::Targets, "is empty".into()));
    }
    for (i, t) in targets.iter().enumerate() {
        if !LORA_TARGETS.contains(&t.as_str()) {
            let all = LORA_TARGETS.join(", ");
            return Err((LoraField::Targets, format!("`{t}` is not one of {all}")));
        }
        if targets[..i].contains(t) {
            return Err((LoraField::Targets, format!("`{t}` is listed twice")));
        }
    }
    Ok(())
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoraSpec {
    pub rank: Option<usize>,
    pub alpha: Option<f64>,
    pub target_modules: Option<Vec<String>>,
    pub dropout: Option<f64>,
    pub rslora: Option<bool>,
    pub serving: Option<String>,
    pub layers_to_transform: Option<LayerList>,
    pub init: Option<String>,
}

/// `layers_to_transform`: one index or a list (PEFT accepts both).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum LayerList {
    One(usize),
    Many(Vec<usize>),
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
    /// The decoder layers adapted, ascending without repeats; `None`: all of them.
    pub layers_to_transform: Option<Vec<usize>>,
    /// A PEFT adapter folder to start from instead of a fresh adapter.
    pub init: Option<std::path::PathBuf>,
}

impl LoraSpec {
    pub(crate) fn validate(self, ctx: &Ctx<'_>) -> Result<LoraConfig> {
        let rank = self.rank.unwrap_or(32);
        let alpha = self.alpha.unwrap_or(64.0);
        let dropout = self.dropout.unwrap_or(0.0);
        let targets = self
            .target_modules
            .unwrap_or_else(|| LORA_TARGETS.map(String::from).to_vec());
        check_lora(rank, alpha, dropout, &targets)
            .map_err(|(field, message)| ctx.invalid(&format!("lora.{}", field.name()), message))?;
        let serving = self.serving.unwrap_or_else(|| "auto".into());
        if !LORA_SERVINGS.contains(&serving.as_str()) {
            return Err(ctx.invalid(
                "lora.serving",
                format!("`{serving}` is not one of {}", LORA_SERVINGS.join(", ")),
            ));
        }
        let layers_to_transform = match self.layers_to_transform {
            None => None,
            Some(l) => {
                let mut l = match l {
                    LayerList::One(i) => vec![i],
                    LayerList::Many(l) => l,
                };
                if l.is_empty() {
                    return Err(ctx.invalid(
                        "lora.layers_to_transform",
                        "is an empty list (leave it out to adapt every layer)",
                    ));
                }
                l.sort_unstable();
                l.dedup();
                Some(l)
            }
        };
        Ok(LoraConfig {
            rank,
            alpha,
            target_modules: targets,
            dropout,
            rslora: self.rslora.unwrap_or(false),
            serving,
            layers_to_transform,
            init: self.init.map(|p| ctx.resolve(&p)),
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

    fn lora(extra: &str) -> Result<crate::config::LoraConfig, String> {
        let text = format!("[model]\npath = 'random:tiny'\n[lora]\n{extra}\n");
        crate::Config::from_toml_str(&text, Path::new("/r/m.toml"))
            .map(|c| c.lora.unwrap())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn layers_and_init() {
        let l = lora("layers_to_transform = [3, 1, 3]\ninit = 'sft'").unwrap();
        assert_eq!(l.layers_to_transform, Some(vec![1, 3]));
        assert_eq!(l.init, Some(std::path::PathBuf::from("/r/sft")));
        assert_eq!(
            lora("layers_to_transform = 2").unwrap().layers_to_transform,
            Some(vec![2])
        );
        assert_eq!(lora("").unwrap().layers_to_transform, None);
        let e = lora("layers_to_transform = []").unwrap_err();
        assert!(
            e.contains("lora.layers_to_transform") && e.contains("m.toml"),
            "{e}"
        );
        let e = lora("layers_to_transform = 'last'").unwrap_err();
        assert!(e.contains("layers_to_transform"), "{e}");
    }
}
