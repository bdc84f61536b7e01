//! Decode attention of many sequences over the paged key/value store (CPU, f32): one pass over
//! all rows, work units (row, KV group) spread over candle's worker pool, each unit following its
//! row's slot table — no gather copy; it reads one head's positions of a block as one contiguous
//! run (the store's layout, see `kv_pool`). The candle twin is `transformer::paged::decode_gathered`.

use candle_core::{Result, Tensor};

use super::pool::{for_ranges, SharedPtr};
use super::storage::cpu_f32;
use super::vector::dot;
use crate::kv_pool::row_of;
use crate::transformer::paged::DecodeTable;

/// `q` `[n, heads, 1, d]` attends over the positions of `table` in the pool buffers
/// `[blocks · kv · BLOCK, d]`. Returns `[n, 1, heads · d]`.
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
    let rows = k_pool.dim(0)?;
    if table
        .slots
        .iter()
        .any(|&s| row_of(s, kv_heads - 1, kv_heads) >= rows)
    {
        candle_core::bail!("paged decode attention: a slot is outside the pool of {rows} rows")
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
        let d = self.d;
        let q = &self.q[(i * self.heads + g * rep) * d..][..rep * d];
        let slots = &self.table.slots[i * self.table.max_len..][..self.table.lens[i]];
        let rows = Rows {
            k: self.k,
            v: self.v,
            kv: self.kv_heads,
            g,
            d,
        };
        #[cfg(target_arch = "x86_64")]
        {
            if super::avx2() {
                // SAFETY: the CPU supports the features the function is compiled for.
                unsafe { attend_avx2(q, &rows, slots, self.scale, scratch, out) };
                return;
            }
        }
        attend(q, &rows, slots, self.scale, scratch, out)
    }
}

/// KV group `g`'s key and value rows in the pool buffers (slot `s` at [`row_of`]`(s, g, kv)`).
struct Rows<'a> {
    k: &'a [f32],
    v: &'a [f32],
    kv: usize,
    g: usize,
    d: usize,
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn attend_avx2(
    q: &[f32],
    rows: &Rows,
    slots: &[u32],
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    attend(q, rows, slots, scale, scores, out)
}

/// Softmax attention of `rep` queries `q` `[rep, d]` over the positions at `slots`.
#[inline(always)]
fn attend(
    q: &[f32],
    rows: &Rows,
    slots: &[u32],
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let d = rows.d;
    let (rep, len) = (q.len() / d, slots.len());
    scores.clear();
    scores.resize(rep * len, 0.0);
    for (p, &s) in slots.iter().enumerate() {
        let at = row_of(s, rows.g, rows.kv) * d;
        let ks = &rows.k[at..at + d];
        for (r, qr) in q.chunks_exact(d).enumerate() {
            scores[r * len + p] = dot(qr, ks) * scale;
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
            let at = row_of(s, rows.g, rows.kv) * d;
            for (oe, ve) in o.iter_mut().zip(&rows.v[at..at + d]) {
                *oe += p * ve;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device};

    use crate::transformer::backend::Candle;
    use crate::transformer::paged::decode_gathered;

    #[test]
    fn the_kernel_equals_its_candle_twin() {
        let dev = Device::Cpu;
        let kv = 2;
        let (pool, table, q) =
            crate::paged_attention::decode_fixture(&dev, DType::F32, (kv, 4, 8), &[1, 70, 33, 129])
                .unwrap();
        let (kp, vp) = pool.layer(0);
        let got = super::paged_decode_attention(&q, kp, vp, kv, &table).unwrap();
        let be = Candle {
            differentiable: false,
        };
        let want = decode_gathered(&be, &q, kp, vp, kv, &table).unwrap();
        assert_eq!(got.dims(), want.dims());
        let diff = (got - want)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!(diff < 1e-5, "kernel vs candle twin: {diff}");
    }
}
