//! The CPU f32 kernels of the chunked log-prob head (see `crate::logprobs`): logits of a chunk
//! into an unzeroed buffer, the row log-sum-exp and picked log-prob in one pass, `dL/dz` in one
//! pass, and the chunk's two backward products, all on raw slices with no graph.

use candle_core::{Result, Tensor};

use super::gemm::{gemm_par, uninit, View};
use super::pool::{for_rows, par_rows};
use super::storage::with1;

/// Row-wise `lse = logsumexp(z / T)`, `z[target] / T - lse` and the entropy of `softmax(z / T)`
/// of `z` `[n, vocab]` (CPU, f32), in one pass: with `e_j = exp(z_j / T − m)` and `S = Σ e_j`,
/// `H = lse − Σ e_j (z_j / T) / S`.
pub(crate) fn lse_pick_entropy(
    z: &Tensor,
    targets: &[u32],
    inv_t: f32,
) -> Result<(Vec<f32>, Vec<f32>, Vec<f32>)> {
    let vocab = z.dim(1)?;
    with1(z, |z| {
        // Row r: [lse, picked, entropy], filled in parallel.
        let mut out = vec![0f32; 3 * targets.len()];
        for_rows(&mut out, 3, 64, |r, o| {
            let row = &z[r * vocab..][..vocab];
            let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) * inv_t;
            let mut buf = [0f32; 1024];
            let (mut sum, mut ez) = (0f32, 0f32);
            for part in row.chunks(buf.len()) {
                let b = &mut buf[..part.len()];
                for (be, &x) in b.iter_mut().zip(part) {
                    *be = x * inv_t - m;
                }
                sum += super::vexp::exp_sum_inplace(b);
                ez += b
                    .iter()
                    .zip(part)
                    .map(|(e, &x)| e * (x * inv_t))
                    .sum::<f32>();
            }
            let l = m + sum.ln();
            o[0] = l;
            o[1] = row[targets[r] as usize] * inv_t - l;
            o[2] = (l - ez / sum).max(0.0);
        });
        let col = |k: usize| out.iter().skip(k).step_by(3).copied().collect::<Vec<f32>>();
        (col(0), col(1), col(2))
    })
}

/// `dL/dz = g · (onehot(target) − softmax(z / T)) / T` for a chunk `z` `[n, vocab]` (CPU, f32).
pub(crate) fn dlogits(
    z: &Tensor,
    lse: &[f32],
    targets: &[u32],
    g: &[f32],
    inv_t: f32,
) -> Result<Tensor> {
    let (n, vocab) = z.dims2()?;
    let dz = with1(z, |z| {
        let mut out = uninit(n * vocab);
        par_rows(&mut out, vocab, |r, o| {
            let row = &z[r * vocab..][..vocab];
            let (l, c) = (lse[r], -g[r] * inv_t);
            for (oe, &x) in o.iter_mut().zip(row) {
                *oe = x * inv_t - l;
            }
            super::vexp::exp_sum_inplace(o);
            o.iter_mut().for_each(|oe| *oe *= c);
            o[targets[r] as usize] += g[r] * inv_t;
        });
        out
    })?;
    Tensor::from_vec(dz, (n, vocab), z.device())
}

/// Logits `h · wᵀ` of a chunk (CPU, f32) into a buffer that is not zero-filled first.
pub(crate) fn logits(h: &Tensor, w: &Tensor) -> Result<Tensor> {
    let (n, hs) = h.dims2()?;
    let vocab = w.dim(0)?;
    let z = with1(h, |h| {
        with1(w, |w| {
            let mut z = uninit(n * vocab);
            // SAFETY: `h` is `[n, hs]`, `w` `[vocab, hs]` (read transposed), `z` `[n, vocab]`.
            unsafe {
                let (hv, wt) = (View::rows(h.as_ptr(), hs), View::rows_t(w.as_ptr(), hs));
                gemm_par(n, vocab, hs, z.as_mut_ptr(), vocab, false, hv, wt);
            }
            z
        })
    })??;
    Tensor::from_vec(z, (n, vocab), h.device())
}

/// The chunk's share of the backward products (CPU, f32): `dh = dz · w` (`[n, hs]`, written) and
/// `dw (+)= dzᵀ · h` (`[vocab, hs]`, accumulated when `acc`).
pub(crate) fn chunk_grads(
    dz: &Tensor,
    w: &Tensor,
    h: &Tensor,
    dh: &mut [f32],
    dw: &mut [f32],
    acc: bool,
) -> Result<()> {
    // An empty `dw`: the head is frozen (LoRA), only `dh` is wanted.
    let (n, hs) = h.dims2()?;
    let vocab = w.dim(0)?;
    with1(dz, |dz| {
        with1(w, |w| {
            with1(h, |h| {
                // SAFETY: `dz` `[n, vocab]`, `w` `[vocab, hs]`, `h` `[n, hs]`; `dh` holds
                // `n · hs` and `dw` `vocab · hs` elements (checked by the caller's sizes).
                unsafe {
                    let dzv = View::rows(dz.as_ptr(), vocab);
                    gemm_par(
                        n,
                        hs,
                        vocab,
                        dh.as_mut_ptr(),
                        hs,
                        false,
                        dzv,
                        View::rows(w.as_ptr(), hs),
                    );
                    if dw.is_empty() {
                        return;
                    }
                    let dzt = View::rows_t(dz.as_ptr(), vocab);
                    gemm_par(
                        vocab,
                        hs,
                        n,
                        dw.as_mut_ptr(),
                        hs,
                        acc,
                        dzt,
                        View::rows(h.as_ptr(), hs),
                    );
                }
            })
        })
    })???;
    Ok(())
}
