//! The bookkeeping of the masked attention kernels: call shapes, the key span each mask row
//! admits, and the row blocks whose probabilities the forward keeps for the backward.

use super::attn::MASKED;

/// Key span `lo..hi` admitted by each mask row (`[b, 1, t, s]`); all keys when none is.
pub(crate) fn spans(m: &[f32], rows: usize, s: usize) -> Vec<(usize, usize)> {
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

/// Shapes of one call.
#[derive(Clone, Copy)]
pub(crate) struct Dims {
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

/// Query rows per block: a block's scores cover the union of its rows' key spans, so a causal
/// `[t, t]` product computes about `(1 + t / BLOCK) / 2` of the square.
pub(crate) const BLOCK: usize = 64;

/// Key-span union of each `(sequence, row block)`, and the offsets of the saved probability blocks.
pub(crate) struct Blocks {
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
