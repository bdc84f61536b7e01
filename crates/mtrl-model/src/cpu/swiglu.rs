//! SwiGLU `silu(g) · u` on the CPU in f32, with its backward: [`SwiGlu`] over separate gate and
//! up projections (inference and the unpacked path), [`SwiGluPacked`] over the one packed
//! `[g | u]` product of the training MLP. One graph node where the elementary spelling records
//! three (silu, its exp, the product), each with a temporary and a backward add.

use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Result, Shape, Tensor};

use super::gemm::uninit;
use super::pool::{par_rows, SharedPtr};
use super::storage::{slice, with2, with3};

fn new_vec(n: usize) -> Vec<f32> {
    vec![0f32; n]
}

/// SwiGLU `silu(g) · u`, elementwise over same-shaped `g`, `u`; `silu(x) = x / (1 + e^(-x))`.
pub(crate) struct SwiGlu;

impl CustomOp2 for SwiGlu {
    fn name(&self) -> &'static str {
        "mtrl-swiglu"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (g, u) = (slice(s1, l1)?, slice(s2, l2)?);
        if l1.dims() != l2.dims() {
            candle_core::bail!("swiglu: {:?} vs {:?}", l1.dims(), l2.dims())
        }
        let n = l1.dims().last().copied().unwrap_or(1).max(1);
        let mut out = new_vec(g.len());
        par_rows(&mut out, n, |r, o| {
            let (g, u) = (&g[r * n..][..n], &u[r * n..][..n]);
            for (oe, &ge) in o.iter_mut().zip(g) {
                *oe = -ge;
            }
            super::vexp::exp_sum_inplace(o);
            for ((oe, &ge), &ue) in o.iter_mut().zip(g).zip(u) {
                *oe = ge / (1.0 + *oe) * ue;
            }
        });
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }

    fn bwd(
        &self,
        g: &Tensor,
        u: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let n = g.dims().last().copied().unwrap_or(1).max(1);
        let (dg, du) = with3(g, u, grad, |g, u, d| {
            let mut dg = new_vec(g.len());
            let mut du = new_vec(g.len());
            let du_ptr = SharedPtr::of(&mut du);
            par_rows(&mut dg, n, |r, o| {
                // SAFETY: row `r` of `du` is written only here; `du` outlives the call.
                let du = unsafe { du_ptr.slice_mut(r * n, n) };
                let (g, u, d) = (&g[r * n..][..n], &u[r * n..][..n], &d[r * n..][..n]);
                for (de, &ge) in du.iter_mut().zip(g) {
                    *de = -ge;
                }
                super::vexp::exp_sum_inplace(du);
                for i in 0..n {
                    let s = 1.0 / (1.0 + du[i]);
                    let silu = g[i] * s;
                    du[i] = d[i] * silu;
                    o[i] = d[i] * u[i] * (s + silu * (1.0 - s));
                }
            });
            (dg, du)
        })?;
        Ok((
            Some(Tensor::from_vec(dg, g.shape(), g.device())?),
            Some(Tensor::from_vec(du, u.shape(), u.device())?),
        ))
    }
}

/// SwiGLU of a packed gate/up projection: row `[g (n) | u (n)]` of `[.., 2n]` → `silu(g) · u`
/// `[.., n]`. The training graph multiplies by the concatenated gate and up weights once (one
/// larger product, one node) instead of twice.
pub(crate) struct SwiGluPacked;

impl CustomOp1 for SwiGluPacked {
    fn name(&self) -> &'static str {
        "mtrl-swiglu-packed"
    }

    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout) -> Result<(CpuStorage, Shape)> {
        let gu = slice(s1, l1)?;
        let n2 = l1.dims().last().copied().unwrap_or(0);
        if n2 % 2 != 0 || n2 == 0 {
            candle_core::bail!("swiglu: packed width {n2} is not even")
        }
        let n = n2 / 2;
        let mut out = uninit(gu.len() / 2);
        par_rows(&mut out, n, |r, o| {
            let (g, u) = gu[r * n2..][..n2].split_at(n);
            for (oe, &ge) in o.iter_mut().zip(g) {
                *oe = -ge;
            }
            super::vexp::exp_sum_inplace(o);
            for ((oe, &ge), &ue) in o.iter_mut().zip(g).zip(u) {
                *oe = ge / (1.0 + *oe) * ue;
            }
        });
        let mut dims = l1.dims().to_vec();
        if let Some(last) = dims.last_mut() {
            *last = n;
        }
        Ok((CpuStorage::F32(out), Shape::from(dims)))
    }

    fn bwd(&self, gu: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let n2 = gu.dims().last().copied().unwrap_or(0);
        let n = n2 / 2;
        let dgu = with2(gu, grad, |gu, d| {
            let mut dgu = uninit(gu.len());
            par_rows(&mut dgu, n2, |r, o| {
                let (g, u) = gu[r * n2..][..n2].split_at(n);
                let d = &d[r * n..][..n];
                let (dg, du) = o.split_at_mut(n);
                for (de, &ge) in du.iter_mut().zip(g) {
                    *de = -ge;
                }
                super::vexp::exp_sum_inplace(du);
                for i in 0..n {
                    let s = 1.0 / (1.0 + du[i]);
                    let silu = g[i] * s;
                    du[i] = d[i] * silu;
                    dg[i] = d[i] * u[i] * (s + silu * (1.0 - s));
                }
            });
            dgu
        })?;
        Ok(Some(Tensor::from_vec(dgu, gu.shape(), gu.device())?))
    }
}
