//! Errors of `mtrl-env`. Tool-call mistakes by the model are *not* errors here: they become error
//! tool responses inside the episode. These are failures of the caller's inputs or of the tools.

use std::path::PathBuf;

/// Result alias of `mtrl-env`.
pub type Result<T> = std::result::Result<T, EnvError>;

#[derive(Debug, thiserror::Error)]
pub enum EnvError {
    /// A task file could not be read.
    #[error("cannot read task file {path}: {message}")]
    Read { path: PathBuf, message: String },
    /// A task file's extension is not one the loader knows.
    #[error(
        "task file {path} has an unsupported format (expected .parquet, .jsonl, .json or .csv)"
    )]
    UnsupportedFormat { path: PathBuf },
    /// One row of a task file is malformed (row is 1-based, header excluded).
    #[error("task file {path}, row {row}: {message}")]
    BadRow {
        path: PathBuf,
        row: usize,
        message: String,
    },
    /// A task's prompt is not what the environment expects.
    #[error("task {task}: {message}")]
    BadTask { task: String, message: String },
    /// A data set has no task left after the validation hold-out.
    #[error("dataset {path} is empty")]
    EmptyDataset { path: PathBuf },
    /// A saved dataset cursor does not fit the datasets it is restored into.
    #[error("dataset cursor does not fit: {0}")]
    Cursor(String),
    /// Two tools share a name.
    #[error("duplicate tool name `{0}`")]
    DuplicateTool(String),
    /// The environment was used out of order (step before reset, step after done, …).
    #[error("environment misuse: {0}")]
    Protocol(String),
    /// A search tool failed (index IO, not model input).
    #[error(transparent)]
    Search(#[from] mtrl_search::SearchError),
    /// The chat codec failed.
    #[error(transparent)]
    Codec(#[from] mtrl_core::CodecError),
    /// A policy driving the environment failed.
    #[error("policy failed: {0}")]
    Agent(String),
    #[error("io error on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}
