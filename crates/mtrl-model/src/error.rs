//! The one error type of `mtrl-model`.
//!
//! Messages are lowercase, have no final period and name the file, key or tensor at fault, so that
//! a user who pointed `--model` at the wrong folder learns what to fix without a backtrace.

use std::path::{Path, PathBuf};

/// Everything that can go wrong while loading, running or saving a policy.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A file could not be read or written.
    #[error("{path}: {err}")]
    Io { path: PathBuf, err: std::io::Error },
    /// A JSON file (config, tokenizer config, index) is malformed.
    #[error("{path}: invalid json: {msg}")]
    Json { path: PathBuf, msg: String },
    /// `config.json` asks for something this implementation does not support.
    #[error("{path}: unsupported setting `{key}`: {msg}")]
    Unsupported {
        path: PathBuf,
        key: String,
        msg: String,
    },
    /// `config.json` is missing a key or has a value of the wrong type or range.
    #[error("{path}: invalid config key `{key}`: {msg}")]
    Config {
        path: PathBuf,
        key: String,
        msg: String,
    },
    /// A checkpoint file is missing, truncated or inconsistent.
    #[error("checkpoint {path}: {msg}")]
    Checkpoint { path: PathBuf, msg: String },
    /// A weight tensor is missing, has the wrong shape or holds NaN/inf.
    #[error("tensor `{name}`: {msg}")]
    Tensor { name: String, msg: String },
    /// The tokenizer files are unusable or do not fit the model.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The chat template failed to compile or render.
    #[error("chat template: {0}")]
    ChatTemplate(String),
    /// A caller passed an argument outside its domain (dtype string, device, sampling parameter …).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A sequence does not fit the model's context window.
    #[error("sequence of {len} tokens does not fit the context window of {max} positions")]
    ContextOverflow { len: usize, max: usize },
    /// An error from candle while computing.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

/// `file: unsupported setting key: msg` (a checkpoint or adapter config asks for what is not
/// implemented).
pub(crate) fn unsupported(path: &Path, key: &str, msg: impl Into<String>) -> ModelError {
    ModelError::Unsupported {
        path: path.to_path_buf(),
        key: key.to_string(),
        msg: msg.into(),
    }
}

/// `file: invalid config key key: msg` (missing, wrong type or out of range).
pub(crate) fn invalid(path: &Path, key: &str, msg: impl Into<String>) -> ModelError {
    ModelError::Config {
        path: path.to_path_buf(),
        key: key.to_string(),
        msg: msg.into(),
    }
}

/// `Result` with [`ModelError`].
pub type Result<T> = std::result::Result<T, ModelError>;

impl ModelError {
    pub(crate) fn io(path: impl Into<PathBuf>, err: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            err,
        }
    }
    pub(crate) fn checkpoint(path: impl Into<PathBuf>, msg: impl Into<String>) -> Self {
        Self::Checkpoint {
            path: path.into(),
            msg: msg.into(),
        }
    }
    pub(crate) fn tensor(name: impl Into<String>, msg: impl Into<String>) -> Self {
        Self::Tensor {
            name: name.into(),
            msg: msg.into(),
        }
    }
}
