//! A vectorisable `exp` for the CPU softmax-like kernels (attention, log-softmax, SwiGLU).
//!
//! glibc's `expf` is a scalar call (~2–3 ns); the softmaxes of a training step evaluate ~10⁸ of
//! them. This is Cephes' `expf` (range reduction by ln 2, degree-5 polynomial, exponent bits
//! spliced in), branch-free so that it compiles to AVX2 + FMA code in the `*_avx2` entry points.
//! Relative error below 5e-7 on `[-87, 88]`; below -87 the result is 0 (no denormals: masked
//! scores must not slow the following matmuls down), above 88 it saturates at `exp(88)`.

/// `exp(x)`, scalar form of the vector kernel (also the tail of every slice).
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const C1: f32 = 0.693_359_4;
    const C2: f32 = -2.121_944_4e-4;
    // Below -87 the result would be (nearly) denormal: flush to 0, as masked scores must be
    // (denormal probabilities make the following matmuls many times slower).
    let tiny = x < -87.0;
    let x = x.clamp(-87.0, 88.0);
    let fx = (x * LOG2E + 0.5).floor();
    let r = x - fx * C1 - fx * C2;
    let z = r * r;
    let p = ((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r
        + 1.666_666_5e-1)
        * r
        + 0.5;
    let y = p * z + r + 1.0;
    // 2^fx without a float→int cast (which does not vectorise): fx + 127 is an integer in
    // [1, 254], and adding 2^23 puts it in the low mantissa bits.
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

/// `xs[i] = exp(xs[i])`; returns `Σ exp(xs[i])`.
pub(crate) fn exp_sum_inplace(xs: &mut [f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if super::avx2() {
            // SAFETY: the CPU supports the features the function is compiled for.
            return unsafe { exp_sum_avx2(xs) };
        }
    }
    exp_sum_generic(xs)
}

#[inline(always)]
fn exp_sum_generic(xs: &mut [f32]) -> f32 {
    let mut acc = [0f32; 8];
    let mut chunks = xs.chunks_exact_mut(8);
    for c in &mut chunks {
        for (a, x) in acc.iter_mut().zip(c.iter_mut()) {
            *x = exp(*x);
            *a += *x;
        }
    }
    let mut tail = 0f32;
    for x in chunks.into_remainder() {
        *x = exp(*x);
        tail += *x;
    }
    acc.iter().sum::<f32>() + tail
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn exp_sum_avx2(xs: &mut [f32]) -> f32 {
    exp_sum_generic(xs)
}

#[cfg(test)]
mod tests {
    #[test]
    fn close_to_libm() {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            if x < -87.0 {
                x += 0.00731;
                continue;
            }
            let want = (x as f64).exp();
            let got = super::exp(x) as f64;
            worst = worst.max(((got - want) / want).abs());
            x += 0.00731;
        }
        assert!(worst < 5e-7, "relative error {worst}");
        assert_eq!(super::exp(-1e30), 0.0);
        assert_eq!(super::exp(-87.5), 0.0);
        let mut v: Vec<f32> = (0..37).map(|i| i as f32 * 0.1 - 2.0).collect();
        let want: f32 = v.iter().map(|x| x.exp()).sum();
        let got = super::exp_sum_inplace(&mut v);
        assert!((got - want).abs() < 1e-5 * want);
    }
}
