//! Checkpoints written off the learner thread.
//!
//! The learner hands [`CheckpointWriter::submit`] a snapshot — the policy's and optimizer's
//! tensors copied (`Policy::snapshot`, `AdamW::snapshot`) and the trainer state — and goes on
//! training while a thread of its own writes, fsyncs, checksums and renames it
//! ([`CheckpointManager::save_snapshot`]), then runs the job's `then` (e.g. `best.json`). One save
//! is in flight at a time: submitting while one runs waits for it (so memory holds at most two
//! snapshots) and returns its error, as does [`CheckpointWriter::flush`]. A process killed
//! mid-save leaves a `.tmp-step-*` folder, never a `step-N` one, and `clean_stale` removes it.

use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

use candle_core::DType;
use mtrl_model::PolicySnapshot;
use std::sync::mpsc::{Receiver, SyncSender};

use crate::adamw::AdamW;
use crate::checkpoint::{CheckpointManager, TrainerState};
use crate::error::{LearnerError, Result};

/// Run after a checkpoint landed, with its folder.
pub type Then = Box<dyn FnOnce(&Path) -> Result<()> + Send>;

/// One checkpoint to write.
pub struct CheckpointJob {
    pub policy: PolicySnapshot,
    pub dtype: DType,
    pub opt: AdamW,
    pub state: TrainerState,
    pub then: Option<Then>,
}

/// The writer thread and its queue.
pub struct CheckpointWriter {
    tx: Option<SyncSender<CheckpointJob>>,
    done: Receiver<Result<PathBuf>>,
    in_flight: usize,
    handle: Option<JoinHandle<()>>,
    last: Option<PathBuf>,
}

impl CheckpointWriter {
    pub fn spawn(mgr: CheckpointManager) -> Result<CheckpointWriter> {
        let (tx, rx) = std::sync::mpsc::sync_channel::<CheckpointJob>(1);
        let (done_tx, done) = std::sync::mpsc::channel();
        let handle = std::thread::Builder::new()
            .name("mtrl-checkpoint".into())
            .spawn(move || {
                for job in rx {
                    let r = mgr
                        .save_snapshot(&job.policy, job.dtype, &job.opt, &job.state)
                        .and_then(|p| match job.then {
                            Some(f) => f(&p).map(|()| p),
                            None => Ok(p),
                        });
                    if done_tx.send(r).is_err() {
                        return;
                    }
                }
            })
            .map_err(|e| {
                LearnerError::Invalid(format!("cannot start the checkpoint writer: {e}"))
            })?;
        Ok(CheckpointWriter {
            tx: Some(tx),
            done,
            in_flight: 0,
            handle: Some(handle),
            last: None,
        })
    }

    fn wait_one(&mut self) -> Result<()> {
        let r = self
            .done
            .recv()
            .map_err(|_| LearnerError::Invalid("the checkpoint writer stopped".into()))?;
        self.in_flight -= 1;
        self.last = Some(r?);
        Ok(())
    }

    /// Queues `job` once the previous save has finished; returns that save's error.
    pub fn submit(&mut self, job: CheckpointJob) -> Result<()> {
        while self.in_flight > 0 {
            self.wait_one()?;
        }
        let tx = self
            .tx
            .as_ref()
            .ok_or_else(|| LearnerError::Invalid("the checkpoint writer is closed".into()))?;
        tx.send(job)
            .map_err(|_| LearnerError::Invalid("the checkpoint writer stopped".into()))?;
        self.in_flight += 1;
        Ok(())
    }

    /// Waits for every queued save; returns the newest checkpoint written, or the first error.
    pub fn flush(&mut self) -> Result<Option<PathBuf>> {
        while self.in_flight > 0 {
            self.wait_one()?;
        }
        Ok(self.last.clone())
    }
}

impl Drop for CheckpointWriter {
    fn drop(&mut self) {
        // Finish what was queued (a save already started is completed, never cut short).
        self.tx.take();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}
