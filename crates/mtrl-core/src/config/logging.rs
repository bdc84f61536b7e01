//! `[logging]`: what a run records besides checkpoints (exporters are wired by the binary).
//!
//! ```toml
//! [logging]
//! trajectories = true                 # log every trajectory to <checkpoint.dir>/trajectories/
//! trajectory_rotate_mb = 64           # start a new trajectories-NNNNN.jsonl past this size
//! trajectory_queue = 4096             # records waiting for the writer; more are dropped and counted
//! trajectory_tokens = false           # also log each trajectory's token ids, loss mask, log-probs
//!                                     # and versions (what the learner trained on)
//! prometheus = "127.0.0.1:9000"       # optional: serve /metrics for Prometheus on this address
//! mlflow = "http://127.0.0.1:5000"    # optional: MLflow tracking server (params, metrics, artifacts)
//! mlflow_experiment = "mtrl"          # MLflow experiment the runs go to (created when missing)
//! ```

use serde::Deserialize;

use super::Ctx;
use crate::error::Result;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoggingSpec {
    pub trajectories: Option<bool>,
    pub trajectory_rotate_mb: Option<usize>,
    pub trajectory_queue: Option<usize>,
    pub trajectory_tokens: Option<bool>,
    pub prometheus: Option<String>,
    pub mlflow: Option<String>,
    pub mlflow_experiment: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct LoggingConfig {
    pub trajectories: bool,
    /// Size in MB (10^6 bytes) after which the trajectory log starts a new file.
    pub trajectory_rotate_mb: usize,
    /// Capacity of the trajectory writer's queue.
    pub trajectory_queue: usize,
    /// Log the token vectors too.
    pub trajectory_tokens: bool,
    pub prometheus: Option<String>,
    pub mlflow: Option<String>,
    /// MLflow experiment name (default [`DEFAULT_MLFLOW_EXPERIMENT`]).
    pub mlflow_experiment: String,
}

/// Default `mlflow_experiment`.
pub const DEFAULT_MLFLOW_EXPERIMENT: &str = "mtrl";
/// Default `trajectory_rotate_mb`.
pub const DEFAULT_TRAJECTORY_ROTATE_MB: usize = 64;
/// Default `trajectory_queue`.
pub const DEFAULT_TRAJECTORY_QUEUE: usize = 4096;

impl Default for LoggingConfig {
    fn default() -> LoggingConfig {
        LoggingConfig {
            trajectories: false,
            trajectory_rotate_mb: DEFAULT_TRAJECTORY_ROTATE_MB,
            trajectory_queue: DEFAULT_TRAJECTORY_QUEUE,
            trajectory_tokens: false,
            prometheus: None,
            mlflow: None,
            mlflow_experiment: DEFAULT_MLFLOW_EXPERIMENT.to_string(),
        }
    }
}

impl LoggingSpec {
    pub(crate) fn validate(self, ctx: &Ctx<'_>) -> Result<LoggingConfig> {
        if let Some(p) = &self.prometheus {
            if p.parse::<std::net::SocketAddr>().is_err() {
                return Err(ctx.invalid(
                    "logging.prometheus",
                    format!("`{p}` is not an address like 127.0.0.1:9000"),
                ));
            }
        }
        if let Some(m) = &self.mlflow {
            ctx.non_empty("logging.mlflow", m)?;
            if !(m.starts_with("http://") || m.starts_with("https://")) {
                return Err(ctx.invalid(
                    "logging.mlflow",
                    format!("`{m}` is not a tracking server URL like http://127.0.0.1:5000"),
                ));
            }
        }
        let experiment = self
            .mlflow_experiment
            .unwrap_or_else(|| DEFAULT_MLFLOW_EXPERIMENT.to_string());
        ctx.non_empty("logging.mlflow_experiment", &experiment)?;
        let rotate = self
            .trajectory_rotate_mb
            .unwrap_or(DEFAULT_TRAJECTORY_ROTATE_MB);
        let queue = self.trajectory_queue.unwrap_or(DEFAULT_TRAJECTORY_QUEUE);
        let trajectories = self.trajectories.unwrap_or(false);
        if self.trajectory_tokens.is_some() && !trajectories {
            return Err(ctx.invalid(
                "logging.trajectory_tokens",
                "has no effect unless logging.trajectories = true",
            ));
        }
        Ok(LoggingConfig {
            trajectories,
            trajectory_tokens: self.trajectory_tokens.unwrap_or(false),
            trajectory_rotate_mb: ctx.range("logging.trajectory_rotate_mb", rotate, 1, 1 << 20)?,
            trajectory_queue: ctx.range("logging.trajectory_queue", queue, 1, 1 << 24)?,
            prometheus: self.prometheus,
            mlflow: self.mlflow,
            mlflow_experiment: experiment,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::Config;

    fn load(text: &str) -> crate::Result<Config> {
        Config::from_toml_str(text, Path::new("configs/t.toml"))
    }

    #[test]
    fn trajectory_log_settings_default_and_are_checked() {
        let c = load("[logging]\ntrajectories = true\n").unwrap();
        assert!(c.logging.trajectories);
        assert_eq!(c.logging.trajectory_rotate_mb, 64);
        assert_eq!(c.logging.trajectory_queue, 4096);
        let c = load("[logging]\ntrajectory_rotate_mb = 2\ntrajectory_queue = 8\n").unwrap();
        assert_eq!(
            (c.logging.trajectory_rotate_mb, c.logging.trajectory_queue),
            (2, 8)
        );
        for key in ["trajectory_rotate_mb", "trajectory_queue"] {
            let msg = load(&format!("[logging]\n{key} = 0\n"))
                .unwrap_err()
                .to_string();
            assert!(msg.contains(&format!("logging.{key}")), "{msg}");
        }
    }

    #[test]
    fn mlflow_settings_default_and_are_checked() {
        let c = load("[logging]\nmlflow = \"http://127.0.0.1:5000\"\n").unwrap();
        assert_eq!(c.logging.mlflow_experiment, "mtrl");
        let c = load("[logging]\nmlflow_experiment = \"search\"\n").unwrap();
        assert_eq!(c.logging.mlflow_experiment, "search");
        for bad in ["mlflow = \"127.0.0.1:5000\"", "mlflow_experiment = \" \""] {
            let msg = load(&format!("[logging]\n{bad}\n"))
                .unwrap_err()
                .to_string();
            assert!(msg.contains("logging.mlflow"), "{msg}");
        }
    }
}
