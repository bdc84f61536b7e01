//! A thin, strided f32 matrix product over the `gemm` crate (the kernels under candle's CPU
//! matmul), for hand-written kernels that multiply sub-blocks of larger buffers without copying
//! them into tensors first.

/// A read-only matrix view: element `(r, c)` is at `ptr + r·rs + c·cs`.
#[derive(Clone, Copy)]
pub(crate) struct View {
    pub ptr: *const f32,
    pub rs: isize,
    pub cs: isize,
}

impl View {
    /// A row-major view with row stride `rs`.
    pub fn rows(ptr: *const f32, rs: usize) -> Self {
        Self {
            ptr,
            rs: rs as isize,
            cs: 1,
        }
    }

    /// The transpose of a row-major matrix with row stride `rs`.
    pub fn rows_t(ptr: *const f32, rs: usize) -> Self {
        Self {
            ptr,
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
        a.ptr,
        a.cs,
        a.rs,
        b.ptr,
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

/// [`gemm`] on candle's thread count (rayon) when the product is large enough to split.
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
    let threads = crate::skinny::num_threads();
    if threads < 2 || m * n * k < (1 << 18) || k == 0 || m == 0 || n == 0 {
        return gemm(m, n, k, dst, dst_rs, acc, a, b);
    }
    gemm::gemm(
        m,
        n,
        k,
        dst,
        1,
        dst_rs as isize,
        acc,
        a.ptr,
        a.cs,
        a.rs,
        b.ptr,
        b.cs,
        b.rs,
        1.0,
        1.0,
        false,
        false,
        false,
        gemm::Parallelism::Rayon(threads),
    )
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
