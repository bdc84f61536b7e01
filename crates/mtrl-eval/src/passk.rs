//! The unbiased pass@k estimator (Chen et al. 2021, "Evaluating Large Language Models Trained on
//! Code", eq. 1): from `n ≥ k` attempts of which `c` passed, the probability that at least one of
//! `k` attempts drawn without replacement passes, `1 − C(n−c, k) / C(n, k)`.
//!
//! Computed as `1 − Π_{i = n−c+1}^{n} (1 − k / i)` (the paper's numerically stable form): no
//! binomial coefficient is ever formed, so large `n` neither overflows nor loses precision.
//! Pure; hand-worked vectors below.

use crate::error::{EvalError, Result};

/// pass@k of one task from `n` attempts with `c` passes. Errors when `k` is 0, `n < k` or
/// `c > n`.
pub fn pass_at_k(n: usize, c: usize, k: usize) -> Result<f64> {
    if k == 0 || n < k || c > n {
        return Err(EvalError::Invalid(format!(
            "pass@k needs 1 ≤ k ≤ n and c ≤ n, got n = {n}, c = {c}, k = {k}"
        )));
    }
    if c == 0 {
        return Ok(0.0);
    }
    if n - c < k {
        return Ok(1.0);
    }
    let miss: f64 = (n - c + 1..=n).map(|i| 1.0 - k as f64 / i as f64).product();
    Ok(1.0 - miss)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) {
        assert!((a - b).abs() < 1e-12, "{a} vs {b}");
    }

    #[test]
    fn hand_worked_values() {
        // n = 5, c = 2, k = 1: the pass rate 2/5.
        close(pass_at_k(5, 2, 1).unwrap(), 0.4);
        // k = 2: 1 − C(3,2)/C(5,2) = 1 − 3/10.
        close(pass_at_k(5, 2, 2).unwrap(), 0.7);
        // k = 3: 1 − C(3,3)/C(5,3) = 1 − 1/10.
        close(pass_at_k(5, 2, 3).unwrap(), 0.9);
        // n − c < k: every draw of k holds a pass.
        close(pass_at_k(5, 2, 4).unwrap(), 1.0);
        close(pass_at_k(4, 4, 4).unwrap(), 1.0);
        close(pass_at_k(10, 0, 3).unwrap(), 0.0);
        // n = k: any pass counts.
        close(pass_at_k(4, 1, 4).unwrap(), 1.0);
        close(pass_at_k(4, 0, 4).unwrap(), 0.0);
    }

    #[test]
    fn matches_binomials_and_stays_finite_for_large_n() {
        fn binom(n: u64, k: u64) -> f64 {
            (0..k).fold(1.0, |acc, i| acc * (n - i) as f64 / (i + 1) as f64)
        }
        for (n, c, k) in [(20u64, 3u64, 5u64), (30, 7, 10), (12, 1, 1)] {
            let exact = 1.0 - binom(n - c, k) / binom(n, k);
            let got = pass_at_k(n as usize, c as usize, k as usize).unwrap();
            assert!((got - exact).abs() < 1e-12, "{n} {c} {k}: {got} vs {exact}");
        }
        let p = pass_at_k(100_000, 10, 1000).unwrap();
        assert!(p.is_finite() && p > 0.0 && p < 1.0, "{p}");
    }

    #[test]
    fn bad_arguments_are_errors() {
        assert!(pass_at_k(3, 1, 4).is_err());
        assert!(pass_at_k(3, 4, 1).is_err());
        assert!(pass_at_k(3, 1, 0).is_err());
    }
}
