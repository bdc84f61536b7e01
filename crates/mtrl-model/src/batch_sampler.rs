//! TEMPORARY host stand-in (replaced by the device sampler from the `device-sampler` branch).

use candle_core::Tensor;

use crate::error::Result;
use crate::sampler::{sample_with, SamplingParams};

/// One row's result.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Drawn {
    pub token: u32,
    pub logprob: f32,
    pub logprob_truncated: f32,
}

pub fn sample_rows(
    logits: &Tensor,
    params: &[&SamplingParams],
    uniforms: &[f64],
) -> Result<Vec<Drawn>> {
    let rows = logits.to_vec2::<f32>()?;
    Ok(rows
        .iter()
        .zip(params)
        .zip(uniforms)
        .map(|((r, p), &u)| {
            let s = sample_with(r, p, u);
            Drawn {
                token: s.token,
                logprob: s.logprob,
                logprob_truncated: s.logprob,
            }
        })
        .collect())
}
