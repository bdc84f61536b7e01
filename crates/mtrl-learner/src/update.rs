//! One optimizer update over a slice of a step's rows, and the proximal log-probs of decoupled
//! PPO.
//!
//! An update runs the slice in micro-batches ([`micro_batches`]: rows grouped by length, packed
//! end to end in the forward), each normalised by the slice's [`GlobalCounts`] so that the summed
//! gradient is the slice's whatever the split; then global-norm clipping and one AdamW step. The
//! ratio's denominator is the sampler's log-probs or the proximal ones ([`RatioBase`]); under
//! `Proximal` the sampler enters as the truncated-IS weight.

use std::collections::BTreeMap;
use std::ops::Range;

use std::time::Instant;

use candle_core::{DType, Tensor};
use mtrl_algo::{aggregate, kl_k3, masked_total, per_token_loss, GlobalCounts, LossInputs};
use mtrl_model::{token_logprobs_host, Policy, DEFAULT_CHUNK_ELEMS};

use crate::batch::{micro_batches, Row};
use crate::clip::{accumulate, clip_or_norm};
use crate::dist::{all_reduce_grads, owns, Collective, CommStats};
use crate::error::Result;
use crate::step::{pad, Learner, RatioBase, StepConfig};

/// Sums over the updates of a step.
#[derive(Debug, Clone, Default)]
pub(crate) struct Totals {
    pub loss: f64,
    pub clipped: f64,
    pub weight_sum: f64,
    pub gap_sum: f64,
    pub kl_sum: f64,
    pub entropy_sum: f64,
    pub norm_sum: f64,
    pub micro_batches: u64,
    pub forward_tokens: u64,
    pub updates: u64,
    /// Why an update was skipped (the first non-finite loss or gradient norm), if one was.
    pub skip_reason: Option<String>,
    pub comm: CommStats,
    /// Seconds in the training forwards (decoder and the head at the loss positions), in the
    /// loss and backward passes, and in clipping plus the optimizer step (this rank's).
    pub forward_s: f64,
    pub backward_s: f64,
    pub optimizer_s: f64,
}

impl Totals {
    pub(crate) fn add(&mut self, o: &Totals) {
        self.loss += o.loss;
        self.clipped += o.clipped;
        self.weight_sum += o.weight_sum;
        self.gap_sum += o.gap_sum;
        self.kl_sum += o.kl_sum;
        self.entropy_sum += o.entropy_sum;
        self.norm_sum += o.norm_sum;
        self.micro_batches += o.micro_batches;
        self.forward_tokens += o.forward_tokens;
        self.updates += o.updates;
        if self.skip_reason.is_none() {
            self.skip_reason.clone_from(&o.skip_reason);
        }
        self.comm.add(&o.comm);
        self.forward_s += o.forward_s;
        self.backward_s += o.backward_s;
        self.optimizer_s += o.optimizer_s;
    }

    /// Sums the per-rank sums of an update's micro-batches over the ranks (a no-op for one).
    fn all_reduce(&mut self, c: &dyn Collective) -> Result<()> {
        if c.world() <= 1 {
            return Ok(());
        }
        let mut v = [
            self.loss,
            self.clipped,
            self.weight_sum,
            self.gap_sum,
            self.kl_sum,
            self.entropy_sum,
            self.micro_batches as f64,
            self.forward_tokens as f64,
        ];
        c.all_reduce_f64(&mut v, "update totals")?;
        [
            self.loss,
            self.clipped,
            self.weight_sum,
            self.gap_sum,
            self.kl_sum,
            self.entropy_sum,
        ] = [v[0], v[1], v[2], v[3], v[4], v[5]];
        self.micro_batches = v[6] as u64;
        self.forward_tokens = v[7] as u64;
        self.comm.calls += 1;
        self.comm.bytes += std::mem::size_of_val(&v) as u64;
        Ok(())
    }
}

/// `n` rows cut into `parts` contiguous slices whose sizes differ by at most one (fewer slices
/// when there are fewer rows).
pub(crate) fn split_even(n: usize, parts: usize) -> Vec<Range<usize>> {
    let parts = parts.clamp(1, n.max(1));
    let (base, extra) = (n / parts, n % parts);
    let mut out = Vec::with_capacity(parts);
    let mut start = 0;
    for i in 0..parts {
        let len = base + usize::from(i < extra);
        out.push(start..start + len);
        start += len;
    }
    out
}

/// Fills every row's `prox` with the current policy's log-probs (no graph), at the row's
/// log-prob positions: the proximal policy of decoupled PPO, fixed for the whole step.
pub(crate) fn proximal_logprobs(policy: &Policy, rows: &mut [Row], cfg: &StepConfig) -> Result<()> {
    let dev = policy.device().clone();
    for group in micro_batches(rows, cfg.micro_batch_tokens, policy.attends_fused()) {
        let mb = pad(rows, &group, &dev)?;
        let lp = token_logprobs_host(
            policy,
            &mb.host(),
            cfg.temperature,
            false,
            DEFAULT_CHUNK_ELEMS,
        )?;
        // One read per micro-batch: the proximal log-probs live on the host rows.
        let lp = mtrl_model::host::vec2::<f32>(&lp.logprobs.to_dtype(DType::F32)?)?;
        for (&i, lp) in group.iter().zip(lp) {
            let row = &mut rows[i];
            row.prox = lp[..row.mask.len()].to_vec();
        }
    }
    Ok(())
}

fn algo(e: mtrl_algo::AlgoError) -> candle_core::Error {
    candle_core::Error::Msg(e.to_string())
}

fn algo_msg(m: &str) -> candle_core::Error {
    candle_core::Error::Msg(m.to_string())
}

impl Learner {
    /// One AdamW update from `rows` at learning rate `lr`; `slice` is its index within the step
    /// (with the policy version, it seeds LoRA dropout, so a resumed run draws the same masks).
    pub(crate) fn update(
        &mut self,
        rows: &[Row],
        cfg: &StepConfig,
        lr: f64,
        slice: u64,
    ) -> Result<Totals> {
        let mut out = Totals::default();
        let global = GlobalCounts {
            tokens: rows.iter().map(Row::trained).sum(),
            // Trajectories, not rows: an agent's segments of one trajectory add up to one.
            sequences: crate::batch::sequences(rows),
        };
        // seq-mean-token-mean divides each row by its own trained tokens; a segment must be
        // divided by its whole trajectory's, so its loss is scaled by its share first (exactly
        // 1 for a row that is a whole trajectory: nothing changes there).
        let segmented = matches!(cfg.aggregation, mtrl_algo::Aggregation::SeqMeanTokenMean)
            && rows.iter().any(|r| r.share() != 1.0);
        let dev = self.policy.device().clone();
        let mut grads: BTreeMap<String, Tensor> = BTreeMap::new();
        let acc = cfg.accumulation;
        let comm = self.comm.clone();
        // The split is the single process's; ranks are dealt its micro-batches (`dealt_to`).
        for (i, group) in micro_batches(rows, cfg.micro_batch_tokens, self.policy.attends_fused())
            .into_iter()
            .enumerate()
        {
            if !owns(comm.as_ref(), i) {
                continue;
            }
            let shares: Option<Tensor> = segmented
                .then(|| {
                    let v: Vec<f32> = group.iter().map(|&r| rows[r].share() as f32).collect();
                    let n = v.len();
                    Tensor::from_vec(v, (n, 1), &dev)
                })
                .transpose()?;
            let mb = pad(rows, &group, &dev)?;
            let stream = (self.version() << 24) ^ (slice << 12) ^ i as u64;
            self.policy.set_dropout_seed(mtrl_core::rng::mix(stream));
            out.micro_batches += 1;
            out.forward_tokens += mb.tokens as u64;
            let reference = match &self.reference {
                Some(r) if cfg.kl_coef > 0.0 => Some(
                    token_logprobs_host(
                        r,
                        &mb.host(),
                        cfg.temperature,
                        false,
                        DEFAULT_CHUNK_ELEMS,
                    )?
                    .logprobs,
                ),
                _ => None,
            };
            let (old, correction) = match cfg.ratio {
                RatioBase::Sampler => (&mb.behaviour, None),
                RatioBase::Proximal => (
                    &mb.prox,
                    Some((&mb.behaviour, cfg.tis_cap.unwrap_or(f64::INFINITY))),
                ),
            };
            // The diagnostics stay on the device until the one read below.
            let mut diag: Option<[Tensor; 3]> = None;
            // Every term below is masked by `mb.mask`: the head runs on those positions only.
            let t_fwd = Instant::now();
            let fwd = token_logprobs_host(
                &self.policy,
                &mb.host(),
                cfg.temperature,
                true,
                DEFAULT_CHUNK_ELEMS,
            )?;
            out.forward_s += t_fwd.elapsed().as_secs_f64();
            let t_bwd = Instant::now();
            // The forward and the backward of `logprobs_and_grads_at`, timed apart.
            let (loss, g) = fwd.loss_and_grads(|lp| {
                let x = LossInputs {
                    logp: lp,
                    logp_old: old,
                    behaviour: correction,
                    advantages: &mb.adv,
                    mask: &mb.mask,
                };
                let mut o = per_token_loss(cfg.loss, &x).map_err(algo)?;
                if let Some(sh) = &shares {
                    o.per_token = o
                        .per_token
                        .broadcast_mul(&sh.to_dtype(o.per_token.dtype())?)?;
                }
                let mut kl_total = o.behaviour_weight.zeros_like()?;
                let mut l =
                    aggregate(&o.per_token, &mb.mask, cfg.aggregation, global).map_err(algo)?;
                if let Some(r) = &reference {
                    let kl = kl_k3(lp, r).map_err(algo)?;
                    kl_total = masked_total(&kl, &mb.mask).map_err(algo)?;
                    let kl = match &shares {
                        Some(sh) => kl.broadcast_mul(&sh.to_dtype(kl.dtype())?)?,
                        None => kl,
                    };
                    let k = aggregate(&kl, &mb.mask, cfg.aggregation, global).map_err(algo)?;
                    l = (l + (k * cfg.kl_coef)?)?;
                }
                diag = Some([o.clipped, o.behaviour_weight, kl_total]);
                Ok(l)
            })?;
            out.backward_s += t_bwd.elapsed().as_secs_f64();
            let gap = fwd
                .logprobs
                .to_dtype(DType::F32)?
                .sub(&mb.behaviour)?
                .exp()?
                .affine(1.0, -1.0)?
                .abs()?;
            let [clipped, weight, kl] = diag.ok_or_else(|| algo_msg("the loss never ran"))?;
            let terms = [
                loss.to_dtype(DType::F64)?,
                clipped,
                weight,
                kl,
                masked_total(&fwd.entropy, &mb.mask).map_err(algo)?,
                masked_total(&gap, &mb.mask).map_err(algo)?,
            ];
            // The micro-batch's one device→host read: loss and diagnostics together.
            let v = mtrl_model::host::vec1::<f64>(&Tensor::stack(&terms, 0)?)?;
            out.loss += v[0];
            out.clipped += v[1];
            out.weight_sum += v[2];
            out.kl_sum += v[3];
            out.entropy_sum += v[4];
            out.gap_sum += v[5];
            accumulate(&mut grads, self.policy.named_parameters(), &g, acc)?;
        }
        out.all_reduce(comm.as_ref())?;
        let params = self.policy.named_parameters();
        let sent = all_reduce_grads(comm.as_ref(), params, &mut grads, self.reduce, acc)?;
        out.comm.add(&sent);
        let t_opt = Instant::now();
        let norm = clip_or_norm(&mut grads, cfg.grad_clip)?;
        out.norm_sum = norm;
        if norm.is_finite() && out.loss.is_finite() {
            self.opt.step(self.policy.named_parameters(), &grads, lr)?;
            out.updates = 1;
            out.optimizer_s = t_opt.elapsed().as_secs_f64();
        } else {
            out.skip_reason = Some(if out.loss.is_finite() {
                format!("non-finite gradient norm ({norm})")
            } else {
                format!("non-finite loss ({})", out.loss)
            });
        }
        Ok(out)
    }
}
