//! Version pinning (`rollout.weight_sync = "pinned"`): every episode of group `i` is generated,
//! first token to last, by policy version
//!
//! ```text
//! pin(i) = max(v₀, ⌊i/B⌋ − η)        v₀: the learner's version when rollouts started
//! ```
//!
//! — the oldest version the staleness gate allows for it. Two rules make it so, with one set of
//! weights in the engine:
//! - the engine applies the update to version `u` only once every group pinned below `u` has been
//!   admitted and has finished ([`Pins::may_apply`]): those are the groups `i < (u + η)·B`;
//! - the scheduler starts group `i` only once the engine serves `pin(i)`.
//!
//! So the tokens of a run no longer depend on when the learner publishes: together with
//! per-(group, sample, turn) sampling seeds and kernels whose rows do not depend on the rest of the
//! batch (`mtrl-model`'s CPU wing), a run is a function of its seeds. The price is staleness of
//! exactly η (after the first η batches) instead of at most η, and a group of batch k + η + 1 waits
//! for the last group of batch k + η to finish. With `"latest"` an episode takes up new weights
//! between decode steps as soon as they are published (fresher tokens, timing-dependent).
//!
//! Resume: a run resumed at step s pins its first η batches to version s (the weights of
//! s − η … s − 1 are not in the checkpoint), so it matches the uninterrupted run exactly only
//! with η = 0.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

pub use mtrl_core::config::WeightSync;

/// The groups a pinned engine waits for, shared by the scheduler and the engine thread.
#[derive(Debug)]
pub struct Pins {
    batch: u64,
    eta: u64,
    start_version: u64,
    end_group: Option<u64>,
    /// Groups admitted so far (the next index to admit), the scheduler's counter.
    admitted: Arc<AtomicU64>,
    /// This rank's admitted groups that have not finished.
    running: Mutex<BTreeSet<u64>>,
}

impl Pins {
    pub(crate) fn new(
        batch: u64,
        eta: u64,
        start_version: u64,
        end_group: Option<u64>,
        admitted: Arc<AtomicU64>,
    ) -> Pins {
        Pins {
            batch: batch.max(1),
            eta,
            start_version,
            end_group,
            admitted,
            running: Mutex::new(BTreeSet::new()),
        }
    }

    /// The version group `index` is generated with.
    pub fn pin(&self, index: u64) -> u64 {
        (index / self.batch)
            .saturating_sub(self.eta)
            .max(self.start_version)
    }

    /// Whether the engine may move to `version`: every group pinned below it was admitted and
    /// has finished.
    pub fn may_apply(&self, version: u64) -> bool {
        if version <= self.start_version {
            return true;
        }
        let mut below = (version + self.eta).saturating_mul(self.batch);
        if let Some(end) = self.end_group {
            below = below.min(end);
        }
        if self.admitted.load(Ordering::SeqCst) < below {
            return false;
        }
        match self.running.lock() {
            Ok(r) => r.first().is_none_or(|&i| i >= below),
            Err(_) => false,
        }
    }

    /// Group `index` starts (called before the admitted counter moves past it); it counts as
    /// running until the returned guard is dropped, so a group that returns, fails, is
    /// cancelled or panics never holds an update back for good.
    pub(crate) fn start(self: &Arc<Self>, index: u64) -> Running {
        if let Ok(mut r) = self.running.lock() {
            r.insert(index);
        }
        Running {
            pins: self.clone(),
            index,
        }
    }
}

/// A running group of a pinned rollout ([`Pins::start`]); dropping it marks the group finished.
#[derive(Debug)]
pub(crate) struct Running {
    pins: Arc<Pins>,
    index: u64,
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(mut r) = self.pins.running.lock() {
            r.remove(&self.index);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_update_waits_for_every_group_pinned_below_it() {
        let admitted = Arc::new(AtomicU64::new(0));
        let p = Arc::new(Pins::new(2, 1, 0, None, admitted.clone()));
        // B = 2, η = 1: batches 0 and 1 run on version 0, batch 2 on 1, batch 3 on 2.
        assert_eq!(
            (0..8).map(|i| p.pin(i)).collect::<Vec<_>>(),
            [0, 0, 0, 0, 1, 1, 2, 2]
        );
        assert!(p.may_apply(0));
        // Version 1 needs groups 0..4 admitted and finished.
        let mut running: Vec<_> = (0..4)
            .map(|i| {
                let g = p.start(i);
                admitted.store(i + 1, Ordering::SeqCst);
                Some(g)
            })
            .collect();
        assert!(!p.may_apply(1));
        for i in [0, 2, 3] {
            running[i] = None;
        }
        assert!(!p.may_apply(1), "group 1 still runs on version 0");
        let _g4 = p.start(4);
        admitted.store(5, Ordering::SeqCst);
        running[1] = None;
        assert!(p.may_apply(1), "group 4 is pinned to 1 itself");
        assert!(!p.may_apply(2));
        // The last step's groups: nothing past end_group is waited for.
        let q = Pins::new(2, 1, 3, Some(8), Arc::new(AtomicU64::new(8)));
        assert_eq!(q.pin(6), 3);
        assert!(q.may_apply(5) && q.may_apply(9));
    }
}
