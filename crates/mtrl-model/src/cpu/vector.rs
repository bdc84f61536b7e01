//! The two reductions the CPU kernels share: a dot product and a maximum, written so that they
//! vectorise (fixed lane counts, fixed reduction trees) and give the same bits on every call with
//! the same inputs, whatever the thread or the batch.

/// Largest element (8 lanes, so that it vectorises; no NaN handling needed here).
#[inline(always)]
pub(crate) fn max(x: &[f32]) -> f32 {
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

/// `Σ a[i]·b[i]` over the common length: 16 lanes (two AVX registers, so two independent add
/// chains), folded to 8, then a fixed pairwise tree, then the scalar tail in order.
#[inline(always)]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
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

#[cfg(test)]
mod tests {
    #[test]
    fn dot_and_max_match_scalar() {
        for n in [0usize, 1, 7, 16, 33, 100] {
            let a: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
            let b: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
            let want: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
            assert!((super::dot(&a, &b) as f64 - want).abs() < 1e-5 * (1.0 + want.abs()));
            let m = a.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            assert_eq!(super::max(&a), m);
        }
    }
}
