//! The linear layer `x · wᵀ` on the CPU in f32: the graph-free skinny product for a few rows
//! (decode steps, short prefills; see [`super::skinny`]) and, otherwise, one [`Linear`] graph node
//! over the `gemm` crate with its backward.

use candle_core::{CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};

use super::gemm::{gemm_par, uninit, View};
use super::storage::{cpu_f32, slice, with3};

/// `x · wᵀ` for `x` `[.., k]` and `w` `[n, k]` (a linear layer without bias) as one graph node:
/// the matmul spelling records reshape, transpose and matmul nodes, each of which costs a zeroed
/// gradient buffer and an add in the backward, and zero-fills its output before the product.
pub(crate) struct Linear;

impl CustomOp2 for Linear {
    fn name(&self) -> &'static str {
        "mtrl-linear"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (x, w) = (slice(s1, l1)?, slice(s2, l2)?);
        let (n, k) = l2.shape().dims2()?;
        if l1.dims().last() != Some(&k) {
            candle_core::bail!("linear: input {:?} for weight {:?}", l1.dims(), l2.dims())
        }
        let m = x.len() / k.max(1);
        let mut out = uninit(m * n);
        // SAFETY: `x` is `[m, k]`, `w` `[n, k]` (read transposed), `out` `[m, n]`.
        unsafe {
            let (xv, wt) = (View::rows(x.as_ptr(), k), View::rows_t(w.as_ptr(), k));
            gemm_par(m, n, k, out.as_mut_ptr(), n, false, xv, wt);
        }
        let mut dims = l1.dims().to_vec();
        if let Some(last) = dims.last_mut() {
            *last = n;
        }
        Ok((CpuStorage::F32(out), Shape::from(dims)))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (n, k) = w.dims2()?;
        // A frozen weight (LoRA's base) or an input without a graph gets no gradient: no product.
        let (want_dx, want_dw) = (x.track_op(), w.track_op());
        let (dx, dw) = with3(x, w, grad, |x, w, g| {
            let m = x.len() / k.max(1);
            let mut dx = if want_dx { uninit(m * k) } else { Vec::new() };
            let mut dw = if want_dw { uninit(n * k) } else { Vec::new() };
            // SAFETY: `g` is `[m, n]`, `w` `[n, k]`, `x` `[m, k]`; `dx` `[m, k]`, `dw` `[n, k]`.
            unsafe {
                if want_dx {
                    let gv = View::rows(g.as_ptr(), n);
                    gemm_par(
                        m,
                        k,
                        n,
                        dx.as_mut_ptr(),
                        k,
                        false,
                        gv,
                        View::rows(w.as_ptr(), k),
                    );
                }
                if want_dw {
                    let gt = View::rows_t(g.as_ptr(), n);
                    gemm_par(
                        n,
                        k,
                        m,
                        dw.as_mut_ptr(),
                        k,
                        false,
                        gt,
                        View::rows(x.as_ptr(), k),
                    );
                }
            }
            (dx, dw)
        })?;
        let dx = match want_dx {
            true => Some(Tensor::from_vec(dx, x.shape(), x.device())?),
            false => None,
        };
        let dw = match want_dw {
            true => Some(Tensor::from_vec(dw, w.shape(), w.device())?),
            false => None,
        };
        Ok((dx, dw))
    }
}

/// `x` `[m, k]` · `w` `[n, k]`ᵀ through [`super::skinny`] (no graph).
pub(crate) fn skinny(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let (m, k) = x.dims2()?;
    let n = w.dim(0)?;
    let (x, w) = (x.contiguous()?, w.contiguous()?);
    let mut out = vec![0f32; m * n];
    {
        let (xs, xl) = x.storage_and_layout();
        let (ws, wl) = w.storage_and_layout();
        let xs = &cpu_f32(&xs)?[xl.start_offset()..][..m * k];
        let ws = &cpu_f32(&ws)?[wl.start_offset()..][..n * k];
        super::skinny::matmul_t(xs, ws, m, n, k, &mut out);
    }
    Tensor::from_vec(out, (m, n), x.device())
}
