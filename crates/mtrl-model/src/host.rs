//! The boundary between the device and the host, accounted.
//!
//! - **Reads.** Every read of device data to the host on the engine's and the learner's step
//!   paths goes through [`vec1`], [`vec2`] or [`scalar`]. On a GPU each one blocks the calling
//!   thread until its stream has caught up, so their number per micro-batch (or per engine step)
//!   is a budget that tests hold ([`reads`] counts them per thread; the learner's budget — one
//!   read per micro-batch and one per update — is held in `mtrl-learner/tests/step.rs`). On the
//!   CPU a read is a copy, but the count is the same: the code path is the one CUDA runs when
//!   the backend is candle's.
//! - **Empty launches.** CUDA cannot launch a kernel over zero elements (an empty grid is an
//!   invalid launch configuration). [`nonempty`] guards the candle ops of the decoder's forward:
//!   an op asked to run on nothing is counted ([`empty_launches`]) and is a debug assertion, so
//!   the CPU tests of the candle backend catch a path that would fail on a GPU.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

use candle_core::{Result, Tensor, WithDType};

thread_local! {
    static READS: Cell<u64> = const { Cell::new(0) };
}

static EMPTY: AtomicU64 = AtomicU64::new(0);

/// Device→host reads made by this thread so far through this module.
pub fn reads() -> u64 {
    READS.with(Cell::get)
}

/// Ops the decoder was asked to run on zero elements since the process started (0 in a correct
/// build; see the module header).
pub fn empty_launches() -> u64 {
    EMPTY.load(Ordering::Relaxed)
}

fn count() {
    READS.with(|r| r.set(r.get() + 1));
}

/// All elements of `t`, flattened, on the host (one read).
pub fn vec1<T: WithDType>(t: &Tensor) -> Result<Vec<T>> {
    count();
    t.flatten_all()?.to_vec1()
}

/// A `[rows, cols]` tensor on the host (one read).
pub fn vec2<T: WithDType>(t: &Tensor) -> Result<Vec<Vec<T>>> {
    count();
    t.to_vec2()
}

/// A one-element tensor on the host (one read).
pub fn scalar<T: WithDType>(t: &Tensor) -> Result<T> {
    count();
    t.flatten_all()?.squeeze(0)?.to_scalar()
}

/// Counts (and, in debug builds, asserts against) an op about to run on the zero elements of
/// `t`; `op` names it in the assertion.
pub(crate) fn nonempty(t: &Tensor, op: &str) {
    if t.elem_count() == 0 {
        EMPTY.fetch_add(1, Ordering::Relaxed);
        debug_assert!(
            false,
            "{op} launched on zero elements (shape {:?})",
            t.dims()
        );
    }
}
