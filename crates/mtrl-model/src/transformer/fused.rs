//! Hand-written CPU (f32) kernels with their backward passes, so that the training graph records
//! one node (and one temporary) where the elementary spelling records five to ten: SwiGLU,
//! RMSNorm and RoPE (the fused attention is in `attn`). Each is checked against the elementary
//! spelling by the PyTorch goldens (values and gradients).

use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Result, Shape, Tensor};

use super::mm::{gemm_par, uninit, View};

use crate::skinny::par_rows;

pub(super) fn slice<'a>(s: &'a CpuStorage, l: &Layout) -> Result<&'a [f32]> {
    let Some((a, b)) = l.contiguous_offsets() else {
        candle_core::bail!("fused kernels need contiguous inputs")
    };
    Ok(&s.as_slice::<f32>()?[a..b])
}

/// Reads contiguous f32 data of CPU tensors.
pub(super) fn with2<R>(a: &Tensor, b: &Tensor, f: impl FnOnce(&[f32], &[f32]) -> R) -> Result<R> {
    let (a, b) = (a.contiguous()?, b.contiguous()?);
    let (sa, la) = a.storage_and_layout();
    let (sb, lb) = b.storage_and_layout();
    let (candle_core::Storage::Cpu(ca), candle_core::Storage::Cpu(cb)) = (&*sa, &*sb) else {
        candle_core::bail!("fused kernels run on the CPU")
    };
    Ok(f(slice(ca, la)?, slice(cb, lb)?))
}

pub(super) fn with3<R>(
    a: &Tensor,
    b: &Tensor,
    c: &Tensor,
    f: impl FnOnce(&[f32], &[f32], &[f32]) -> R,
) -> Result<R> {
    let c = c.contiguous()?;
    let (sc, lc) = c.storage_and_layout();
    let candle_core::Storage::Cpu(cc) = &*sc else {
        candle_core::bail!("fused kernels run on the CPU")
    };
    let cs = slice(cc, lc)?;
    with2(a, b, |a, b| f(a, b, cs))
}

fn new_vec(n: usize) -> Vec<f32> {
    vec![0f32; n]
}

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
        let (dx, dw) = with3(x, w, grad, |x, w, g| {
            let m = x.len() / k.max(1);
            let (mut dx, mut dw) = (uninit(m * k), uninit(n * k));
            // SAFETY: `g` is `[m, n]`, `w` `[n, k]`, `x` `[m, k]`; `dx` `[m, k]`, `dw` `[n, k]`.
            unsafe {
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
            (dx, dw)
        })?;
        Ok((
            Some(Tensor::from_vec(dx, x.shape(), x.device())?),
            Some(Tensor::from_vec(dw, w.shape(), w.device())?),
        ))
    }
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
            crate::vexp::exp_sum_inplace(o);
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
            let du_ptr = du.as_mut_ptr() as usize;
            par_rows(&mut dg, n, |r, o| {
                // SAFETY: row `r` of `du` is written only here; `du` outlives the call.
                let du =
                    unsafe { std::slice::from_raw_parts_mut((du_ptr as *mut f32).add(r * n), n) };
                let (g, u, d) = (&g[r * n..][..n], &u[r * n..][..n], &d[r * n..][..n]);
                for (de, &ge) in du.iter_mut().zip(g) {
                    *de = -ge;
                }
                crate::vexp::exp_sum_inplace(du);
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
            crate::vexp::exp_sum_inplace(o);
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
                crate::vexp::exp_sum_inplace(du);
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
            let dxp = dx.as_mut_ptr() as usize;
            crate::skinny::par_rows_min(&mut part, d, 2 * d, |bi, dw| {
                for r in bi * BLOCK..((bi + 1) * BLOCK).min(rows) {
                    let (x, g) = (&x[r * d..][..d], &g[r * d..][..d]);
                    // SAFETY: row `r` of `dx` is written by this block only; `dx` outlives the call.
                    let o =
                        unsafe { std::slice::from_raw_parts_mut((dxp as *mut f32).add(r * d), d) };
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
