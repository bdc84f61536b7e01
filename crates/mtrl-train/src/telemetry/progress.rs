//! Progress on stderr: [`ProgressSink`] draws a bar of a run's steps from its records, and
//! [`IndexBar`] shows an index build (`mtrl_search::index::Progress`). Both stay hidden when
//! stderr is not a terminal; a hidden SFT bar prints a line every 10 steps instead, so logs of
//! long runs still show progress.

use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use mtrl_search::index::Progress;

use crate::error::Result;

use super::{Record, RunStatus, Sink};

fn bar(template: &str, total: u64) -> ProgressBar {
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template(template)
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar
}

/// The bar of an RL run (`step i/n`) or an SFT run (`sft i/n`).
pub struct ProgressSink {
    bar: ProgressBar,
    total: u64,
}

impl ProgressSink {
    /// An RL run of `total` steps, `start` of them already done (a resume).
    pub fn train(total: u64, start: u64) -> ProgressSink {
        let b = bar("step {pos}/{len} [{bar:30}] {msg} eta {eta}", total);
        b.set_position(start);
        ProgressSink { bar: b, total }
    }

    /// An SFT run of `total` optimizer steps.
    pub fn sft(total: u64) -> ProgressSink {
        let b = bar("sft {pos}/{len} [{bar:30}] {msg} eta {eta}", total);
        ProgressSink { bar: b, total }
    }
}

impl Sink for ProgressSink {
    fn record(&mut self, r: Record<'_>) -> Result<()> {
        match r {
            Record::Step(s) => {
                self.bar.set_position(s.step);
                self.bar
                    .set_message(format!("reward {:.3} loss {:+.4}", s.reward_mean, s.loss));
            }
            Record::Sft(s) => {
                if self.bar.is_hidden() && s.step.is_multiple_of(10) {
                    eprintln!(
                        "         sft step {}/{}: loss {:.3} ({:.0} s)",
                        s.step, self.total, s.loss, s.elapsed_s
                    );
                }
                self.bar.set_position(s.step);
                self.bar.set_message(format!("loss {:.3}", s.loss));
            }
            Record::Eval { .. } => {}
        }
        Ok(())
    }

    fn finish(&mut self, _status: RunStatus) -> Result<Option<(&'static str, serde_json::Value)>> {
        self.bar.finish_and_clear();
        Ok(None)
    }
}

/// An indicatif bar for index builds (hidden when `quiet`).
pub struct IndexBar {
    bar: Option<ProgressBar>,
    quiet: bool,
}

impl IndexBar {
    pub fn new(quiet: bool) -> IndexBar {
        IndexBar { bar: None, quiet }
    }
}

impl Progress for IndexBar {
    fn start(&mut self, stage: &str, total: u64) {
        if self.quiet {
            return;
        }
        let b = bar(
            "{msg:>14} [{bar:40}] {pos}/{len} {per_sec} eta {eta}",
            total,
        );
        b.set_message(stage.to_string());
        b.enable_steady_tick(Duration::from_millis(200));
        self.bar = Some(b);
    }

    fn set(&mut self, done: u64) {
        if let Some(b) = &self.bar {
            b.set_position(done);
        }
    }

    fn finish(&mut self) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
    }
}
