//! RoPE tables: cos/sin of every position's angles, computed once per model as transformers does,
//! and gathered once per forward into the rows of that forward's positions ([`Angles`]), which
//! every layer then shares.

use candle_core::{DType, Device, Result, Tensor};

use crate::config::Config;

/// RoPE tables, `[max_positions, head_dim / 2]`.
#[derive(Debug, Clone)]
pub(crate) struct Rope {
    cos: Tensor,
    sin: Tensor,
}

/// cos/sin rows of one forward's positions, `[b, t, head_dim / 2]` each (contiguous).
#[derive(Debug, Clone)]
pub(crate) struct Angles {
    pub cos: Tensor,
    pub sin: Tensor,
}

impl Rope {
    pub fn new(cfg: &Config, dtype: DType, dev: &Device) -> Result<Self> {
        let half = cfg.head_dim / 2;
        // As transformers: inv_freq in f32, angle = f32(pos) * inv_freq in f32, then cos/sin.
        let inv: Vec<f32> = (0..half)
            .map(|i| (1.0 / cfg.rope_theta.powf((2 * i) as f64 / cfg.head_dim as f64)) as f32)
            .collect();
        let n = cfg.max_position_embeddings;
        let mut cos = Vec::with_capacity(n * half);
        let mut sin = Vec::with_capacity(n * half);
        for p in 0..n {
            for f in &inv {
                let a = (p as f32 * f) as f64;
                cos.push(a.cos() as f32);
                sin.push(a.sin() as f32);
            }
        }
        Ok(Self {
            cos: Tensor::from_vec(cos, (n, half), dev)?.to_dtype(dtype)?,
            sin: Tensor::from_vec(sin, (n, half), dev)?.to_dtype(dtype)?,
        })
    }

    /// The rows of `positions` (`[b, t]` u32).
    pub fn gather(&self, positions: &Tensor) -> Result<Angles> {
        let (b, t) = positions.dims2()?;
        let flat = positions.flatten_all()?;
        let cos = self.cos.index_select(&flat, 0)?;
        let half = cos.dim(1)?;
        let sin = self.sin.index_select(&flat, 0)?;
        Ok(Angles {
            cos: cos.reshape((b, t, half))?,
            sin: sin.reshape((b, t, half))?,
        })
    }
}

/// RoPE of `x` spelled with candle ops (every op records a backward: candle's fused RoPE has
/// none): rotate-half of the last dimension, with `cos`/`sin` `[b, t, d / 2]` broadcast over the
/// head axis `head_axis` of `x` (1 for `[b, heads, t, d]`, 2 for token-major `[b, t, heads, d]`).
pub(crate) fn spelled(x: &Tensor, cos: &Tensor, sin: &Tensor, head_axis: usize) -> Result<Tensor> {
    let d = x.dim(candle_core::D::Minus1)?;
    let cos = Tensor::cat(&[cos, cos], candle_core::D::Minus1)?.unsqueeze(head_axis)?;
    let sin = Tensor::cat(&[sin, sin], candle_core::D::Minus1)?.unsqueeze(head_axis)?;
    let x1 = x.narrow(candle_core::D::Minus1, 0, d / 2)?;
    let x2 = x.narrow(candle_core::D::Minus1, d / 2, d / 2)?;
    let rot = Tensor::cat(&[&x2.neg()?, &x1], candle_core::D::Minus1)?;
    x.broadcast_mul(&cos)? + rot.broadcast_mul(&sin)?
}
