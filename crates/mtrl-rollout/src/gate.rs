//! The admission rule of bounded staleness (AReaL): with bound η, global batch B (in groups) and
//! learner version v, a new group is admitted only while `admitted < (η + v + 1) · B`, where
//! `admitted` counts every group admitted so far (finished, consumed or running).
//!
//! Together with in-order consumption (batch k is exactly groups `k·B .. (k+1)·B`, see
//! [`crate::InOrder`]) this bounds staleness without throwing samples away: group i is admitted at
//! a version ≥ ⌊i/B⌋ − η and trained at version ⌊i/B⌋, and every token it holds was sampled at
//! its admission version or later. η = 0 is synchronous on-policy RL.

/// The admission rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gate {
    /// Groups per learner step (B).
    pub batch: u64,
    /// η.
    pub max_staleness: u64,
}

impl Gate {
    /// How many groups may have been admitted in total while the learner is at `version`.
    pub fn capacity(&self, version: u64) -> u64 {
        (self.max_staleness + version + 1).saturating_mul(self.batch)
    }

    /// Whether group number `admitted` (0-based, counted since the start of training) may start.
    pub fn may_admit(&self, admitted: u64, version: u64) -> bool {
        admitted < self.capacity(version)
    }

    /// The learner version at which group `index` is trained under in-order consumption.
    pub fn trained_at(&self, index: u64) -> u64 {
        index / self.batch.max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synchronous_and_bounded() {
        let g = Gate {
            batch: 4,
            max_staleness: 0,
        };
        assert!((0..4).all(|i| g.may_admit(i, 0)));
        assert!(!g.may_admit(4, 0));
        assert!(g.may_admit(4, 1) && !g.may_admit(8, 1));
        let g2 = Gate {
            batch: 4,
            max_staleness: 2,
        };
        assert!(g2.may_admit(11, 0) && !g2.may_admit(12, 0));
        // Every admissible group is trained at most η versions after it was admitted.
        for v in 0..10 {
            for i in 0..g2.capacity(v) {
                assert!(g2.may_admit(i, v) && g2.trained_at(i) <= v + 2);
            }
        }
        assert_eq!(g2.trained_at(7), 1);
    }
}
