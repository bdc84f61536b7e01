//! Errors of the learner: optimizer state, checkpoints, training steps.

use std::path::PathBuf;

pub type Result<T> = std::result::Result<T, LearnerError>;

#[derive(Debug, thiserror::Error)]
pub enum LearnerError {
    #[error("tensor error: {0}")]
    Tensor(#[from] candle_core::Error),
    #[error(transparent)]
    Model(#[from] mtrl_model::ModelError),
    #[error(transparent)]
    Algo(#[from] mtrl_algo::AlgoError),
    #[error("cannot {action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("checkpoint {path} is invalid: {message}")]
    BadCheckpoint { path: PathBuf, message: String },
    /// A collective between data-parallel ranks failed (the message names the ranks).
    #[error("{0}")]
    Collective(String),
    #[error("invalid argument: {0}")]
    Invalid(String),
}

impl LearnerError {
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> LearnerError {
        let path = path.into();
        move |source| LearnerError::Io {
            action,
            path,
            source,
        }
    }
}
