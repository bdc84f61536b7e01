//! Learning-rate schedules: linear warm-up, then constant or cosine decay to `min_lr`.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Decay {
    Constant,
    Cosine { total_steps: u64, min_lr: f64 },
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LrSchedule {
    pub lr: f64,
    pub warmup_steps: u64,
    pub decay: Decay,
}

impl LrSchedule {
    pub fn constant(lr: f64) -> LrSchedule {
        LrSchedule {
            lr,
            warmup_steps: 0,
            decay: Decay::Constant,
        }
    }

    /// The learning rate of optimizer step `step` (1-based: the first update is step 1).
    pub fn lr_at(&self, step: u64) -> f64 {
        if self.warmup_steps > 0 && step <= self.warmup_steps {
            return self.lr * step as f64 / self.warmup_steps as f64;
        }
        match self.decay {
            Decay::Constant => self.lr,
            Decay::Cosine {
                total_steps,
                min_lr,
            } => {
                let span = total_steps.saturating_sub(self.warmup_steps).max(1) as f64;
                let t = (step.saturating_sub(self.warmup_steps) as f64 / span).min(1.0);
                min_lr + 0.5 * (self.lr - min_lr) * (1.0 + (std::f64::consts::PI * t).cos())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warmup_then_cosine() {
        let s = LrSchedule {
            lr: 1.0,
            warmup_steps: 4,
            decay: Decay::Cosine {
                total_steps: 14,
                min_lr: 0.0,
            },
        };
        assert_eq!(s.lr_at(1), 0.25);
        assert_eq!(s.lr_at(4), 1.0);
        assert!((s.lr_at(9) - 0.5).abs() < 1e-12); // halfway through the cosine
        assert!(s.lr_at(14).abs() < 1e-12);
        assert!(s.lr_at(100).abs() < 1e-12);
        assert_eq!(LrSchedule::constant(0.1).lr_at(7), 0.1);
    }
}
