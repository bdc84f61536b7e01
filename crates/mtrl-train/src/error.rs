//! The error of a training run: every lower crate's error, wrapped transparently, plus messages
//! with context ("loading the policy of runs/x/step-00000003: …"). [`Context`] gives `Result`
//! and `Option` the `context` / `with_context` methods the run code reads best with, and
//! [`bail!`](crate::bail) returns a formatted message; the cause chain stays walkable through
//! `std::error::Error::source`, so the binary prints it whole.

use std::fmt::Display;

/// Result alias of `mtrl-train`.
pub type Result<T> = std::result::Result<T, TrainError>;

/// Everything a run can fail on. Messages name the file, key or step involved.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error(transparent)]
    Core(#[from] mtrl_core::CoreError),
    #[error(transparent)]
    Codec(#[from] mtrl_core::CodecError),
    #[error(transparent)]
    Search(#[from] mtrl_search::SearchError),
    #[error(transparent)]
    Model(#[from] mtrl_model::ModelError),
    #[error(transparent)]
    Env(#[from] mtrl_env::EnvError),
    #[error(transparent)]
    Learner(#[from] mtrl_learner::LearnerError),
    #[error(transparent)]
    Rollout(#[from] mtrl_rollout::RolloutError),
    #[error(transparent)]
    Eval(#[from] mtrl_eval::error::EvalError),
    #[error(transparent)]
    Serve(#[from] mtrl_serve::ServeError),
    #[error(transparent)]
    Tensor(#[from] candle_core::Error),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// A message of this crate (a refused resume, a missing config key, …).
    #[error("{0}")]
    Msg(String),
    /// What was being done when `source` happened.
    #[error("{what}")]
    Context {
        what: String,
        #[source]
        source: Box<TrainError>,
    },
}

impl TrainError {
    /// A plain message.
    pub fn msg(m: impl Display) -> TrainError {
        TrainError::Msg(m.to_string())
    }
}

/// Returns early with a formatted [`TrainError::Msg`].
#[macro_export]
macro_rules! bail {
    ($($arg:tt)*) => {
        return Err($crate::error::TrainError::Msg(format!($($arg)*)))
    };
}

/// Adds what was being done to an error (or turns a `None` into an error).
pub trait Context<T> {
    fn context(self, what: impl Display) -> Result<T>;
    fn with_context<D: Display>(self, what: impl FnOnce() -> D) -> Result<T>;
}

impl<T, E: Into<TrainError>> Context<T> for std::result::Result<T, E> {
    fn context(self, what: impl Display) -> Result<T> {
        self.map_err(|e| TrainError::Context {
            what: what.to_string(),
            source: Box::new(e.into()),
        })
    }

    fn with_context<D: Display>(self, what: impl FnOnce() -> D) -> Result<T> {
        self.map_err(|e| TrainError::Context {
            what: what().to_string(),
            source: Box::new(e.into()),
        })
    }
}

impl<T> Context<T> for Option<T> {
    fn context(self, what: impl Display) -> Result<T> {
        self.ok_or_else(|| TrainError::Msg(what.to_string()))
    }

    fn with_context<D: Display>(self, what: impl FnOnce() -> D) -> Result<T> {
        self.ok_or_else(|| TrainError::Msg(what().to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_keeps_the_cause_chain() {
        let e: Result<()> = Err(std::io::Error::other("disk full")).context("writing step 3");
        let e = e.unwrap_err();
        assert_eq!(e.to_string(), "writing step 3");
        let cause = std::error::Error::source(&e).map(|c| c.to_string());
        assert_eq!(cause.as_deref(), Some("disk full"));
        let none: Result<u8> = None.with_context(|| format!("no key `{}`", "x"));
        assert_eq!(none.unwrap_err().to_string(), "no key `x`");
    }
}
