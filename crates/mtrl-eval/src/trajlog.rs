//! The trajectory log: every training and evaluation episode as one JSON line, written by a
//! background thread so that logging never slows the learner.
//!
//! A line is a [`TrajectoryRecord`]: the readable part of a [`Trajectory`] (messages, tool calls
//! with arguments, result ids and latency, answer, reward, failure) with token *counts* instead of
//! the token vectors, the range of policy versions that sampled it, and where it came from
//! (`kind` train/eval, `step` = training step it was trained in, or an evaluation label).
//! Every line carries `format_version` ([`TRAJLOG_FORMAT_VERSION`]); readers refuse any other,
//! naming the file and line.
//!
//! Files are `trajectories-00001.jsonl`, `trajectories-00002.jsonl`, … in one folder; a new file
//! starts when the current one would pass `rotate_bytes`. Reopening a folder (a resumed run)
//! continues after the highest number, and refuses a folder whose newest file has another format
//! version.
//!
//! Invariants:
//! - [`TrajectoryLog::send`] never blocks: records go through a bounded crossbeam channel with
//!   `try_send`; when the queue is full (or the writer stopped) the record is dropped and counted
//!   (`dropped`, and the `trajectories_dropped_total` counter of the `metrics` facade).
//! - The writer never panics: the first IO error stops writing, is kept, and is returned by
//!   [`TrajectoryLog::close`]; records after it count as dropped.
//! - Dropping or closing the log drains the queue, flushes and joins the writer. The writer also
//!   flushes whenever its queue runs empty, so a running training's files are readable.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender, TrySendError};
use mtrl_core::Trajectory;

use crate::error::{EvalError, Result};

mod read;
mod record;

pub use read::{read_file, read_run, trajectory_files, RunLog};
pub use record::{
    At, Kind, TokenCounts, TokenVectors, TrajectoryRecord, VersionRange, FILE_PREFIX,
    TRAJLOG_FORMAT_VERSION,
};

/// How the log writes.
#[derive(Debug, Clone, PartialEq)]
pub struct LogOptions {
    /// A new file starts when the current one would pass this size.
    pub rotate_bytes: u64,
    /// Records that may wait for the writer; more are dropped.
    pub queue: usize,
    /// Records carry the token vectors ([`TokenVectors`]).
    pub tokens: bool,
}

impl Default for LogOptions {
    fn default() -> LogOptions {
        LogOptions {
            rotate_bytes: 64_000_000,
            queue: 4096,
            tokens: false,
        }
    }
}

impl LogOptions {
    /// The options of a `[logging]` section.
    pub fn from_config(cfg: &mtrl_core::LoggingConfig) -> LogOptions {
        LogOptions {
            rotate_bytes: cfg.trajectory_rotate_mb as u64 * 1_000_000,
            queue: cfg.trajectory_queue,
            tokens: cfg.trajectory_tokens,
        }
    }
}

/// What a log wrote.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogStats {
    pub written: u64,
    pub dropped: u64,
    /// Files written to by this log, in order.
    pub files: Vec<PathBuf>,
}

#[derive(Default)]
struct Shared {
    written: AtomicU64,
    dropped: AtomicU64,
    files: Mutex<Vec<PathBuf>>,
    error: Mutex<Option<(PathBuf, std::io::Error)>>,
    /// Test hook: the writer takes this lock before each record, so a test can stall it.
    #[cfg(test)]
    pause: Mutex<()>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Rewinds a run's log to training step `step` (a run resuming from that checkpoint): training
/// records of later steps go — the resumed run writes them again — and so does an incomplete last
/// line (a process killed mid-write). Files are rewritten through a temp file and a rename, and
/// only when something goes. Returns how many records were removed.
pub fn truncate_after(dir: &Path, step: u64) -> Result<usize> {
    let mut removed = 0;
    for (_, path) in read::numbered_files(dir)? {
        removed += keep_lines(&path, |line| {
            match serde_json::from_str::<TrajectoryRecord>(line.trim_end()) {
                Ok(r) => !(r.kind == Kind::Train && matches!(r.step, At::Step(s) if s > step)),
                // Only the last line can be cut short; a bad line elsewhere is left for the
                // reader to report.
                Err(_) => line.ends_with('\n'),
            }
        })?;
    }
    Ok(removed)
}

/// Rewrites the line file `path` with only the lines `keep` accepts (each with its `\n`, the
/// last one possibly without), through a temp file, fsync and rename, and only when a line goes.
/// Returns how many lines went; a missing file has none.
pub fn keep_lines(path: &Path, mut keep: impl FnMut(&str) -> bool) -> Result<usize> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| EvalError::Io { path, source }
    };
    let text = match std::fs::read_to_string(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        r => r.map_err(io(path))?,
    };
    let mut kept = String::with_capacity(text.len());
    let mut gone = 0;
    for line in text.split_inclusive('\n') {
        if keep(line) {
            kept.push_str(line);
        } else {
            gone += 1;
        }
    }
    if gone > 0 {
        let tmp = path.with_extension("jsonl.tmp");
        std::fs::write(&tmp, kept.as_bytes()).map_err(io(&tmp))?;
        std::fs::File::open(&tmp)
            .and_then(|f| f.sync_all())
            .map_err(io(&tmp))?;
        std::fs::rename(&tmp, path).map_err(io(path))?;
    }
    Ok(gone)
}

/// A trajectory log being written (see the module docs).
pub struct TrajectoryLog {
    dir: PathBuf,
    tx: Option<Sender<TrajectoryRecord>>,
    worker: Option<JoinHandle<()>>,
    shared: Arc<Shared>,
    tokens: bool,
}

impl TrajectoryLog {
    /// Starts a log in `dir` (created), numbering after any `trajectories-N.jsonl` already there.
    pub fn open(dir: &Path, opts: LogOptions) -> Result<TrajectoryLog> {
        std::fs::create_dir_all(dir).map_err(|source| EvalError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let existing = read::numbered_files(dir)?;
        if let Some((_, newest)) = existing.last() {
            read::check_first_line(newest)?;
        }
        let next = existing.last().map_or(1, |(n, _)| n + 1);
        let (tx, rx) = crossbeam_channel::bounded(opts.queue.max(1));
        let shared = Arc::new(Shared::default());
        let writer = Writer {
            dir: dir.to_path_buf(),
            rotate_bytes: opts.rotate_bytes.max(1),
            next,
            file: None,
            bytes: 0,
            shared: shared.clone(),
        };
        let worker = std::thread::Builder::new()
            .name("trajectory-log".into())
            .spawn(move || writer.run(rx))
            .map_err(|source| EvalError::Io {
                path: dir.to_path_buf(),
                source,
            })?;
        Ok(TrajectoryLog {
            dir: dir.to_path_buf(),
            tx: Some(tx),
            worker: Some(worker),
            shared,
            tokens: opts.tokens,
        })
    }

    /// The folder written to.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Queues a record without blocking; false when it was dropped (queue full, writer stopped).
    pub fn send_record(&self, record: TrajectoryRecord) -> bool {
        let sent = match &self.tx {
            Some(tx) => match tx.try_send(record) {
                Ok(()) => true,
                Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => false,
            },
            None => false,
        };
        if !sent {
            self.shared.dropped.fetch_add(1, Ordering::Relaxed);
            metrics::counter!("trajectories_dropped_total").increment(1);
        }
        sent
    }

    fn record(&self, kind: Kind, step: At, sample: u32, t: &Trajectory) -> TrajectoryRecord {
        let mut r = TrajectoryRecord::new(kind, step, sample, t);
        if self.tokens {
            r.ids = Some(TokenVectors::of(t));
        }
        r
    }

    /// Queues one trajectory (sample index 0); false when it was dropped.
    pub fn send(&self, kind: Kind, step: impl Into<At>, t: &Trajectory) -> bool {
        self.send_record(self.record(kind, step.into(), 0, t))
    }

    /// Queues every trajectory of a batch of groups, each with its index in its group; returns
    /// how many were queued.
    pub fn send_groups(
        &self,
        kind: Kind,
        step: impl Into<At>,
        groups: &[Vec<Trajectory>],
    ) -> usize {
        let step = step.into();
        let mut queued = 0;
        for group in groups {
            for (i, t) in group.iter().enumerate() {
                queued += self.send_record(self.record(kind, step.clone(), i as u32, t)) as usize;
            }
        }
        queued
    }

    /// Counts so far (records still queued are neither written nor dropped yet).
    pub fn stats(&self) -> LogStats {
        LogStats {
            written: self.shared.written.load(Ordering::Relaxed),
            dropped: self.shared.dropped.load(Ordering::Relaxed),
            files: lock(&self.shared.files).clone(),
        }
    }

    /// The writer's IO error, if it stopped on one.
    pub fn error(&self) -> Option<String> {
        lock(&self.shared.error)
            .as_ref()
            .map(|(p, e)| format!("{}: {e}", p.display()))
    }

    /// Writes what is queued, flushes, stops the writer; the writer's IO error, if any.
    pub fn close(mut self) -> Result<LogStats> {
        self.finish();
        if let Some((path, source)) = lock(&self.shared.error).take() {
            return Err(EvalError::Io { path, source });
        }
        Ok(self.stats())
    }

    fn finish(&mut self) {
        self.tx = None;
        if let Some(w) = self.worker.take() {
            if w.join().is_err() {
                let mut e = lock(&self.shared.error);
                e.get_or_insert_with(|| {
                    let msg = "the trajectory writer thread panicked";
                    (self.dir.clone(), std::io::Error::other(msg))
                });
            }
        }
    }
}

impl Drop for TrajectoryLog {
    fn drop(&mut self) {
        self.finish();
    }
}

/// The background writer.
struct Writer {
    dir: PathBuf,
    rotate_bytes: u64,
    next: u64,
    file: Option<(PathBuf, BufWriter<std::fs::File>)>,
    bytes: u64,
    shared: Arc<Shared>,
}

impl Writer {
    fn run(mut self, rx: Receiver<TrajectoryRecord>) {
        let shared = self.shared.clone();
        let mut failed = false;
        for record in rx.iter() {
            #[cfg(test)]
            let _paused = lock(&shared.pause);
            if !failed && self.write(&record).is_ok() {
                shared.written.fetch_add(1, Ordering::Relaxed);
                metrics::counter!("trajectories_written_total").increment(1);
                if rx.is_empty() {
                    failed = self.flush().is_err();
                }
            } else {
                failed = true;
                shared.dropped.fetch_add(1, Ordering::Relaxed);
                metrics::counter!("trajectories_dropped_total").increment(1);
            }
        }
        if !failed {
            let _ = self.flush();
        }
    }

    fn fail(&self, path: &Path, e: std::io::Error) {
        lock(&self.shared.error).get_or_insert((path.to_path_buf(), e));
    }

    fn write(&mut self, record: &TrajectoryRecord) -> std::result::Result<(), ()> {
        let mut line = match serde_json::to_vec(record) {
            Ok(l) => l,
            Err(e) => {
                self.fail(&self.dir, std::io::Error::other(e));
                return Err(());
            }
        };
        line.push(b'\n');
        let full = self.bytes > 0 && self.bytes + line.len() as u64 > self.rotate_bytes;
        if self.file.is_none() || full {
            self.flush()?;
            let path = self
                .dir
                .join(format!("{FILE_PREFIX}{:05}.jsonl", self.next));
            let f = std::fs::OpenOptions::new()
                .create_new(true)
                .write(true)
                .open(&path)
                .map_err(|e| self.fail(&path, e))?;
            self.next += 1;
            self.bytes = 0;
            lock(&self.shared.files).push(path.clone());
            self.file = Some((path, BufWriter::new(f)));
        }
        let Some((path, w)) = self.file.as_mut() else {
            return Err(());
        };
        if let Err(e) = w.write_all(&line) {
            let path = path.clone();
            self.fail(&path, e);
            return Err(());
        }
        self.bytes += line.len() as u64;
        Ok(())
    }

    fn flush(&mut self) -> std::result::Result<(), ()> {
        if let Some((path, w)) = self.file.as_mut() {
            if let Err(e) = w.flush() {
                let path = path.clone();
                self.fail(&path, e);
                return Err(());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
