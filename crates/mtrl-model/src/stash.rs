//! A tensor a custom op's forward keeps for its backward (FlashAttention-2's log-sum-exp,
//! RMSNorm's `1/rms`). candle hands `CustomOp::bwd` the op by `&self`, so the slot is
//! interior-mutable; the backward takes it, so a second backward of one forward is an error.

use std::sync::Mutex;

use candle_core::{Result, Tensor};

pub(crate) struct Stash {
    /// The op and the kept tensor's name, for errors.
    op: &'static str,
    name: &'static str,
    slot: Mutex<Option<Tensor>>,
}

impl Stash {
    pub(crate) fn new(op: &'static str, name: &'static str) -> Self {
        Stash {
            op,
            name,
            slot: Mutex::new(None),
        }
    }

    /// Keeps `t` (the forward).
    pub(crate) fn keep(&self, t: Tensor) -> Result<()> {
        match self.slot.lock() {
            Ok(mut g) => {
                *g = Some(t);
                Ok(())
            }
            Err(_) => candle_core::bail!("{}: {} lock poisoned", self.op, self.name),
        }
    }

    /// Takes what the forward kept (the backward).
    pub(crate) fn take(&self) -> Result<Tensor> {
        let kept = match self.slot.lock() {
            Ok(mut g) => g.take(),
            Err(_) => candle_core::bail!("{}: {} lock poisoned", self.op, self.name),
        };
        match kept {
            Some(t) => Ok(t),
            None => candle_core::bail!("{}: backward without a forward (or twice)", self.op),
        }
    }
}
