//! Configuration: TOML spec structs → validated config structs.
//!
//! Each section lives in its own file. `Config::load` reads one file; `Config::from_toml_str` takes
//! the text plus the path it came from (used for error messages and to resolve relative paths).

mod algorithm;
mod checkpoint;
mod data;
mod distributed;
mod env;
mod hyperparameters;
mod logging;
mod lora;
mod model;
mod rollout;
mod search;
mod sft;
mod train;

use std::path::{Path, PathBuf};

use serde::Deserialize;

pub use algorithm::{
    AlgorithmConfig, AlgorithmSpec, ADVANTAGES, GRPO_STDS, LOSSES, LOSS_AGGS, PASS_AT_K_REWARDS,
    RATIOS,
};
pub use checkpoint::{CheckpointConfig, CheckpointSpec};
pub use data::{DataConfig, DataSpec, DatasetConfig, OneOrMany};
pub use distributed::{DistributedConfig, DistributedSpec, GRAD_REDUCES};
pub use env::{
    EnvConfig, EnvSpec, HitFormat, RewardChoice, RewardKind, RewardSpec, SubmitExcess,
    ToolCallSyntax,
};
pub use hyperparameters::HyperparametersSpec;
pub use logging::{LoggingConfig, LoggingSpec};
pub use lora::{check_lora, LoraConfig, LoraField, LoraSpec, LORA_SERVINGS, LORA_TARGETS};
pub use model::{ModelConfig, ModelSource, ModelSpec, RANDOM_PRESETS};
pub use rollout::{
    AgentConfig, BehaviourLogprobs, EnvironmentKind, RolloutConfig, RolloutSpec, WeightSync,
};
pub use search::{
    Bm25Config, Columns, EmbedderChoice, RetrievalEvalConfig, SearchConfig, SearchSpec, StopWords,
    VectorConfig,
};
pub use sft::{RftConfig, RftSpec, Scratch, SftSettings, SftSpec, WarmStartConfig, WarmStartSpec};
pub use train::{LrScheduleKind, TrainConfig, TrainSpec, VAL_METRICS};

use crate::error::{CoreError, Result};

/// The raw file, one field per top-level section.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigSpec {
    /// Free-form run name, used in reports.
    pub name: Option<String>,
    pub search: Option<SearchSpec>,
    pub env: Option<EnvSpec>,
    pub data: Option<DataSpec>,
    pub model: Option<ModelSpec>,
    pub lora: Option<LoraSpec>,
    pub rollout: Option<RolloutSpec>,
    pub algorithm: Option<AlgorithmSpec>,
    pub train: Option<TrainSpec>,
    pub checkpoint: Option<CheckpointSpec>,
    pub logging: Option<LoggingSpec>,
    pub sft: Option<SftSpec>,
    pub warm_start: Option<WarmStartSpec>,
    pub distributed: Option<DistributedSpec>,
    /// The managed service's flat names, mapped onto the sections above.
    pub hyperparameters: Option<HyperparametersSpec>,
}

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file this config came from (for messages).
    pub source: PathBuf,
    pub name: String,
    pub search: Option<SearchConfig>,
    /// `[env]`; commands that run episodes use [`EnvConfig::default`] when it is absent.
    pub env: Option<EnvConfig>,
    pub data: Option<DataConfig>,
    /// `[model]`, needed by commands that load a policy.
    pub model: Option<ModelConfig>,
    /// `[lora]`: when present, an adapter is trained on the frozen base.
    pub lora: Option<LoraConfig>,
    /// `[rollout]` (defaults when absent).
    pub rollout: RolloutConfig,
    /// `[algorithm]` (defaults when absent).
    pub algorithm: AlgorithmConfig,
    /// `[train]` (defaults when absent).
    pub train: TrainConfig,
    /// `[checkpoint]` (default dir `runs/<name>` beside the config).
    pub checkpoint: CheckpointConfig,
    /// `[logging]` (defaults when absent).
    pub logging: LoggingConfig,
    pub sft: SftSettings,
    pub warm_start: Option<WarmStartConfig>,
    /// `[distributed]` (defaults when absent).
    pub distributed: DistributedConfig,
}

impl Config {
    /// Reads and validates a TOML config file.
    pub fn load(path: &Path) -> Result<Config> {
        let text = std::fs::read_to_string(path).map_err(|source| CoreError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_toml_str(&text, path)
    }

    /// Parses and validates config text; `path` names the origin and anchors relative paths.
    pub fn from_toml_str(text: &str, path: &Path) -> Result<Config> {
        let spec: ConfigSpec = toml::from_str(text).map_err(|e| CoreError::Parse {
            path: path.to_path_buf(),
            message: e.to_string().trim_end().to_string(),
        })?;
        spec.validate(path)
    }

    /// The `[data]` section, or an error naming the file when it is absent.
    pub fn data(&self) -> Result<&DataConfig> {
        self.data.as_ref().ok_or_else(|| CoreError::MissingSection {
            path: self.source.clone(),
            section: "data".into(),
        })
    }

    /// The `[env]` section, or the defaults when it is absent.
    pub fn env_or_default(&self) -> EnvConfig {
        self.env.clone().unwrap_or_default()
    }

    /// The `[model]` section, or an error naming the file when it is absent.
    pub fn model(&self) -> Result<&ModelConfig> {
        self.model
            .as_ref()
            .ok_or_else(|| CoreError::MissingSection {
                path: self.source.clone(),
                section: "model".into(),
            })
    }

    /// The `[search]` section, or an error naming the file when it is absent.
    pub fn search(&self) -> Result<&SearchConfig> {
        self.search
            .as_ref()
            .ok_or_else(|| CoreError::MissingSection {
                path: self.source.clone(),
                section: "search".into(),
            })
    }
}

impl ConfigSpec {
    /// Applies defaults and checks ranges; `path` is the file the spec was read from.
    pub fn validate(mut self, path: &Path) -> Result<Config> {
        let ctx = Ctx { path };
        let mapped = match self.hyperparameters.take() {
            Some(h) => h.apply(&ctx, &mut self)?,
            None => Vec::new(),
        };
        self.validate_sections(&ctx)
            .map_err(|e| hyperparameters::blame(e, &mapped))
    }

    fn validate_sections(self, ctx: &Ctx<'_>) -> Result<Config> {
        let path = ctx.path;
        let ctx = Ctx { path };
        let name = self.name.unwrap_or_else(|| {
            path.file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "run".into())
        });
        let search = self.search.map(|s| s.validate(&ctx)).transpose()?;
        let env = self.env.map(|s| s.validate(&ctx)).transpose()?;
        let data = self.data.map(|s| s.validate(&ctx)).transpose()?;
        let model = self.model.map(|s| s.validate(&ctx)).transpose()?;
        let lora = self.lora.map(|s| s.validate(&ctx)).transpose()?;
        if let (Some(l), Some(m)) = (&lora, &model) {
            if l.serving == "merged" && m.dtype != "f32" {
                return Err(ctx.invalid(
                    "lora.serving",
                    format!(
                        "`merged` with model.dtype = {}: the merged copy would round the \
                         adapter's updates away; use `unmerged` or `auto`",
                        m.dtype
                    ),
                ));
            }
        }
        let rollout = self.rollout.unwrap_or_default().validate(&ctx)?;
        let algorithm = self.algorithm.unwrap_or_default().validate(&ctx)?;
        let train = self.train.unwrap_or_default().validate(&ctx)?;
        let checkpoint = self.checkpoint.unwrap_or_default().validate(&ctx, &name)?;
        let logging = self.logging.unwrap_or_default().validate(&ctx)?;
        let sft = self.sft.unwrap_or_default().validate(&ctx)?;
        let warm_start = self.warm_start.map(|s| s.validate(&ctx)).transpose()?;
        if let Some(ws) = warm_start.as_ref().filter(|w| w.p_rrf > 0.0) {
            if !env.as_ref().is_some_and(|e| e.submit_rrf) {
                return Err(ctx.invalid(
                    "warm_start.p_rrf",
                    format!(
                        "{} needs env.submit_rrf = true (the teacher writes {{\"top\": n, \"rrf\": true}})",
                        ws.p_rrf
                    ),
                ));
            }
        }
        if let Some(ws) = warm_start.as_ref().filter(|w| w.scratch.is_none()) {
            if ws.rft.is_some() {
                return Err(ctx.invalid(
                    "warm_start.rft",
                    "the RFT control runs only in a job that builds its policy from scratch \
                     (`warm_start.model_config`)",
                ));
            }
            if !model
                .as_ref()
                .is_some_and(|m| matches!(m.source, ModelSource::Dir(_)))
            {
                return Err(ctx.invalid(
                    "warm_start",
                    "without `model_config` it warm-starts the pretrained [model], so `model.path` \
                     must be a checkpoint folder or a .gguf file",
                ));
            }
            if lora.as_ref().is_some_and(|l| l.init.is_some()) {
                return Err(ctx.invalid(
                    "lora.init",
                    "the job with [warm_start] starts RL from its own SFT adapter",
                ));
            }
        }
        if rollout.environment == rollout::EnvironmentKind::Agent
            && env
                .as_ref()
                .is_some_and(|e| e.tool_calls == env::ToolCallSyntax::Tolerant)
        {
            return Err(ctx.invalid(
                "env.tool_calls",
                "\"tolerant\" reads calls in the built-in search environment; with \
                 rollout.environment = \"agent\" your agent reads its model's text (the endpoint \
                 returns the <tool_call> blocks as tool_calls)",
            ));
        }
        let distributed = self.distributed.unwrap_or_default().validate(&ctx)?;
        Ok(Config {
            source: path.to_path_buf(),
            name,
            search,
            env,
            data,
            model,
            lora,
            rollout,
            algorithm,
            train,
            checkpoint,
            logging,
            sft,
            warm_start,
            distributed,
        })
    }
}

/// Validation context: where the spec came from.
pub(crate) struct Ctx<'a> {
    pub path: &'a Path,
}

impl Ctx<'_> {
    /// Resolves a path from the file: absolute stays, relative is taken from the config's folder.
    pub fn resolve(&self, p: &str) -> PathBuf {
        let p = Path::new(p);
        if p.is_absolute() {
            return p.to_path_buf();
        }
        match self.path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir.join(p),
            _ => p.to_path_buf(),
        }
    }

    pub fn invalid(&self, key: &str, message: impl Into<String>) -> CoreError {
        CoreError::Invalid {
            path: self.path.to_path_buf(),
            key: key.to_string(),
            message: message.into(),
        }
    }

    /// Checks `lo <= v <= hi` for an integer key.
    pub fn range(&self, key: &str, v: usize, lo: usize, hi: usize) -> Result<usize> {
        if v < lo || v > hi {
            return Err(self.invalid(key, format!("{v} is outside {lo}..={hi}")));
        }
        Ok(v)
    }

    pub fn non_empty(&self, key: &str, v: &str) -> Result<()> {
        if v.trim().is_empty() {
            return Err(self.invalid(key, "must not be empty"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_top_level_key_names_key_and_file() {
        let err = Config::from_toml_str("nmae = 'x'\n", Path::new("cfg/a.toml")).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("cfg/a.toml"), "{msg}");
        assert!(msg.contains("nmae"), "{msg}");
    }

    #[test]
    fn missing_search_section_is_reported() {
        let cfg = Config::from_toml_str("name = 'x'\n", Path::new("a.toml")).unwrap();
        let msg = cfg.search().unwrap_err().to_string();
        assert!(msg.contains("[search]") && msg.contains("a.toml"), "{msg}");
    }

    #[test]
    fn p_rrf_needs_submit_rrf() {
        let ws = "[warm_start]\nmodel_config = 'm.json'\ntokenizer = 't'\np_rrf = 0.5\n";
        let load = |env: &str| Config::from_toml_str(&format!("{env}{ws}"), Path::new("d.toml"));
        let err = load("[env]\nsubmit_hits = true\n").unwrap_err().to_string();
        assert!(
            err.contains("warm_start.p_rrf") && err.contains("d.toml"),
            "{err}"
        );
        let cfg = load("[env]\nsubmit_hits = true\nsubmit_rrf = true\n").unwrap();
        assert_eq!(cfg.warm_start.unwrap().p_rrf, 0.5);
    }

    #[test]
    fn a_warm_start_of_a_pretrained_model() {
        let load =
            |t: &str| Config::from_toml_str(t, Path::new("w.toml")).map_err(|e| e.to_string());
        let model = "[model]\npath = 'qwen.gguf'\n";
        let cfg = load(&format!(
            "{model}[warm_start]\neval_k = 0\n[sft]\nmax_steps = 3\n"
        ))
        .unwrap();
        let ws = cfg.warm_start.unwrap();
        assert!(ws.scratch.is_none());
        assert_eq!(ws.eval_k, 0);
        assert_eq!(cfg.sft.max_steps, 3);
        for (text, key) in [
            // Keys of a tokenizer that is not trained, or a tokenizer without a model config.
            (
                format!("{model}[warm_start]\ntokenizer_vocab = 900\n"),
                "warm_start.tokenizer_vocab",
            ),
            (
                format!("{model}[warm_start]\nid_tokens = true\n"),
                "warm_start.id_tokens",
            ),
            (
                format!("{model}[warm_start]\ntokenizer = 't'\n"),
                "warm_start.tokenizer",
            ),
            (
                "[model]\npath = 'random:tiny'\n[warm_start]\n".to_string(),
                "model.path",
            ),
            (
                format!("{model}[warm_start]\n[warm_start.rft]\noutput = 'r'\n"),
                "warm_start.rft",
            ),
            (
                format!("{model}[lora]\ninit = 'a'\n[warm_start]\n"),
                "lora.init",
            ),
            (
                "[warm_start]\nmodel_config = 'm.json'\n".to_string(),
                "warm_start.tokenizer",
            ),
        ] {
            let e = load(&text).unwrap_err();
            assert!(e.contains(key) && e.contains("w.toml"), "{key}: {e}");
        }
    }

    #[test]
    fn name_defaults_to_file_stem() {
        let cfg = Config::from_toml_str("", Path::new("configs/cranfield.toml")).unwrap();
        assert_eq!(cfg.name, "cranfield");
    }
}
