//! `[logging]`: what a run records besides checkpoints (exporters are wired by the binary).
//!
//! ```toml
//! [logging]
//! trajectories = true                 # append every trajectory to <checkpoint.dir>/trajectories.jsonl
//! prometheus = "127.0.0.1:9000"       # optional metrics endpoint (exporter: later issue)
//! mlflow = "http://127.0.0.1:5000"    # optional
//! ```

use serde::Deserialize;

use super::Ctx;
use crate::error::Result;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoggingSpec {
    pub trajectories: Option<bool>,
    pub prometheus: Option<String>,
    pub mlflow: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoggingConfig {
    pub trajectories: bool,
    pub prometheus: Option<String>,
    pub mlflow: Option<String>,
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
        }
        Ok(LoggingConfig {
            trajectories: self.trajectories.unwrap_or(false),
            prometheus: self.prometheus,
            mlflow: self.mlflow,
        })
    }
}
