//! Errors of evaluation jobs, trajectory logs, inspection and plots.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    Invalid(String),
    /// A model folder that does not exist (or is not a folder).
    #[error("{path}: no such model folder (expected a Hugging Face checkpoint folder with config.json, *.safetensors and tokenizer.json)")]
    MissingModel { path: PathBuf },
    /// Loading a policy, tokenizer or chat template failed.
    #[error("{path}: {message}")]
    Model { path: PathBuf, message: String },
    /// A test task file that cannot be evaluated (unreadable, a bad row, a task without qrels).
    #[error("{path}: {message}")]
    TestFile { path: PathBuf, message: String },
    /// Reading run records (`metrics.jsonl`; the message names the file and line).
    #[error(transparent)]
    Core(#[from] mtrl_core::CoreError),
    /// Opening or querying a search index.
    #[error(transparent)]
    Search(#[from] mtrl_search::SearchError),
    /// Reading task files (the message names the file and row).
    #[error(transparent)]
    Env(#[from] mtrl_env::EnvError),
    /// Test tasks that also appear in the training files (by query / prompt content).
    #[error("{0}")]
    Leak(String),
    /// An episode or the generation engine failed.
    #[error("evaluating {model} on {benchmark}: {message}")]
    Episode {
        model: String,
        benchmark: String,
        message: String,
    },
}

pub type Result<T> = std::result::Result<T, EvalError>;
