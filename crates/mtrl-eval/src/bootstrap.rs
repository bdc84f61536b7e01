//! Paired bootstrap confidence interval for the difference of two means over the same tasks
//! (e.g. nDCG@10 of tuned − base).
//!
//! Each resample draws `n` task indices with replacement (SplitMix64 seeded by `seed`, so the
//! interval is a pure function of the inputs) and takes the mean of the per-task differences;
//! the interval is the percentile interval of those means (nearest-rank percentiles). Pairing by
//! task removes the between-task variance that two independent samples would carry.

use mtrl_core::rng::SplitMix64;
use serde::{Deserialize, Serialize};

use crate::error::{EvalError, Result};

/// Resamples used when none are given.
pub const DEFAULT_RESAMPLES: usize = 2000;

/// A difference of means with its bootstrap interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Interval {
    /// mean(a) − mean(b) on the observed tasks.
    pub diff: f64,
    pub low: f64,
    pub high: f64,
    /// Coverage, e.g. 0.95.
    pub level: f64,
    pub resamples: usize,
    pub seed: u64,
}

/// The `level` percentile interval of mean(a − b) over `resamples` paired resamples.
/// `a[i]` and `b[i]` must be the same task.
pub fn paired_bootstrap(
    a: &[f64],
    b: &[f64],
    resamples: usize,
    level: f64,
    seed: u64,
) -> Result<Interval> {
    if a.len() != b.len() || a.is_empty() {
        return Err(EvalError::Invalid(format!(
            "a paired bootstrap needs two equally long non-empty samples, got {} and {}",
            a.len(),
            b.len()
        )));
    }
    if resamples == 0 || !(level > 0.0 && level < 1.0) {
        return Err(EvalError::Invalid(format!(
            "bootstrap needs resamples > 0 and a level in (0, 1), got {resamples} and {level}"
        )));
    }
    let d: Vec<f64> = a.iter().zip(b).map(|(x, y)| x - y).collect();
    let n = d.len();
    let mean = |it: &mut dyn Iterator<Item = f64>| it.sum::<f64>() / n as f64;
    let diff = mean(&mut d.iter().copied());
    let mut rng = SplitMix64(seed);
    let mut means: Vec<f64> = (0..resamples)
        .map(|_| mean(&mut (0..n).map(|_| d[rng.below(n)])))
        .collect();
    means.sort_by(f64::total_cmp);
    let alpha = 1.0 - level;
    // Nearest rank: the smallest value with at least p·B values at or below it.
    let rank = |p: f64| ((p * resamples as f64).ceil() as usize).clamp(1, resamples) - 1;
    Ok(Interval {
        diff,
        low: means[rank(alpha / 2.0)],
        high: means[rank(1.0 - alpha / 2.0)],
        level,
        resamples,
        seed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_contains_the_observed_difference() {
        let a: Vec<f64> = (0..40).map(|i| ((i * 37) % 11) as f64 / 10.0).collect();
        let b: Vec<f64> = (0..40).map(|i| ((i * 13) % 7) as f64 / 10.0).collect();
        let x = paired_bootstrap(&a, &b, 2000, 0.95, 42).unwrap();
        assert_eq!(x, paired_bootstrap(&a, &b, 2000, 0.95, 42).unwrap());
        let expected = a.iter().sum::<f64>() / 40.0 - b.iter().sum::<f64>() / 40.0;
        assert!((x.diff - expected).abs() < 1e-12);
        assert!(x.low <= x.diff && x.diff <= x.high, "{x:?}");
        assert!(x.low < x.high);
        // Another seed moves the ends a little, not the observed difference.
        let y = paired_bootstrap(&a, &b, 2000, 0.95, 43).unwrap();
        assert_eq!(x.diff, y.diff);
        assert!((x.low - y.low).abs() < 0.1 && (x.high - y.high).abs() < 0.1);
    }

    #[test]
    fn constant_differences_give_a_point_interval() {
        let a = [0.5, 0.7, 0.9];
        let b = [0.25, 0.45, 0.65];
        let x = paired_bootstrap(&a, &b, 100, 0.95, 0).unwrap();
        for v in [x.diff, x.low, x.high] {
            assert!((v - 0.25).abs() < 1e-12, "{x:?}");
        }
    }

    #[test]
    fn bad_inputs_are_errors() {
        assert!(paired_bootstrap(&[1.0], &[1.0, 2.0], 10, 0.95, 0).is_err());
        assert!(paired_bootstrap(&[], &[], 10, 0.95, 0).is_err());
        assert!(paired_bootstrap(&[1.0], &[1.0], 0, 0.95, 0).is_err());
        assert!(paired_bootstrap(&[1.0], &[1.0], 10, 1.0, 0).is_err());
    }
}
