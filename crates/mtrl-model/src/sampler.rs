//! Next-token sampling: temperature, top-k, top-p, with a per-sequence seeded RNG.
//!
//! The reported log-prob is `log_softmax(logits / T)[token]` over the **full** vocabulary, taken
//! before top-k/top-p truncation: that is the distribution the learner evaluates
//! (`logprobs::token_logprobs` with the same `T`). With `temperature == 0` (greedy) the token is the
//! argmax (first index on ties, like `torch.argmax`) and the log-prob is under `T = 1`.
//! Truncation order follows transformers: temperature → top-k → top-p (nucleus over the
//! renormalised top-k set) → draw.
//!
//! RNG: `ChaCha8Rng::seed_from_u64(seed)`, one per sequence, one `f64` draw per token, so the same
//! seed and the same logits give the same tokens regardless of batch composition.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::error::{ModelError, Result};

/// Sampling parameters of one sequence.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 = greedy.
    pub temperature: f64,
    /// Nucleus mass in (0, 1]; 1 = off.
    pub top_p: f64,
    /// Keep the k most likely tokens; 0 = off.
    pub top_k: usize,
    /// Seed of this sequence's RNG.
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            seed: 0,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            ..Self::default()
        }
    }

    /// Rejects NaN/negative temperatures and `top_p` outside (0, 1].
    pub fn validate(&self) -> Result<()> {
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return Err(ModelError::InvalidArgument(format!(
                "temperature must be >= 0, got {}",
                self.temperature
            )));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(ModelError::InvalidArgument(format!(
                "top_p must be in (0, 1], got {}",
                self.top_p
            )));
        }
        Ok(())
    }

    /// A fresh RNG for this sequence.
    pub fn rng(&self) -> ChaCha8Rng {
        ChaCha8Rng::seed_from_u64(self.seed)
    }
}

/// One sampled token with its log-prob under `log_softmax(logits / T)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampled {
    pub token: u32,
    pub logprob: f32,
}

/// Samples one token from `logits` (one row, raw model output).
pub fn sample(logits: &[f32], params: &SamplingParams, rng: &mut ChaCha8Rng) -> Sampled {
    let u = draw(params, rng);
    sample_with(logits, params, u)
}

/// The sequence's one uniform draw for its next token: `rng.random::<f64>()`, or no draw at all
/// (0) for greedy decoding, so a greedy sequence's RNG never advances.
pub fn draw(params: &SamplingParams, rng: &mut ChaCha8Rng) -> f64 {
    if params.temperature == 0.0 {
        0.0
    } else {
        rng.random::<f64>()
    }
}

/// [`sample`] with the uniform draw `u` given.
pub fn sample_with(logits: &[f32], params: &SamplingParams, u: f64) -> Sampled {
    let greedy = params.temperature == 0.0;
    let t = if greedy { 1.0 } else { params.temperature };
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = logits
        .iter()
        .map(|&l| ((l as f64 - max) / t).exp())
        .sum::<f64>()
        .ln();
    let logprob = |i: usize| ((logits[i] as f64 - max) / t - lse) as f32;
    if greedy {
        let mut best = 0;
        for (i, &l) in logits.iter().enumerate() {
            if l > logits[best] {
                best = i;
            }
        }
        return Sampled {
            token: best as u32,
            logprob: logprob(best),
        };
    }
    let weight = |i: usize| ((logits[i] as f64 - max) / t).exp();
    let v = logits.len();
    if (params.top_k == 0 || params.top_k >= v) && params.top_p >= 1.0 {
        let total: f64 = (0..v).map(weight).sum();
        let mut target = u * total;
        for i in 0..v {
            target -= weight(i);
            if target < 0.0 {
                return Sampled {
                    token: i as u32,
                    logprob: logprob(i),
                };
            }
        }
        let last = (0..v).rev().find(|&i| weight(i) > 0.0).unwrap_or(0);
        return Sampled {
            token: last as u32,
            logprob: logprob(last),
        };
    }
    let mut idx: Vec<usize> = (0..v).collect();
    let desc = |a: &usize, b: &usize| logits[*b].total_cmp(&logits[*a]).then(a.cmp(b));
    if params.top_k > 0 && params.top_k < v {
        idx.select_nth_unstable_by(params.top_k - 1, desc);
        idx.truncate(params.top_k);
    }
    idx.sort_unstable_by(desc);
    let weights: Vec<f64> = idx.iter().map(|&i| weight(i)).collect();
    let total: f64 = weights.iter().sum();
    let mut keep = weights.len();
    if params.top_p < 1.0 {
        let mut cum = 0.0;
        for (n, w) in weights.iter().enumerate() {
            cum += w / total;
            if cum >= params.top_p {
                keep = n + 1;
                break;
            }
        }
    }
    let kept_total: f64 = weights[..keep].iter().sum();
    let mut target = u * kept_total;
    for n in 0..keep {
        target -= weights[n];
        if target < 0.0 {
            return Sampled {
                token: idx[n] as u32,
                logprob: logprob(idx[n]),
            };
        }
    }
    let i = idx[keep - 1];
    Sampled {
        token: i as u32,
        logprob: logprob(i),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_picks_first_max_and_reports_logprob() {
        let l = [1.0f32, 3.0, 3.0, 0.0];
        let s = sample(
            &l,
            &SamplingParams::greedy(),
            &mut SamplingParams::greedy().rng(),
        );
        assert_eq!(s.token, 1);
        let lse = l.iter().map(|x| (*x as f64).exp()).sum::<f64>().ln();
        assert!((s.logprob as f64 - (3.0 - lse)).abs() < 1e-6);
    }

    #[test]
    fn top_k_one_is_argmax_and_logprob_is_untruncated() {
        let l = [0.5f32, 2.0, 1.0];
        let p = SamplingParams {
            temperature: 2.0,
            top_k: 1,
            ..Default::default()
        };
        let s = sample(&l, &p, &mut p.rng());
        assert_eq!(s.token, 1);
        let lse = l.iter().map(|x| (*x as f64 / 2.0).exp()).sum::<f64>().ln();
        assert!((s.logprob as f64 - (1.0 - lse)).abs() < 1e-6);
    }

    #[test]
    fn top_p_keeps_nucleus_and_seed_reproduces() {
        let l = [5.0f32, 4.9, -10.0, -10.0];
        let p = SamplingParams {
            temperature: 1.0,
            top_p: 0.9,
            seed: 7,
            ..Default::default()
        };
        let (mut r1, mut r2) = (p.rng(), p.rng());
        for _ in 0..200 {
            let a = sample(&l, &p, &mut r1);
            assert!(a.token < 2);
            assert_eq!(a, sample(&l, &p, &mut r2));
        }
        assert!(SamplingParams {
            top_p: 0.0,
            ..p.clone()
        }
        .validate()
        .is_err());
        assert!(SamplingParams {
            temperature: f64::NAN,
            ..p
        }
        .validate()
        .is_err());
    }
}
