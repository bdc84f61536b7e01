//! `y = x · wᵀ` for few rows of `x` (CPU, f32, no gradient): the decode-step projections.
//!
//! Why not candle's matmul: for a handful of rows the `gemm` crate spends most of its time packing
//! the weight and dispatching rayon tasks (a `[8, 256] · [256, 768]` product runs at ~20 GFLOP/s,
//! ~100 µs), and candle asks for the thread count on every call, which on Linux re-reads
//! `/proc/cpuinfo`. A decode step is ~30 such products, so the weight-streaming kernel below (each
//! `w` row read once per 4 rows of `x`, 4 × 3 register tiles, AVX2 + FMA when present) makes a
//! step ~2× cheaper.
//!
//! Invariant: every output element is the same sequence of f32 operations whatever `m` and however
//! the work is split between threads (per-lane FMA over `k`, then a fixed horizontal sum, then the
//! scalar tail), so a sequence's logits do not depend on which other sequences share its batch.

use super::pool::{for_ranges, SharedPtr};

/// Most rows of `x` for which [`matmul_t`] beats candle's `gemm` path (measured on 2 cores).
pub(crate) const MAX_ROWS: usize = 64;

const MR: usize = 4;
const NR: usize = 3;
/// Output columns per work unit handed to a thread.
const COLS_PER_UNIT: usize = NR * 16;

/// `out[m, n] = x[m, k] · w[n, k]ᵀ`.
pub(crate) fn matmul_t(x: &[f32], w: &[f32], m: usize, n: usize, k: usize, out: &mut [f32]) {
    assert!(x.len() >= m * k && w.len() >= n * k && out.len() >= m * n);
    let units = n.div_ceil(COLS_PER_UNIT);
    let o = SharedPtr::of(out);
    let parallel = m * n * k >= (1 << 18);
    for_ranges(units, parallel, |range| {
        let j0 = range.start * COLS_PER_UNIT;
        let j1 = (range.end * COLS_PER_UNIT).min(n);
        // SAFETY: units own disjoint column ranges `j0..j1` of `out`, which outlives the call;
        // `x`, `w` bounds were checked above.
        unsafe { cols(x.as_ptr(), w.as_ptr(), m, n, k, j0, j1, o.get()) };
    });
}

/// Columns `j0..j1` of the product.
///
/// # Safety
/// `x`: `m·k`, `w`: `n·k`, `out`: `m·n` valid elements; `j1 <= n`.
#[allow(clippy::too_many_arguments)]
unsafe fn cols(
    x: *const f32,
    w: *const f32,
    m: usize,
    n: usize,
    k: usize,
    j0: usize,
    j1: usize,
    out: *mut f32,
) {
    #[cfg(target_arch = "x86_64")]
    {
        if super::avx2() {
            return cols_avx2(x, w, m, n, k, j0, j1, out);
        }
    }
    cols_generic(x, w, m, n, k, j0, j1, out)
}

/// Portable fallback: one dot product per output, the same order on every row.
#[allow(clippy::too_many_arguments)]
unsafe fn cols_generic(
    x: *const f32,
    w: *const f32,
    m: usize,
    n: usize,
    k: usize,
    j0: usize,
    j1: usize,
    out: *mut f32,
) {
    for j in j0..j1 {
        let wj = std::slice::from_raw_parts(w.add(j * k), k);
        for r in 0..m {
            let xr = std::slice::from_raw_parts(x.add(r * k), k);
            *out.add(r * n + j) = xr.iter().zip(wj).map(|(a, b)| a * b).sum();
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn cols_avx2(
    x: *const f32,
    w: *const f32,
    m: usize,
    n: usize,
    k: usize,
    j0: usize,
    j1: usize,
    out: *mut f32,
) {
    let mut j = j0;
    while j < j1 {
        let nr = NR.min(j1 - j);
        let mut r = 0;
        while r < m {
            let mr = MR.min(m - r);
            let (xp, wp, op) = (x.add(r * k), w.add(j * k), out.add(r * n + j));
            match (mr, nr) {
                (4, 3) => tile::<4, 3>(xp, wp, k, op, n),
                (4, 2) => tile::<4, 2>(xp, wp, k, op, n),
                (4, _) => tile::<4, 1>(xp, wp, k, op, n),
                (3, 3) => tile::<3, 3>(xp, wp, k, op, n),
                (3, 2) => tile::<3, 2>(xp, wp, k, op, n),
                (3, _) => tile::<3, 1>(xp, wp, k, op, n),
                (2, 3) => tile::<2, 3>(xp, wp, k, op, n),
                (2, 2) => tile::<2, 2>(xp, wp, k, op, n),
                (2, _) => tile::<2, 1>(xp, wp, k, op, n),
                (_, 3) => tile::<1, 3>(xp, wp, k, op, n),
                (_, 2) => tile::<1, 2>(xp, wp, k, op, n),
                _ => tile::<1, 1>(xp, wp, k, op, n),
            }
            r += mr;
        }
        j += nr;
    }
}

/// An `R × C` block of outputs: rows `x[0..R]`, weight rows `w[0..C]` (both `k` wide).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn tile<const R: usize, const C: usize>(
    x: *const f32,
    w: *const f32,
    k: usize,
    out: *mut f32,
    ldo: usize,
) {
    use std::arch::x86_64::*;
    let mut acc = [[_mm256_setzero_ps(); C]; R];
    let k8 = k / 8 * 8;
    let mut p = 0;
    while p < k8 {
        let mut wv = [_mm256_setzero_ps(); C];
        for (c, v) in wv.iter_mut().enumerate() {
            *v = _mm256_loadu_ps(w.add(c * k + p));
        }
        for (r, a) in acc.iter_mut().enumerate() {
            let xv = _mm256_loadu_ps(x.add(r * k + p));
            for (c, v) in a.iter_mut().enumerate() {
                *v = _mm256_fmadd_ps(xv, wv[c], *v);
            }
        }
        p += 8;
    }
    for (r, a) in acc.iter().enumerate() {
        for (c, v) in a.iter().enumerate() {
            // Fixed reduction tree: (lo + hi) over 4 lanes, then pairs.
            let s4 = _mm_add_ps(_mm256_castps256_ps128(*v), _mm256_extractf128_ps(*v, 1));
            let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
            let s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
            let mut s = _mm_cvtss_f32(s1);
            for q in k8..k {
                s += *x.add(r * k + q) * *w.add(c * k + q);
            }
            *out.add(r * ldo + c) = s;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(x: &[f32], w: &[f32], m: usize, n: usize, k: usize) -> Vec<f32> {
        let mut y = vec![0f32; m * n];
        for r in 0..m {
            for j in 0..n {
                y[r * n + j] = (0..k)
                    .map(|q| x[r * k + q] as f64 * w[j * k + q] as f64)
                    .sum::<f64>() as f32;
            }
        }
        y
    }

    #[test]
    fn matches_reference_and_is_row_independent() {
        for &(m, n, k) in &[
            (1, 1, 1),
            (1, 7, 13),
            (5, 10, 24),
            (8, 200, 64),
            (16, 515, 257),
        ] {
            let x: Vec<f32> = (0..m * k)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
                .collect();
            let w: Vec<f32> = (0..n * k)
                .map(|i| ((i * 53 % 97) as f32 - 48.0) / 48.0)
                .collect();
            let mut y = vec![0f32; m * n];
            matmul_t(&x, &w, m, n, k, &mut y);
            let want = reference(&x, &w, m, n, k);
            for (a, b) in y.iter().zip(&want) {
                assert!(
                    (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
                    "{m}x{n}x{k}: {a} vs {b}"
                );
            }
            // Row r alone gives bit-identical results (no dependence on the batch).
            for r in 0..m {
                let mut one = vec![0f32; n];
                matmul_t(&x[r * k..(r + 1) * k], &w, 1, n, k, &mut one);
                assert_eq!(&one[..], &y[r * n..(r + 1) * n], "{m}x{n}x{k} row {r}");
            }
        }
    }
}
