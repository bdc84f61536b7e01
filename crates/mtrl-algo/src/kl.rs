//! KL penalty to a frozen reference policy, per token: the k3 estimator
//! exp(ref − logp) − (ref − logp) − 1 (unbiased, always ≥ 0), as used by GRPO.
//!
//! Guards as verl's `kl_penalty("low_var_kl")`: ref − logp is clamped to ±20 before `exp` and
//! the estimate to at most 10, so one far-off token cannot dominate (or overflow) the penalty.

use candle_core::Tensor;

use crate::error::Result;

/// Per-token k3 KL estimate; the gradient flows through `logp` only.
pub fn kl_k3(logp: &Tensor, ref_logp: &Tensor) -> Result<Tensor> {
    let d = (ref_logp.detach() - logp)?.clamp(-20.0, 20.0)?;
    Ok(((d.exp()? - &d)? - 1.0)?.minimum(10.0)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    #[test]
    fn k3_values_and_gradient() {
        // Hand-worked: d = ref − logp = 0.5 → e^0.5 − 0.5 − 1 = 0.148721270700128.
        let logp = Var::new(&[-1.0f64, -2.0], &Device::Cpu).unwrap();
        let r = Tensor::new(&[-0.5f64, -2.0], &Device::Cpu).unwrap();
        let kl = kl_k3(logp.as_tensor(), &r).unwrap();
        let v = kl.to_vec1::<f64>().unwrap();
        assert!((v[0] - 0.148721270700128).abs() < 1e-12);
        assert_eq!(v[1], 0.0);
        // d/dlogp = −e^d + 1 → 1 − e^0.5 = −0.6487212707001282.
        let g = kl.sum_all().unwrap().backward().unwrap();
        let g = g.get(logp.as_tensor()).unwrap().to_vec1::<f64>().unwrap();
        assert!((g[0] + 0.6487212707001282).abs() < 1e-12);
        assert_eq!(g[1], 0.0);
    }
}
