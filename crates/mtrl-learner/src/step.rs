//! The training step: a batch of groups in, one AdamW update and version v + 1 out.
//!
//! 1. advantages per group, staleness check, rows with shifted masks ([`crate::batch`]);
//! 2. [`GlobalCounts`] of the whole batch, so micro-batch losses and gradients add up to the
//!    full-batch ones whatever the split;
//! 3. per micro-batch (token budget): the training forward with exact gradients
//!    (`mtrl_model::logprobs_and_grads`); the proximal log-probs are the detached current ones
//!    (one update per batch, so the PPO ratio is 1 and the clip acts through the behaviour
//!    correction); the rollout's behaviour log-probs enter as the truncated-IS / decoupled-PPO
//!    weight `min(exp(logp_prox − logp_behav), C)`; optional k3 KL to a frozen reference policy;
//!    gradients accumulated by parameter name;
//! 4. global-norm clipping, AdamW with the scheduled learning rate; the version becomes v + 1.
//!
//! [`Learner::weights`] then gives device-side copies of every parameter for the rollout engine
//! (`Tensor::copy`: no host round trip when learner and engine share a device), finished on the
//! device before they are handed over (the engine thread runs on another CUDA stream).
//!
//! Determinism: on CPU the same batch, weights and optimizer state give the same bits (fixed
//! micro-batch split, in-order accumulation, no RNG).

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use mtrl_algo::{
    aggregate, kl_k3, per_token_loss, Advantage, Aggregation, GlobalCounts, LossInputs, PolicyLoss,
};
use mtrl_core::{AlgorithmConfig, Trajectory};
use mtrl_model::{logprobs_and_grads, token_logprobs, Policy};
use serde::{Deserialize, Serialize};

use crate::adamw::AdamW;
use crate::batch::{build_rows, micro_batches, Row};
use crate::clip::{clip_global_norm, global_norm};
use crate::error::{LearnerError, Result};
use crate::schedule::LrSchedule;

/// What a step needs besides the model and optimizer.
#[derive(Debug, Clone, PartialEq)]
pub struct StepConfig {
    pub loss: PolicyLoss,
    pub advantage: Advantage,
    pub aggregation: Aggregation,
    /// Cap C of the behaviour correction; `None` = no correction.
    pub tis_cap: Option<f64>,
    pub kl_coef: f64,
    pub max_staleness: u64,
    /// Sampling temperature (log-probs are taken under `logits / T`, as the engine reports them).
    pub temperature: f64,
    /// 0 = no clipping.
    pub grad_clip: f64,
    pub micro_batch_tokens: usize,
    pub schedule: LrSchedule,
}

impl StepConfig {
    /// Maps `[algorithm]` names onto `mtrl-algo`; `max_len` is L of `seq-mean-token-sum-norm`.
    pub fn from_algorithm(
        a: &AlgorithmConfig,
        temperature: f64,
        grad_clip: f64,
        micro_batch_tokens: usize,
        schedule: LrSchedule,
        max_len: usize,
    ) -> Result<StepConfig> {
        let loss = match a.loss.as_str() {
            "ppo" => PolicyLoss::Ppo {
                clip_low: a.clip_low,
                clip_high: a.clip_high,
                dual_clip: a.dual_clip,
            },
            "cispo" => PolicyLoss::Cispo {
                clip_high: a.clip_high,
            },
            "is" => PolicyLoss::Is {
                cap: if a.tis_cap > 0.0 { a.tis_cap } else { 2.0 },
            },
            other => return Err(LearnerError::Invalid(format!("unknown loss `{other}`"))),
        };
        let advantage = Advantage::from_name(&a.advantage)
            .ok_or_else(|| LearnerError::Invalid(format!("unknown advantage `{}`", a.advantage)))?;
        let aggregation = Aggregation::from_name(&a.loss_agg, max_len.max(1))
            .ok_or_else(|| LearnerError::Invalid(format!("unknown loss_agg `{}`", a.loss_agg)))?;
        Ok(StepConfig {
            loss,
            advantage,
            aggregation,
            tis_cap: (a.tis_cap > 0.0).then_some(a.tis_cap),
            kl_coef: a.kl_coef,
            max_staleness: a.max_staleness,
            temperature,
            grad_clip,
            micro_batch_tokens,
            schedule,
        })
    }
}

/// What one step did.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StepMetrics {
    /// Version after the step.
    pub version: u64,
    pub loss: f64,
    /// Fraction of trained tokens whose objective was clipped (PPO) or capped (CISPO, IS).
    pub clip_fraction: f64,
    /// Mean behaviour-correction weight over trained tokens (1 when on-policy; 0 when off).
    pub behaviour_weight: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    pub lr: f64,
    /// Policy-sampled tokens trained on.
    pub tokens: u64,
    /// Padded tokens through the model.
    pub padded_tokens: u64,
    pub sequences: u64,
    pub micro_batches: u64,
    /// Mean k3 KL to the reference (0 without one).
    pub kl: f64,
    /// Mean negative log-prob of the trained tokens (an entropy estimate when on-policy).
    pub entropy: f64,
    pub dropped_stale: u64,
    pub empty: u64,
    /// `lag_counts[k]`: trajectories whose oldest token was k versions old.
    pub lag_counts: Vec<u64>,
    /// The update was skipped (no tokens, or a non-finite gradient).
    pub skipped: bool,
    pub learn_s: f64,
}

/// Policy, optional frozen reference, optimizer and step configuration.
pub struct Learner {
    pub policy: Policy,
    reference: Option<Policy>,
    pub opt: AdamW,
    pub cfg: StepConfig,
    version: u64,
}

fn algo(e: mtrl_algo::AlgoError) -> candle_core::Error {
    candle_core::Error::Msg(e.to_string())
}

/// A padded micro-batch (also used by [`crate::sft`]).
pub(crate) struct Micro {
    pub(crate) ids: Tensor,
    pub(crate) attention: Tensor,
    pub(crate) mask: Tensor,
    behaviour: Tensor,
    adv: Tensor,
    padded: usize,
}

pub(crate) fn pad(rows: &[Row], dev: &Device) -> Result<Micro> {
    let t = rows.iter().map(|r| r.tokens.len()).max().unwrap_or(2);
    let b = rows.len();
    let (mut ids, mut att) = (vec![0u32; b * t], vec![0u32; b * t]);
    let (mut mask, mut beh) = (vec![0f32; b * (t - 1)], vec![0f32; b * (t - 1)]);
    for (i, r) in rows.iter().enumerate() {
        ids[i * t..i * t + r.tokens.len()].copy_from_slice(&r.tokens);
        att[i * t..i * t + r.tokens.len()].fill(1);
        let n = r.mask.len();
        mask[i * (t - 1)..i * (t - 1) + n].copy_from_slice(&r.mask);
        beh[i * (t - 1)..i * (t - 1) + n].copy_from_slice(&r.behaviour);
    }
    let adv: Vec<f32> = rows.iter().map(|r| r.advantage as f32).collect();
    Ok(Micro {
        ids: Tensor::from_vec(ids, (b, t), dev)?,
        attention: Tensor::from_vec(att, (b, t), dev)?,
        mask: Tensor::from_vec(mask, (b, t - 1), dev)?,
        behaviour: Tensor::from_vec(beh, (b, t - 1), dev)?,
        adv: Tensor::from_vec(adv, b, dev)?,
        padded: b * t,
    })
}

fn masked_sum(t: &Tensor, mask: &Tensor) -> Result<f64> {
    Ok(t.to_dtype(DType::F32)?
        .mul(mask)?
        .sum_all()?
        .to_dtype(DType::F64)?
        .to_scalar::<f64>()?)
}

impl Learner {
    /// `version` is the policy version of `policy`'s current weights.
    pub fn new(
        policy: Policy,
        reference: Option<Policy>,
        opt: AdamW,
        cfg: StepConfig,
        version: u64,
    ) -> Learner {
        Learner {
            policy,
            reference,
            opt,
            cfg,
            version,
        }
    }

    pub fn version(&self) -> u64 {
        self.version
    }

    /// One update from `groups` (each the G trajectories of one task); the version becomes v + 1
    /// even when the update is skipped, so that the rollout schedule advances.
    pub fn step(&mut self, groups: &[Vec<Trajectory>]) -> Result<StepMetrics> {
        let t0 = Instant::now();
        let cfg = self.cfg.clone();
        let rows = build_rows(groups, cfg.advantage, self.version, cfg.max_staleness)?;
        let mut m = StepMetrics {
            dropped_stale: rows.dropped_stale,
            empty: rows.empty,
            lag_counts: rows.lag_counts.clone(),
            sequences: rows.rows.len() as u64,
            ..StepMetrics::default()
        };
        let tokens: f64 = rows
            .rows
            .iter()
            .map(|r| r.mask.iter().sum::<f32>() as f64)
            .sum();
        m.tokens = tokens as u64;
        self.version += 1;
        m.version = self.version;
        if tokens == 0.0 {
            m.skipped = true;
            m.learn_s = t0.elapsed().as_secs_f64();
            return Ok(m);
        }
        let global = GlobalCounts {
            tokens,
            sequences: rows.rows.len() as f64,
        };
        let dev = self.policy.device().clone();
        let mut grads: BTreeMap<String, Tensor> = BTreeMap::new();
        let (mut clipped, mut wsum, mut kl_sum, mut nll_sum) = (0.0, 0.0, 0.0, 0.0);
        for range in micro_batches(&rows.rows, cfg.micro_batch_tokens) {
            let mb = pad(&rows.rows[range], &dev)?;
            m.micro_batches += 1;
            m.padded_tokens += mb.padded as u64;
            let reference = match &self.reference {
                Some(r) if cfg.kl_coef > 0.0 => Some(
                    token_logprobs(
                        r,
                        &mb.ids,
                        Some(&mb.attention),
                        cfg.temperature,
                        false,
                        1 << 25,
                    )?
                    .logprobs,
                ),
                _ => None,
            };
            let mut diag = (0.0, 0.0, 0.0);
            let (loss, fwd, g) = logprobs_and_grads(
                &self.policy,
                &mb.ids,
                Some(&mb.attention),
                cfg.temperature,
                |lp| {
                    let old = lp.detach();
                    let x = LossInputs {
                        logp: lp,
                        logp_old: &old,
                        behaviour: cfg.tis_cap.map(|c| (&mb.behaviour, c)),
                        advantages: &mb.adv,
                        mask: &mb.mask,
                    };
                    let out = per_token_loss(cfg.loss, &x).map_err(algo)?;
                    diag.0 = out.clipped_tokens;
                    diag.1 = out.behaviour_weight_sum;
                    let mut l = aggregate(&out.per_token, &mb.mask, cfg.aggregation, global)
                        .map_err(algo)?;
                    if let Some(r) = &reference {
                        let kl = kl_k3(lp, r).map_err(algo)?;
                        diag.2 = kl
                            .mul(&mb.mask)?
                            .sum_all()?
                            .to_dtype(DType::F64)?
                            .to_scalar::<f64>()?;
                        let k = aggregate(&kl, &mb.mask, cfg.aggregation, global).map_err(algo)?;
                        l = (l + (k * cfg.kl_coef)?)?;
                    }
                    Ok(l)
                },
            )?;
            m.loss += loss as f64;
            clipped += diag.0;
            wsum += diag.1;
            kl_sum += diag.2;
            nll_sum -= masked_sum(&fwd.logprobs, &mb.mask)?;
            for (name, var) in self.policy.named_parameters() {
                if let Some(gr) = g.get(var.as_tensor()) {
                    let gr = gr.to_dtype(DType::F32)?;
                    let acc = match grads.remove(name) {
                        Some(prev) => (prev + gr)?,
                        None => gr,
                    };
                    grads.insert(name.clone(), acc);
                }
            }
        }
        m.clip_fraction = clipped / tokens;
        m.behaviour_weight = if cfg.tis_cap.is_some() {
            wsum / tokens
        } else {
            0.0
        };
        m.kl = kl_sum / tokens;
        m.entropy = nll_sum / tokens;
        let norm = if cfg.grad_clip > 0.0 {
            clip_global_norm(&mut grads, cfg.grad_clip)?.0
        } else {
            global_norm(&grads)?
        };
        m.grad_norm = norm;
        m.lr = cfg.schedule.lr_at(self.opt.step_count() + 1);
        if norm.is_finite() && m.loss.is_finite() {
            self.opt
                .step(self.policy.named_parameters(), &grads, m.lr)?;
        } else {
            m.skipped = true;
        }
        m.learn_s = t0.elapsed().as_secs_f64();
        Ok(m)
    }

    /// Device-side copies of every parameter (HF names), for the rollout engine.
    ///
    /// Invariant: the tensors returned are complete — the copies have finished on the device
    /// before this returns. candle's CUDA work is asynchronous and each host thread launches on
    /// its own stream (`CudaDevice::new` takes the per-thread default stream), so the engine
    /// thread, reading these on its stream, would not otherwise be ordered after the learner's
    /// copies. One `Device::synchronize` after all copies (not one per tensor) waits for this
    /// thread's stream; on the CPU it is a no-op, the copies being done when `copy` returns.
    pub fn weights(&self) -> Result<HashMap<String, Tensor>> {
        let mut out = HashMap::with_capacity(self.policy.named_parameters().len());
        for (name, var) in self.policy.named_parameters() {
            out.insert(name.clone(), var.as_tensor().detach().copy()?);
        }
        self.policy.device().synchronize()?;
        Ok(out)
    }
}
