//! Errors of the RL math (shape mismatches and invalid parameters).

/// Result alias of `mtrl-algo`.
pub type Result<T> = std::result::Result<T, AlgoError>;

#[derive(Debug, thiserror::Error)]
pub enum AlgoError {
    #[error("tensor error: {0}")]
    Tensor(#[from] candle_core::Error),
    #[error("invalid argument: {0}")]
    Invalid(String),
}
