//! Shared vocabulary of mtrl: configuration specs and their validation, the error type every
//! other crate can wrap, chat messages with the [`ChatCodec`] seam between environment and
//! tokenizer, the [`Trajectory`] record that rollout and learner exchange, the typed run records
//! ([`StepRecord`], [`SftRecord`]) that training writes and plots read, and the one seeded-random
//! module ([`rng`]), and phase trace lines for placing a stall ([`trace`], `MTRL_TRACE=1`).
//!
//! Configuration is two-stage (ripgrep style): a TOML file is parsed into `*Spec` structs that mirror
//! the file one-to-one (`deny_unknown_fields`, so a mistyped key is an error naming the key and the
//! file), then `validate()` turns the spec into plain config structs with defaults applied, ranges
//! checked and relative paths resolved against the config file's folder. Validation does no IO: it
//! never checks that a path exists, because the commands that use a path report that with context.
//!
//! Invariant: this crate depends on nothing heavier than serde; every crate may depend on it.

pub mod chat;
pub mod config;
pub mod error;
pub mod mem;
pub mod record;
pub mod rng;
pub mod trace;
pub mod trajectory;

pub use chat::{ChatCodec, CodecError, Message, Role, ToolCall};
pub use config::{
    AlgorithmConfig, CheckpointConfig, LoggingConfig, ModelConfig, RolloutConfig, TrainConfig,
};
pub use config::{Config, DataConfig, EnvConfig, SearchConfig};
pub use error::{CoreError, Result};
pub use record::{read_jsonl, SftRecord, StepRecord, Versioned};
pub use trajectory::{
    CallErrorKind, FailureReason, ToolStats, Trajectory, TRAJECTORY_FORMAT_VERSION,
};
