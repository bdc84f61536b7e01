//! Decode attention of many sequences over their own KV caches (CPU, f32): one hand-written pass
//! over all sequences, work units (sequence, KV group) spread over candle's worker pool.

/// The decode attention of many sequences over their own caches (CPU, f32).
/// `q`: `[n, heads, d]`; cache `i`: keys/values `[kv, cap_i, d]` with `lens[i]` valid positions.
pub(super) struct DecodeAttn<'a> {
    pub(super) q: &'a [f32],
    pub(super) caches: &'a [(&'a [f32], &'a [f32], usize)],
    pub(super) lens: &'a [usize],
    pub(super) heads: usize,
    pub(super) kv_heads: usize,
    pub(super) d: usize,
    pub(super) scale: f32,
}

impl DecodeAttn<'_> {
    /// Writes `[n, heads, d]` into `out`; work units are (sequence, KV group) pairs.
    pub(super) fn run(&self, out: &mut [f32]) {
        let units = self.lens.len() * self.kv_heads;
        let work: usize = self.lens.iter().sum::<usize>() * self.heads * self.d;
        let group = (self.heads / self.kv_heads) * self.d;
        if work < (1 << 16) || crate::skinny::num_threads() < 2 {
            let mut scratch = Vec::new();
            for (u, o) in out.chunks_exact_mut(group).enumerate() {
                self.unit(u, o, &mut scratch);
            }
            return;
        }
        let out_ptr = out.as_mut_ptr() as usize;
        candle_core::utils::barrier_pool().execute_chunked(units, |range| {
            let mut scratch = Vec::new();
            for u in range {
                // SAFETY: unit `u` writes only `out[u * group..(u + 1) * group]`, disjoint across
                // units, and `out` outlives the pool call.
                let o = unsafe {
                    std::slice::from_raw_parts_mut((out_ptr as *mut f32).add(u * group), group)
                };
                self.unit(u, o, &mut scratch);
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
            if crate::skinny::avx2() {
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
            *x = crate::vexp::exp(*x - m);
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

#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for j in 0..8 {
            acc[j] += x[j] * y[j];
        }
    }
    acc.iter().sum::<f32>() + tail
}
