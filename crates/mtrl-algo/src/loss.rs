//! Per-token policy losses (before masking and aggregation).
//!
//! With ratio r = exp(logp − logp_old) and advantage A (per sequence, broadcast over tokens):
//! - `ppo`: l = −min(r·A, clip(r, 1−ε_low, 1+ε_high)·A); with `dual_clip = c` (c > 1) and A < 0,
//!   l = min(l, −c·A) (dual-clip PPO). Where the clipped term is the smaller one, the gradient is
//!   0; that choice is made explicitly with a mask rather than left to `minimum`'s tie rule, so
//!   inside the trust region the gradient is exactly −A·r·∇logp (never doubled).
//! - `cispo`: w = sg(clip(r, 1−ε_low, 1+ε_high)); l = −w·A·logp (MiniMax-M1, with the managed
//!   service's two-sided bounds; ε_low = 1 leaves the lower side open as in the paper). The value
//!   depends on logp itself; the gradient is −A·w·∇logp: a clipped IS weight that never vanishes.
//! - `is`: importance-sampled policy gradient l = −A·r (the service's `importance_sampling`), with
//!   an optional truncation cap C: l = −A·r·sg(min(r, C)/r), whose value is −A·min(r, C) and whose
//!   gradient is −A·min(r, C)·∇logp (truncated IS: the weight is capped, never zeroed).
//!
//! `logp_old` is what the ratio is taken against: the sampler's log-probs (the managed service's
//! definition) or a proximal policy the learner recomputed before several updates (decoupled PPO).
//! In the second case the behaviour log-probs (the ones the rollout engine sampled with) are given
//! too and every per-token loss is multiplied by w = sg(min(exp(logp_old − logp_behaviour), C)) —
//! truncated IS (TIS) of the proximal policy against the sampler.
//!
//! Advantages are per sequence (`[B]`, broadcast over tokens) or per token (`[B, T]`, for the
//! per-turn estimators).
//!
//! Numerical guards (as verl's `core_algos.py`): the log-ratio is clamped to ±[`LOG_RATIO_BOUND`]
//! before `exp`, weights and caps are formed in log space (`min(r, C)/r = exp(min(0, ln C − ln r))`,
//! never 0/0), and the per-token loss is *selected* to 0 at masked positions (`where`, not `· 0`,
//! which would keep a NaN or ±inf from a prompt or padding position: their "behaviour" log-prob
//! is a placeholder 0). Dual-clip PPO is offered (`algorithm.dual_clip`, off by default).

use candle_core::{DType, Tensor};
use serde::{Deserialize, Serialize};

use crate::error::{AlgoError, Result};

/// |log π_θ − log π_old| above this is clamped before `exp` (verl: ±20).
pub const LOG_RATIO_BOUND: f64 = 20.0;

/// `t` where `mask` ≠ 0, exactly 0 elsewhere (whatever `t` holds there, NaN included); the
/// gradient into `t` at masked positions is 0 too.
pub fn select_masked(t: &Tensor, mask: &Tensor) -> Result<Tensor> {
    let keep = mask.ne(0.0)?;
    let zeros = t.zeros_like()?;
    Ok(keep.where_cond(t, &zeros)?)
}

/// A policy loss, picked by name in the config.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum PolicyLoss {
    Ppo {
        clip_low: f64,
        clip_high: f64,
        dual_clip: Option<f64>,
    },
    Cispo {
        clip_low: f64,
        clip_high: f64,
    },
    /// `cap`: truncation of the IS weight (`None` = untruncated).
    Is {
        cap: Option<f64>,
    },
}

/// Tensors of one (micro-)batch. All `[B, T]` except `advantages` (`[B]` or `[B, T]`).
pub struct LossInputs<'a> {
    /// Current policy log-probs, on the autograd graph.
    pub logp: &'a Tensor,
    /// Proximal / old policy log-probs (no gradient).
    pub logp_old: &'a Tensor,
    /// Behaviour log-probs reported by the rollout engine, with the truncation cap C
    /// (`f64::INFINITY`: untruncated).
    pub behaviour: Option<(&'a Tensor, f64)>,
    pub advantages: &'a Tensor,
    /// 1 on tokens that count (policy-sampled), 0 elsewhere.
    pub mask: &'a Tensor,
}

/// Per-token loss plus the diagnostics the learner logs. The diagnostics are scalar tensors on
/// the loss's device (no graph): the learner reads them back with its others, once per
/// micro-batch, instead of one device→host wait each.
pub struct LossOutput {
    /// `[B, T]`, not yet masked: [`crate::aggregate`] selects the trained positions.
    pub per_token: Tensor,
    /// Number of masked tokens whose objective was clipped (PPO) or capped (CISPO, IS).
    pub clipped: Tensor,
    /// Sum of the behaviour-correction weights over masked tokens (0 without correction).
    pub behaviour_weight: Tensor,
}

impl LossOutput {
    /// [`Self::clipped`] on the host.
    pub fn clipped_tokens(&self) -> Result<f64> {
        scalar(&self.clipped)
    }

    /// [`Self::behaviour_weight`] on the host.
    pub fn behaviour_weight_sum(&self) -> Result<f64> {
        scalar(&self.behaviour_weight)
    }
}

fn scalar(t: &Tensor) -> Result<f64> {
    Ok(t.to_dtype(DType::F64)?.to_scalar::<f64>()?)
}

/// Σ t · mask over the positions `mask` keeps (selected first, so a NaN or ±inf at a masked
/// position does not leak in): an f64 scalar tensor on `t`'s device, detached.
pub fn masked_total(t: &Tensor, mask: &Tensor) -> Result<Tensor> {
    let t = t.to_dtype(mask.dtype())?;
    Ok(select_masked(&t, mask)?
        .mul(mask)?
        .sum_all()?
        .detach()
        .to_dtype(DType::F64)?)
}

/// [`masked_total`] on the host.
pub fn masked_sum(t: &Tensor, mask: &Tensor) -> Result<f64> {
    scalar(&masked_total(t, mask)?)
}

/// The per-token loss of `loss` on `x`.
pub fn per_token_loss(loss: PolicyLoss, x: &LossInputs<'_>) -> Result<LossOutput> {
    let (b, t) = x.logp.dims2()?;
    for (name, tensor) in [("logp_old", x.logp_old), ("mask", x.mask)] {
        if tensor.dims() != [b, t] {
            return Err(AlgoError::Invalid(format!(
                "{name} has shape {:?}, expected [{b}, {t}]",
                tensor.dims()
            )));
        }
    }
    let dtype = x.logp.dtype();
    let adv = match x.advantages.dims() {
        [n] if *n == b => x
            .advantages
            .to_dtype(dtype)?
            .unsqueeze(1)?
            .broadcast_as((b, t))?,
        [n, m] if *n == b && *m == t => x.advantages.to_dtype(dtype)?,
        other => {
            return Err(AlgoError::Invalid(format!(
                "advantages have shape {other:?}, expected [{b}] or [{b}, {t}]"
            )))
        }
    };
    let old = x.logp_old.detach();
    let log_ratio = (x.logp - &old)?.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)?;
    let ratio = log_ratio.exp()?;
    let (per_token, clipped) = match loss {
        PolicyLoss::Ppo {
            clip_low,
            clip_high,
            dual_clip,
        } => {
            let surr1 = ratio.mul(&adv)?;
            let surr2 = ratio
                .detach()
                .clamp(1.0 - clip_low, 1.0 + clip_high)?
                .mul(&adv)?;
            // Clipped where the clipped surrogate is strictly smaller: no gradient there.
            let clipped = surr1.gt(&surr2)?.to_dtype(dtype)?;
            let keep = clipped.affine(-1.0, 1.0)?;
            let mut l = (surr1.mul(&keep)? + surr2.mul(&clipped)?)?.neg()?;
            if let Some(c) = dual_clip {
                if c <= 1.0 {
                    return Err(AlgoError::Invalid(format!(
                        "dual_clip must be > 1, got {c}"
                    )));
                }
                // For A < 0 the loss is capped at −c·A (a constant: no gradient beyond it).
                let cap = adv.affine(-c, 0.0)?;
                let neg_adv = adv.lt(0.0)?.to_dtype(dtype)?;
                let over = l.gt(&cap)?.to_dtype(dtype)?.mul(&neg_adv)?;
                l = (l.mul(&over.affine(-1.0, 1.0)?)? + cap.mul(&over)?)?;
            }
            let n = masked_total(&clipped, x.mask)?;
            (l, n)
        }
        PolicyLoss::Cispo {
            clip_low,
            clip_high,
        } => {
            let r = ratio.detach();
            let (lo, hi) = (1.0 - clip_low, 1.0 + clip_high);
            let w = r.clamp(lo, hi)?;
            let capped = (r.gt(hi)?.to_dtype(dtype)? + r.lt(lo)?.to_dtype(dtype)?)?;
            let l = w.mul(&adv)?.mul(x.logp)?.neg()?;
            (l, masked_total(&capped, x.mask)?)
        }
        PolicyLoss::Is { cap: None } => (ratio.mul(&adv)?.neg()?, zero(x.mask)?),
        PolicyLoss::Is { cap: Some(cap) } => {
            if cap <= 0.0 {
                return Err(AlgoError::Invalid(format!(
                    "the IS cap must be > 0, got {cap}"
                )));
            }
            let lr = log_ratio.detach();
            let over = lr.gt(cap.ln())?;
            // sg(min(r, C) / r) = exp(min(0, ln C − ln r)): 1 below the cap, C / r above it,
            // finite wherever r underflows.
            let scale = lr.affine(-1.0, cap.ln())?.minimum(0.0)?.exp()?;
            let l = ratio.mul(&scale)?.mul(&adv)?.neg()?;
            (l, masked_total(&over, x.mask)?)
        }
    };
    let (per_token, weight_sum) = match x.behaviour {
        None => (per_token, zero(x.mask)?),
        Some((behaviour, c)) => {
            if behaviour.dims() != [b, t] {
                return Err(AlgoError::Invalid(format!(
                    "behaviour log-probs have shape {:?}",
                    behaviour.dims()
                )));
            }
            if c <= 0.0 {
                return Err(AlgoError::Invalid(format!(
                    "the TIS cap must be > 0, got {c}"
                )));
            }
            // min(exp(old − behaviour), C) in log space.
            let w = (&old - behaviour.to_dtype(dtype)?.detach())?
                .clamp(-LOG_RATIO_BOUND, c.ln())?
                .exp()?;
            let sum = masked_total(&w, x.mask)?;
            (per_token.mul(&w)?, sum)
        }
    };
    Ok(LossOutput {
        per_token,
        clipped,
        behaviour_weight: weight_sum,
    })
}

/// An f64 scalar 0 on `like`'s device.
fn zero(like: &Tensor) -> Result<Tensor> {
    Ok(Tensor::zeros((), DType::F64, like.device())?)
}
