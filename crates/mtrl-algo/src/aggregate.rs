//! Loss aggregation with global normalisers.
//!
//! - `token-mean`: Σ l·m / N_tokens
//! - `seq-mean-token-mean`: Σ_b (Σ_t l·m / n_b) / N_seqs
//! - `seq-mean-token-sum`: Σ l·m / N_seqs
//! - `seq-mean-token-sum-norm`: Σ l·m / (N_seqs · L), L a constant (Dr. GRPO)
//!
//! N_tokens and N_seqs count the *whole* global batch ([`GlobalCounts`]), n_b the tokens of
//! sequence b (a sequence is never split across micro-batches). Each formula is then a sum of
//! per-sequence terms with a fixed denominator, so the micro-batch losses add up to the full-batch
//! loss and so do their gradients.

use candle_core::{DType, Tensor};
use serde::{Deserialize, Serialize};

use crate::error::{AlgoError, Result};

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Aggregation {
    TokenMean,
    SeqMeanTokenMean,
    SeqMeanTokenSum,
    SeqMeanTokenSumNorm { max_len: usize },
}

impl Aggregation {
    /// Config names: `token-mean`, `seq-mean-token-mean`, `seq-mean-token-sum`,
    /// `seq-mean-token-sum-norm` (the latter needs the constant L).
    pub fn from_name(name: &str, max_len: usize) -> Option<Aggregation> {
        Some(match name {
            "token-mean" => Aggregation::TokenMean,
            "seq-mean-token-mean" => Aggregation::SeqMeanTokenMean,
            "seq-mean-token-sum" => Aggregation::SeqMeanTokenSum,
            "seq-mean-token-sum-norm" => Aggregation::SeqMeanTokenSumNorm { max_len },
            _ => return None,
        })
    }
}

/// Counts over the whole global batch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GlobalCounts {
    pub tokens: f64,
    pub sequences: f64,
}

impl GlobalCounts {
    /// Counts of one mask `[B, T]` (when the micro-batch is the whole batch).
    pub fn of_mask(mask: &Tensor) -> Result<GlobalCounts> {
        let (b, _) = mask.dims2()?;
        Ok(GlobalCounts {
            tokens: mask.to_dtype(DType::F64)?.sum_all()?.to_scalar::<f64>()?,
            sequences: b as f64,
        })
    }
}

/// The scalar loss of one micro-batch.
pub fn aggregate(
    per_token: &Tensor,
    mask: &Tensor,
    agg: Aggregation,
    global: GlobalCounts,
) -> Result<Tensor> {
    if global.tokens <= 0.0 || global.sequences <= 0.0 {
        return Err(AlgoError::Invalid(format!(
            "empty global batch: {global:?}"
        )));
    }
    let mask = mask.to_dtype(per_token.dtype())?;
    // Selected, then weighted: a NaN or ±inf at a masked position must not survive `· 0`.
    let masked = crate::loss::select_masked(per_token, &mask)?.mul(&mask)?;
    Ok(match agg {
        Aggregation::TokenMean => (masked.sum_all()? / global.tokens)?,
        Aggregation::SeqMeanTokenMean => {
            let per_seq = masked.sum(1)?;
            let n = mask.sum(1)?.clamp(1.0, f64::MAX)?;
            (per_seq.div(&n)?.sum_all()? / global.sequences)?
        }
        Aggregation::SeqMeanTokenSum => (masked.sum_all()? / global.sequences)?,
        Aggregation::SeqMeanTokenSumNorm { max_len } => {
            if max_len == 0 {
                return Err(AlgoError::Invalid(
                    "seq-mean-token-sum-norm needs L > 0".into(),
                ));
            }
            (masked.sum_all()? / (global.sequences * max_len as f64))?
        }
    })
}
