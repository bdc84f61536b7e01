//! [`JsonlSink`]: the run's own record file (`metrics.jsonl`, `sft-metrics.jsonl`), one typed
//! record per line. A resumed run rewrites the file from the checkpoint's history first, so the
//! file always equals the history of the checkpoint it continues from plus the new steps.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::{Context, Result};

use super::{Record, Sink};

pub struct JsonlSink {
    path: PathBuf,
    out: std::io::BufWriter<std::fs::File>,
}

impl JsonlSink {
    /// Creates (truncates) `path` and writes `history` (already-serialised lines) into it.
    pub fn create(path: &Path, history: &[serde_json::Value]) -> Result<JsonlSink> {
        let f = std::fs::File::create(path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        let mut s = JsonlSink {
            path: path.to_path_buf(),
            out: std::io::BufWriter::new(f),
        };
        for line in history {
            s.write(line)?;
        }
        s.flush()?;
        Ok(s)
    }

    fn write(&mut self, v: &serde_json::Value) -> Result<()> {
        writeln!(self.out, "{v}").with_context(|| format!("cannot write {}", self.path.display()))
    }

    fn flush(&mut self) -> Result<()> {
        self.out
            .flush()
            .with_context(|| format!("cannot write {}", self.path.display()))
    }
}

impl Sink for JsonlSink {
    /// Each record is flushed at once: a killed run leaves every finished step on disk.
    fn record(&mut self, r: Record<'_>) -> Result<()> {
        self.write(&r.to_json())?;
        self.flush()
    }
}
