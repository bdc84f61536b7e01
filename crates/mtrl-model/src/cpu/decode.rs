//! Decode attention of many sequences over their own KV caches (CPU, f32): one hand-written pass
//! over all sequences, work units (sequence, KV group) spread over candle's worker pool, instead of
//! one append + two matmuls + one softmax per sequence and layer.

use candle_core::{Result, Tensor};

use super::pool::{for_ranges, SharedPtr};
use super::storage::cpu_f32;
use super::vector::dot;
use crate::kv_cache::KvCache;

/// Appends each sequence's `k`, `v` (`[n, kv, 1, d]`, row `i` for `caches[i]`) to layer `li` of its
/// cache, then attends `q` (`[n, heads, 1, d]`) over every cache. Returns `[n, 1, heads · d]`.
pub(crate) fn decode_attention(
    li: usize,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    caches: &mut [&mut KvCache],
) -> Result<Tensor> {
    let n = caches.len();
    let (_, heads, _, d) = q.dims4()?;
    let kv_heads = k.dim(1)?;
    let mut lens = Vec::with_capacity(n);
    for (i, c) in caches.iter_mut().enumerate() {
        lens.push(c.write(li, &k.narrow(0, i, 1)?, &v.narrow(0, i, 1)?)?);
    }
    let q = q.contiguous()?;
    let (q_st, q_l) = q.storage_and_layout();
    let qs = &cpu_f32(&q_st)?[q_l.start_offset()..q_l.start_offset() + n * heads * d];
    let mut bufs = Vec::with_capacity(n);
    for c in caches.iter() {
        let Some((kb, vb)) = c.buffers(li) else {
            candle_core::bail!("kv cache layer {li} is empty after a write")
        };
        if !kb.is_contiguous() || !vb.is_contiguous() {
            candle_core::bail!("kv cache buffers must be contiguous")
        }
        bufs.push((kb.storage_and_layout(), vb.storage_and_layout(), kb.dim(2)?));
    }
    let mut views = Vec::with_capacity(n);
    for ((ks, kl), (vs, vl), cap) in &bufs {
        let k = &cpu_f32(ks)?[kl.start_offset()..];
        let v = &cpu_f32(vs)?[vl.start_offset()..];
        views.push((k, v, *cap));
    }
    let attn = DecodeAttn {
        q: qs,
        caches: &views,
        lens: &lens,
        heads,
        kv_heads,
        d,
        scale: 1.0 / (d as f32).sqrt(),
    };
    let mut out = vec![0f32; n * heads * d];
    attn.run(&mut out);
    drop(views);
    drop(bufs);
    Tensor::from_vec(out, (n, 1, heads * d), q.device())
}

/// The decode attention of many sequences over their own caches (CPU, f32).
/// `q`: `[n, heads, d]`; cache `i`: keys/values `[kv, cap_i, d]` with `lens[i]` valid positions.
struct DecodeAttn<'a> {
    q: &'a [f32],
    caches: &'a [(&'a [f32], &'a [f32], usize)],
    lens: &'a [usize],
    heads: usize,
    kv_heads: usize,
    d: usize,
    scale: f32,
}

impl DecodeAttn<'_> {
    /// Writes `[n, heads, d]` into `out`; work units are (sequence, KV group) pairs.
    fn run(&self, out: &mut [f32]) {
        let units = self.lens.len() * self.kv_heads;
        let work: usize = self.lens.iter().sum::<usize>() * self.heads * self.d;
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
        let (k, v, cap) = self.caches[i];
        let (d, len) = (self.d, self.lens[i]);
        let rep = self.heads / self.kv_heads;
        let q = &self.q[(i * self.heads + g * rep) * d..][..rep * d];
        let k = &k[g * cap * d..][..len * d];
        let v = &v[g * cap * d..][..len * d];
        #[cfg(target_arch = "x86_64")]
        {
            if super::avx2() {
                // SAFETY: the CPU supports the features the function is compiled for.
                unsafe { attend_group_avx2(q, k, v, d, self.scale, scratch, out) };
                return;
            }
        }
        attend_group(q, k, v, d, self.scale, scratch, out);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn attend_group_avx2(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    d: usize,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    attend_group(q, k, v, d, scale, scores, out)
}

/// Softmax attention of `rep` queries `q` `[rep, d]` over `len` keys/values `[len, d]`.
#[inline(always)]
fn attend_group(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    d: usize,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let rep = q.len() / d;
    let len = k.len() / d;
    scores.clear();
    scores.resize(rep * len, 0.0);
    for (s, ks) in k.chunks_exact(d).enumerate() {
        for (r, qr) in q.chunks_exact(d).enumerate() {
            scores[r * len + s] = dot(qr, ks) * scale;
        }
    }
    for (row, o) in scores.chunks_exact_mut(len).zip(out.chunks_exact_mut(d)) {
        let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0f32;
        for x in row.iter_mut() {
            *x = super::vexp::exp(*x - m);
            sum += *x;
        }
        let inv = 1.0 / sum;
        o.fill(0.0);
        for (p, vs) in row.iter().zip(v.chunks_exact(d)) {
            let p = p * inv;
            for (oe, ve) in o.iter_mut().zip(vs) {
                *oe += p * ve;
            }
        }
    }
}
