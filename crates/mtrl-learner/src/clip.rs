//! Global gradient-norm clipping (torch `clip_grad_norm_` semantics): total = sqrt(Σ‖g‖²) over
//! unique parameters (a tied embedding counts once, its gradient holding both uses), and every
//! gradient is scaled by min(1, max_norm / (total + 1e-6)). Also the accumulation of micro-batch
//! gradients by parameter name that the RL update and the SFT step share.

use std::collections::BTreeMap;

use candle_core::backprop::GradStore;
use candle_core::{DType, Tensor, Var};

use crate::error::Result;

/// The global L2 norm of the gradients: each tensor's sum of squares (in f64) on its device, all
/// of them summed there, one read back (not one wait per parameter).
pub fn global_norm(grads: &BTreeMap<String, Tensor>) -> Result<f64> {
    let sums = grads
        .values()
        .map(|g| g.to_dtype(DType::F64)?.sqr()?.sum_all())
        .collect::<candle_core::Result<Vec<_>>>()?;
    if sums.is_empty() {
        return Ok(0.0);
    }
    let sq = mtrl_model::host::scalar::<f64>(&Tensor::stack(&sums, 0)?.sum_all()?)?;
    Ok(sq.sqrt())
}

/// Scales `grads` in place so that their global norm is at most `max_norm`; returns
/// `(norm before clipping, coefficient applied)`. A non-finite norm is returned as is and the
/// gradients are left untouched (the caller skips the step).
pub fn clip_global_norm(grads: &mut BTreeMap<String, Tensor>, max_norm: f64) -> Result<(f64, f64)> {
    let total = global_norm(grads)?;
    if !total.is_finite() {
        return Ok((total, 1.0));
    }
    let coef = (max_norm / (total + 1e-6)).min(1.0);
    if coef < 1.0 {
        for g in grads.values_mut() {
            *g = (&*g * coef)?;
        }
    }
    Ok((total, coef))
}

/// Adds the gradients `g` holds for `params` into `acc`, by parameter name, in `dtype`
/// (`train.grad_accumulation`: f32 by default, f64 for sums exact in any order).
pub(crate) fn accumulate(
    acc: &mut BTreeMap<String, Tensor>,
    params: &BTreeMap<String, Var>,
    g: &GradStore,
    dtype: DType,
) -> Result<()> {
    for (name, var) in params {
        if let Some(gr) = g.get(var.as_tensor()) {
            let gr = gr.to_dtype(dtype)?;
            let sum = match acc.remove(name) {
                Some(prev) => (prev + gr)?,
                None => gr,
            };
            acc.insert(name.clone(), sum);
        }
    }
    Ok(())
}

/// The global norm before clipping; clips to `max_norm` when it is > 0 (0 = no clipping).
pub(crate) fn clip_or_norm(grads: &mut BTreeMap<String, Tensor>, max_norm: f64) -> Result<f64> {
    if max_norm > 0.0 {
        Ok(clip_global_norm(grads, max_norm)?.0)
    } else {
        global_norm(grads)
    }
}
