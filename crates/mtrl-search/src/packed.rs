//! Products with a weight matrix packed once, at load, into column panels: the dense layers of
//! the CPU BERT path (`embed/bert_cpu.rs`).
//!
//! Why not the `gemm` crate here: it packs the weight operand again on every call, which for the
//! few rows of a lone query (10–30 tokens) costs several times the product itself (measured on
//! this project's 2-core machine: a 15 × 384 · 384 × 1152 product with cold weights took 580–690
//! µs through `gemm`, the weights alone stream in about 185 µs). Packed once, a panel is read
//! straight from memory into a 6 × 16 register tile (BLIS's AVX2 shape: 12 accumulators, two
//! panel loads and six broadcasts per step).
//!
//! Determinism: every output element is one FMA chain over `k` in order, whatever the number of
//! rows, the row blocking or the thread count — so a text's vector is the same bits alone or in a
//! batch.

use crate::kernels::avx2;

/// Columns per panel.
const NR: usize = 16;
/// Rows per register tile.
const MR: usize = 6;
/// Depth of one pass over a panel.
const KC: usize = 256;

/// A `[k, n]` matrix stored as `⌈n/16⌉` panels of `k × 16` (row-major inside a panel), zero past
/// column `n`.
pub(crate) struct Packed {
    pub k: usize,
    pub n: usize,
    data: Vec<f32>,
}

impl Packed {
    /// Packs a row-major `[k, n]` matrix.
    pub fn new(w: &[f32], k: usize, n: usize) -> Packed {
        assert_eq!(w.len(), k * n, "packed matrix shape");
        let panels = n.div_ceil(NR);
        let mut data = vec![0f32; panels * k * NR];
        for p in 0..panels {
            for kk in 0..k {
                for c in 0..NR.min(n - p * NR) {
                    data[(p * k + kk) * NR + c] = w[kk * n + p * NR + c];
                }
            }
        }
        Packed { k, n, data }
    }

    fn panel(&self, p: usize) -> &[f32] {
        &self.data[p * self.k * NR..(p + 1) * self.k * NR]
    }
}

/// A pointer to the output that the threads of [`matmul`] write at disjoint columns.
#[derive(Clone, Copy)]
struct Out(*mut f32);
// SAFETY: only an address; each thread writes its own panels' columns (see `matmul`).
unsafe impl Send for Out {}
unsafe impl Sync for Out {}

impl Out {
    /// The address (a method, so that closures capture the whole `Send` wrapper).
    fn ptr(self) -> *mut f32 {
        self.0
    }
}

/// `dst[m, n] = x[m, k] · w` (`x` and `dst` row-major, dense), over `threads` of rayon's pool by
/// column panels.
pub(crate) fn matmul(x: &[f32], m: usize, w: &Packed, dst: &mut [f32], threads: usize) {
    let (k, n) = (w.k, w.n);
    assert!(
        x.len() >= m * k && dst.len() >= m * n,
        "packed matmul shapes"
    );
    let panels = n.div_ceil(NR);
    let out = Out(dst.as_mut_ptr());
    // Rows per group: the group's rows of `x` stay in L2 while every panel passes over them.
    let group = (((128 << 10) / (4 * k.max(1))) / MR).max(1) * MR;
    let run = move |p0: usize, p1: usize| {
        for g in (0..m).step_by(group) {
            for p in p0..p1 {
                let panel = w.panel(p);
                let cols = NR.min(n - p * NR);
                // k in blocks of KC, so that a tile's slice of the panel (KC × 16) stays in L1
                // while the group's tiles pass over it; a later block continues each element's
                // FMA chain from the value stored by the one before (an f32 store and load are
                // exact), so the result is the same as one unblocked chain.
                for k0 in (0..k).step_by(KC) {
                    let kl = KC.min(k - k0);
                    for r in (g..(g + group).min(m)).step_by(MR) {
                        let rows = MR.min(m - r);
                        // SAFETY: rows r..r+rows and columns p·16..p·16+cols lie inside `dst`
                        // (m × n, checked above); threads own disjoint panel ranges, so no
                        // element is written by two of them, and `dst` is borrowed for the call.
                        unsafe {
                            tile(
                                rows,
                                cols,
                                kl,
                                k,
                                &x[r * k + k0..(r + rows - 1) * k + k0 + kl],
                                &panel[k0 * NR..(k0 + kl) * NR],
                                out.ptr().add(r * n + p * NR),
                                n,
                                k0 > 0,
                            )
                        };
                    }
                }
            }
        }
    };
    let threads = threads.clamp(1, panels.max(1));
    if threads == 1 {
        run(0, panels);
    } else {
        let per = panels.div_ceil(threads);
        rayon::scope(|s| {
            for t in 0..threads {
                let (p0, p1) = (t * per, ((t + 1) * per).min(panels));
                if p0 < p1 {
                    s.spawn(move |_| run(p0, p1));
                }
            }
        });
    }
}

/// One `rows × cols` tile (rows ≤ 6, cols ≤ 16) of `dst` (row stride `ds`): `kl` steps over
/// `rows` rows of `x` (row stride `xs`) and a panel slice, starting from zero or (`resume`) from
/// the tile's stored values.
///
/// # Safety
/// `dst` must be valid for reads and writes at `r·ds + c` for `r < rows`, `c < cols`.
#[allow(clippy::too_many_arguments)]
unsafe fn tile(
    rows: usize,
    cols: usize,
    kl: usize,
    xs: usize,
    x: &[f32],
    panel: &[f32],
    dst: *mut f32,
    ds: usize,
    resume: bool,
) {
    let mut acc = [[0f32; NR]; MR];
    if resume {
        for (r, a) in acc.iter_mut().enumerate().take(rows) {
            std::ptr::copy_nonoverlapping(dst.add(r * ds), a.as_mut_ptr(), cols);
        }
    }
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        match rows {
            6 => tile_avx2::<6>(kl, xs, x, panel, &mut acc),
            5 => tile_avx2::<5>(kl, xs, x, panel, &mut acc),
            4 => tile_avx2::<4>(kl, xs, x, panel, &mut acc),
            3 => tile_avx2::<3>(kl, xs, x, panel, &mut acc),
            2 => tile_avx2::<2>(kl, xs, x, panel, &mut acc),
            _ => tile_avx2::<1>(kl, xs, x, panel, &mut acc),
        }
        return store(rows, cols, &acc, dst, ds);
    }
    for (r, a) in acc.iter_mut().enumerate().take(rows) {
        for kk in 0..kl {
            let xv = x[r * xs + kk];
            for (c, a) in a.iter_mut().enumerate() {
                *a = xv.mul_add(panel[kk * NR + c], *a);
            }
        }
    }
    store(rows, cols, &acc, dst, ds)
}

/// # Safety
/// As [`tile`].
unsafe fn store(rows: usize, cols: usize, acc: &[[f32; NR]; MR], dst: *mut f32, ds: usize) {
    for (r, a) in acc.iter().enumerate().take(rows) {
        std::ptr::copy_nonoverlapping(a.as_ptr(), dst.add(r * ds), cols);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_avx2<const R: usize>(
    kl: usize,
    xs: usize,
    x: &[f32],
    panel: &[f32],
    acc: &mut [[f32; NR]; MR],
) {
    use std::arch::x86_64::*;
    assert!(R >= 1 && x.len() > (R - 1) * xs + kl - 1 && panel.len() >= kl * NR);
    let mut a = [[_mm256_setzero_ps(); 2]; R];
    for (r, a) in a.iter_mut().enumerate() {
        a[0] = _mm256_loadu_ps(acc[r].as_ptr());
        a[1] = _mm256_loadu_ps(acc[r].as_ptr().add(8));
    }
    let (xp, wp) = (x.as_ptr(), panel.as_ptr());
    for kk in 0..kl {
        // SAFETY: kk < kl, so the panel row (16 floats at kk·16) and x[r·xs + kk] (r < R) are
        // inside the slices checked above.
        let w0 = _mm256_loadu_ps(wp.add(kk * NR));
        let w1 = _mm256_loadu_ps(wp.add(kk * NR + 8));
        for (r, a) in a.iter_mut().enumerate() {
            let xb = _mm256_broadcast_ss(&*xp.add(r * xs + kk));
            a[0] = _mm256_fmadd_ps(xb, w0, a[0]);
            a[1] = _mm256_fmadd_ps(xb, w1, a[1]);
        }
    }
    for (r, a) in a.iter().enumerate() {
        _mm256_storeu_ps(acc[r].as_mut_ptr(), a[0]);
        _mm256_storeu_ps(acc[r].as_mut_ptr().add(8), a[1]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_a_plain_product_for_any_rows_threads_and_ragged_columns() {
        let (k, n) = (300, 41);
        let w: Vec<f32> = (0..k * n)
            .map(|i| ((i * 31) % 17) as f32 * 0.1 - 0.8)
            .collect();
        let packed = Packed::new(&w, k, n);
        for m in [1usize, 5, 6, 7, 13, 40] {
            let x: Vec<f32> = (0..m * k)
                .map(|i| ((i * 7) % 11) as f32 * 0.2 - 1.0)
                .collect();
            let mut want = vec![0f32; m * n];
            for r in 0..m {
                for c in 0..n {
                    want[r * n + c] = (0..k).map(|kk| x[r * k + kk] * w[kk * n + c]).sum();
                }
            }
            let mut one = vec![f32::NAN; m * n];
            matmul(&x, m, &packed, &mut one, 1);
            let mut two = vec![f32::NAN; m * n];
            matmul(&x, m, &packed, &mut two, 3);
            assert_eq!(one, two, "threads change nothing");
            for (a, b) in one.iter().zip(&want) {
                assert!((a - b).abs() < 1e-4, "m {m}: {a} vs {b}");
            }
            // A row's result does not depend on the other rows.
            let mut alone = vec![0f32; n];
            matmul(&x[(m - 1) * k..], 1, &packed, &mut alone, 1);
            assert_eq!(alone, one[(m - 1) * n..]);
        }
    }
}
