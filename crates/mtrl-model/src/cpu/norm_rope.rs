//! RMSNorm and RoPE on the CPU in f32 for the training graph, each one node with its backward
//! where the elementary spelling records five to ten. (Inference uses candle's fused kernels,
//! which have no backward.) Both are checked against the PyTorch goldens, values and gradients.

use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Result, Shape, Tensor};

use super::gemm::uninit;
use super::pool::{for_rows, par_rows, SharedPtr};
use super::storage::{slice, with2, with3};

fn new_vec(n: usize) -> Vec<f32> {
    vec![0f32; n]
}

/// RMSNorm over the last dimension with weight `w`.
pub(crate) struct RmsNorm {
    pub eps: f32,
}

impl CustomOp2 for RmsNorm {
    fn name(&self) -> &'static str {
        "mtrl-rms-norm"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (x, w) = (slice(s1, l1)?, slice(s2, l2)?);
        let d = w.len();
        let mut out = new_vec(x.len());
        let eps = self.eps;
        par_rows(&mut out, d, |r, o| {
            let x = &x[r * d..][..d];
            let ms = x.iter().map(|v| v * v).sum::<f32>() / d as f32;
            let inv = 1.0 / (ms + eps).sqrt();
            for ((oe, &xe), &we) in o.iter_mut().zip(x).zip(w) {
                *oe = xe * inv * we;
            }
        });
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let d = w.elem_count();
        let eps = self.eps;
        let (dx, dw) = with3(x, w, grad, |x, w, g| {
            let rows = x.len() / d.max(1);
            let mut dx = uninit(x.len());
            // Fixed blocks of rows, each with its own share of `dw` (summed in block order after),
            // so the result does not depend on the thread count.
            const BLOCK: usize = 64;
            let blocks = rows.div_ceil(BLOCK);
            let mut part = vec![0f32; blocks * d];
            let dxp = SharedPtr::of(&mut dx);
            for_rows(&mut part, d, 2 * d, |bi, dw| {
                for r in bi * BLOCK..((bi + 1) * BLOCK).min(rows) {
                    let (x, g) = (&x[r * d..][..d], &g[r * d..][..d]);
                    // SAFETY: row `r` of `dx` is written by this block only; `dx` outlives the call.
                    let o = unsafe { dxp.slice_mut(r * d, d) };
                    let ms = x.iter().map(|v| v * v).sum::<f32>() / d as f32;
                    let inv = 1.0 / (ms + eps).sqrt();
                    // dot = Σ g·w·x̂ / d
                    let mut dot = 0f32;
                    for ((&xe, &ge), (&we, dwe)) in x.iter().zip(g).zip(w.iter().zip(dw.iter_mut()))
                    {
                        let xh = xe * inv;
                        *dwe += ge * xh;
                        dot += ge * we * xh;
                    }
                    let dot = dot / d as f32;
                    for ((oe, &xe), (&ge, &we)) in o.iter_mut().zip(x).zip(g.iter().zip(w)) {
                        *oe = inv * (ge * we - xe * inv * dot);
                    }
                }
            });
            let mut dw = vec![0f32; d];
            for p in part.chunks_exact(d.max(1)) {
                for (a, &b) in dw.iter_mut().zip(p) {
                    *a += b;
                }
            }
            (dx, dw)
        })?;
        Ok((
            Some(Tensor::from_vec(dx, x.shape(), x.device())?),
            Some(Tensor::from_vec(dw, w.shape(), w.device())?),
        ))
    }
}

/// Non-interleaved RoPE (`rotate_half`) of `x` `[b, h, t, d]` with `cos`/`sin` `[b, t, d/2]`;
/// `sign = -1` rotates backwards (the backward pass).
pub(crate) struct Rope {
    pub cos: Tensor,
    pub sin: Tensor,
    pub sign: f32,
}

impl CustomOp1 for Rope {
    fn name(&self) -> &'static str {
        "mtrl-rope"
    }

    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = slice(s1, l1)?;
        let (b, h, t, d) = l1.shape().dims4()?;
        let half = d / 2;
        let sign = self.sign;
        let out = with2(&self.cos, &self.sin, |cos, sin| {
            if cos.len() != b * t * half {
                return Err(candle_core::Error::Msg("rope: table shape".into()));
            }
            let mut out = new_vec(x.len());
            par_rows(&mut out, t * d, |r, o| {
                let bi = r / h;
                let x = &x[r * t * d..][..t * d];
                for ti in 0..t {
                    let c = &cos[(bi * t + ti) * half..][..half];
                    let s = &sin[(bi * t + ti) * half..][..half];
                    let (x1, x2) = x[ti * d..][..d].split_at(half);
                    let (o1, o2) = o[ti * d..][..d].split_at_mut(half);
                    for j in 0..half {
                        let sj = sign * s[j];
                        o1[j] = x1[j] * c[j] - x2[j] * sj;
                        o2[j] = x2[j] * c[j] + x1[j] * sj;
                    }
                }
            });
            Ok(out)
        })??;
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }

    fn bwd(&self, _x: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let back = Rope {
            cos: self.cos.clone(),
            sin: self.sin.clone(),
            sign: -self.sign,
        };
        Ok(Some(grad.contiguous()?.apply_op1_no_bwd(&back)?))
    }
}
