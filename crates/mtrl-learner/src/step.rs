//! The training step: a batch of groups in, one AdamW update and version v + 1 out.
//!
//! 1. advantages per group, staleness check, rows with shifted masks ([`crate::batch`]);
//! 2. [`GlobalCounts`] of the whole batch, so micro-batch losses and gradients add up to the
//!    full-batch ones whatever the split;
//! 3. the rows are cut into `ppo_mini_batches` mini-batches, one optimizer update each
//!    ([`crate::update`]); the PPO / CISPO / IS ratio is π_θ over
//!    - the **sampler** (`ratio = "sampler"`, the managed service's definition): the rollout's
//!      behaviour log-probs, so a stale or mismatched sample is clipped against the policy that
//!      actually produced it; or
//!    - a **proximal** policy (`ratio = "proximal"`, decoupled PPO as in AReaL): the learner's
//!      log-probs recomputed once at the start of the step, before the first update; the
//!      sampler then enters as the truncated-IS weight `min(exp(logp_prox − logp_behav), C)`.
//!      With one update per batch the proximal policy would be the current one (ratio 1), so the
//!      config requires `ppo_mini_batches >= 2` there;
//! 4. per update: micro-batches (token budget) through the training forward with exact gradients,
//!    optional k3 KL to a frozen reference, gradients accumulated by name, global-norm clipping,
//!    AdamW at the step's scheduled learning rate. The version becomes v + 1.
//!
//! [`Learner::weights`] then gives device-side copies of every parameter for the rollout engine
//! (`Tensor::copy`: no host round trip when learner and engine share a device), finished on the
//! device before they are handed over (the engine thread runs on another CUDA stream).
//!
//! Determinism: on CPU the same batch, weights and optimizer state give the same bits (fixed
//! micro-batch split, in-order accumulation, no RNG).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use mtrl_algo::{Advantage, AdvantageOptions, Aggregation, PolicyLoss, Std};
use mtrl_core::{AlgorithmConfig, Trajectory};
use mtrl_model::{HostBatch, Policy};
use serde::{Deserialize, Serialize};

use crate::adamw::AdamW;
use crate::batch::{build_rows, Row};
use crate::dist::{Collective, CommStats, Local, ReduceOptions};
use crate::error::{LearnerError, Result};
use crate::schedule::LrSchedule;
use crate::update::{proximal_logprobs, split_even, Totals};

/// The denominator of the policy ratio.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RatioBase {
    /// The rollout's behaviour log-probs.
    Sampler,
    /// The learner's log-probs recomputed at the start of the step.
    Proximal,
}

/// What a step needs besides the model and optimizer.
#[derive(Debug, Clone, PartialEq)]
pub struct StepConfig {
    pub loss: PolicyLoss,
    pub advantage: Advantage,
    pub aggregation: Aggregation,
    /// What the ratio is taken against.
    pub ratio: RatioBase,
    /// Optimizer updates per batch (contiguous slices of the rows).
    pub mini_batches: usize,
    /// Cap C of the IS weights: the sampler correction under [`RatioBase::Proximal`] (always
    /// applied) and the truncation of the IS loss; `None` = no cap (`algorithm.tis_cap = 0`).
    pub tis_cap: Option<f64>,
    pub kl_coef: f64,
    pub max_staleness: u64,
    /// Sampling temperature (log-probs are taken under `logits / T`, as the engine reports them).
    pub temperature: f64,
    /// 0 = no clipping.
    pub grad_clip: f64,
    pub micro_batch_tokens: usize,
    pub schedule: LrSchedule,
    /// The dtype micro-batch gradients are summed in (and all-reduced in across ranks).
    pub accumulation: DType,
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
                clip_low: a.clip_low,
                clip_high: a.clip_high,
            },
            "is" => PolicyLoss::Is {
                cap: (a.tis_cap > 0.0).then_some(a.tis_cap),
            },
            other => return Err(LearnerError::Invalid(format!("unknown loss `{other}`"))),
        };
        let opts = AdvantageOptions {
            std: match a.grpo_std.as_str() {
                "unbiased" => Std::Unbiased,
                _ => Std::Population,
            },
            k: Some(a.pass_k),
            threshold: Some(a.success_threshold),
            continuous: a.pass_at_k_reward == "continuous",
            best_only: a.pass_at_k_reward == "best_only",
            norm_by_std: true,
        };
        let advantage = Advantage::from_name(&a.advantage, &opts)
            .map_err(|e| LearnerError::Invalid(format!("algorithm.advantage: {e}")))?;
        let aggregation = Aggregation::from_name(&a.loss_agg, max_len.max(1))
            .ok_or_else(|| LearnerError::Invalid(format!("unknown loss_agg `{}`", a.loss_agg)))?;
        let ratio = match a.ratio.as_str() {
            "sampler" => RatioBase::Sampler,
            "proximal" => RatioBase::Proximal,
            other => return Err(LearnerError::Invalid(format!("unknown ratio `{other}`"))),
        };
        Ok(StepConfig {
            loss,
            advantage,
            aggregation,
            ratio,
            mini_batches: a.ppo_mini_batches.max(1),
            tis_cap: (a.tis_cap > 0.0).then_some(a.tis_cap),
            kl_coef: a.kl_coef,
            max_staleness: a.max_staleness,
            temperature,
            grad_clip,
            micro_batch_tokens,
            schedule,
            accumulation: DType::F32,
        })
    }
}

/// What one step did.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StepMetrics {
    /// Version after the step.
    pub version: u64,
    pub loss: f64,
    /// Fraction of trained tokens whose objective was clipped (PPO) or capped (CISPO, IS), over
    /// every update of the step.
    pub clip_fraction: f64,
    /// Mean sampler-correction weight over trained tokens (`ratio = "proximal"`; 0 with
    /// `ratio = "sampler"`, which has no correction).
    pub behaviour_weight: f64,
    /// Mean over trained tokens of |π_θ/π_sampler − 1|, each taken at the forward that trains
    /// it: how far the samples are from the policy being updated (0 on-policy with an exact
    /// engine).
    pub sampler_gap: f64,
    /// Global gradient norm before clipping (mean over the step's updates).
    pub grad_norm: f64,
    pub lr: f64,
    /// Policy-sampled tokens trained on.
    pub tokens: u64,
    /// Tokens through the model (the rows packed end to end, no padding).
    pub forward_tokens: u64,
    pub sequences: u64,
    pub micro_batches: u64,
    /// Optimizer updates applied (0 when skipped).
    pub updates: u64,
    /// Mean k3 KL to the reference (0 without one).
    pub kl: f64,
    /// Mean entropy of the whole next-token distribution (under the sampling temperature) at the
    /// trained tokens' positions, taken at the forward that trains them.
    pub entropy: f64,
    pub dropped_stale: u64,
    pub empty: u64,
    /// `lag_counts[k]`: trajectories whose oldest token was k versions old.
    pub lag_counts: Vec<u64>,
    /// The update was skipped (no tokens, or a non-finite gradient).
    pub skipped: bool,
    /// Optimizer updates skipped for a non-finite loss or gradient norm, and the first cause.
    #[serde(default)]
    pub skipped_updates: u64,
    #[serde(default)]
    pub skip_reason: Option<String>,
    pub learn_s: f64,
    /// Of `learn_s`: the training forwards, the loss and backward passes, clipping and the
    /// optimizer steps.
    #[serde(default)]
    pub forward_s: f64,
    #[serde(default)]
    pub backward_s: f64,
    #[serde(default)]
    pub optimizer_s: f64,
    /// What this rank sent to the data-parallel all-reduces (zeros for one process).
    #[serde(default)]
    pub comm: CommStats,
}

/// A padded micro-batch (also used by [`crate::sft`]).
pub(crate) struct Micro {
    /// Ids, attention and loss mask on the host (`[b · t]`, `[b · t]`, `[b · (t − 1)]`): the
    /// forward takes them from here ([`Micro::host`]), so nothing is read back to index rows.
    pub(crate) ids: Vec<u32>,
    pub(crate) attention: Vec<u32>,
    pub(crate) need: Vec<f32>,
    pub(crate) shape: (usize, usize),
    pub(crate) mask: Tensor,
    pub(crate) behaviour: Tensor,
    /// The proximal log-probs (zeros unless computed).
    pub(crate) prox: Tensor,
    /// Per-position advantages.
    pub(crate) adv: Tensor,
    pub(crate) tokens: usize,
}

impl Micro {
    /// The batch as the forward takes it, log-probs needed at the loss mask's positions.
    pub(crate) fn host(&self) -> HostBatch<'_> {
        HostBatch {
            ids: &self.ids,
            attention: &self.attention,
            need: Some(&self.need),
            rows: self.shape.0,
            len: self.shape.1,
        }
    }
}

/// The micro-batch of `rows[group]`, right-padded to its longest row.
pub(crate) fn pad(rows: &[Row], group: &[usize], dev: &Device) -> Result<Micro> {
    let rows: Vec<&Row> = group.iter().map(|&i| &rows[i]).collect();
    let t = rows.iter().map(|r| r.tokens.len()).max().unwrap_or(2);
    let b = rows.len();
    let (mut ids, mut att) = (vec![0u32; b * t], vec![0u32; b * t]);
    let w = t - 1;
    let (mut mask, mut beh) = (vec![0f32; b * w], vec![0f32; b * w]);
    let (mut prox, mut adv) = (vec![0f32; b * w], vec![0f32; b * w]);
    for (i, r) in rows.iter().enumerate() {
        ids[i * t..i * t + r.tokens.len()].copy_from_slice(&r.tokens);
        att[i * t..i * t + r.tokens.len()].fill(1);
        let n = r.mask.len();
        mask[i * w..i * w + n].copy_from_slice(&r.mask);
        beh[i * w..i * w + n].copy_from_slice(&r.behaviour);
        adv[i * w..i * w + n].copy_from_slice(&r.advantages);
        if !r.prox.is_empty() {
            prox[i * w..i * w + n].copy_from_slice(&r.prox);
        }
    }
    let tensor = |v: Vec<f32>| Tensor::from_vec(v, (b, w), dev);
    Ok(Micro {
        ids,
        attention: att,
        need: mask.clone(),
        shape: (b, t),
        mask: tensor(mask)?,
        behaviour: tensor(beh)?,
        prox: tensor(prox)?,
        adv: tensor(adv)?,
        tokens: rows.iter().map(|r| r.tokens.len()).sum(),
    })
}

/// Policy, optional frozen reference, optimizer and step configuration.
pub struct Learner {
    pub policy: Policy,
    pub(crate) reference: Option<Policy>,
    pub opt: AdamW,
    pub cfg: StepConfig,
    version: u64,
    /// The data-parallel ranks ([`Local`] for one process).
    pub(crate) comm: Arc<dyn Collective>,
    pub(crate) reduce: ReduceOptions,
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
            comm: Arc::new(Local),
            reduce: ReduceOptions::default(),
        }
    }

    /// Trains as one rank of `comm`: this rank's share of each update's micro-batches, gradients
    /// summed over the ranks in `reduce`'s buckets.
    pub fn with_collective(mut self, comm: Arc<dyn Collective>, reduce: ReduceOptions) -> Learner {
        self.comm = comm;
        self.reduce = reduce;
        self
    }

    pub fn collective(&self) -> &Arc<dyn Collective> {
        &self.comm
    }

    pub fn version(&self) -> u64 {
        self.version
    }

    /// One training step from `groups` (each the G trajectories of one task): `ppo_mini_batches`
    /// updates; the version becomes v + 1 even when the update is skipped, so that the rollout
    /// schedule advances.
    pub fn step(&mut self, groups: &[Vec<Trajectory>]) -> Result<StepMetrics> {
        let t0 = Instant::now();
        let cfg = self.cfg.clone();
        let mut rows = build_rows(groups, cfg.advantage, self.version, cfg.max_staleness)?;
        let mut m = StepMetrics {
            dropped_stale: rows.dropped_stale,
            empty: rows.empty,
            lag_counts: rows.lag_counts.clone(),
            sequences: rows.rows.len() as u64,
            ..StepMetrics::default()
        };
        let tokens: f64 = rows.rows.iter().map(Row::trained).sum();
        m.tokens = tokens as u64;
        // The schedule counts training steps (1-based), not optimizer updates.
        m.lr = cfg.schedule.lr_at(self.version + 1);
        self.version += 1;
        m.version = self.version;
        if tokens == 0.0 {
            m.skipped = true;
            m.learn_s = t0.elapsed().as_secs_f64();
            return Ok(m);
        }
        if cfg.ratio == RatioBase::Proximal {
            proximal_logprobs(&self.policy, &mut rows.rows, &cfg)?;
        }
        let mut total = Totals::default();
        let slices = split_even(rows.rows.len(), cfg.mini_batches);
        for (k, range) in slices.iter().enumerate() {
            let u = self.update(&rows.rows[range.clone()], &cfg, m.lr, k as u64)?;
            total.add(&u);
        }
        m.loss = total.loss / slices.len() as f64;
        m.micro_batches = total.micro_batches;
        m.forward_tokens = total.forward_tokens;
        m.updates = total.updates;
        m.skipped = total.updates == 0;
        m.skipped_updates = slices.len() as u64 - total.updates;
        m.skip_reason = total.skip_reason;
        m.clip_fraction = total.clipped / tokens;
        m.behaviour_weight = match cfg.ratio {
            RatioBase::Proximal => total.weight_sum / tokens,
            RatioBase::Sampler => 0.0,
        };
        m.sampler_gap = total.gap_sum / tokens;
        m.kl = total.kl_sum / tokens;
        m.entropy = total.entropy_sum / tokens;
        m.grad_norm = total.norm_sum / slices.len() as f64;
        m.comm = total.comm;
        m.forward_s = total.forward_s;
        m.backward_s = total.backward_s;
        m.optimizer_s = total.optimizer_s;
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
