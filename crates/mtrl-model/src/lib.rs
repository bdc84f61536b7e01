//! `mtrl-model`: the policy of mtrl — a Qwen2/Qwen3 causal LM on candle, served for rollouts and
//! trained by the learner.
//!
//! Why not candle-transformers' Qwen: it returns only the last position's logits and hides
//! `lm_head`, while RL needs (a) every sampled token's log-prob during generation and (b) every
//! position's log-prob with gradients during training. So this crate owns the decoder
//! ([`transformer`]), exposes every parameter as a `Var` under its Hugging Face name ([`policy`]),
//! and builds two consumers on it:
//!
//! - the **generation engine** ([`engine`]): one batched loop over one paged key/value store
//!   ([`kv_pool`]), sequences joining and leaving between steps, conversations kept resident
//!   between turns (sessions), chunked prefill riding along with decoding, seeded sampling as
//!   tensor ops where the logits are ([`batch_sampler`]; [`sampler`] is the host spelling), each
//!   token tagged with its log-prob and the policy version that sampled it;
//! - the **training forward** ([`logprobs`]): next-token log-probs of a padded batch with exact
//!   gradients, computed in vocabulary chunks so `[B, T, V]` logits never exist at once.
//!
//! Around them: HF checkpoint IO ([`checkpoint`], [`config`]), the tokenizer and a Python-compatible
//! chat-template renderer ([`tokenizer`], [`chat_template`]), and a throughput bench ([`bench`]).
//!
//! Invariants: the reported log-prob of a sampled token is `log_softmax(logits / T)[token]` before
//! truncation, the same quantity the learner computes; weights are only replaced between decode
//! steps; unsupported checkpoints are refused at load, never approximated.

pub mod batch_sampler;
pub mod bench;
pub mod bench_engine;
pub mod chat_template;
pub mod checkpoint;
pub mod codec;
pub mod config;
mod cpu;
pub mod device;
pub mod engine;
pub mod engine_attention;
pub mod error;
pub mod flash_prefill;
pub mod flash_varlen;
pub mod gguf;
pub mod host;
pub mod kv_cache;
pub mod kv_pool;
mod kv_write;
pub mod logprob_head;
pub mod logprobs;
pub mod lora;
pub mod paged_attention;
pub mod policy;
pub mod rms_norm;
pub mod sampler;
mod stash;
pub mod swiglu;
pub mod tokenizer;
pub mod tokenizer_train;
pub mod transformer;

pub use batch_sampler::{sample_rows, Drawn};
pub use chat_template::{ChatOptions, ChatTemplate};
pub use codec::TemplateCodec;
pub use config::{parse_device, parse_dtype, Config, Family, GenerationConfig};
pub use device::engine_device;
pub use engine::{
    Completion, Engine, EngineCounters, EngineOptions, FinishReason, GenerationRequest,
    LegacyEngine, SampledToken, SeqId, StepOutput, Stepper,
};
pub use engine_attention::EngineAttention;
pub use error::{ModelError, Result};
pub use flash_varlen::AttentionKernel;
pub use kv_cache::KvCache;
pub use logprobs::{
    logprobs_and_grads, logprobs_and_grads_at, token_logprobs, token_logprobs_at,
    token_logprobs_host, HostBatch, TokenLogprobs, DEFAULT_CHUNK_ELEMS,
};
pub use lora::LoraSpec;
pub use policy::{left_padding_positions, LoraServing, Policy, PolicySnapshot};
pub use sampler::{Sampled, SamplingParams};
pub use tokenizer::Tokenizer;
pub use tokenizer_train::{train_tokenizer, TokenizerTraining};

use std::path::Path;

/// Loads policy + tokenizer from an HF checkpoint folder and checks that they fit each other.
pub fn load_pretrained(
    dir: &Path,
    dtype: candle_core::DType,
    device: &candle_core::Device,
) -> Result<(Policy, Tokenizer)> {
    let policy = Policy::load(dir, dtype, device)?;
    let tok = Tokenizer::from_dir(dir)?;
    tok.check_vocab(policy.config().vocab_size)?;
    Ok((policy, tok))
}
