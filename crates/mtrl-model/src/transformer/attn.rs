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

/// Mask entries at or below this are "no attention" (the decoder writes -1e30).
const MASKED: f32 = -1.0e29;

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
    /// Probabilities of the admitted spans, row after row in `[b, heads, t]` order.
    p: Vec<f32>,
    /// Per `[b, heads, t]` row: offset into `p`.
    off: Vec<usize>,
    /// Per `[b, t]` query: admitted key span `lo..hi`.
    span: Vec<(usize, usize)>,
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

/// Key span `lo..hi` admitted by each mask row (`[b, 1, t, s]`); all keys when none is.
fn spans(m: &[f32], rows: usize, s: usize) -> Vec<(usize, usize)> {
    (0..rows)
        .map(|r| {
            let row = &m[r * s..][..s];
            match row.iter().position(|&x| x > MASKED) {
                Some(lo) => (
                    lo,
                    s - row.iter().rev().position(|&x| x > MASKED).unwrap_or(0),
                ),
                None => (0, s),
            }
        })
        .collect()
}

/// `[n, d]` → `[d, n]`.
fn transpose(x: &[f32], n: usize, d: usize) -> Vec<f32> {
    let mut out = vec![0f32; n * d];
    for (j, row) in x.chunks_exact(d).enumerate() {
        for (dd, &v) in row.iter().enumerate() {
            out[dd * n + j] = v;
        }
    }
    out
}

#[inline(always)]
fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    for (ye, &xe) in y.iter_mut().zip(x) {
        *ye += a * xe;
    }
}

/// `out[j] = Σ_c a[c] · xt[c·stride + j]`: a row of `a · xt` with `xt` transposed (`[a.len(),
/// stride]`), eight outputs held in registers while `c` runs (summed in the order of `c`).
#[inline(always)]
fn gemv_t(out: &mut [f32], a: &[f32], xt: &[f32], stride: usize) {
    let n = out.len();
    let mut chunks = out.chunks_exact_mut(8);
    for (jb, o) in (&mut chunks).enumerate() {
        let mut acc = [0f32; 8];
        for (c, &ac) in a.iter().enumerate() {
            let x: &[f32; 8] = xt[c * stride + jb * 8..][..8]
                .try_into()
                .unwrap_or(&[0.0; 8]);
            for (e, &xe) in acc.iter_mut().zip(x) {
                *e += ac * xe;
            }
        }
        o.copy_from_slice(&acc);
    }
    let done = n - chunks.into_remainder().len();
    for j in done..n {
        let mut acc = 0f32;
        for (c, &ac) in a.iter().enumerate() {
            acc += ac * xt[c * stride + j];
        }
        out[j] = acc;
    }
}

/// `out[c] = Σ_j w[j] · x[j·d + c]` (`d = out.len()`, `x` row-major): eight columns at a time held
/// in registers while `j` runs.
#[inline(always)]
fn gemv_n(out: &mut [f32], w: &[f32], x: &[f32]) {
    let d = out.len();
    let mut chunks = out.chunks_exact_mut(8);
    for (cb, o) in (&mut chunks).enumerate() {
        let mut acc = [0f32; 8];
        for (j, &wj) in w.iter().enumerate() {
            let xr: &[f32; 8] = x[j * d + cb * 8..][..8].try_into().unwrap_or(&[0.0; 8]);
            for (e, &xe) in acc.iter_mut().zip(xr) {
                *e += wj * xe;
            }
        }
        o.copy_from_slice(&acc);
    }
    let done = d - chunks.into_remainder().len();
    for c in done..d {
        let mut acc = 0f32;
        for (j, &wj) in w.iter().enumerate() {
            acc += wj * x[j * d + c];
        }
        out[c] = acc;
    }
}

/// Largest element (8 lanes, so that it vectorises; no NaN handling needed here).
#[inline(always)]
fn max(x: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; 8];
    let chunks = x.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for l in 0..8 {
            acc[l] = if c[l] > acc[l] { c[l] } else { acc[l] };
        }
    }
    let mut m = f32::NEG_INFINITY;
    for &v in acc.iter().chain(rest) {
        m = if v > m { v } else { m };
    }
    m
}

#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let mut acc = [0f32; 16];
    let (ac, bc) = (a[..n].chunks_exact(16), b[..n].chunks_exact(16));
    let (ar, br) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for l in 0..16 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut h = [0f32; 8];
    for l in 0..8 {
        h[l] = acc[l] + acc[l + 8];
    }
    let mut s = ((h[0] + h[4]) + (h[1] + h[5])) + ((h[2] + h[6]) + (h[3] + h[7]));
    for (x, y) in ar.iter().zip(br) {
        s += x * y;
    }
    s
}

/// Shapes of one call.
#[derive(Clone, Copy)]
struct Dims {
    b: usize,
    heads: usize,
    kv: usize,
    t: usize,
    s: usize,
    d: usize,
}

/// Raw output pointer shared by work units that write disjoint elements.
#[derive(Clone, Copy)]
struct Out(*mut f32);
// SAFETY: units write disjoint elements (see each use).
unsafe impl Send for Out {}
unsafe impl Sync for Out {}

/// Runs `f(unit)` for units `0..n` on candle's worker pool.
fn par_units(n: usize, f: impl Fn(usize) + Sync) {
    if crate::skinny::num_threads() < 2 {
        (0..n).for_each(f);
    } else {
        candle_core::utils::barrier_pool().execute_chunked(n, |r| r.for_each(&f));
    }
}

struct Fwd<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    m: &'a [f32],
    span: &'a [(usize, usize)],
    off: &'a [usize],
    dims: Dims,
    scale: f32,
}

impl Fwd<'_> {
    /// Unit `(bi, g)`: the heads of KV group `g` of sequence `bi`. Writes `out[bi, :, head]` and
    /// the unit's rows of `p` (when saving).
    #[inline(always)]
    fn unit(&self, u: usize, out: Out, p: Option<Out>) {
        let Dims {
            heads, kv, t, s, d, ..
        } = self.dims;
        let (bi, g) = (u / kv, u % kv);
        let rep = heads / kv;
        let kt = transpose(&self.k[u * s * d..][..s * d], s, d);
        let vr = &self.v[u * s * d..][..s * d];
        let mut sc = vec![0f32; s];
        for hh in g * rep..(g + 1) * rep {
            for i in 0..t {
                let (lo, hi) = self.span[bi * t + i];
                let n = hi - lo;
                let sc = &mut sc[..n];
                let q = &self.q[((bi * heads + hh) * t + i) * d..][..d];
                gemv_t(sc, q, &kt[lo..], s);
                let mrow = &self.m[(bi * t + i) * s + lo..][..n];
                for (x, &mm) in sc.iter_mut().zip(mrow) {
                    *x = *x * self.scale + mm;
                }
                let mx = max(sc);
                sc.iter_mut().for_each(|x| *x -= mx);
                let inv = 1.0 / crate::vexp::exp_sum_inplace(sc);
                sc.iter_mut().for_each(|x| *x *= inv);
                // SAFETY: `out[bi, i, hh·d..]` and row `(bi, hh, i)` of `p` belong to this unit
                // only; the buffers outlive the pool call.
                unsafe {
                    let o = out.0.add((bi * t + i) * heads * d + hh * d);
                    gemv_n(std::slice::from_raw_parts_mut(o, d), sc, &vr[lo * d..]);
                    if let Some(p) = p {
                        let dst = p.0.add(self.off[(bi * heads + hh) * t + i]);
                        std::ptr::copy_nonoverlapping(sc.as_ptr(), dst, n);
                    }
                }
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn unit_avx2(&self, u: usize, out: Out, p: Option<Out>) {
        self.unit(u, out, p)
    }

    fn run(&self, u: usize, out: Out, p: Option<Out>) {
        #[cfg(target_arch = "x86_64")]
        {
            if crate::skinny::avx2() {
                // SAFETY: the CPU supports the features the function is compiled for.
                return unsafe { self.unit_avx2(u, out, p) };
            }
        }
        self.unit(u, out, p)
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
    /// Unit `(bi, g)`: writes `dq[bi, heads of g]`, `dk[bi, g]`, `dv[bi, g]`.
    #[inline(always)]
    fn unit(&self, u: usize, dq: Out, dk: Out, dv: Out) {
        let Dims {
            heads, kv, t, s, d, ..
        } = self.dims;
        let (bi, g) = (u / kv, u % kv);
        let rep = heads / kv;
        let kr = &self.k[u * s * d..][..s * d];
        let vt = transpose(&self.v[u * s * d..][..s * d], s, d);
        let mut dkt = vec![0f32; d * s];
        let mut dvt = vec![0f32; d * s];
        let mut dp = vec![0f32; s];
        for hh in g * rep..(g + 1) * rep {
            for i in 0..t {
                let (lo, hi) = self.saved.span[bi * t + i];
                let n = hi - lo;
                let p = &self.saved.p[self.saved.off[(bi * heads + hh) * t + i]..][..n];
                let go = &self.g[(bi * t + i) * heads * d + hh * d..][..d];
                let dp = &mut dp[..n];
                gemv_t(dp, go, &vt[lo..], s);
                for (dd, &gd) in go.iter().enumerate() {
                    axpy(&mut dvt[dd * s + lo..][..n], gd, p);
                }
                let c = dot(p, dp);
                for (x, &pe) in dp.iter_mut().zip(p) {
                    *x = self.scale * pe * (*x - c);
                }
                let q = &self.q[((bi * heads + hh) * t + i) * d..][..d];
                // SAFETY: row `(bi, hh, i)` of `dq` belongs to this unit only.
                let dqr = unsafe {
                    std::slice::from_raw_parts_mut(dq.0.add(((bi * heads + hh) * t + i) * d), d)
                };
                gemv_n(dqr, dp, &kr[lo * d..]);
                for (dd, &qd) in q.iter().enumerate() {
                    axpy(&mut dkt[dd * s + lo..][..n], qd, dp);
                }
            }
        }
        // SAFETY: block `(bi, g)` of `dk`/`dv` belongs to this unit only.
        unsafe {
            let (dk, dv) = (dk.0.add(u * s * d), dv.0.add(u * s * d));
            for j in 0..s {
                for dd in 0..d {
                    *dk.add(j * d + dd) = dkt[dd * s + j];
                    *dv.add(j * d + dd) = dvt[dd * s + j];
                }
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn unit_avx2(&self, u: usize, dq: Out, dk: Out, dv: Out) {
        self.unit(u, dq, dk, dv)
    }

    fn run(&self, u: usize, dq: Out, dk: Out, dv: Out) {
        #[cfg(target_arch = "x86_64")]
        {
            if crate::skinny::avx2() {
                // SAFETY: the CPU supports the features the function is compiled for.
                return unsafe { self.unit_avx2(u, dq, dk, dv) };
            }
        }
        self.unit(u, dq, dk, dv)
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
        b,
        heads,
        kv,
        t,
        s,
        d,
    })
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
        let (q, k, v) = (
            super::fused::slice(s1, l1)?,
            super::fused::slice(s2, l2)?,
            super::fused::slice(s3, l3)?,
        );
        let mask = self.mask.contiguous()?;
        let (ms, ml) = mask.storage_and_layout();
        let candle_core::Storage::Cpu(mc) = &*ms else {
            candle_core::bail!("attention mask must be on the CPU")
        };
        let m = super::fused::slice(mc, ml)?;
        let dm = dims(l1, l2, l3, ml)?;
        let Dims { b, heads, t, d, .. } = dm;
        let span = spans(m, b * t, dm.s);
        let mut off = Vec::with_capacity(b * heads * t);
        let mut total = 0;
        if self.save {
            for bi in 0..b {
                for _ in 0..heads {
                    for i in 0..t {
                        off.push(total);
                        let (lo, hi) = span[bi * t + i];
                        total += hi - lo;
                    }
                }
            }
        }
        let mut out = vec![0f32; b * t * heads * d];
        let mut p = vec![0f32; total];
        let fwd = Fwd {
            q,
            k,
            v,
            m,
            span: &span,
            off: &off,
            dims: dm,
            scale: self.scale,
        };
        let (o, pp) = (Out(out.as_mut_ptr()), Out(p.as_mut_ptr()));
        let save = self.save;
        par_units(b * dm.kv, |u| fwd.run(u, o, save.then_some(pp)));
        if save {
            *self.saved.lock().unwrap_or_else(|e| e.into_inner()) = Some(Saved { p, off, span });
        }
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
        let guard = self.saved.lock().unwrap_or_else(|e| e.into_inner());
        let Some(saved) = guard.as_ref() else {
            candle_core::bail!("attention backward without saved probabilities")
        };
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
        let bwd = Bwd {
            q: super::fused::slice(cq, lq)?,
            k: super::fused::slice(ck, lk)?,
            v: super::fused::slice(cv, lv)?,
            g: super::fused::slice(cg, lg)?,
            saved,
            dims: dm,
            scale: self.scale,
        };
        let mut dq = vec![0f32; q.elem_count()];
        let mut dk = vec![0f32; k.elem_count()];
        let mut dv = vec![0f32; v.elem_count()];
        let (a, b, c) = (
            Out(dq.as_mut_ptr()),
            Out(dk.as_mut_ptr()),
            Out(dv.as_mut_ptr()),
        );
        par_units(dm.b * dm.kv, |u| bwd.run(u, a, b, c));
        let dev = q.device();
        Ok((
            Some(Tensor::from_vec(dq, q.shape(), dev)?),
            Some(Tensor::from_vec(dk, k.shape(), dev)?),
            Some(Tensor::from_vec(dv, v.shape(), dev)?),
        ))
    }
}
