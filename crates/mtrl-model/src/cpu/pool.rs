//! The one way the CPU kernels run in parallel: candle's worker pool (`barrier_pool`), and the one
//! raw pointer type that crosses into its threads.
//!
//! Why candle's pool and no other: candle's own CPU ops (matmul, the softmax and norm kernels) run
//! on it, and the kernels here alternate with those ops op by op. A second pool (rayon's global
//! one, say) would keep its own spinning threads on the same two-to-sixteen cores and each pool's
//! barrier would wait for threads the other has descheduled.
//!
//! Determinism: every loop here hands out fixed units (rows, column blocks, attention groups); a
//! unit's arithmetic does not depend on which thread runs it or on how the units are chunked, so
//! results are the same bits for any thread count.

use std::ops::Range;
use std::sync::OnceLock;

/// candle's thread count, read once (candle re-derives it on every call, which on Linux re-reads
/// `/proc/cpuinfo`).
pub(crate) fn num_threads() -> usize {
    static N: OnceLock<usize> = OnceLock::new();
    *N.get_or_init(candle_core::utils::get_num_threads)
}

/// Runs `f` over the units `0..n`: on the calling thread as one range when `parallel` is false
/// (the caller's work estimate is too small to pay for a wake-up) or there is one thread, else in
/// ranges handed out by candle's worker pool.
pub(crate) fn for_ranges(n: usize, parallel: bool, f: impl Fn(Range<usize>) + Sync) {
    if !parallel || num_threads() < 2 {
        f(0..n);
    } else {
        candle_core::utils::barrier_pool().execute_chunked(n, f);
    }
}

/// Runs `f(unit)` for every unit of `0..n`, in parallel when there are threads.
pub(crate) fn for_units(n: usize, f: impl Fn(usize) + Sync) {
    for_ranges(n, true, |r| r.for_each(&f))
}

/// Runs `f(row_index, out_row)` over the rows of `out` (`row_len` wide), in parallel from
/// `min_len` output elements on. Each row is computed the same way whichever thread takes it.
pub(crate) fn for_rows(
    out: &mut [f32],
    row_len: usize,
    min_len: usize,
    f: impl Fn(usize, &mut [f32]) + Sync,
) {
    let rows = out.len() / row_len.max(1);
    let parallel = out.len() >= min_len;
    let o = SharedPtr::of(out);
    for_ranges(rows, parallel, |range| {
        for r in range {
            // SAFETY: rows are disjoint, inside `out`, and `out` outlives the call.
            f(r, unsafe { o.slice_mut(r * row_len, row_len) });
        }
    });
}

/// [`for_rows`] with the default threshold (32 Ki output elements).
pub(crate) fn par_rows(out: &mut [f32], row_len: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    for_rows(out, row_len, 1 << 15, f)
}

/// A raw f32 pointer that the pool's threads share: into an output that units write at disjoint
/// elements, or into an input they only read (the matrix views of [`super::gemm::View`]).
///
/// The pointer itself promises nothing; each dereference is an `unsafe` block whose comment names
/// the disjointness (or read-only use) that makes it sound, and the buffer it points into is
/// borrowed by the caller for the whole pool call.
#[derive(Clone, Copy)]
pub(crate) struct SharedPtr(*mut f32);

// SAFETY: a `SharedPtr` is only an address; sending or sharing it is harmless. What the threads do
// through it is covered at each `unsafe` use (disjoint writes, shared reads).
unsafe impl Send for SharedPtr {}
unsafe impl Sync for SharedPtr {}

impl SharedPtr {
    /// Wraps `p`.
    pub(crate) fn new(p: *mut f32) -> Self {
        Self(p)
    }

    /// The start of `out`.
    pub(crate) fn of(out: &mut [f32]) -> Self {
        Self(out.as_mut_ptr())
    }

    /// A pointer the holder will only read through.
    pub(crate) fn read_only(p: *const f32) -> Self {
        Self(p.cast_mut())
    }

    /// The pointer (a method, so that closures capture the whole `Sync` wrapper).
    pub(crate) fn get(self) -> *mut f32 {
        self.0
    }

    /// The pointer `n` elements on.
    ///
    /// # Safety
    /// The result must stay inside (or one past) the buffer pointed into.
    pub(crate) unsafe fn add(self, n: usize) -> Self {
        Self(self.0.add(n))
    }

    /// `len` elements from `off` on, as a mutable slice.
    ///
    /// # Safety
    /// The elements must lie inside the buffer, be written by no one else while the slice lives,
    /// and the buffer must outlive it.
    pub(crate) unsafe fn slice_mut<'a>(self, off: usize, len: usize) -> &'a mut [f32] {
        std::slice::from_raw_parts_mut(self.0.add(off), len)
    }
}
