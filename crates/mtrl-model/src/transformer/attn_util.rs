//! Shared pieces of the attention kernels: shapes, key spans and row blocks, the raw output
//! pointer, the worker-pool loop and two small vector helpers.

use super::attn::MASKED;

/// Key span `lo..hi` admitted by each mask row (`[b, 1, t, s]`); all keys when none is.
pub(super) fn spans(m: &[f32], rows: usize, s: usize) -> Vec<(usize, usize)> {
    (0..rows)
        .map(|r| {
            let row = &m[r * s..][..s];
            match row.iter().position(|&x| x > MASKED) {
                Some(lo) => (
                    lo,
                    s - row.iter().rev().position(|&x| x > MASKED).unwrap_or(0),
                ),
                None => (0, s),
            }
        })
        .collect()
}

/// Largest element (8 lanes, so that it vectorises; no NaN handling needed here).
#[inline(always)]
pub(super) fn max(x: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; 8];
    let chunks = x.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for l in 0..8 {
            acc[l] = if c[l] > acc[l] { c[l] } else { acc[l] };
        }
    }
    let mut m = f32::NEG_INFINITY;
    for &v in acc.iter().chain(rest) {
        m = if v > m { v } else { m };
    }
    m
}

#[inline(always)]
pub(super) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let mut acc = [0f32; 16];
    let (ac, bc) = (a[..n].chunks_exact(16), b[..n].chunks_exact(16));
    let (ar, br) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for l in 0..16 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut h = [0f32; 8];
    for l in 0..8 {
        h[l] = acc[l] + acc[l + 8];
    }
    let mut s = ((h[0] + h[4]) + (h[1] + h[5])) + ((h[2] + h[6]) + (h[3] + h[7]));
    for (x, y) in ar.iter().zip(br) {
        s += x * y;
    }
    s
}

/// Shapes of one call.
#[derive(Clone, Copy)]
pub(super) struct Dims {
    /// Batch strides (elements) of `q` and of `k`/`v`: `q[bi, h, i]` is at `bi·qbs + (h·t + i)·d`.
    pub qbs: usize,
    pub kbs: usize,
    pub b: usize,
    pub heads: usize,
    pub kv: usize,
    pub t: usize,
    pub s: usize,
    pub d: usize,
}

/// Raw output pointer shared by work units that write disjoint elements.
#[derive(Clone, Copy)]
pub(super) struct Out(pub *mut f32);
// SAFETY: units write disjoint elements (see each use).
unsafe impl Send for Out {}
unsafe impl Sync for Out {}

impl Out {
    /// The pointer (a method, so that closures capture the whole `Sync` wrapper).
    pub(super) fn get(self) -> *mut f32 {
        self.0
    }
}

/// Runs `f(unit)` for units `0..n` on candle's worker pool.
pub(super) fn par_units(n: usize, f: impl Fn(usize) + Sync) {
    if crate::skinny::num_threads() < 2 {
        (0..n).for_each(f);
    } else {
        candle_core::utils::barrier_pool().execute_chunked(n, |r| r.for_each(&f));
    }
}

/// Query rows per block: a block's scores cover the union of its rows' key spans, so a causal
/// `[t, t]` product computes about `(1 + t / BLOCK) / 2` of the square.
pub(super) const BLOCK: usize = 64;

/// Key-span union of each `(sequence, row block)`, and the offsets of the saved probability blocks.
pub(super) struct Blocks {
    pub nblk: usize,
    /// Per `(bi, blk)`: key span `lo..hi` of the block.
    pub span: Vec<(usize, usize)>,
    /// Per `(bi, head, blk)`: offset of the `[rows, hi - lo]` probability block in the saved buffer.
    pub off: Vec<usize>,
    pub total: usize,
}

impl Blocks {
    pub fn new(rows: &[(usize, usize)], b: usize, heads: usize, t: usize) -> Self {
        let nblk = t.div_ceil(BLOCK);
        let mut span = Vec::with_capacity(b * nblk);
        for bi in 0..b {
            for blk in 0..nblk {
                let r = &rows[bi * t + blk * BLOCK..bi * t + ((blk + 1) * BLOCK).min(t)];
                let lo = r.iter().map(|x| x.0).min().unwrap_or(0);
                let hi = r.iter().map(|x| x.1).max().unwrap_or(0);
                span.push((lo, hi.max(lo)));
            }
        }
        let mut off = Vec::with_capacity(b * heads * nblk);
        let mut total = 0;
        for bi in 0..b {
            for _ in 0..heads {
                for blk in 0..nblk {
                    off.push(total);
                    let (lo, hi) = span[bi * nblk + blk];
                    total += (((blk + 1) * BLOCK).min(t) - blk * BLOCK) * (hi - lo);
                }
            }
        }
        Self {
            nblk,
            span,
            off,
            total,
        }
    }
}
