//! Statistics shared by the estimators: exact group mean/std under a [`Std`] convention and
//! verl's token-weighted batch whitening (`masked_whiten`, `verl/utils/torch_functional.py`).

use super::{Sample, Std};
use crate::error::{AlgoError, Result};

/// ε added to a standard deviation before dividing (verl's `epsilon`).
pub(super) const EPS: f64 = 1e-6;

/// Whether all values are bit-for-bit equal (true for 0 or 1 values).
pub(super) fn all_equal(x: &[f64]) -> bool {
    x.windows(2).all(|w| w[0] == w[1])
}

/// Mean and std of `x` (not empty) under `std`; all-equal values give their value exactly and
/// std 0, one value gives std 0 under both conventions.
pub(super) fn mean_std(x: &[f64], std: Std) -> (f64, f64) {
    if all_equal(x) {
        return (x[0], 0.0);
    }
    let n = x.len() as f64;
    let mean = x.iter().sum::<f64>() / n;
    let ss: f64 = x.iter().map(|v| (v - mean).powi(2)).sum();
    let dof = match std {
        Std::Population => n,
        Std::Unbiased => n - 1.0,
    };
    (mean, (ss / dof).sqrt())
}

/// verl's `masked_whiten(values, response_mask)` over the whole batch: every trained token is
/// one element, so a turn counts with its token count. mean = Σ n·v / N,
/// var = Σ n·(v − mean)² / (N − 1) (masked_var's default `unbiased=True`),
/// out = (v − mean) / √(var + 1e-8). Turns without tokens are shifted and scaled too (they train
/// nothing). Like verl, N ≤ 1 is an error.
pub(super) fn whiten_tokens(
    groups: &[Vec<Sample>],
    mut values: Vec<Vec<Vec<f64>>>,
) -> Result<Vec<Vec<Vec<f64>>>> {
    let pairs = || {
        groups.iter().zip(&values).flat_map(|(group, vals)| {
            group
                .iter()
                .zip(vals)
                .flat_map(|(s, v)| s.turn_tokens.iter().zip(v).map(|(&n, &v)| (n as f64, v)))
        })
    };
    let n: f64 = pairs().map(|(n, _)| n).sum();
    if n < 2.0 {
        return Err(AlgoError::Invalid(format!(
            "batch whitening needs at least 2 trained tokens in the batch, got {n}"
        )));
    }
    let trained: Vec<f64> = pairs().filter(|(n, _)| *n > 0.0).map(|(_, v)| v).collect();
    let (mean, var) = if all_equal(&trained) {
        (trained[0], 0.0)
    } else {
        let mean = pairs().map(|(n, v)| n * v).sum::<f64>() / n;
        let ss: f64 = pairs().map(|(n, v)| n * (v - mean).powi(2)).sum();
        (mean, ss / (n - 1.0))
    };
    let scale = 1.0 / (var + 1e-8).sqrt();
    for v in values.iter_mut().flatten().flatten() {
        *v = (*v - mean) * scale;
    }
    Ok(values)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(r: &[f64], n: &[usize]) -> Sample {
        Sample {
            turn_rewards: r.to_vec(),
            turn_tokens: n.to_vec(),
        }
    }

    #[test]
    fn mean_std_conventions() {
        // x = (0, 1, 2): mean 1, Σ(x − 1)² = 2, population std √(2/3), unbiased std √(2/2) = 1.
        let (m, p) = mean_std(&[0.0, 1.0, 2.0], Std::Population);
        assert_eq!(m, 1.0);
        assert!((p - (2.0f64 / 3.0).sqrt()).abs() < 1e-15);
        assert_eq!(mean_std(&[0.0, 1.0, 2.0], Std::Unbiased), (1.0, 1.0));
        // 0.1 · 3 / 3 ≠ 0.1 in floating point; all-equal values give their value exactly.
        assert_eq!(mean_std(&[0.1; 3], Std::Unbiased), (0.1, 0.0));
        assert_eq!(mean_std(&[7.0], Std::Unbiased), (7.0, 0.0));
    }

    #[test]
    fn whitening_weighs_turns_by_tokens() {
        // Values 1 (3 tokens) and −1 (1 token): N = 4, mean = (3 − 1)/4 = 0.5,
        // Σ n (v − mean)² = 3·0.25 + 1·2.25 = 3, var = 3/(4 − 1) = 1 ⇒ (0.5, −1.5)/√(1 + 1e-8).
        let g = vec![vec![s(&[0.0], &[3]), s(&[0.0], &[1])]];
        let w = whiten_tokens(&g, vec![vec![vec![1.0], vec![-1.0]]]).unwrap();
        let k = 1.0 / (1.0f64 + 1e-8).sqrt();
        assert_eq!(w, vec![vec![vec![0.5 * k], vec![-1.5 * k]]]);
        // One trained token in the whole batch: verl's masked_var refuses it, so do we.
        let one = vec![vec![s(&[0.0], &[1]), s(&[0.0], &[0])]];
        assert!(whiten_tokens(&one, vec![vec![vec![1.0], vec![2.0]]]).is_err());
    }
}
