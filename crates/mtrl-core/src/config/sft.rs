//! `[sft]` (supervised fine-tuning on trajectory files, `mtrl sft`) and `[warm_start]` (how the
//! default job builds a policy from scratch: tokenizer, architecture, imperfect teacher).
//!
//! An example (the defaults are in docs/configuration.md):
//!
//! ```toml
//! [sft]
//! trajectories = "runs/teacher.jsonl"   # default input of `mtrl sft` (JSON Lines trajectories)
//! output = "runs/sft"                   # where the fine-tuned HF checkpoint is written
//! epochs = 2
//! max_steps = 0                         # stop after this many optimizer steps (0: the epochs')
//! batch_size = 32                       # conversations per optimizer step
//! lr = 3e-3
//! warmup_steps = 5                      # then cosine decay to min_lr over the run
//! min_lr = 3e-4
//! grad_clip = 1.0
//! micro_batch_tokens = 8192
//! seed = 0                              # shuffling
//!
//! [warm_start]
//! model_config = "demo-model.json"      # HF config.json of a random-init policy built from scratch;
//!                                       # leave it out to warm-start the pretrained [model]
//!                                       # (with its [lora] adapter when there is one)
//! tokenizer = "runs/tokenizer"           # where the trained tokenizer is written (from scratch only)
//! tokenizer_vocab = 2048                # BPE trained on the corpus + teacher conversations
//! teacher_samples = 4                   # teacher episodes per training task
//! pseudo_queries = 600                  # extra teacher episodes on document titles
//! max_searches = 2                      # the teacher's action space (mtrl-env's teacher):
//! p_one_message = 0.5                   #   searches per episode, in one message or one per turn,
//! p_interleave = 0.5                    #   round-robin across searches or rank order,
//! p_reorder = 0.2                       #   reversed or shuffled submissions,
//! p_top = 0.0                           #   submit({"top": n}) instead of listing ranks (env.submit_hits)
//! p_rrf = 0.0                           #   a merged submit fused by reciprocal rank instead
//!                                       #   ({"top": n, "rrf": true}; needs env.submit_rrf)
//! keyword_queries = true               # the teacher searches with content words only
//! id_tokens = true                      # every document id is one token of the tokenizer
//! eval_k = 4                            # sampled attempts per task in the final evaluation
//!                                       # (pass@k); 0: greedy only (`--eval-k` overrides)
//!
//! [warm_start.rft]                      # the rejection-sampling control of the default job:
//! threshold = 0.3                       #   SFT of the base on teacher episodes with reward ≥ this,
//! lr = 1e-3                             #   as many episodes and steps as RL trains on
//! output = "runs/rft"
//! ```

use std::path::PathBuf;

use serde::Deserialize;

use super::Ctx;
use crate::error::Result;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SftSpec {
    pub trajectories: Option<String>,
    pub output: Option<String>,
    pub epochs: Option<usize>,
    pub max_steps: Option<u64>,
    pub batch_size: Option<usize>,
    pub lr: Option<f64>,
    pub warmup_steps: Option<u64>,
    pub min_lr: Option<f64>,
    pub grad_clip: Option<f64>,
    pub micro_batch_tokens: Option<usize>,
    pub seed: Option<u64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SftSettings {
    pub trajectories: Option<PathBuf>,
    pub output: Option<PathBuf>,
    pub epochs: usize,
    /// Stop after this many optimizer steps; 0: every step of `epochs`.
    pub max_steps: u64,
    pub batch_size: usize,
    pub lr: f64,
    pub warmup_steps: u64,
    pub min_lr: f64,
    pub grad_clip: f64,
    pub micro_batch_tokens: usize,
    pub seed: u64,
}

impl SftSpec {
    pub(crate) fn validate(self, ctx: &Ctx<'_>) -> Result<SftSettings> {
        let lr = self.lr.unwrap_or(1e-5);
        if lr.is_nan() || lr <= 0.0 || lr >= 1.0 {
            return Err(ctx.invalid("sft.lr", format!("{lr} is outside (0, 1)")));
        }
        let min_lr = self.min_lr.unwrap_or(0.0);
        if !(0.0..=lr).contains(&min_lr) {
            return Err(ctx.invalid("sft.min_lr", format!("{min_lr} is outside [0, sft.lr]")));
        }
        let grad_clip = self.grad_clip.unwrap_or(1.0);
        if grad_clip.is_nan() || grad_clip < 0.0 {
            return Err(ctx.invalid("sft.grad_clip", "must be ≥ 0"));
        }
        Ok(SftSettings {
            trajectories: self.trajectories.map(|p| ctx.resolve(&p)),
            output: self.output.map(|p| ctx.resolve(&p)),
            epochs: ctx.range("sft.epochs", self.epochs.unwrap_or(1), 1, 10_000)?,
            max_steps: self.max_steps.unwrap_or(0),
            batch_size: ctx.range("sft.batch_size", self.batch_size.unwrap_or(32), 1, 1 << 20)?,
            lr,
            warmup_steps: self.warmup_steps.unwrap_or(0),
            min_lr,
            grad_clip,
            micro_batch_tokens: ctx.range(
                "sft.micro_batch_tokens",
                self.micro_batch_tokens.unwrap_or(8192),
                16,
                1 << 30,
            )?,
            seed: self.seed.unwrap_or(0),
        })
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WarmStartSpec {
    pub model_config: Option<String>,
    pub tokenizer: Option<String>,
    pub tokenizer_vocab: Option<usize>,
    pub teacher_samples: Option<usize>,
    pub pseudo_queries: Option<usize>,
    pub max_searches: Option<usize>,
    pub p_one_message: Option<f64>,
    pub p_interleave: Option<f64>,
    pub p_reorder: Option<f64>,
    pub p_top: Option<f64>,
    pub p_rrf: Option<f64>,
    pub keyword_queries: Option<bool>,
    pub id_tokens: Option<bool>,
    pub eval_k: Option<usize>,
    pub rft: Option<RftSpec>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RftSpec {
    pub threshold: Option<f64>,
    pub lr: Option<f64>,
    pub output: Option<String>,
}

/// The default job's rejection-sampling fine-tuning control (`[warm_start.rft]`).
#[derive(Debug, Clone, PartialEq)]
pub struct RftConfig {
    /// Teacher episodes with reward ≥ this are kept.
    pub threshold: f64,
    pub lr: f64,
    /// Where the RFT checkpoint is written.
    pub output: PathBuf,
}

/// What a from-scratch warm start builds: a random-init policy of `model_config` and a tokenizer
/// trained into `tokenizer`.
#[derive(Debug, Clone, PartialEq)]
pub struct Scratch {
    pub model_config: PathBuf,
    pub tokenizer: PathBuf,
}

#[derive(Debug, Clone, PartialEq)]
pub struct WarmStartConfig {
    /// `None`: the pretrained `[model]` is warm-started (its own tokenizer and chat template).
    pub scratch: Option<Scratch>,
    pub tokenizer_vocab: usize,
    pub teacher_samples: usize,
    pub pseudo_queries: usize,
    pub max_searches: usize,
    pub p_one_message: f64,
    pub p_interleave: f64,
    pub p_reorder: f64,
    pub p_top: f64,
    /// Probability that a submit of two or more searches is fused by reciprocal rank.
    pub p_rrf: f64,
    pub keyword_queries: bool,
    pub id_tokens: bool,
    /// pass@k's k (sampled attempts per task) of the job's final evaluation; 0: greedy only.
    pub eval_k: usize,
    pub rft: Option<RftConfig>,
}

impl WarmStartSpec {
    pub(crate) fn validate(self, ctx: &Ctx<'_>) -> Result<WarmStartConfig> {
        let scratch =
            match (self.model_config, self.tokenizer) {
                (Some(m), Some(t)) => Some(Scratch {
                    model_config: ctx.resolve(&m),
                    tokenizer: ctx.resolve(&t),
                }),
                (None, None) => {
                    // Keys of a tokenizer that is not trained would not act.
                    for (key, set) in [
                        ("warm_start.tokenizer_vocab", self.tokenizer_vocab.is_some()),
                        ("warm_start.id_tokens", self.id_tokens.is_some()),
                    ] {
                        if set {
                            return Err(ctx.invalid(
                                key,
                                "only acts with `warm_start.model_config` (a policy built from \
                             scratch with its own tokenizer); the pretrained [model] keeps its own",
                            ));
                        }
                    }
                    None
                }
                (Some(_), None) => return Err(ctx.invalid(
                    "warm_start.tokenizer",
                    "is required with `warm_start.model_config` (where the trained tokenizer goes)",
                )),
                (None, Some(_)) => return Err(ctx.invalid(
                    "warm_start.tokenizer",
                    "only acts with `warm_start.model_config`: the pretrained [model] keeps its \
                     own tokenizer",
                )),
            };
        let prob = |key: &str, v: Option<f64>, d: f64| -> Result<f64> {
            let v = v.unwrap_or(d);
            if !(0.0..=1.0).contains(&v) {
                return Err(ctx.invalid(key, format!("{v} is not a probability")));
            }
            Ok(v)
        };
        let rft = match self.rft {
            None => None,
            Some(r) => {
                let threshold = r.threshold.unwrap_or(0.3);
                if !threshold.is_finite() {
                    return Err(ctx.invalid("warm_start.rft.threshold", "must be a number"));
                }
                let lr = r.lr.unwrap_or(1e-3);
                if lr.is_nan() || lr <= 0.0 || lr >= 1.0 {
                    return Err(ctx.invalid("warm_start.rft.lr", format!("{lr} is outside (0, 1)")));
                }
                let output = r
                    .output
                    .ok_or_else(|| ctx.invalid("warm_start.rft.output", "is required"))?;
                Some(RftConfig {
                    threshold,
                    lr,
                    output: ctx.resolve(&output),
                })
            }
        };
        Ok(WarmStartConfig {
            scratch,
            tokenizer_vocab: ctx.range(
                "warm_start.tokenizer_vocab",
                self.tokenizer_vocab.unwrap_or(2048),
                300,
                1 << 20,
            )?,
            teacher_samples: ctx.range(
                "warm_start.teacher_samples",
                self.teacher_samples.unwrap_or(4),
                1,
                1000,
            )?,
            pseudo_queries: self.pseudo_queries.unwrap_or(0),
            max_searches: ctx.range(
                "warm_start.max_searches",
                self.max_searches.unwrap_or(2),
                1,
                100,
            )?,
            p_one_message: prob("warm_start.p_one_message", self.p_one_message, 0.5)?,
            p_interleave: prob("warm_start.p_interleave", self.p_interleave, 0.5)?,
            p_reorder: prob("warm_start.p_reorder", self.p_reorder, 0.2)?,
            p_top: prob("warm_start.p_top", self.p_top, 0.0)?,
            p_rrf: prob("warm_start.p_rrf", self.p_rrf, 0.0)?,
            keyword_queries: self.keyword_queries.unwrap_or(true),
            id_tokens: self.id_tokens.unwrap_or(true),
            eval_k: ctx.range("warm_start.eval_k", self.eval_k.unwrap_or(4), 0, 1000)?,
            rft,
        })
    }
}
