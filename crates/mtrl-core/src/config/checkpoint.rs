//! `[checkpoint]`: where and how often training state is saved.
//!
//! ```toml
//! [checkpoint]
//! dir = "../runs/cranfield"   # default: runs/<name> next to the config's folder
//! every_steps = 10            # 0 = only at the end and on Ctrl-C / SIGTERM
//! keep_last = 3
//! background = true           # written by a thread of their own while training goes on
//! ```

use std::path::PathBuf;

use serde::Deserialize;

use super::Ctx;
use crate::error::Result;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointSpec {
    pub dir: Option<String>,
    pub every_steps: Option<u64>,
    pub keep_last: Option<usize>,
    pub background: Option<bool>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct CheckpointConfig {
    pub dir: PathBuf,
    pub every_steps: u64,
    pub keep_last: usize,
    /// Checkpoints are written by a background thread (the learner only copies the tensors).
    pub background: bool,
}

impl CheckpointSpec {
    pub(crate) fn validate(self, ctx: &Ctx<'_>, name: &str) -> Result<CheckpointConfig> {
        let dir = match self.dir {
            Some(d) => {
                ctx.non_empty("checkpoint.dir", &d)?;
                ctx.resolve(&d)
            }
            None => ctx.resolve(&format!("runs/{name}")),
        };
        Ok(CheckpointConfig {
            dir,
            every_steps: self.every_steps.unwrap_or(10),
            background: self.background.unwrap_or(true),
            keep_last: ctx.range(
                "checkpoint.keep_last",
                self.keep_last.unwrap_or(3),
                1,
                1 << 20,
            )?,
        })
    }
}
