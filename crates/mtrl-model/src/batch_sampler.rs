//! Batched next-token sampling where the logits are (CUDA or CPU), as candle tensor ops.
//!
//! Why: [`crate::sampler::sample`] works on one host row in f64, so every decode step copied the
//! whole `[n, V]` logits (V = 151,936 for Qwen3) to the host. [`sample_rows`] does the same job on
//! the device and brings back one `[n, 3]` f32 tensor (token, full log-prob, truncated log-prob;
//! token ids are exact in f32 below 2^24). The CPU tests run the very ops that run on CUDA.
//!
//! **Algorithm** (per row, all rows at once; f32 throughout):
//! 1. `z = logits / T` (`T = 1` for greedy), `m = max z`, `e = exp(z − m)`, `s = Σ e`; the full
//!    log-prob of a token is `z[t] − m − ln s`, as `log_softmax(logits / T)[t]`.
//! 2. Greedy rows: the first index where `z == m` (the minimum over `where(z == m, index, V)`),
//!    so ties go to the first index by construction — candle's CUDA `argmax` is a tree reduction
//!    that promises nothing about ties.
//! 3. Truncating rows (`0 < top_k < V` or `top_p < 1`; the whole step is skipped when there are
//!    none) get two thresholds, found by **bisection on the value** vectorised over rows (per-row
//!    bounds as `[m, 1]` tensors, each probe one compare + one row sum) and then a few exact
//!    **snap** steps that move a bound onto the nearest data value (a masked row max / min):
//!    - top-k: the largest `τ` with `#{z ≥ τ} ≥ k`, i.e. the k-th largest value; kept: `z ≥ τ_k`;
//!    - top-p over the renormalised top-k set (transformers' order: temperature → top-k →
//!      top-p): a token is kept when the top-k mass strictly above its value is `< p`, so the
//!      kept set is `z > λ_p` for the largest `λ_p` whose strictly-greater mass is still `≥ p`.
//!
//!    The bracket is `[max(min z, m − 120), m]`: below `m − 120` `e` underflows to 0 in f32, so
//!    such tokens carry no weight either way. 36 halvings leave it under `120 · 2⁻³⁶ ≈ 2e-9`, below
//!    the f32 spacing of any `|z| ≳ 0.02`; the two snaps then resolve up to two distinct values
//!    left inside it, which makes the thresholds exact in practice. Should more remain, the
//!    thresholds err on the side of keeping (kept set ⊇ the exact one, never dropping a token of
//!    the true top-k / nucleus).
//! 4. Inverse CDF in vocabulary order over the kept weights `w = e · keep`: the token is the
//!    first index whose cumulative weight exceeds `u · Σw`. The cumulative sum is a two-level
//!    scan: rows are cut into `B` blocks of `C ≈ √V` (power of two), block sums are reduced and
//!    scanned (Hillis–Steele: `log₂ B` shifted adds), the block is chosen, gathered, and scanned
//!    the same way. Both levels only pick indices whose own weight is `> 0`, and fall back to the
//!    last positive index when rounding (or `u → 1`) leaves no cumulative value above the
//!    target, so the drawn token is always kept with nonzero probability.
//!
//! **Row independence** (invariant): a row's result is bit-identical whatever other rows share
//! the batch. Only elementwise ops, row gathers and per-row reductions over the last dimension are
//! used (candle's CUDA reductions launch one block per output row with a width set by the row
//! length alone); no matmul (cuBLAS picks algorithms by shape, and `Tensor::cumsum` is a matmul
//! with a `[V, V]` triangle) and no `arg_sort_last_dim` (candle-kernels' bitonic sort keeps a
//! whole row in one block's shared memory: 1 MiB of indices at V = 151,936).
//!
//! **Ties**: values are compared after temperature scaling in f32. Top-k keeps every token tied
//! with the k-th value (as transformers' `scores < topk(...)[-1]` mask does), so more than k may
//! be kept; top-p keeps or drops a group of tied values together (the mass test uses the mass
//! strictly above the value). The host sampler instead breaks ties by index and keeps exactly k.

use candle_core::{DType, Device, Tensor, D};

use crate::error::{ModelError, Result};
use crate::sampler::SamplingParams;

/// One row's result.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Drawn {
    pub token: u32,
    /// `log_softmax(logits / T)[token]` over the full vocabulary (`T = 1` for greedy): the
    /// quantity the learner evaluates.
    pub logprob: f32,
    /// Log-prob under the truncated (top-k → top-p) renormalised distribution the token was
    /// drawn from; equals `logprob` when nothing is truncated, and for greedy.
    pub logprob_truncated: f32,
}

/// Halvings of the threshold bracket (see the module doc).
const BISECT_STEPS: usize = 36;
/// Exact snap steps after the bisection.
const SNAP_STEPS: usize = 2;
/// Below `m − WINDOW`, `exp(z − m)` is 0 in f32 (`exp(−104)` is already under the least
/// subnormal), so thresholds need not be searched there.
const WINDOW: f64 = 120.0;
/// The largest f32 below 1: a `u` that rounds up to 1.0 in f32 is clamped here.
const ONE_BELOW: f32 = 1.0 - f32::EPSILON / 2.0;
/// Token ids and row offsets are carried in f32; exact below this.
const F32_EXACT: usize = 1 << 24;

/// Samples one token per row of `logits` (`[n, V]`, any float dtype; computed in f32).
///
/// `params[i]` are row i's parameters (temperature 0 = greedy, `top_k` 0 = off, `top_p` 1 = off;
/// the seed is not used here), `uniforms[i]` in `[0, 1)` its one draw (the engine takes it from
/// the sequence's own seeded RNG). Only the `[n, 3]` result crosses to the host.
pub fn sample_rows(
    logits: &Tensor,
    params: &[&SamplingParams],
    uniforms: &[f64],
) -> Result<Vec<Drawn>> {
    let (n, v) = check(logits, params, uniforms)?;
    if n == 0 {
        return Ok(Vec::new());
    }
    let dev = logits.device();
    let greedy: Vec<u8> = params
        .iter()
        .map(|p| u8::from(p.temperature == 0.0))
        .collect();
    let temps: Vec<f32> = params
        .iter()
        .map(|p| {
            if p.temperature == 0.0 {
                1.0
            } else {
                p.temperature as f32
            }
        })
        .collect();
    let t = Tensor::from_vec(temps, (n, 1), dev)?;
    let z = logits.to_dtype(DType::F32)?.broadcast_div(&t)?;
    let m = z.max_keepdim(1)?;
    let e = z.broadcast_sub(&m)?.exp()?;
    let s = e.sum_keepdim(1)?;
    let grid = Grid::new(n, v, dev)?;
    let any_greedy = greedy.contains(&1);
    let any_sampled = greedy.contains(&0);

    let token_greedy = if any_greedy {
        Some(first_max(&z, &m, &grid)?)
    } else {
        None
    };
    let (token_sampled, kept_mass) = if any_sampled {
        let w = match thresholds(&z, &e, &m, params, v)? {
            None => e.clone(),
            Some((tk, tp)) => {
                let zero = scalar(0.0, dev)?.broadcast_as((n, v))?;
                let w = z.broadcast_ge(&tk)?.where_cond(&e, &zero)?;
                z.broadcast_gt(&tp)?.where_cond(&w, &zero)?
            }
        };
        // For untruncated rows `w` is `e` bit for bit, so this sum equals `s` and the two
        // log-probs agree exactly.
        let kept = w.sum_keepdim(1)?;
        let u: Vec<f32> = uniforms
            .iter()
            .map(|&u| (u as f32).min(ONE_BELOW))
            .collect();
        let u = Tensor::from_vec(u, (n, 1), dev)?;
        (Some(inverse_cdf(&w, &u, &grid)?), kept)
    } else {
        (None, s.clone())
    };
    let token = match (token_greedy, token_sampled) {
        (Some(g), Some(r)) => Tensor::from_vec(greedy, (n, 1), dev)?.where_cond(&g, &r)?,
        (Some(g), None) => g,
        (None, Some(r)) => r,
        (None, None) => unreachable!("n > 0 rows are greedy or sampled"),
    };
    // NaN logits could leave an out-of-range index; clamp so the gather stays in bounds.
    let token = token.clamp(0f32, (v - 1) as f32)?;
    let zt = z
        .gather(&token.to_dtype(DType::U32)?.contiguous()?, 1)?
        .broadcast_sub(&m)?;
    let logprob = (&zt - s.log()?)?;
    let truncated = (&zt - kept_mass.log()?)?;
    let rows = crate::host::vec2::<f32>(&Tensor::cat(&[&token, &logprob, &truncated], 1)?)?;
    Ok(rows
        .into_iter()
        .map(|r| Drawn {
            token: r[0] as u32,
            logprob: r[1],
            logprob_truncated: r[2],
        })
        .collect())
}

/// Shapes, dtypes, parameter domains; never panics on user input.
fn check(logits: &Tensor, params: &[&SamplingParams], uniforms: &[f64]) -> Result<(usize, usize)> {
    let bad = |msg: String| Err(ModelError::InvalidArgument(msg));
    let (n, v) = match logits.dims() {
        &[n, v] => (n, v),
        d => return bad(format!("logits must be [n, vocab], got shape {d:?}")),
    };
    if !logits.dtype().is_float() {
        return bad(format!(
            "logits must be a float tensor, got {:?}",
            logits.dtype()
        ));
    }
    if v == 0 || v >= F32_EXACT {
        return bad(format!("vocabulary of {v} is outside 1..2^24"));
    }
    if params.len() != n || uniforms.len() != n {
        return bad(format!(
            "{n} logit rows but {} sampling params and {} uniforms",
            params.len(),
            uniforms.len()
        ));
    }
    if n * Grid::blocks_of(v).0 >= F32_EXACT {
        return bad(format!("{n} rows of {v} logits are too many for one call"));
    }
    for (i, (p, &u)) in params.iter().zip(uniforms).enumerate() {
        p.validate()
            .map_err(|e| ModelError::InvalidArgument(format!("row {i}: {e}")))?;
        let t = p.temperature as f32;
        if p.temperature != 0.0 && !(t >= f32::MIN_POSITIVE && t.is_finite()) {
            return bad(format!(
                "row {i}: temperature {} is outside f32",
                p.temperature
            ));
        }
        if !(0.0..1.0).contains(&u) {
            return bad(format!("row {i}: uniform draw {u} is not in [0, 1)"));
        }
    }
    Ok((n, v))
}

/// The two-level layout: `B` blocks of `C` columns (`B·C ≥ V`, tail padded with zero weight),
/// with index rows built on the device from two short host vectors.
struct Grid {
    b: usize,
    c: usize,
    v: usize,
    /// `[1, B]`, `[1, C]`, `[1, V]` f32 indices.
    iota_b: Tensor,
    iota_c: Tensor,
    iota_v: Tensor,
    /// `[n]` f32: `i · B`, row i's first block in the `[n·B, C]` view.
    row_base: Tensor,
}

impl Grid {
    /// `(B, C)` for a vocabulary of `v`: `C` the power of two at or above `√v`.
    fn blocks_of(v: usize) -> (usize, usize) {
        let c = ((v as f64).sqrt().ceil() as usize)
            .max(1)
            .next_power_of_two();
        (v.div_ceil(c), c)
    }

    fn new(n: usize, v: usize, dev: &Device) -> Result<Self> {
        let (b, c) = Self::blocks_of(v);
        let iota_b = Tensor::arange(0f32, b as f32, dev)?;
        let iota_c = Tensor::arange(0f32, c as f32, dev)?.unsqueeze(0)?;
        let iota_v = iota_b
            .unsqueeze(1)?
            .affine(c as f64, 0.0)?
            .broadcast_add(&iota_c)?
            .reshape((1, b * c))?
            .narrow(1, 0, v)?;
        let row_base = Tensor::arange(0f32, n as f32, dev)?.affine(b as f64, 0.0)?;
        Ok(Self {
            b,
            c,
            v,
            iota_b: iota_b.unsqueeze(0)?,
            iota_c,
            iota_v,
            row_base,
        })
    }
}

/// A `[1, 1]` f32 constant, to broadcast.
fn scalar(x: f32, dev: &Device) -> Result<Tensor> {
    Ok(Tensor::new(&[[x]], dev)?)
}

/// First index of each row's maximum `m` (`[n, 1]` f32).
fn first_max(z: &Tensor, m: &Tensor, g: &Grid) -> Result<Tensor> {
    let shape = z.shape();
    let idx = g.iota_v.broadcast_as(shape)?;
    let none = scalar(g.v as f32, z.device())?.broadcast_as(shape)?;
    Ok(z.broadcast_eq(m)?.where_cond(&idx, &none)?.min_keepdim(1)?)
}

/// Inclusive prefix sums along the last dimension (Hillis–Steele: `⌈log₂ L⌉` shifted adds, each
/// elementwise, so every row's sums depend on that row alone).
fn inclusive_scan(x: &Tensor) -> Result<Tensor> {
    let l = x.dim(D::Minus1)?;
    let mut acc = x.clone();
    let mut d = 1;
    while d < l {
        let shifted = acc.narrow(1, 0, l - d)?.pad_with_zeros(1, d, 0)?;
        acc = (acc + shifted)?;
        d *= 2;
    }
    Ok(acc)
}

/// Per row, the first index `j` with `cum[j] > target` among those with `weight[j] > 0`, else
/// the last index with `weight[j] > 0` (`[r, 1]` f32). Rows must hold some positive weight.
fn pick(cum: &Tensor, target: &Tensor, weight: &Tensor, iota: &Tensor) -> Result<Tensor> {
    let shape = cum.shape();
    let dev = cum.device();
    let l = shape.dims()[1];
    let idx = iota.broadcast_as(shape)?;
    let none = scalar(l as f32, dev)?.broadcast_as(shape)?;
    let before = scalar(-1.0, dev)?.broadcast_as(shape)?;
    let positive = weight.gt(0f64)?;
    let candidates = positive.where_cond(&idx, &none)?;
    let first = cum
        .broadcast_gt(target)?
        .where_cond(&candidates, &none)?
        .min_keepdim(1)?;
    let last = positive.where_cond(&idx, &before)?.max_keepdim(1)?;
    Ok(first.minimum(&last)?)
}

/// Inverse CDF in index order over the kept weights `w` (`[n, V]`) with draws `u` (`[n, 1]`):
/// the two-level scan of the module doc. Returns `[n, 1]` f32 token ids.
fn inverse_cdf(w: &Tensor, u: &Tensor, g: &Grid) -> Result<Tensor> {
    let n = w.dim(0)?;
    let blocks = w
        .pad_with_zeros(1, 0, g.b * g.c - g.v)?
        .reshape((n * g.b, g.c))?;
    let sums = blocks.sum_keepdim(1)?.reshape((n, g.b))?;
    let cum = inclusive_scan(&sums)?;
    let target = u.mul(&cum.narrow(1, g.b - 1, 1)?)?;
    let block = pick(&cum, &target, &sums, &g.iota_b)?;
    let before = cum
        .pad_with_zeros(1, 1, 0)?
        .narrow(1, 0, g.b)?
        .contiguous()?;
    let rest = (&target - before.gather(&block.to_dtype(DType::U32)?.contiguous()?, 1)?)?;
    let rows = (g.row_base.unsqueeze(1)? + &block)?
        .squeeze(1)?
        .to_dtype(DType::U32)?;
    let chosen = blocks.index_select(&rows, 0)?;
    let within = pick(&inclusive_scan(&chosen)?, &rest, &chosen, &g.iota_c)?;
    Ok(block.affine(g.c as f64, 0.0)?.add(&within)?)
}

/// Per-row thresholds `(τ_k, λ_p)` as `[n, 1]` tensors (keep `z ≥ τ_k` and `z > λ_p`; `−∞` for
/// rows that do not truncate), or `None` when no sampled row truncates.
fn thresholds(
    z: &Tensor,
    e: &Tensor,
    m: &Tensor,
    params: &[&SamplingParams],
    v: usize,
) -> Result<Option<(Tensor, Tensor)>> {
    let top_k = |p: &SamplingParams| p.top_k > 0 && p.top_k < v;
    let rows: Vec<u32> = (0..params.len() as u32)
        .filter(|&i| {
            let p = params[i as usize];
            p.temperature != 0.0 && (top_k(p) || p.top_p < 1.0)
        })
        .collect();
    if rows.is_empty() {
        return Ok(None);
    }
    let dev = z.device();
    let r = rows.len();
    let sub = |x: &Tensor| -> Result<Tensor> {
        if r == params.len() {
            return Ok(x.clone());
        }
        Ok(x.index_select(&Tensor::new(rows.as_slice(), dev)?, 0)?)
    };
    let (z, e, m) = (sub(z)?, sub(e)?, sub(m)?);
    let column = |f: &dyn Fn(&SamplingParams) -> f32| -> Result<Tensor> {
        let col: Vec<f32> = rows.iter().map(|&i| f(params[i as usize])).collect();
        Ok(Tensor::from_vec(col, (r, 1), dev)?)
    };
    let ninf = f32::NEG_INFINITY;
    let k = column(&|p| if top_k(p) { p.top_k as f32 } else { 0.0 })?;
    let p = column(&|p| p.top_p as f32)?;
    let lo = z.min_keepdim(1)?.maximum(&m.affine(1.0, -WINDOW)?)?;
    let tk = top_k_threshold(&z, &k, &lo, &m)?;
    let tk = k
        .gt(0f64)?
        .where_cond(&tk, &scalar(ninf, dev)?.broadcast_as((r, 1))?)?;
    let zero = scalar(0.0, dev)?.broadcast_as(z.shape())?;
    let w = z.broadcast_ge(&tk)?.where_cond(&e, &zero)?;
    let goal = p.mul(&w.sum_keepdim(1)?)?;
    let tp = top_p_threshold(&z, &w, &goal, &lo.affine(1.0, -1.0)?, &m)?;
    let tp = p
        .lt(1f64)?
        .where_cond(&tp, &scalar(ninf, dev)?.broadcast_as((r, 1))?)?;
    if r == params.len() {
        return Ok(Some((tk, tp)));
    }
    // Back to all rows: slot r holds −∞ for the rows that do not truncate.
    let mut slot = vec![r as u32; params.len()];
    for (j, &i) in rows.iter().enumerate() {
        slot[i as usize] = j as u32;
    }
    let slot = Tensor::new(slot.as_slice(), dev)?;
    let spread = |x: &Tensor| -> Result<Tensor> {
        Ok(Tensor::cat(&[x, &scalar(ninf, dev)?], 0)?.index_select(&slot, 0)?)
    };
    Ok(Some((spread(&tk)?, spread(&tp)?)))
}

/// Midpoint of a bracket, elementwise.
fn mid(lo: &Tensor, hi: &Tensor) -> Result<Tensor> {
    Ok((hi - lo)?.affine(0.5, 0.0)?.add(lo)?)
}

/// The largest `τ` with `#{z ≥ τ} ≥ k` (the k-th largest value), searched in `[lo, hi]`.
/// Invariant: the predicate holds at `lo` (or `lo` is the window floor, below which nothing
/// weighs) and fails at `hi`, unless it already holds at the row maximum `hi`.
fn top_k_threshold(z: &Tensor, k: &Tensor, lo: &Tensor, hi: &Tensor) -> Result<Tensor> {
    let enough = |tau: &Tensor| -> Result<Tensor> {
        let count = z.broadcast_ge(tau)?.to_dtype(DType::F32)?.sum_keepdim(1)?;
        Ok(count.ge(k)?)
    };
    let at_max = enough(hi)?;
    let mut lo = at_max.where_cond(hi, lo)?;
    let mut hi = hi.clone();
    for _ in 0..BISECT_STEPS {
        let c = mid(&lo, &hi)?;
        let ok = enough(&c)?;
        lo = ok.where_cond(&c, &lo)?;
        hi = ok.where_cond(&hi, &c)?;
    }
    let below = scalar(f32::NEG_INFINITY, z.device())?.broadcast_as(z.shape())?;
    for _ in 0..SNAP_STEPS {
        // The largest value under `hi`: if it is in the bracket it is either the answer (the
        // predicate holds there) or the new upper bound.
        let a = z.broadcast_lt(&hi)?.where_cond(z, &below)?.max_keepdim(1)?;
        let inside = a.ge(&lo)?;
        lo = inside.where_cond(&enough(&a)?.where_cond(&a, &lo)?, &lo)?;
        hi = inside.where_cond(&a, &hi)?;
    }
    Ok(lo)
}

/// The largest `λ` whose kept weight strictly above it is still `≥ goal` (= `p · Σw`), searched
/// in `[lo, hi]`; tokens `z > λ` form the nucleus. At `lo` all the weight lies above (mass ≥
/// goal), at the row maximum `hi` none does (0 < goal).
fn top_p_threshold(
    z: &Tensor,
    w: &Tensor,
    goal: &Tensor,
    lo: &Tensor,
    hi: &Tensor,
) -> Result<Tensor> {
    let zero = scalar(0.0, z.device())?.broadcast_as(z.shape())?;
    let covered = |lam: &Tensor| -> Result<Tensor> {
        let above = z.broadcast_gt(lam)?.where_cond(w, &zero)?.sum_keepdim(1)?;
        Ok(above.ge(goal)?)
    };
    let (mut lo, mut hi) = (lo.clone(), hi.clone());
    for _ in 0..BISECT_STEPS {
        let c = mid(&lo, &hi)?;
        let ok = covered(&c)?;
        lo = ok.where_cond(&c, &lo)?;
        hi = ok.where_cond(&hi, &c)?;
    }
    let above = scalar(f32::INFINITY, z.device())?.broadcast_as(z.shape())?;
    for _ in 0..SNAP_STEPS {
        // The smallest value over `lo`: if the mass above it still covers the goal it becomes
        // the new `lo`; otherwise it is the smallest kept value and closes the bracket.
        let b = z.broadcast_gt(&lo)?.where_cond(z, &above)?.min_keepdim(1)?;
        let inside = b.lt(&hi)?;
        let ok = covered(&b)?;
        lo = inside.where_cond(&ok.where_cond(&b, &lo)?, &lo)?;
        hi = inside.where_cond(&ok.where_cond(&hi, &b)?, &hi)?;
    }
    Ok(lo)
}
