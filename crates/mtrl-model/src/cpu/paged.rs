//! Decode attention of many sequences over the paged key/value store (CPU, f32): one pass over
//! all rows, work units (row, KV group) spread over candle's worker pool, each unit following its
//! row's slot table — no gather copy. The candle twin is `transformer::paged::decode_gathered`.

use candle_core::{Result, Tensor};

use super::pool::{for_ranges, SharedPtr};
use super::storage::cpu_f32;
use super::vector::dot;
use crate::transformer::paged::DecodeTable;

/// `q` `[n, heads, 1, d]` attends over the positions of `table` in the pool buffers
/// `[slots, kv · d]`. Returns `[n, 1, heads · d]`.
pub(crate) fn paged_decode_attention(
    q: &Tensor,
    k_pool: &Tensor,
    v_pool: &Tensor,
    kv_heads: usize,
    table: &DecodeTable,
) -> Result<Tensor> {
    let (n, heads, _, d) = q.dims4()?;
    if table.lens.len() != n || !k_pool.is_contiguous() || !v_pool.is_contiguous() {
        candle_core::bail!("paged decode attention: {n} queries, bad table or pool layout")
    }
    let q = q.contiguous()?;
    let (q_st, q_l) = q.storage_and_layout();
    let qs = &cpu_f32(&q_st)?[q_l.start_offset()..][..n * heads * d];
    let (k_st, k_l) = k_pool.storage_and_layout();
    let (v_st, v_l) = v_pool.storage_and_layout();
    let ks = &cpu_f32(&k_st)?[k_l.start_offset()..][..k_pool.elem_count()];
    let vs = &cpu_f32(&v_st)?[v_l.start_offset()..][..v_pool.elem_count()];
    let slots = k_pool.dim(0)?;
    if table.slots.iter().any(|&s| s as usize >= slots) {
        candle_core::bail!("paged decode attention: a slot is outside the pool of {slots}")
    }
    let attn = PagedAttn {
        q: qs,
        k: ks,
        v: vs,
        table,
        heads,
        kv_heads,
        d,
        scale: 1.0 / (d as f32).sqrt(),
    };
    let mut out = vec![0f32; n * heads * d];
    attn.run(&mut out);
    Tensor::from_vec(out, (n, 1, heads * d), q.device())
}

struct PagedAttn<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    table: &'a DecodeTable,
    heads: usize,
    kv_heads: usize,
    d: usize,
    scale: f32,
}

impl PagedAttn<'_> {
    fn run(&self, out: &mut [f32]) {
        let units = self.table.lens.len() * self.kv_heads;
        let work: usize = self.table.lens.iter().sum::<usize>() * self.heads * self.d;
        let group = (self.heads / self.kv_heads) * self.d;
        let o = SharedPtr::of(out);
        for_ranges(units, work >= (1 << 16), |range| {
            let mut scratch = Vec::new();
            for u in range {
                // SAFETY: unit `u` writes only `out[u * group..(u + 1) * group]`, disjoint across
                // units, and `out` outlives the pool call.
                self.unit(u, unsafe { o.slice_mut(u * group, group) }, &mut scratch);
            }
        });
    }

    fn unit(&self, u: usize, out: &mut [f32], scratch: &mut Vec<f32>) {
        let (i, g) = (u / self.kv_heads, u % self.kv_heads);
        let rep = self.heads / self.kv_heads;
        let q = &self.q[(i * self.heads + g * rep) * self.d..][..rep * self.d];
        let slots = &self.table.slots[i * self.table.max_len..][..self.table.lens[i]];
        #[cfg(target_arch = "x86_64")]
        {
            if super::avx2() {
                // SAFETY: the CPU supports the features the function is compiled for.
                unsafe { self.attend_avx2(q, g, slots, scratch, out) };
                return;
            }
        }
        self.attend(q, g, slots, scratch, out)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn attend_avx2(
        &self,
        q: &[f32],
        g: usize,
        slots: &[u32],
        scratch: &mut Vec<f32>,
        out: &mut [f32],
    ) {
        self.attend(q, g, slots, scratch, out)
    }

    /// Group `g`'s `d` elements of slot `s` in a pool buffer.
    #[inline(always)]
    fn row<'b>(&self, buf: &'b [f32], s: u32, g: usize) -> &'b [f32] {
        &buf[(s as usize * self.kv_heads + g) * self.d..][..self.d]
    }

    /// Softmax attention of the `rep` queries of KV group `g` over the positions at `slots`.
    #[inline(always)]
    fn attend(&self, q: &[f32], g: usize, slots: &[u32], scores: &mut Vec<f32>, out: &mut [f32]) {
        let d = self.d;
        let (rep, len) = (q.len() / d, slots.len());
        scores.clear();
        scores.resize(rep * len, 0.0);
        for (p, &s) in slots.iter().enumerate() {
            let ks = self.row(self.k, s, g);
            for (r, qr) in q.chunks_exact(d).enumerate() {
                scores[r * len + p] = dot(qr, ks) * self.scale;
            }
        }
        for (sc, o) in scores.chunks_exact_mut(len).zip(out.chunks_exact_mut(d)) {
            let m = sc.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0f32;
            for x in sc.iter_mut() {
                *x = super::vexp::exp(*x - m);
                sum += *x;
            }
            let inv = 1.0 / sum;
            o.fill(0.0);
            for (pr, &s) in sc.iter().zip(slots) {
                let p = pr * inv;
                for (oe, ve) in o.iter_mut().zip(self.row(self.v, s, g)) {
                    *oe += p * ve;
                }
            }
        }
    }
}
