//! Row kernels: branch-free `exp`, `erf`, softmax, layer norm, `axpy` for the BERT path
//! (`embed/bert_cpu.rs`) and the dot product of the HNSW graph and of attention. Each compiles to
//! AVX2 + FMA code in its `*_avx2` entry point (picked at run time; the generic code runs
//! elsewhere). The products of the dense layers are in `packed.rs`.
//!
//! `unsafe` here (and in `packed.rs` and the prefetch hint of `vector/hnsw.rs`, the crate's only
//! other `unsafe`): calls into
//! `#[target_feature(enable = "avx2,fma")]` functions after [`avx2`] confirmed the CPU has those
//! features, and the intrinsics' loads inside slices whose lengths bound every index.
//!
//! Determinism: a row's result is the same sequence of f32 operations whatever the other rows of
//! the product, so a text's vector does not depend on the batch it was embedded in.

/// Whether the CPU has AVX2 and FMA (checked once).
pub(crate) fn avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::OnceLock;
        static HAS: OnceLock<bool> = OnceLock::new();
        *HAS.get_or_init(|| is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Cephes' `expf`, branch-free (range reduction by ln 2, degree-5 polynomial, exponent bits
/// spliced in); relative error below 5e-7 on `[-87, 88]`, 0 below -87.
#[inline(always)]
fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    let tiny = x < -87.0;
    let x = x.clamp(-87.0, 88.0);
    let fx = (x * LOG2E + 0.5).floor();
    let r = x - fx * 0.693_359_4 - fx * -2.121_944_4e-4;
    let z = r * r;
    let p = ((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r
        + 1.666_666_5e-1)
        * r
        + 0.5;
    let y = p * z + r + 1.0;
    let biased = (fx + 127.0 + 8_388_608.0)
        .to_bits()
        .wrapping_sub(0x4B00_0000);
    let e = y * f32::from_bits(biased << 23);
    if tiny {
        0.0
    } else {
        e
    }
}

/// `erf(x)`: the rational approximation of Eigen and XLA for f32 (odd degree-13 over even
/// degree-8 polynomial on `[-4, 4]`, ±1 outside); absolute error below 1e-6.
#[inline(always)]
fn erf(x: f32) -> f32 {
    let x = x.clamp(-4.0, 4.0);
    let x2 = x * x;
    let mut p = -2.726_142_3e-10_f32;
    p = p * x2 + 2.770_681_4e-8;
    p = p * x2 + -2.101_024e-6;
    p = p * x2 + -5.692_506_4e-5;
    p = p * x2 + -7.349_906_3e-4;
    p = p * x2 + -2.954_6e-3;
    p = p * x2 + -1.609_603_3e-2;
    let p = p * x;
    let mut q = -1.456_607_2e-5_f32;
    q = q * x2 + -2.133_740_6e-4;
    q = q * x2 + -1.682_827e-3;
    q = q * x2 + -7.373_329e-3;
    q = q * x2 + -1.426_474e-2;
    p / q
}

/// `x = gelu(x + bias[col])` (erf form) over rows of `bias.len()` columns.
pub(crate) fn bias_gelu(xs: &mut [f32], bias: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        // SAFETY: the CPU supports the features the function is compiled for.
        return unsafe { bias_gelu_avx2(xs, bias) };
    }
    bias_gelu_generic(xs, bias)
}

#[inline(always)]
fn bias_gelu_generic(xs: &mut [f32], bias: &[f32]) {
    for row in xs.chunks_exact_mut(bias.len()) {
        for (x, b) in row.iter_mut().zip(bias) {
            let v = *x + b;
            *x = 0.5 * v * (1.0 + erf(v * std::f32::consts::FRAC_1_SQRT_2));
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn bias_gelu_avx2(xs: &mut [f32], bias: &[f32]) {
    bias_gelu_generic(xs, bias)
}

/// Softmax of one row, in place.
pub(crate) fn softmax(row: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        // SAFETY: the CPU supports the features the function is compiled for.
        return unsafe { softmax_avx2(row) };
    }
    softmax_generic(row)
}

#[inline(always)]
fn softmax_generic(row: &mut [f32]) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut acc = [0f32; 8];
    let mut chunks = row.chunks_exact_mut(8);
    for c in &mut chunks {
        for (a, x) in acc.iter_mut().zip(c.iter_mut()) {
            *x = exp(*x - max);
            *a += *x;
        }
    }
    let mut sum = 0f32;
    for x in chunks.into_remainder() {
        *x = exp(*x - max);
        sum += *x;
    }
    let inv = 1.0 / (sum + acc.iter().sum::<f32>());
    row.iter_mut().for_each(|x| *x *= inv);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn softmax_avx2(row: &mut [f32]) {
    softmax_generic(row)
}

/// Sum of `xs` in eight lanes (vectorises; the order is fixed by the length alone).
#[inline(always)]
fn lane_sum(xs: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    let mut acc = [0f32; 8];
    let mut chunks = xs.chunks_exact(8);
    for c in &mut chunks {
        for (a, x) in acc.iter_mut().zip(c) {
            *a += f(*x);
        }
    }
    let tail: f32 = chunks.remainder().iter().map(|&x| f(x)).sum();
    acc.iter().sum::<f32>() + tail
}

/// Layer norm over rows of `gamma.len()` columns, in place: `(x - mean) / sqrt(var + eps) · γ + β`
/// (biased variance, as PyTorch).
pub(crate) fn layer_norm(xs: &mut [f32], gamma: &[f32], beta: &[f32], eps: f32) {
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        // SAFETY: the CPU supports the features the function is compiled for.
        return unsafe { layer_norm_avx2(xs, gamma, beta, eps) };
    }
    layer_norm_generic(xs, gamma, beta, eps)
}

#[inline(always)]
fn layer_norm_generic(xs: &mut [f32], gamma: &[f32], beta: &[f32], eps: f32) {
    let n = gamma.len() as f32;
    for row in xs.chunks_exact_mut(gamma.len()) {
        let mean = lane_sum(row, |x| x) / n;
        let var = lane_sum(row, |x| (x - mean) * (x - mean)) / n;
        let inv = 1.0 / (var + eps).sqrt();
        for ((x, g), b) in row.iter_mut().zip(gamma).zip(beta) {
            *x = (*x - mean) * inv * g + b;
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn layer_norm_avx2(xs: &mut [f32], gamma: &[f32], beta: &[f32], eps: f32) {
    layer_norm_generic(xs, gamma, beta, eps)
}

/// `y += a·x`.
pub(crate) fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        // SAFETY: the CPU supports the features the function is compiled for.
        return unsafe { axpy_avx2(y, a, x) };
    }
    y.iter_mut().zip(x).for_each(|(y, x)| *y += a * x);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn axpy_avx2(y: &mut [f32], a: f32, x: &[f32]) {
    y.iter_mut().zip(x).for_each(|(y, x)| *y = x.mul_add(a, *y));
}

/// `Σ a[i]·b[i]` (eight-lane accumulators, four of them in flight).
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        // SAFETY: the CPU supports the features the function is compiled for.
        return unsafe { dot_avx2(a, b) };
    }
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let n = a.len().min(b.len());
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    // SAFETY: every load reads 8 floats at `i < n − 7` (or `n − 31` for the unrolled loop), inside
    // both slices.
    while i + 32 <= n {
        for (j, a) in acc.iter_mut().enumerate() {
            let o = i + 8 * j;
            *a = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(o)), _mm256_loadu_ps(pb.add(o)), *a);
        }
        i += 32;
    }
    while i + 8 <= n {
        acc[0] = _mm256_fmadd_ps(
            _mm256_loadu_ps(pa.add(i)),
            _mm256_loadu_ps(pb.add(i)),
            acc[0],
        );
        i += 8;
    }
    let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    let hi = _mm256_extractf128_ps(s, 1);
    let q = _mm_add_ps(_mm256_castps256_ps128(s), hi);
    let q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    let q = _mm_add_ss(q, _mm_shuffle_ps(q, q, 1));
    let mut sum = _mm_cvtss_f32(q);
    while i < n {
        sum += *pa.add(i) * *pb.add(i);
        i += 1;
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_and_exp_are_close_to_libm() {
        // Reference erf by integrating 2/√π·e^(−t²) along the sweep (Simpson per step, f64),
        // from erf(−6) = −1 (to 1e−17).
        let density = |t: f64| 2.0 / std::f64::consts::PI.sqrt() * (-t * t).exp();
        let (mut worst_erf, mut worst_exp) = (0f64, 0f64);
        let step = 0.000_73f64;
        let (mut x, mut reference) = (-6.0f64, -1.0f64);
        while x < 6.0 {
            worst_erf = worst_erf.max((erf(x as f32) as f64 - reference).abs());
            let want = x.exp();
            worst_exp = worst_exp.max(((exp(x as f32) as f64 - want) / want).abs());
            reference +=
                step / 6.0 * (density(x) + 4.0 * density(x + step / 2.0) + density(x + step));
            x += step;
        }
        assert!(worst_erf < 1e-6, "erf abs error {worst_erf}");
        assert!(worst_exp < 5e-7, "exp rel error {worst_exp}");
        assert_eq!(exp(-100.0), 0.0);
    }

    #[test]
    fn row_kernels_match_plain_formulas() {
        let mut row: Vec<f32> = (0..37).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        let want: Vec<f32> = {
            let m = row.iter().copied().fold(f32::MIN, f32::max);
            let e: Vec<f32> = row.iter().map(|x| (x - m).exp()).collect();
            let s: f32 = e.iter().sum();
            e.iter().map(|x| x / s).collect()
        };
        softmax(&mut row);
        for (a, b) in row.iter().zip(&want) {
            assert!((a - b).abs() < 1e-6);
        }
        let gamma = vec![2.0f32; 19];
        let beta = vec![0.5f32; 19];
        let mut xs: Vec<f32> = (0..38).map(|i| i as f32).collect();
        layer_norm(&mut xs, &gamma, &beta, 1e-12);
        let mean: f32 = xs[..19].iter().sum::<f32>() / 19.0;
        assert!((mean - 0.5).abs() < 1e-5, "{mean}");
        let mut g = vec![1.0f32, -1.0, 0.0, 3.0];
        bias_gelu(&mut g, &[0.0, 0.0]);
        assert!((g[0] - 0.841_344_7).abs() < 1e-6 && (g[1] + 0.158_655_3).abs() < 1e-6);
        assert_eq!(g[2], 0.0);
    }

    #[test]
    fn dot_matches_plain_sum() {
        for n in [0usize, 1, 7, 8, 31, 32, 33, 384, 385] {
            let a: Vec<f32> = (0..n).map(|i| (i as f32 * 0.3).cos()).collect();
            let b: Vec<f32> = (0..n).map(|i| (i as f32 * 0.7).sin()).collect();
            let want: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
            assert!((dot(&a, &b) as f64 - want).abs() < 1e-4, "n = {n}");
        }
    }
}
