//! [`InOrder`]: the learner's end of the rollout channel.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError};
use mtrl_env::Trajectory;

use crate::error::RolloutError;
use crate::runner::{Group, Shard};

/// Reassembles finished groups into learner batches in admission order: batch k is exactly
/// groups `k·B .. (k+1)·B`, whatever order they finished in.
pub struct InOrder {
    rx: Receiver<Group>,
    next: u64,
    buffer: BTreeMap<u64, Vec<Trajectory>>,
    shard: Shard,
}

impl InOrder {
    /// Groups received and not yet handed out.
    pub fn buffered(&self) -> usize {
        self.buffer.len()
    }

    /// `next` is the index of the first group of the next batch.
    pub fn new(rx: Receiver<Group>, next: u64) -> InOrder {
        InOrder {
            rx,
            next,
            buffer: BTreeMap::new(),
            shard: Shard::default(),
        }
    }

    /// Batches of this rank's groups only (see [`Shard`]).
    pub fn sharded(mut self, shard: Shard) -> InOrder {
        self.shard = shard;
        self
    }

    /// Waits for the next `batch` groups; `None` when `timeout` passed first (call again) —
    /// groups received meanwhile are kept. Errors when the rollout side is gone.
    pub fn next_batch(
        &mut self,
        batch: usize,
        timeout: Duration,
    ) -> std::result::Result<Option<Vec<Vec<Trajectory>>>, RolloutError> {
        let deadline = Instant::now() + timeout;
        let end = self.next + batch as u64;
        let shard = self.shard;
        let mine = move |i: &u64| shard.owns(*i, batch);
        while (self.next..end)
            .filter(mine)
            .any(|i| !self.buffer.contains_key(&i))
        {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok((i, g)) => {
                    self.buffer.insert(i, g);
                }
                Err(RecvTimeoutError::Timeout) => return Ok(None),
                Err(RecvTimeoutError::Disconnected) => return Err(RolloutError::Stopped),
            }
        }
        let out = (self.next..end)
            .filter(mine)
            .filter_map(|i| self.buffer.remove(&i))
            .collect();
        self.next = end;
        Ok(Some(out))
    }
}
