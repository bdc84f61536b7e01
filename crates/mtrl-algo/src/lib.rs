//! Pure RL math, picked by name (verl style): advantage estimators over a batch of groups
//! (outcome, per-turn and batch-whitened: GRPO, Dr. GRPO, RLOO, OPO, GPG, pass@k, Monte Carlo,
//! per-turn GRPO, REINFORCE++; see [`advantage`]), per-token policy losses (PPO clip, CISPO,
//! truncated IS) with behaviour-policy corrections, loss aggregation with *global* normalisers,
//! and the KL penalty to a reference policy.
//!
//! Inputs are candle tensors so the loss stays on the autograd graph of the policy's log-probs;
//! advantages work on plain per-turn rewards and trained-token counts ([`Sample`]). Nothing here
//! does IO or knows about models, tokenizers or channels. Every function is checked against
//! `tests/fixtures/rl-golden.json` (float64 numpy, gradients cross-checked with torch autograd) or
//! hand-worked vectors.
//!
//! Aggregation and micro-batching: each aggregation divides by counts of the *global* batch
//! ([`GlobalCounts`]), so summing the losses (and gradients) of micro-batches equals the loss of
//! the whole batch: the gradient does not depend on how the batch is split.

pub mod advantage;
pub mod aggregate;
pub mod error;
pub mod kl;
pub mod loss;

pub use advantage::{
    advantages, batch_advantages, Advantage, AdvantageOptions, PassAtKReward, Sample, Std,
};
pub use aggregate::{aggregate, Aggregation, GlobalCounts};
pub use error::{AlgoError, Result};
pub use kl::kl_k3;
pub use loss::{masked_sum, masked_total, per_token_loss, LossInputs, LossOutput, PolicyLoss};
