//! The layer pieces of the decoder: linear layers (with the skinny and fused CPU paths), RMSNorm,
//! softmax and RoPE, each in its inference spelling (candle's fused kernels, no backward) and its
//! training spelling (differentiable; hand-written CPU kernels with backward where they apply).

use candle_core::{DType, Device, Module, Result, Tensor, D};

use super::{cpu_f32, fused, fused_cpu, WeightFn};
use crate::config::Config;

#[derive(Debug, Clone)]
pub(super) struct Linear {
    pub w: Tensor,
    pub b: Option<Tensor>,
}

impl Linear {
    pub fn load(
        get: &WeightFn,
        name: &str,
        out: usize,
        inp: usize,
        bias: bool,
    ) -> crate::error::Result<Self> {
        Ok(Self {
            w: get(&format!("{name}.weight"), &[out, inp])?,
            b: if bias {
                Some(get(&format!("{name}.bias"), &[out])?)
            } else {
                None
            },
        })
    }
}

impl Module for Linear {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let dims = x.dims().to_vec();
        let inp = dims[dims.len() - 1];
        let rows = x.elem_count() / inp;
        let y = if rows <= crate::skinny::MAX_ROWS
            && fused_cpu(x)
            && !x.track_op()
            && !self.w.track_op()
        {
            skinny_linear(&x.reshape((rows, inp))?, &self.w)?
        } else if fused_cpu(x) && self.w.dtype() == DType::F32 {
            // One graph node, no reshapes: the op keeps the leading dims.
            let (x, w) = (x.contiguous()?, self.w.contiguous()?);
            let y = if x.track_op() || w.track_op() {
                x.apply_op2(&w, fused::Linear)?
            } else {
                x.apply_op2_no_bwd(&w, &fused::Linear)?
            };
            return match &self.b {
                Some(b) => y.broadcast_add(b),
                None => Ok(y),
            };
        } else {
            x.reshape((rows, inp))?.matmul(&self.w.t()?)?
        };
        let y = match &self.b {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        };
        let mut out = dims;
        let last = out.len() - 1;
        out[last] = self.w.dim(0)?;
        y.reshape(out)
    }
}

/// `x` `[m, k]` · `w` `[n, k]`ᵀ through [`crate::skinny`] (CPU, f32, no graph).
fn skinny_linear(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let (m, k) = x.dims2()?;
    let n = w.dim(0)?;
    let (x, w) = (x.contiguous()?, w.contiguous()?);
    let mut out = vec![0f32; m * n];
    {
        let (xs, xl) = x.storage_and_layout();
        let (ws, wl) = w.storage_and_layout();
        let xs = &cpu_f32(&xs)?[xl.start_offset()..][..m * k];
        let ws = &cpu_f32(&ws)?[wl.start_offset()..][..n * k];
        crate::skinny::matmul_t(xs, ws, m, n, k, &mut out);
    }
    Tensor::from_vec(out, (m, n), x.device())
}

pub(super) fn rms_norm(x: &Tensor, w: &Tensor, eps: f64, differentiable: bool) -> Result<Tensor> {
    if !differentiable {
        return candle_nn::ops::rms_norm(&x.contiguous()?, w, eps as f32);
    }
    if fused_cpu(x) {
        return x
            .contiguous()?
            .apply_op2(w, fused::RmsNorm { eps: eps as f32 });
    }
    let dtype = x.dtype();
    let x = x.to_dtype(DType::F32)?;
    let var = x.sqr()?.mean_keepdim(D::Minus1)?;
    let normed = x.broadcast_div(&(var + eps)?.sqrt()?)?;
    normed.to_dtype(dtype)?.broadcast_mul(w)
}

/// Softmax over the last dimension; the max is detached (it cancels in the gradient).
pub(super) fn softmax(x: &Tensor, differentiable: bool) -> Result<Tensor> {
    if !differentiable {
        return candle_nn::ops::softmax_last_dim(&x.contiguous()?);
    }
    let m = x.max_keepdim(D::Minus1)?.detach();
    let e = x.broadcast_sub(&m)?.exp()?;
    e.broadcast_div(&e.sum_keepdim(D::Minus1)?)
}

/// RoPE tables, `[max_positions, head_dim / 2]`.
#[derive(Debug, Clone)]
pub(super) struct Rope {
    cos: Tensor,
    sin: Tensor,
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

    /// cos/sin for flat positions, shaped `[b, t, head_dim/2]`.
    pub fn gather(&self, positions: &Tensor) -> Result<(Tensor, Tensor)> {
        let (b, t) = positions.dims2()?;
        let flat = positions.flatten_all()?;
        let cos = self.cos.index_select(&flat, 0)?;
        let half = cos.dim(1)?;
        let sin = self.sin.index_select(&flat, 0)?;
        Ok((cos.reshape((b, t, half))?, sin.reshape((b, t, half))?))
    }
}

/// `x`: `[b, h, t, d]`; `cos`/`sin`: `[b, t, d/2]`.
pub(super) fn apply_rope(
    x: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
    differentiable: bool,
) -> Result<Tensor> {
    if !differentiable {
        return candle_nn::rotary_emb::rope(&x.contiguous()?, cos, sin);
    }
    if fused_cpu(x) {
        return x.contiguous()?.apply_op1(fused::Rope {
            cos: cos.contiguous()?,
            sin: sin.contiguous()?,
            sign: 1.0,
        });
    }
    let d = x.dim(D::Minus1)?;
    let cos = Tensor::cat(&[cos, cos], D::Minus1)?.unsqueeze(1)?;
    let sin = Tensor::cat(&[sin, sin], D::Minus1)?.unsqueeze(1)?;
    let x1 = x.narrow(D::Minus1, 0, d / 2)?;
    let x2 = x.narrow(D::Minus1, d / 2, d / 2)?;
    let rot = Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)?;
    x.broadcast_mul(&cos)? + rot.broadcast_mul(&sin)?
}
