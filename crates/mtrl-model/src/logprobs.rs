//! Per-token log-probabilities of the next token, for the learner (with gradients) and for scoring.
//!
//! `logp[b, t] = log_softmax(logits[b, t] / T)[ids[b, t+1]]`, shape `[b, t_len - 1]`, valid where
//! `mask[b, t] == mask[b, t+1] == 1` (0 elsewhere). `T` is the sampling temperature: this is the
//! same distribution the generation engine reports its log-probs under (see `engine`).
//!
//! Packing: a batch whose rows are right-padded (the learner's) runs packed end to end, without
//! its padding ([`crate::transformer::VarLen`]); any other mask runs as the padded batch it is.
//! With [`Policy::set_activation_checkpointing`] a differentiable packed forward keeps only the
//! layer inputs, and the backward recomputes each layer (`transformer::recompute`).
//!
//! Memory: full-vocabulary logits are never held for the whole batch. The decoder runs once with
//! autograd up to the final hidden states `h` (`[rows, hidden]`, only valid rows kept); the
//! vocabulary projection + log-softmax run in row chunks of at most `chunk_elems` logits, without
//! a graph (the CPU f32 kernels of `cpu::logits`, else `logprob_head`: one kernel per pass on
//! CUDA). `backward(dL/dlogp)` recomputes each chunk's logits and forms the exact gradients
//! `dL/dz = g · (onehot − softmax(z/T)) / T`, `dL/dh = dL/dz · W`, `dL/dW = dL/dzᵀ · h`, then
//! backpropagates the surrogate `Σ h·stopgrad(dL/dh) + Σ W·stopgrad(dL/dW)` through the decoder,
//! which yields the true gradient of every parameter (the tied embedding receives both uses).

use candle_core::backprop::GradStore;
use candle_core::{DType, Tensor, D};

use crate::cpu;
use crate::cpu::logits::{logits, lse_pick_entropy};
use crate::error::{ModelError, Result};
use crate::host;
use crate::policy::Policy;
use crate::transformer::{Checkpointed, VarLen};

mod backward;

/// Default budget of logits materialised at once (32 Mi f32 = 128 MiB).
pub const DEFAULT_CHUNK_ELEMS: usize = 1 << 25;

/// The length of each row when every row is ones then zeros (right padding) and holds a token.
fn prefix_lengths(mask: &[Vec<u8>]) -> Option<Vec<usize>> {
    mask.iter()
        .map(|r| {
            let l = r.iter().take_while(|&&m| m == 1).count();
            (l > 0 && r[l..].iter().all(|&m| m == 0)).then_some(l)
        })
        .collect()
}

/// The result of a training forward; call [`TokenLogprobs::backward`] with `dL/dlogp`.
pub struct TokenLogprobs {
    /// `[b, t_len - 1]` f32, no graph; 0 where invalid.
    pub logprobs: Tensor,
    /// `[b, t_len - 1]` f32, 1 where the log-prob is defined.
    pub valid_mask: Tensor,
    /// `[b, t_len - 1]` f32, no graph: the entropy of the whole next-token distribution
    /// `softmax(logits / T)` at each position (0 where invalid).
    pub entropy: Tensor,
    hidden: Tensor,
    lm_head: Tensor,
    rows: Vec<u32>,
    targets: Vec<u32>,
    temperature: f64,
    chunk_rows: usize,
    shape: (usize, usize),
    /// Per chunk, on the CPU fast path: the row log-sum-exps of `z / T` and, while the total stays
    /// within the logits budget, the logits `z` themselves (so backward need not recompute them).
    chunks: Vec<(Vec<f32>, Option<Tensor>)>,
    /// Per chunk, on the candle path: the row log-sum-exps `[n]` f32 on the device.
    lse_d: Vec<Tensor>,
    /// On the candle path: the targets `[rows]` u32 on the device.
    targets_d: Option<Tensor>,
    /// With activation checkpointing: the layers the backward recomputes.
    recompute: Option<Checkpointed>,
    /// The policy's trainable tensors: the gradient store is trimmed to them.
    params: Vec<Tensor>,
}

/// The gather index that spreads per-row values (`rows` order, then one 0 appended) over the
/// `[b · (t − 1)]` positions: entry `p` is the row computed at position `p`, or `rows.len()`.
fn spread_index(rows: &[u32], t: usize, b: usize, dev: &candle_core::Device) -> Result<Tensor> {
    let mut src = vec![rows.len() as u32; b * (t - 1)];
    for (i, &r) in rows.iter().enumerate() {
        let (bi, ti) = (r as usize / t, r as usize % t);
        src[bi * (t - 1) + ti] = i as u32;
    }
    Ok(Tensor::from_vec(src, b * (t - 1), dev)?)
}

/// The per-row values of `chunks` spread to `shape` by `src` ([`spread_index`]), on the device.
fn spread(mut chunks: Vec<Tensor>, src: &Tensor, shape: (usize, usize)) -> Result<Tensor> {
    chunks.push(Tensor::zeros(1, DType::F32, src.device())?);
    Ok(Tensor::cat(&chunks, 0)?
        .index_select(src, 0)?
        .reshape(shape)?)
}

/// Runs the forward for `ids` `[b, t]` with `attention_mask` `[b, t]` (right padding, positions
/// `0..t`). `differentiable` selects the training view (graph recorded) or the inference view.
pub fn token_logprobs(
    policy: &Policy,
    ids: &Tensor,
    attention_mask: Option<&Tensor>,
    temperature: f64,
    differentiable: bool,
    chunk_elems: usize,
) -> Result<TokenLogprobs> {
    token_logprobs_at(
        policy,
        ids,
        attention_mask,
        None,
        temperature,
        differentiable,
        chunk_elems,
    )
}

/// A right-padded batch the host already holds (the learner built it): `ids` and `attention`
/// (1 = token) `[rows · len]`, and optionally the positions `need` `[rows · (len − 1)]` (non-zero
/// where a log-prob is needed, see [`token_logprobs_at`]). The forward of such a batch reads
/// nothing back from the device to check, select or place rows.
#[derive(Debug, Clone, Copy)]
pub struct HostBatch<'a> {
    pub ids: &'a [u32],
    pub attention: &'a [u32],
    pub need: Option<&'a [f32]>,
    pub rows: usize,
    pub len: usize,
}

/// [`token_logprobs`] at the positions where `need` `[b, t_len - 1]` is non-zero only (a loss
/// mask): the vocabulary projection — for a 150k vocabulary as costly as the whole decoder on
/// a sequence — runs on those rows alone. Elsewhere the log-prob and entropy are 0 and
/// `valid_mask` is 0.
pub fn token_logprobs_at(
    policy: &Policy,
    ids: &Tensor,
    attention_mask: Option<&Tensor>,
    need: Option<&Tensor>,
    temperature: f64,
    differentiable: bool,
    chunk_elems: usize,
) -> Result<TokenLogprobs> {
    let (b, t) = ids.dims2()?;
    if let Some(n) = need {
        if t >= 2 && n.dims() != [b, t - 1] {
            return Err(ModelError::InvalidArgument(format!(
                "the positions needed have shape {:?}, expected [{b}, {}]",
                n.dims(),
                t - 1
            )));
        }
    }
    let id_rows = host::vec1::<u32>(&ids.to_dtype(DType::U32)?)?;
    let attention = match attention_mask {
        Some(m) => host::vec1::<u32>(&m.to_dtype(DType::U32)?)?,
        None => vec![1; b * t],
    };
    let need = need
        .map(|n| host::vec1::<f32>(&n.to_dtype(DType::F32)?))
        .transpose()?;
    let batch = HostBatch {
        ids: &id_rows,
        attention: &attention,
        need: need.as_deref(),
        rows: b,
        len: t,
    };
    token_logprobs_host(policy, &batch, temperature, differentiable, chunk_elems)
}

/// [`token_logprobs_at`] of a batch the host holds: on a GPU the forward makes no device→host
/// read (the log-probs and entropies stay on the device).
pub fn token_logprobs_host(
    policy: &Policy,
    batch: &HostBatch<'_>,
    temperature: f64,
    differentiable: bool,
    chunk_elems: usize,
) -> Result<TokenLogprobs> {
    if !(temperature > 0.0 && temperature.is_finite()) {
        return Err(ModelError::InvalidArgument(format!(
            "temperature must be > 0, got {temperature}"
        )));
    }
    let model = if differentiable {
        policy.training()
    } else {
        policy.inference()
    };
    let (b, t) = (batch.rows, batch.len);
    if t < 2 {
        return Err(ModelError::InvalidArgument(
            "need at least 2 tokens per row for next-token log-probs".into(),
        ));
    }
    if batch.ids.len() != b * t || batch.attention.len() != b * t {
        return Err(ModelError::InvalidArgument(format!(
            "a batch of {b} rows of {t}: {} ids and {} attention entries",
            batch.ids.len(),
            batch.attention.len()
        )));
    }
    if let Some(n) = batch.need.filter(|n| n.len() != b * (t - 1)) {
        return Err(ModelError::InvalidArgument(format!(
            "the positions needed have {} entries, expected [{b}, {}]",
            n.len(),
            t - 1
        )));
    }
    let dev = policy.device().clone();
    let mask: Vec<Vec<u8>> = batch
        .attention
        .chunks(t)
        .map(|r| r.iter().map(|&x| u8::from(x != 0)).collect())
        .collect();
    let max_id = batch.ids.iter().copied().max().unwrap_or(0);
    // Right-padded rows (the learner's) run packed, end to end without their padding; any other
    // mask runs as the padded batch it is. `at[bi]`: where row `bi` starts in `flat`.
    let lens = prefix_lengths(&mask);
    let (flat, at, recompute) = match lens {
        Some(lens) => {
            let packed: Vec<u32> = batch
                .ids
                .chunks(t)
                .zip(&lens)
                .flat_map(|(r, &l)| r[..l].iter().copied())
                .collect();
            let varlen =
                VarLen::new(&lens, policy.dtype(), &dev)?.with_fused(policy.attends_fused());
            let (h, rc) = policy.hidden_packed(model, &packed, max_id, varlen, differentiable)?;
            let mut at = Vec::with_capacity(b);
            lens.iter().fold(0, |off, &l| {
                at.push(off);
                off + l
            });
            (h, at, rc)
        }
        None => {
            let ids = Tensor::from_slice(batch.ids, (b, t), &dev)?;
            let hidden = policy.hidden_rows(model, &ids, max_id, &mask)?;
            let hsize = hidden.dim(D::Minus1)?;
            let at = (0..b).map(|bi| bi * t).collect();
            (hidden.reshape((b * t, hsize))?, at, None)
        }
    };
    let mut rows = Vec::new();
    let mut targets = Vec::new();
    let mut valid = vec![0f32; b * (t - 1)];
    for bi in 0..b {
        for ti in 0..t - 1 {
            let needed = batch.need.is_none_or(|n| n[bi * (t - 1) + ti] != 0.0);
            if needed && mask[bi][ti] == 1 && mask[bi][ti + 1] == 1 {
                rows.push((bi * t + ti) as u32);
                targets.push(batch.ids[bi * t + ti + 1]);
                valid[bi * (t - 1) + ti] = 1.0;
            }
        }
    }
    let sel: Vec<u32> = rows
        .iter()
        .map(|&r| (at[r as usize / t] + r as usize % t) as u32)
        .collect();
    let hidden = if rows.is_empty() {
        flat.narrow(0, 0, 0)?
    } else {
        flat.index_select(&Tensor::from_vec(sel, rows.len(), &dev)?, 0)?
    };
    let lm_head = model.lm_head().clone();
    let vocab = lm_head.dim(0)?;
    let hd = hidden.detach();
    let wd = lm_head.detach();
    // The CPU f32 kernels of `cpu::logits`, under the same rule that picks the decoder's kernels.
    let fast = cpu::handles(wd.device(), wd.dtype());
    // On the CPU a chunk's logits (and its `dL/dz`) stay below glibc's mmap threshold, so their
    // buffers are reused from the heap instead of being faulted in afresh (see `cpu::alloc`).
    let chunk_cap = if fast {
        chunk_elems.min(cpu::alloc::MAX_HEAP_BLOCK / 4 - 4096)
    } else {
        chunk_elems
    };
    let chunk_rows = (chunk_cap / vocab.max(1)).max(1);
    let mut values = vec![0f32; if fast { b * (t - 1) } else { 0 }];
    let mut entropy = values.clone();
    // The candle path (CUDA): each chunk's log-sum-exps, picked log-probs and entropies stay on
    // the device; the targets go up once.
    let (mut lse_d, mut picked_d, mut ent_d) = (Vec::new(), Vec::new(), Vec::new());
    let targets_d = if fast || rows.is_empty() {
        None
    } else {
        Some(Tensor::from_slice(&targets, targets.len(), &dev)?)
    };
    let inv_t = (1.0 / temperature) as f32;
    let mut chunks = Vec::new();
    let mut kept = 0usize;
    let mut start = 0;
    while start < rows.len() {
        let n = chunk_rows.min(rows.len() - start);
        if fast {
            let z = logits(&hd.narrow(0, start, n)?, &wd)?;
            let (lse, picked, ent) = lse_pick_entropy(&z, &targets[start..start + n], inv_t)?;
            let keep = differentiable && kept + n * vocab <= chunk_elems;
            if keep {
                kept += n * vocab;
            }
            chunks.push((lse, keep.then_some(z)));
            for (i, (v, h)) in picked.into_iter().zip(ent).enumerate() {
                let r = rows[start + i] as usize;
                let (bi, ti) = (r / t, r % t);
                values[bi * (t - 1) + ti] = v;
                entropy[bi * (t - 1) + ti] = h;
            }
        } else {
            // One kernel over the chunk's logits (CUDA; the twin elsewhere), in their dtype.
            let z = hd.narrow(0, start, n)?.matmul(&wd.t()?)?;
            let Some(all) = &targets_d else { break };
            let tgt = all.narrow(0, start, n)?;
            let o = crate::logprob_head::lse_pick_entropy(&z, &tgt, inv_t)?;
            lse_d.push(o.narrow(1, 0, 1)?.squeeze(1)?);
            picked_d.push(o.narrow(1, 1, 1)?.squeeze(1)?);
            ent_d.push(o.narrow(1, 2, 1)?.squeeze(1)?);
        }
        start += n;
    }
    let (logprobs, entropy) = if fast {
        (
            Tensor::from_vec(values, (b, t - 1), &dev)?,
            Tensor::from_vec(entropy, (b, t - 1), &dev)?,
        )
    } else {
        let src = spread_index(&rows, t, b, &dev)?;
        (
            spread(picked_d, &src, (b, t - 1))?,
            spread(ent_d, &src, (b, t - 1))?,
        )
    };
    Ok(TokenLogprobs {
        logprobs,
        valid_mask: Tensor::from_vec(valid, (b, t - 1), &dev)?,
        entropy,
        hidden,
        lm_head,
        rows,
        targets,
        temperature,
        chunk_rows,
        shape: (b, t),
        chunks,
        lse_d,
        targets_d,
        recompute,
        params: policy
            .named_parameters()
            .values()
            .map(|v| v.as_tensor().clone())
            .collect(),
    })
}

impl TokenLogprobs {
    /// Whether the backward recomputes the decoder layer by layer (activation checkpointing: a
    /// differentiable forward of packed rows by a policy with it on).
    pub fn recomputes_layers(&self) -> bool {
        self.recompute.is_some()
    }
}

/// Training forward + backward through an arbitrary loss of the log-probs: `loss_fn` receives a
/// `[b, t_len - 1]` tensor that records gradients and returns a scalar loss. Returns the loss value,
/// the log-probs and the parameter gradients.
pub fn logprobs_and_grads(
    policy: &Policy,
    ids: &Tensor,
    attention_mask: Option<&Tensor>,
    temperature: f64,
    loss_fn: impl FnOnce(&Tensor) -> candle_core::Result<Tensor>,
) -> Result<(f32, TokenLogprobs, GradStore)> {
    logprobs_and_grads_at(policy, ids, attention_mask, None, temperature, loss_fn)
}

/// [`logprobs_and_grads`] computing the log-probs only where `need` is non-zero (see
/// [`token_logprobs_at`]): the loss must not depend on the other positions.
pub fn logprobs_and_grads_at(
    policy: &Policy,
    ids: &Tensor,
    attention_mask: Option<&Tensor>,
    need: Option<&Tensor>,
    temperature: f64,
    loss_fn: impl FnOnce(&Tensor) -> candle_core::Result<Tensor>,
) -> Result<(f32, TokenLogprobs, GradStore)> {
    let fwd = token_logprobs_at(
        policy,
        ids,
        attention_mask,
        need,
        temperature,
        true,
        DEFAULT_CHUNK_ELEMS,
    )?;
    let (loss, grads) = fwd.loss_and_grads(loss_fn)?;
    Ok((host::scalar::<f32>(&loss)?, fwd, grads))
}
