//! Supervised fine-tuning (warm start): next-token cross-entropy on the masked ids of
//! teacher-forced conversations, with the same chunked log-probs, gradient clipping and AdamW as
//! the RL step.
//!
//! Loss: `−Σ mask·log p / Σ mask` over the whole batch (token mean), computed in micro-batches
//! of at most `micro_batch_tokens` rows × longest row ([`crate::batch::micro_batches`]) whose
//! gradients are summed, so the update does not depend on how the batch was split.

use std::collections::BTreeMap;

use candle_core::{DType, Tensor};
use mtrl_model::{token_logprobs_host, Policy, DEFAULT_CHUNK_ELEMS};

use crate::adamw::AdamW;
use crate::batch::{micro_batches, Row};
use crate::clip::{accumulate, clip_or_norm};
use crate::error::{LearnerError, Result};
use crate::schedule::LrSchedule;
use crate::step::pad;

/// One supervised example: ids and a 0/1 mask over them (1 = learn to produce this id).
#[derive(Debug, Clone, PartialEq)]
pub struct SftExample {
    pub tokens: Vec<u32>,
    pub loss_mask: Vec<u8>,
}

/// Step settings.
#[derive(Debug, Clone, PartialEq)]
pub struct SftConfig {
    pub schedule: LrSchedule,
    /// 0 = no clipping.
    pub grad_clip: f64,
    pub micro_batch_tokens: usize,
}

/// What one step did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SftMetrics {
    /// Mean negative log-likelihood per trained id.
    pub loss: f64,
    /// Ids trained on.
    pub tokens: u64,
    pub grad_norm: f64,
    pub lr: f64,
    pub skipped: bool,
}

fn rows(examples: &[SftExample]) -> Result<Vec<Row>> {
    examples
        .iter()
        .enumerate()
        .map(|(i, e)| {
            if e.tokens.len() != e.loss_mask.len() || e.tokens.len() < 2 {
                return Err(LearnerError::Invalid(format!(
                    "sft example {i}: {} ids and {} mask entries (need equal lengths ≥ 2)",
                    e.tokens.len(),
                    e.loss_mask.len()
                )));
            }
            let n = e.tokens.len() - 1;
            Ok(Row {
                tokens: e.tokens.clone(),
                mask: e.loss_mask[1..].iter().map(|m| *m as f32).collect(),
                behaviour: vec![0.0; n],
                advantages: vec![0.0; n],
                prox: Vec::new(),
                traj_tokens: 0.0,
            })
        })
        .collect()
}

/// One optimizer step of `policy` on `examples`.
pub fn sft_step(
    policy: &Policy,
    opt: &mut AdamW,
    examples: &[SftExample],
    cfg: &SftConfig,
) -> Result<SftMetrics> {
    let mut rows = rows(examples)?;
    // Similar lengths share a micro-batch: less padding (the loss is a sum, order-free).
    rows.sort_by_key(|r| r.tokens.len());
    let total: f64 = rows.iter().map(|r| r.mask.iter().sum::<f32>() as f64).sum();
    let mut m = SftMetrics {
        tokens: total as u64,
        lr: cfg.schedule.lr_at(opt.step_count() + 1),
        ..SftMetrics::default()
    };
    if total == 0.0 {
        m.skipped = true;
        return Ok(m);
    }
    let dev = policy.device().clone();
    let mut grads: BTreeMap<String, Tensor> = BTreeMap::new();
    for group in micro_batches(&rows, cfg.micro_batch_tokens, policy.attends_fused()) {
        let mb = pad(&rows, &group, &dev)?;
        // Log-probs at the trained positions only (the head's cost follows the assistant's ids).
        let fwd = token_logprobs_host(policy, &mb.host(), 1.0, true, DEFAULT_CHUNK_ELEMS)?;
        let (loss, g) = fwd.loss_and_grads(|lp| {
            lp.to_dtype(DType::F32)?.mul(&mb.mask)?.sum_all()? * (-1.0 / total)
        })?;
        m.loss += mtrl_model::host::scalar::<f32>(&loss)? as f64;
        accumulate(&mut grads, policy.named_parameters(), &g, DType::F32)?;
    }
    m.grad_norm = clip_or_norm(&mut grads, cfg.grad_clip)?;
    if m.grad_norm.is_finite() && m.loss.is_finite() {
        opt.step(policy.named_parameters(), &grads, m.lr)?;
    } else {
        m.skipped = true;
    }
    Ok(m)
}
