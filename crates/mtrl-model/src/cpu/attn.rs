//! Fused masked attention for the CPU in f32, with its backward: `softmax(scale · q·kᵀ + mask)·v`
//! in one graph node, computing each query row only over the span of keys its mask lets through
//! (causal rows stop at the diagonal, left padding starts later), so the `[b, h, t, s]` scores of
//! the matmul spelling and the gradients of scores and probabilities are never formed.
//!
//! Exactness: inside a row's span the mask is added as before, and outside it every key has mask
//! value ≤ -1e29, whose probability is exactly 0 in f32 next to any admitted key. A row that admits
//! no key (a padding query) keeps the matmul spelling's result: a uniform softmax over all keys.
//! The probabilities of the admitted spans are kept for the backward (half of `[b, h, t, s]` for a
//! causal batch).
//!
//! Work units are (sequence, KV group): a unit owns its key/value gradients, so the backward needs
//! no atomics; the GQA query heads of a group share the unit's (transposed) keys and values.

use std::sync::Mutex;

use candle_core::{CpuStorage, CustomOp3, Layout, Result, Shape, Tensor};

pub(super) use super::attn_blocks::Dims;
use super::attn_blocks::{spans, Blocks, BLOCK};
use super::gemm::{gemm, uninit, View};
use super::pool::{for_units, SharedPtr};
use super::storage::slice;
use super::vector::{dot, max};

/// Mask entries at or below this are "no attention" (the decoder writes -1e30).
pub(super) const MASKED: f32 = -1.0e29;

/// `softmax(scale · q·kᵀ + mask) · v` for `q` `[b, heads, t, d]`, `k`, `v` `[b, kv, s, d]`,
/// additive `mask` `[b, 1, t, s]` (no gradient); output `[b, t, heads · d]`.
pub(crate) struct MaskedAttention {
    pub scale: f32,
    pub mask: Tensor,
    /// Keep the probabilities for [`CustomOp3::bwd`] (training).
    pub save: bool,
    saved: Mutex<Option<Saved>>,
}

struct Saved {
    /// Probability blocks (see [`Blocks`]), zero outside each row's admitted span.
    p: Vec<f32>,
    blocks: Blocks,
}

impl MaskedAttention {
    pub fn new(scale: f32, mask: Tensor, save: bool) -> Self {
        Self {
            scale,
            mask,
            save,
            saved: Mutex::new(None),
        }
    }
}

struct Fwd<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    m: &'a [f32],
    span: &'a [(usize, usize)],
    blocks: &'a Blocks,
    dims: Dims,
    scale: f32,
}

impl Fwd<'_> {
    /// Unit `(bi, g)`: the heads of KV group `g` of sequence `bi`. Writes `out[bi, :, head]` and
    /// the unit's probability blocks (into `p` when saving, else into a scratch buffer).
    fn run(&self, u: usize, out: SharedPtr, p: Option<SharedPtr>) {
        let Dims {
            heads, kv, t, s, d, ..
        } = self.dims;
        let (bi, g) = (u / kv, u % kv);
        let rep = heads / kv;
        let ko = bi * self.dims.kbs + g * s * d;
        let (kr, vr) = (&self.k[ko..][..s * d], &self.v[ko..][..s * d]);
        let nblk = self.blocks.nblk;
        let mut scratch = if p.is_none() {
            vec![0f32; BLOCK.min(t) * s]
        } else {
            Vec::new()
        };
        for hh in g * rep..(g + 1) * rep {
            for blk in 0..nblk {
                let (i0, i1) = (blk * BLOCK, ((blk + 1) * BLOCK).min(t));
                let (lo, hi) = self.blocks.span[bi * nblk + blk];
                let (nb, w) = (i1 - i0, hi - lo);
                // SAFETY: the block of `p` at this offset belongs to this unit only.
                let pb: &mut [f32] = match p {
                    Some(p) => unsafe {
                        p.slice_mut(self.blocks.off[(bi * heads + hh) * nblk + blk], nb * w)
                    },
                    None => &mut scratch[..nb * w],
                };
                let qb = &self.q[bi * self.dims.qbs + (hh * t + i0) * d..][..nb * d];
                // SAFETY: the views cover `qb` (`[nb, d]`), keys `lo..hi` and `pb` (`[nb, w]`).
                unsafe {
                    let kt = View::rows_t(kr[lo * d..].as_ptr(), d);
                    let qv = View::rows(qb.as_ptr(), d);
                    gemm(nb, w, d, pb.as_mut_ptr(), w, false, qv, kt);
                }
                for (r, row) in pb.chunks_exact_mut(w.max(1)).take(nb).enumerate() {
                    let i = i0 + r;
                    let (rlo, rhi) = self.span[bi * t + i];
                    let (a, bb) = (rlo - lo, rhi - lo);
                    row[..a].fill(0.0);
                    row[bb..].fill(0.0);
                    let sc = &mut row[a..bb];
                    let mrow = &self.m[(bi * t + i) * s + rlo..][..rhi - rlo];
                    for (x, &mm) in sc.iter_mut().zip(mrow) {
                        *x = *x * self.scale + mm;
                    }
                    let mx = max(sc);
                    sc.iter_mut().for_each(|x| *x -= mx);
                    let inv = 1.0 / super::vexp::exp_sum_inplace(sc);
                    sc.iter_mut().for_each(|x| *x *= inv);
                }
                // SAFETY: `out[bi, i0..i1, hh·d..]` belongs to this unit only.
                unsafe {
                    let o = out.get().add((bi * t + i0) * heads * d + hh * d);
                    let pv = View::rows(pb.as_ptr(), w);
                    let vv = View::rows(vr[lo * d..].as_ptr(), d);
                    gemm(nb, d, w, o, heads * d, false, pv, vv);
                }
            }
        }
    }
}

struct Bwd<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    g: &'a [f32],
    saved: &'a Saved,
    dims: Dims,
    scale: f32,
}

impl Bwd<'_> {
    /// Unit `(bi, g)`: writes `dq[bi, heads of g]`, `dk[bi, g]`, `dv[bi, g]` (`dk`, `dv` zeroed).
    fn run(&self, u: usize, dq: SharedPtr, dk: SharedPtr, dv: SharedPtr) {
        let Dims {
            heads, kv, t, s, d, ..
        } = self.dims;
        let (bi, g) = (u / kv, u % kv);
        let rep = heads / kv;
        let ko = bi * self.dims.kbs + g * s * d;
        let (kr, vr) = (&self.k[ko..][..s * d], &self.v[ko..][..s * d]);
        let blocks = &self.saved.blocks;
        let nblk = blocks.nblk;
        let mut ds = vec![0f32; BLOCK.min(t) * s];
        for hh in g * rep..(g + 1) * rep {
            for blk in 0..nblk {
                let (i0, i1) = (blk * BLOCK, ((blk + 1) * BLOCK).min(t));
                let (lo, hi) = blocks.span[bi * nblk + blk];
                let (nb, w) = (i1 - i0, hi - lo);
                let off = blocks.off[(bi * heads + hh) * nblk + blk];
                let p = &self.saved.p[off..][..nb * w];
                let go = self.g[((bi * t + i0) * heads + hh) * d..].as_ptr();
                let qb = &self.q[bi * self.dims.qbs + (hh * t + i0) * d..][..nb * d];
                let ds = &mut ds[..nb * w];
                // SAFETY: every view stays inside its buffer; the `dk`/`dv` rows `lo..hi` of
                // block `(bi, g)` and the `dq` rows of head `hh` belong to this unit only.
                unsafe {
                    let dvb = dv.get().add(ko + lo * d);
                    // dV += Pᵀ · dO
                    gemm(
                        w,
                        d,
                        nb,
                        dvb,
                        d,
                        true,
                        View::rows_t(p.as_ptr(), w),
                        View::rows(go, heads * d),
                    );
                    // dP = dO · Vᵀ
                    let vt = View::rows_t(vr[lo * d..].as_ptr(), d);
                    gemm(
                        nb,
                        w,
                        d,
                        ds.as_mut_ptr(),
                        w,
                        false,
                        View::rows(go, heads * d),
                        vt,
                    );
                }
                for (dsr, pr) in ds.chunks_exact_mut(w.max(1)).zip(p.chunks_exact(w.max(1))) {
                    let c = dot(pr, dsr);
                    for (x, &pe) in dsr.iter_mut().zip(pr) {
                        *x = self.scale * pe * (*x - c);
                    }
                }
                // SAFETY: as above.
                unsafe {
                    let dqb = dq.get().add(bi * self.dims.qbs + (hh * t + i0) * d);
                    let kv_ = View::rows(kr[lo * d..].as_ptr(), d);
                    gemm(nb, d, w, dqb, d, false, View::rows(ds.as_ptr(), w), kv_);
                    let dkb = dk.get().add(ko + lo * d);
                    gemm(
                        w,
                        d,
                        nb,
                        dkb,
                        d,
                        true,
                        View::rows_t(ds.as_ptr(), w),
                        View::rows(qb.as_ptr(), d),
                    );
                }
            }
        }
    }
}

fn dims(lq: &Layout, lk: &Layout, lv: &Layout, lm: &Layout) -> Result<Dims> {
    let (b, heads, t, d) = lq.shape().dims4()?;
    let (kb, kv, s, kd) = lk.shape().dims4()?;
    let (mb, _, mt, ms) = lm.shape().dims4()?;
    if kb != b || kd != d || lv.dims() != lk.dims() || kv == 0 || heads % kv != 0 {
        candle_core::bail!(
            "attention: q {:?} k {:?} v {:?}",
            lq.dims(),
            lk.dims(),
            lv.dims()
        )
    }
    if (mb, mt, ms) != (b, t, s) {
        candle_core::bail!(
            "attention: mask {:?} for q {:?} k {:?}",
            lm.dims(),
            lq.dims(),
            lk.dims()
        )
    }
    Ok(Dims {
        qbs: heads * t * d,
        kbs: kv * s * d,
        b,
        heads,
        kv,
        t,
        s,
        d,
    })
}

impl MaskedAttention {
    /// The `[b, 1, t, s]` mask's data, for [`Self::forward`].
    pub(super) fn with_mask<R>(&self, f: impl FnOnce(&[f32], &[usize]) -> Result<R>) -> Result<R> {
        let mask = self.mask.contiguous()?;
        let (ms, ml) = mask.storage_and_layout();
        let candle_core::Storage::Cpu(mc) = &*ms else {
            candle_core::bail!("attention mask must be on the CPU")
        };
        f(slice(mc, ml)?, ml.dims())
    }

    /// The forward over raw buffers laid out as `dm` says; `m` is the `[b, 1, t, s]` mask.
    /// Returns `[b, t, heads · d]` and keeps the probabilities when saving.
    pub(super) fn forward(&self, q: &[f32], k: &[f32], v: &[f32], m: &[f32], dm: Dims) -> Vec<f32> {
        let Dims { b, heads, t, d, .. } = dm;
        let span = spans(m, b * t, dm.s);
        let blocks = Blocks::new(&span, b, heads, t);
        let mut out = uninit(b * t * heads * d);
        let mut p = uninit(if self.save { blocks.total } else { 0 });
        let fwd = Fwd {
            q,
            k,
            v,
            m,
            span: &span,
            blocks: &blocks,
            dims: dm,
            scale: self.scale,
        };
        let (o, pp) = (SharedPtr::of(&mut out), SharedPtr::of(&mut p));
        let save = self.save;
        for_units(b * dm.kv, |u| fwd.run(u, o, save.then_some(pp)));
        if save {
            *self.saved.lock().unwrap_or_else(|e| e.into_inner()) = Some(Saved { p, blocks });
        }
        out
    }

    /// The backward over raw buffers: writes every element of `dq` and accumulates into `dk`, `dv`
    /// (which the caller zeroes), laid out like `q`, `k`, `v`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn backward(
        &self,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        g: &[f32],
        dm: Dims,
        dq: SharedPtr,
        dk: SharedPtr,
        dv: SharedPtr,
    ) -> Result<()> {
        let guard = self.saved.lock().unwrap_or_else(|e| e.into_inner());
        let Some(saved) = guard.as_ref() else {
            candle_core::bail!("attention backward without saved probabilities")
        };
        let bwd = Bwd {
            q,
            k,
            v,
            g,
            saved,
            dims: dm,
            scale: self.scale,
        };
        for_units(dm.b * dm.kv, |u| bwd.run(u, dq, dk, dv));
        Ok(())
    }
}

impl CustomOp3 for MaskedAttention {
    fn name(&self) -> &'static str {
        "mtrl-masked-attention"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (q, k, v) = (slice(s1, l1)?, slice(s2, l2)?, slice(s3, l3)?);
        let mask = self.mask.contiguous()?;
        let (ms, ml) = mask.storage_and_layout();
        let candle_core::Storage::Cpu(mc) = &*ms else {
            candle_core::bail!("attention mask must be on the CPU")
        };
        let dm = dims(l1, l2, l3, ml)?;
        let out = self.forward(q, k, v, slice(mc, ml)?, dm);
        let Dims { b, heads, t, d, .. } = dm;
        Ok((CpuStorage::F32(out), Shape::from((b, t, heads * d))))
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (q, k, v, grad) = (
            q.contiguous()?,
            k.contiguous()?,
            v.contiguous()?,
            grad.contiguous()?,
        );
        let (sq, lq) = q.storage_and_layout();
        let (sk, lk) = k.storage_and_layout();
        let (sv, lv) = v.storage_and_layout();
        let (sg, lg) = grad.storage_and_layout();
        let (
            candle_core::Storage::Cpu(cq),
            candle_core::Storage::Cpu(ck),
            candle_core::Storage::Cpu(cv),
            candle_core::Storage::Cpu(cg),
        ) = (&*sq, &*sk, &*sv, &*sg)
        else {
            candle_core::bail!("attention backward runs on the CPU")
        };
        let dm = dims(lq, lk, lv, self.mask.layout())?;
        let mut dq = uninit(q.elem_count());
        let mut dk = vec![0f32; k.elem_count()];
        let mut dv = vec![0f32; v.elem_count()];
        let (a, b, c) = (
            SharedPtr::of(&mut dq),
            SharedPtr::of(&mut dk),
            SharedPtr::of(&mut dv),
        );
        self.backward(
            slice(cq, lq)?,
            slice(ck, lk)?,
            slice(cv, lv)?,
            slice(cg, lg)?,
            dm,
            a,
            b,
            c,
        )?;
        let dev = q.device();
        Ok((
            Some(Tensor::from_vec(dq, q.shape(), dev)?),
            Some(Tensor::from_vec(dk, k.shape(), dev)?),
            Some(Tensor::from_vec(dv, v.shape(), dev)?),
        ))
    }
}
