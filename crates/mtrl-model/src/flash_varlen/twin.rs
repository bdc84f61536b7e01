//! The CPU twin of the fused attention (see the parent module for the contract): the same
//! arithmetic as FlashAttention-2's varlen causal kernels, one query at a time, accumulated in
//! f64 whatever the operands' dtype (the reference the GPU selftest compares the kernels with).

use candle_core::WithDType;

/// The backward's inputs, each contiguous: `q`, `out`, `dout` `[T, heads, d]`; `k`, `v`
/// `[T, kv, d]`; `lse` `[heads, T]`.
pub(crate) struct Operands<'a, T> {
    pub q: &'a [T],
    pub k: &'a [T],
    pub v: &'a [T],
    pub out: &'a [T],
    pub dout: &'a [T],
    pub lse: &'a [f32],
}

fn f<T: WithDType>(x: T) -> f64 {
    x.to_f64()
}

fn dot<T: WithDType>(a: &[T], b: &[T]) -> f64 {
    a.iter().zip(b).map(|(&x, &y)| f(x) * f(y)).sum()
}

/// The scaled scores of query `i` (global index `qi`, head `h`) over keys `off..=off + i` of its
/// row, reading KV head `g`.
#[allow(clippy::too_many_arguments)]
fn scores<T: WithDType>(
    q: &[T],
    k: &[T],
    (qi, h, g): (usize, usize, usize),
    (off, i): (usize, usize),
    (heads, kv, d): (usize, usize, usize),
    scale: f64,
    s: &mut Vec<f64>,
) {
    let qrow = &q[(qi * heads + h) * d..][..d];
    s.clear();
    s.extend((0..=i).map(|j| dot(qrow, &k[((off + j) * kv + g) * d..][..d]) * scale));
}

/// `(out [T, heads, d], lse [heads, T])` of packed rows `offsets`; `dims` `(T, heads, kv, d)`.
pub(crate) fn forward<T: WithDType>(
    q: &[T],
    k: &[T],
    v: &[T],
    offsets: &[usize],
    (t, heads, kv, d): (usize, usize, usize, usize),
    scale: f64,
) -> (Vec<T>, Vec<f32>) {
    let rep = heads / kv;
    let mut out = vec![T::zero(); t * heads * d];
    let mut lse = vec![0f32; heads * t];
    let (mut s, mut acc) = (Vec::new(), vec![0f64; d]);
    for w in offsets.windows(2) {
        let (off, len) = (w[0], w[1] - w[0]);
        for h in 0..heads {
            let g = h / rep;
            for i in 0..len {
                let qi = off + i;
                scores(q, k, (qi, h, g), (off, i), (heads, kv, d), scale, &mut s);
                let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let l: f64 = s.iter().map(|x| (x - m).exp()).sum();
                let z = m + l.ln();
                acc.fill(0.0);
                for (j, &x) in s.iter().enumerate() {
                    let p = (x - z).exp();
                    let vrow = &v[((off + j) * kv + g) * d..][..d];
                    for (a, &y) in acc.iter_mut().zip(vrow) {
                        *a += p * f(y);
                    }
                }
                for (o, &a) in out[(qi * heads + h) * d..][..d].iter_mut().zip(&acc) {
                    *o = T::from_f64(a);
                }
                lse[h * t + qi] = z as f32;
            }
        }
    }
    (out, lse)
}

/// `[dq | dk per query head | dv per query head]`, each `[T, heads, d]` (see the parent module).
pub(crate) fn backward<T: WithDType>(
    o: Operands<'_, T>,
    offsets: &[usize],
    (t, heads, kv, d): (usize, usize, usize, usize),
    scale: f64,
) -> Vec<T> {
    let rep = heads / kv;
    let n = t * heads * d;
    let mut g = vec![0f64; 3 * n];
    let (dq, rest) = g.split_at_mut(n);
    let (dk, dv) = rest.split_at_mut(n);
    let mut s = Vec::new();
    for w in offsets.windows(2) {
        let (off, len) = (w[0], w[1] - w[0]);
        for h in 0..heads {
            let kh = h / rep;
            for i in 0..len {
                let qi = off + i;
                let at = (qi * heads + h) * d;
                let (qrow, orow, grow) = (&o.q[at..][..d], &o.out[at..][..d], &o.dout[at..][..d]);
                let z = o.lse[h * t + qi] as f64;
                let big_d = dot(grow, orow);
                scores(
                    o.q,
                    o.k,
                    (qi, h, kh),
                    (off, i),
                    (heads, kv, d),
                    scale,
                    &mut s,
                );
                for (j, &x) in s.iter().enumerate() {
                    let p = (x - z).exp();
                    let kat = ((off + j) * kv + kh) * d;
                    let (krow, vrow) = (&o.k[kat..][..d], &o.v[kat..][..d]);
                    let ds = p * (dot(grow, vrow) - big_d) * scale;
                    let jat = ((off + j) * heads + h) * d;
                    for c in 0..d {
                        dv[jat + c] += p * f(grow[c]);
                        dq[at + c] += ds * f(krow[c]);
                        dk[jat + c] += ds * f(qrow[c]);
                    }
                }
            }
        }
    }
    g.into_iter().map(T::from_f64).collect()
}
