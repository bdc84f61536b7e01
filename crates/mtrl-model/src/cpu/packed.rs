//! The attention half of a decoder layer on the CPU training path, over one packed projection.
//!
//! The elementary spelling projects q, k and v separately, reshapes them, normalises q and k per
//! head, transposes all three to head-major, makes them contiguous and rotates q and k: some
//! fifteen graph nodes, each of which costs a zeroed gradient buffer and an add in the backward.
//! Here the layer multiplies by the concatenated `[q; k; v]` weights once ([`super::linear::Linear`]),
//! [`QkvPrep`] turns the `[b, t, (heads + 2·kv)·d]` product into head-major `[b, heads + 2·kv, t, d]`
//! with q/k RMSNorm and RoPE applied (one node), and [`PackedAttention`] attends over that buffer
//! directly (one node). The arithmetic per element is that of `norm_rope::RmsNorm` and `norm_rope::Rope`.

use candle_core::{CpuStorage, CustomOp1, CustomOp2, DType, Layout, Result, Shape, Tensor};

use super::attn::{Dims, MaskedAttention};
use super::gemm::uninit;
use super::linear::Linear;
use super::pool::{for_units, SharedPtr};
use super::storage::{slice, with2, with3};
use crate::transformer::VarLen;

/// The training self-attention of `a` over normed `h` `[b, t, hidden]` under `mask`, before
/// `o_proj`: one product with the concatenated q/k/v weights, one [`QkvPrep`] node, one
/// [`PackedAttention`] node. Returns `[b, t, heads · d]`.
pub(crate) fn self_attention(
    a: &crate::transformer::Attention,
    h: &Tensor,
    rope: &crate::transformer::Angles,
    mask: &Tensor,
) -> Result<Tensor> {
    attend(a, &prep(a, h, rope)?, mask)
}

/// Packed rows ([`VarLen`]) `h` `[1, T, hidden]`: the q/k/v product over the packed tokens,
/// spread to the padded layout for [`QkvPrep`] (`rope`: that layout's angles) and the attention,
/// gathered back. Returns `[1, T, heads · d]`, before `o_proj`.
pub(crate) fn varlen_self_attention(
    a: &crate::transformer::Attention,
    h: &Tensor,
    rope: &crate::transformer::Angles,
    v: &VarLen,
) -> Result<Tensor> {
    let p = prep_heads(a, &v.spread(&product(a, h)?)?, rope)?;
    v.gather(&attend(a, &p, v.mask()?)?)
}

/// The q/k/v product of normed `h` `[b, t, hidden]` with norms and RoPE applied, head-major:
/// `[b, heads + 2·kv, t, d]`.
fn prep(
    a: &crate::transformer::Attention,
    h: &Tensor,
    rope: &crate::transformer::Angles,
) -> Result<Tensor> {
    prep_heads(a, &product(a, h)?, rope)
}

/// `h · [q; k; v]ᵀ` (+ LoRA deltas and biases): `[b, t, (heads + 2·kv)·d]`.
fn product(a: &crate::transformer::Attention, h: &Tensor) -> Result<Tensor> {
    let w = Tensor::cat(&[&a.q.w, &a.k.w, &a.v.w], 0)?;
    let mut qkv = h.contiguous()?.apply_op2(&w, Linear)?;
    let parts = [&a.q, &a.k, &a.v];
    if let Some(d) = crate::transformer::lora::packed_delta(&parts, h, &super::backend::product)? {
        qkv = (qkv + d)?;
    }
    if let (Some(qb), Some(kb), Some(vb)) = (&a.q.b, &a.k.b, &a.v.b) {
        qkv = qkv.broadcast_add(&Tensor::cat(&[qb, kb, vb], 0)?)?;
    }
    Ok(qkv)
}

/// [`QkvPrep`] of a q/k/v product `[b, t, (heads + 2·kv)·d]` under `rope` (`[b, t, d/2]`).
fn prep_heads(
    a: &crate::transformer::Attention,
    qkv: &Tensor,
    rope: &crate::transformer::Angles,
) -> Result<Tensor> {
    let d = a.head_dim;
    let norms = match (&a.q_norm, &a.k_norm) {
        (Some(qn), Some(kn)) => Some(Tensor::cat(&[qn, kn], 0)?),
        _ => None,
    };
    let prep = QkvPrep {
        heads: a.heads,
        kv: a.kv_heads,
        d,
        eps: a.eps as f32,
        norm: norms.is_some(),
        cos: rope.cos.contiguous()?,
        sin: rope.sin.contiguous()?,
    };
    let norms = match norms {
        Some(n) => n,
        None => Tensor::ones(2 * d, DType::F32, qkv.device())?,
    };
    qkv.contiguous()?.apply_op2(&norms, prep)
}

/// [`PackedAttention`] of a prepared `[b, heads + 2·kv, t, d]` buffer under `mask`.
fn attend(a: &crate::transformer::Attention, p: &Tensor, mask: &Tensor) -> Result<Tensor> {
    let scale = (1.0 / (a.head_dim as f64).sqrt()) as f32;
    p.apply_op1(PackedAttention {
        heads: a.heads,
        kv: a.kv_heads,
        inner: MaskedAttention::new(scale, mask.contiguous()?, true),
    })
}

/// Largest head size the kernels take (they keep one head row on the stack).
pub(crate) const MAX_HEAD_DIM: usize = 512;

/// `[b, t, (heads + 2·kv)·d]` → `[b, heads + 2·kv, t, d]`: q heads, then k heads (both RMS-normed
/// with their `[d]` weights when `norm`, then rotated), then v heads (copied). The second input is
/// `[q_norm; k_norm]` (`[2d]`; ignored, and given no gradient, when `norm` is false).
pub(crate) struct QkvPrep {
    pub heads: usize,
    pub kv: usize,
    pub d: usize,
    pub eps: f32,
    pub norm: bool,
    /// `[b, t, d/2]` each, contiguous.
    pub cos: Tensor,
    pub sin: Tensor,
}

impl QkvPrep {
    fn tables<R>(&self, f: impl FnOnce(&[f32], &[f32]) -> Result<R>) -> Result<R> {
        with2(&self.cos, &self.sin, f)?
    }

    fn dims(&self, l: &Layout) -> Result<(usize, usize, usize)> {
        let (b, t, w) = l.shape().dims3()?;
        let nh = self.heads + 2 * self.kv;
        if w != nh * self.d {
            candle_core::bail!("qkv prep: width {w}, expected {}", nh * self.d)
        }
        Ok((b, t, nh))
    }
}

impl CustomOp2 for QkvPrep {
    fn name(&self) -> &'static str {
        "mtrl-qkv-prep"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (x, nw) = (slice(s1, l1)?, slice(s2, l2)?);
        let (b, t, nh) = self.dims(l1)?;
        let (d, half, heads, kv) = (self.d, self.d / 2, self.heads, self.kv);
        if nw.len() != 2 * d {
            candle_core::bail!("qkv prep: norm weights {:?}", l2.dims())
        }
        let mut out = uninit(x.len());
        let o = SharedPtr::of(&mut out);
        self.tables(|cos, sin| {
            for_units(b * nh, |u| {
                let (bi, j) = (u / nh, u % nh);
                let w = &nw[if j < heads { 0 } else { d }..][..d];
                for i in 0..t {
                    let src = &x[((bi * t + i) * nh + j) * d..][..d];
                    // SAFETY: row `(bi, j, i)` of the output belongs to this unit only.
                    let dst = unsafe { o.slice_mut(((bi * nh + j) * t + i) * d, d) };
                    if j >= heads + kv {
                        dst.copy_from_slice(src);
                        continue;
                    }
                    let mut y = [0f32; MAX_HEAD_DIM];
                    let y = &mut y[..d];
                    if self.norm {
                        let ms = src.iter().map(|v| v * v).sum::<f32>() / d as f32;
                        let inv = 1.0 / (ms + self.eps).sqrt();
                        for ((ye, &xe), &we) in y.iter_mut().zip(src).zip(w) {
                            *ye = xe * inv * we;
                        }
                    } else {
                        y.copy_from_slice(src);
                    }
                    let c = &cos[(bi * t + i) * half..][..half];
                    let s = &sin[(bi * t + i) * half..][..half];
                    let (y1, y2) = y.split_at(half);
                    let (o1, o2) = dst.split_at_mut(half);
                    for k in 0..half {
                        o1[k] = y1[k] * c[k] - y2[k] * s[k];
                        o2[k] = y2[k] * c[k] + y1[k] * s[k];
                    }
                }
            });
            Ok(())
        })?;
        Ok((CpuStorage::F32(out), Shape::from((b, nh, t, d))))
    }

    fn bwd(
        &self,
        x: &Tensor,
        nw: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (b, t, nh) = self.dims(x.layout())?;
        let (d, half, heads, kv) = (self.d, self.d / 2, self.heads, self.kv);
        let (dx, part) = with3(x, nw, grad, |xd, wd, gd| -> Result<(Vec<f32>, Vec<f32>)> {
            let mut dx = uninit(xd.len());
            // Per unit: its rows' contribution to the norm weight gradient.
            let mut part = vec![0f32; b * nh * d];
            let (o, po) = (SharedPtr::of(&mut dx), SharedPtr::of(&mut part));
            self.tables(|cos, sin| {
                for_units(b * nh, |u| {
                    let (bi, j) = (u / nh, u % nh);
                    let w = &wd[if j < heads { 0 } else { d }..][..d];
                    // SAFETY: the unit's slot of `part` and its rows of `dx` belong to it only.
                    let dw = unsafe { po.slice_mut(u * d, d) };
                    for i in 0..t {
                        let g = &gd[((bi * nh + j) * t + i) * d..][..d];
                        // SAFETY: as above.
                        let dst = unsafe { o.slice_mut(((bi * t + i) * nh + j) * d, d) };
                        if j >= heads + kv {
                            dst.copy_from_slice(g);
                            continue;
                        }
                        // Rotate the gradient back (RoPE with the negated angle).
                        let c = &cos[(bi * t + i) * half..][..half];
                        let s = &sin[(bi * t + i) * half..][..half];
                        let mut gr = [0f32; MAX_HEAD_DIM];
                        let gr = &mut gr[..d];
                        let (g1, g2) = g.split_at(half);
                        let (r1, r2) = gr.split_at_mut(half);
                        for k in 0..half {
                            r1[k] = g1[k] * c[k] + g2[k] * s[k];
                            r2[k] = g2[k] * c[k] - g1[k] * s[k];
                        }
                        if !self.norm {
                            dst.copy_from_slice(gr);
                            continue;
                        }
                        let xr = &xd[((bi * t + i) * nh + j) * d..][..d];
                        let ms = xr.iter().map(|v| v * v).sum::<f32>() / d as f32;
                        let inv = 1.0 / (ms + self.eps).sqrt();
                        let mut dot = 0f32;
                        for ((&xe, &ge), (&we, dwe)) in
                            xr.iter().zip(&*gr).zip(w.iter().zip(&mut *dw))
                        {
                            let xh = xe * inv;
                            *dwe += ge * xh;
                            dot += ge * we * xh;
                        }
                        let dot = dot / d as f32;
                        for ((oe, &xe), (&ge, &we)) in dst.iter_mut().zip(xr).zip(gr.iter().zip(w))
                        {
                            *oe = inv * (ge * we - xe * inv * dot);
                        }
                    }
                });
                Ok(())
            })?;
            Ok((dx, part))
        })??;
        let dev = x.device();
        let dx = Tensor::from_vec(dx, x.shape(), dev)?;
        if !self.norm {
            return Ok((Some(dx), None));
        }
        let mut dnw = vec![0f32; 2 * d];
        for u in 0..b * nh {
            let j = u % nh;
            if j >= heads + kv {
                continue;
            }
            let dst = &mut dnw[if j < heads { 0 } else { d }..][..d];
            for (a, &p) in dst.iter_mut().zip(&part[u * d..][..d]) {
                *a += p;
            }
        }
        Ok((Some(dx), Some(Tensor::from_vec(dnw, 2 * d, dev)?)))
    }
}

/// [`MaskedAttention`] over the head-major packed buffer of [`QkvPrep`] (`[b, heads + 2·kv, t,
/// d]`, keys = queries): output `[b, t, heads · d]`; the backward returns the packed gradient.
pub(crate) struct PackedAttention {
    pub heads: usize,
    pub kv: usize,
    pub inner: MaskedAttention,
}

impl PackedAttention {
    fn dims(&self, l: &Layout) -> Result<Dims> {
        let (b, nh, t, d) = l.shape().dims4()?;
        if nh != self.heads + 2 * self.kv || self.kv == 0 || !self.heads.is_multiple_of(self.kv) {
            candle_core::bail!("packed attention: {:?} for {} heads", l.dims(), self.heads)
        }
        Ok(Dims {
            qbs: nh * t * d,
            kbs: nh * t * d,
            b,
            heads: self.heads,
            kv: self.kv,
            t,
            s: t,
            d,
        })
    }
}

impl CustomOp1 for PackedAttention {
    fn name(&self) -> &'static str {
        "mtrl-packed-attention"
    }

    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = slice(s1, l1)?;
        let dm = self.dims(l1)?;
        let (kq, vq) = (dm.heads * dm.t * dm.d, (dm.heads + dm.kv) * dm.t * dm.d);
        let out = self.inner.with_mask(|m, md| {
            if md != [dm.b, 1, dm.t, dm.t] {
                candle_core::bail!("packed attention: mask {md:?} for {:?}", l1.dims())
            }
            Ok(self.inner.forward(x, &x[kq..], &x[vq..], m, dm))
        })?;
        let (b, t, hd) = (dm.b, dm.t, dm.heads * dm.d);
        Ok((CpuStorage::F32(out), Shape::from((b, t, hd))))
    }

    fn bwd(&self, x: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let dm = self.dims(x.layout())?;
        let (kq, vq) = (dm.heads * dm.t * dm.d, (dm.heads + dm.kv) * dm.t * dm.d);
        let dx = with2(x, grad, |xd, gd| -> Result<Vec<f32>> {
            // Key and value gradients accumulate, so the buffer starts at zero.
            let mut dx = vec![0f32; xd.len()];
            let p = SharedPtr::of(&mut dx);
            // SAFETY: the offsets stay inside `dx` (q, k and v blocks of every sequence).
            let (dq, dk, dv) = unsafe { (p, p.add(kq), p.add(vq)) };
            self.inner
                .backward(xd, &xd[kq..], &xd[vq..], gd, dm, dq, dk, dv)?;
            Ok(dx)
        })??;
        Ok(Some(Tensor::from_vec(dx, x.shape(), x.device())?))
    }
}
