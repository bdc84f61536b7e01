//! Errors of the rollout side.

/// Result alias of `mtrl-rollout`.
pub type Result<T> = std::result::Result<T, RolloutError>;

/// What can stop rollouts.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RolloutError {
    /// The generation engine failed (bad request, tensor error, weight update refused).
    #[error("generation engine: {0}")]
    Engine(String),
    /// The engine thread is gone (it stopped after an error, or rollouts were shut down).
    #[error("generation engine stopped")]
    EngineStopped,
    /// An environment failed (bad task, codec error, protocol misuse).
    #[error("environment, task {task}: {message}")]
    Env { task: String, message: String },
    /// No group can arrive any more (the scheduler and every group task have ended).
    #[error("rollouts stopped")]
    Stopped,
    /// An episode attempt ran past `rollout.timeout_s`.
    #[error("episode of task {task} ran past rollout.timeout_s = {seconds} s")]
    Timeout { task: String, seconds: f64 },
    /// Rollouts were cancelled (shutdown).
    #[error("rollouts cancelled")]
    Cancelled,
    /// Something that is not a user error (a panicked worker).
    #[error("internal rollout error: {0}")]
    Internal(String),
}
