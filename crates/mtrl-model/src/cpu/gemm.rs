//! A thin, strided f32 matrix product over the `gemm` crate (the kernels under candle's CPU
//! matmul), for hand-written kernels that multiply sub-blocks of larger buffers without copying
//! them into tensors first, and the uninitialised output buffer they write into.

use super::pool::{for_ranges, num_threads, SharedPtr};

/// A read-only matrix view: element `(r, c)` is at `ptr + r·rs + c·cs`. It crosses into the pool's
/// threads as a [`SharedPtr`] that is only ever read through.
#[derive(Clone, Copy)]
pub(crate) struct View {
    ptr: SharedPtr,
    rs: isize,
    cs: isize,
}

impl View {
    /// A row-major view with row stride `rs`.
    pub fn rows(ptr: *const f32, rs: usize) -> Self {
        Self {
            ptr: SharedPtr::read_only(ptr),
            rs: rs as isize,
            cs: 1,
        }
    }

    fn ptr(self) -> *const f32 {
        self.ptr.get()
    }

    /// The view from row `r` on.
    ///
    /// # Safety
    /// Row `r` must lie inside the viewed buffer.
    unsafe fn down(self, r: usize) -> Self {
        Self {
            ptr: SharedPtr::read_only(self.ptr().offset(r as isize * self.rs)),
            ..self
        }
    }

    /// The view from column `c` on.
    ///
    /// # Safety
    /// Column `c` must lie inside the viewed buffer.
    unsafe fn right(self, c: usize) -> Self {
        Self {
            ptr: SharedPtr::read_only(self.ptr().offset(c as isize * self.cs)),
            ..self
        }
    }

    /// The transpose of a row-major matrix with row stride `rs`.
    pub fn rows_t(ptr: *const f32, rs: usize) -> Self {
        Self {
            ptr: SharedPtr::read_only(ptr),
            rs: 1,
            cs: rs as isize,
        }
    }
}

/// `dst[m, n] (+)= a[m, k] · b[k, n]`, row-major `dst` with row stride `dst_rs`; accumulates into
/// `dst` when `acc`, else overwrites it (its old contents are never read). Runs on the calling
/// thread (callers parallelise over independent products).
///
/// # Safety
/// Every element the views and `dst` address must be valid (and `dst` writable and not aliased
/// by `a` or `b`) for the given sizes.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm(
    m: usize,
    n: usize,
    k: usize,
    dst: *mut f32,
    dst_rs: usize,
    acc: bool,
    a: View,
    b: View,
) {
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !acc {
            for r in 0..m {
                std::ptr::write_bytes(dst.add(r * dst_rs), 0, n);
            }
        }
        return;
    }
    gemm::gemm(
        m,
        n,
        k,
        dst,
        1,
        dst_rs as isize,
        acc,
        a.ptr(),
        a.cs,
        a.rs,
        b.ptr(),
        b.cs,
        b.rs,
        1.0,
        1.0,
        false,
        false,
        false,
        gemm::Parallelism::None,
    )
}

/// [`gemm`] split by output rows over candle's worker pool (the pool the other CPU kernels use,
/// so no second pool's threads compete with it for the cores) when the product is large enough.
/// Each row block is a fixed range, so the result does not depend on which thread computes it.
///
/// # Safety
/// As [`gemm`].
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm_par(
    m: usize,
    n: usize,
    k: usize,
    dst: *mut f32,
    dst_rs: usize,
    acc: bool,
    a: View,
    b: View,
) {
    let threads = num_threads();
    if threads < 2 || m * n * k < (1 << 18) || m.max(n) < 32 {
        return gemm(m, n, k, dst, dst_rs, acc, a, b);
    }
    // Blocks of rows (or of columns, when the product is wider than tall: each block packs the
    // operand it shares again, so the smaller one is shared), a few per thread so that uneven
    // progress evens out, multiples of 16.
    let by_cols = n > m;
    let len = if by_cols { n } else { m };
    let parts = (threads * 4).min(len / 16).max(1);
    let step = len.div_ceil(parts).next_multiple_of(16);
    let units = len.div_ceil(step);
    let d = SharedPtr::new(dst);
    for_ranges(units, true, |range| {
        for u in range {
            let (i0, i1) = (u * step, (u * step + step).min(len));
            let d = d.get();
            // SAFETY: the blocks are disjoint; the caller vouches for the whole product.
            unsafe {
                if by_cols {
                    gemm(m, i1 - i0, k, d.add(i0), dst_rs, acc, a, b.right(i0));
                } else {
                    gemm(
                        i1 - i0,
                        n,
                        k,
                        d.add(i0 * dst_rs),
                        dst_rs,
                        acc,
                        a.down(i0),
                        b,
                    );
                }
            }
        }
    });
}

/// A buffer of `n` f32 whose contents are unspecified until written (no zero fill; the caller
/// overwrites every element before reading it).
#[allow(clippy::uninit_vec)]
pub(crate) fn uninit(n: usize) -> Vec<f32> {
    let mut v = Vec::with_capacity(n);
    // SAFETY: f32 has no invalid bit patterns, and callers write every element before reading.
    unsafe { v.set_len(n) };
    v
}
