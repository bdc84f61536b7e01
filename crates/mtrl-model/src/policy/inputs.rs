//! The checks and the decoder call between a padded batch and its hidden states: ids against the
//! vocabulary, positions against the context window. [`Policy::hidden`] reads a batch given as
//! tensors back to check it (counted reads, see [`crate::host`]); [`Policy::hidden_rows`] takes
//! a batch the host built and reads nothing.

use candle_core::{DType, Tensor};

use super::Policy;
use crate::error::{ModelError, Result};
use crate::transformer::{Checkpointed, Transformer, VarLen};

impl Policy {
    /// Hidden states of `model` for a padded batch, plus the mask as rows of 0/1.
    pub(crate) fn hidden(
        &self,
        model: &Transformer,
        ids: &Tensor,
        attention_mask: Option<&Tensor>,
        position_ids: Option<&Tensor>,
    ) -> Result<(Tensor, Vec<Vec<u8>>)> {
        let (b, t) = ids.dims2()?;
        if t > model.max_positions() {
            return Err(ModelError::ContextOverflow {
                len: t,
                max: model.max_positions(),
            });
        }
        let ids = ids.to_dtype(DType::U32)?.to_device(&self.device)?;
        let max_id = crate::host::scalar::<u32>(&ids.max_all()?)?;
        self.check_ids(max_id)?;
        let mask: Vec<Vec<u8>> = match attention_mask {
            Some(m) => crate::host::vec2::<u32>(&m.to_dtype(DType::U32)?)?
                .into_iter()
                .map(|r| r.into_iter().map(|x| u8::from(x != 0)).collect())
                .collect(),
            None => vec![vec![1u8; t]; b],
        };
        let positions = match position_ids {
            Some(p) => p.to_dtype(DType::U32)?.to_device(&self.device)?,
            None => Tensor::arange(0u32, t as u32, &self.device)?
                .unsqueeze(0)?
                .repeat((b, 1))?,
        };
        let pmax = crate::host::scalar::<u32>(&positions.max_all()?)? as usize;
        if pmax >= model.max_positions() {
            return Err(ModelError::ContextOverflow {
                len: pmax + 1,
                max: model.max_positions(),
            });
        }
        let hidden = model.forward_hidden(&ids, &positions, Some(&mask))?;
        Ok((hidden, mask))
    }

    /// Errors unless every id up to `max_id` is in the vocabulary.
    fn check_ids(&self, max_id: u32) -> Result<()> {
        if max_id as usize >= self.config.vocab_size {
            return Err(ModelError::InvalidArgument(format!(
                "token id {max_id} is outside the vocabulary of {} ids",
                self.config.vocab_size
            )));
        }
        Ok(())
    }

    /// [`Self::hidden`] of a right-padded batch at positions `0..t` whose ids (largest
    /// `max_id`) and mask rows the host already holds: nothing is read back to check them.
    pub(crate) fn hidden_rows(
        &self,
        model: &Transformer,
        ids: &Tensor,
        max_id: u32,
        mask: &[Vec<u8>],
    ) -> Result<Tensor> {
        let (b, t) = ids.dims2()?;
        if t > model.max_positions() {
            return Err(ModelError::ContextOverflow {
                len: t,
                max: model.max_positions(),
            });
        }
        self.check_ids(max_id)?;
        let positions = Tensor::arange(0u32, t as u32, &self.device)?
            .unsqueeze(0)?
            .repeat((b, 1))?;
        Ok(model.forward_hidden(ids, &positions, Some(mask))?)
    }

    /// Final-normed hidden states `[T, hidden]` of packed rows (the ids of all rows end to end,
    /// largest `max_id`; `varlen` their lengths), and, with activation checkpointing on in the
    /// training view, what the backward must recompute.
    pub(crate) fn hidden_packed(
        &self,
        model: &Transformer,
        ids: &[u32],
        max_id: u32,
        varlen: VarLen,
        differentiable: bool,
    ) -> Result<(Tensor, Option<Checkpointed>)> {
        let longest = varlen.max_len();
        if longest > model.max_positions() {
            return Err(ModelError::ContextOverflow {
                len: longest,
                max: model.max_positions(),
            });
        }
        self.check_ids(max_id)?;
        let n = varlen.tokens();
        let ids = Tensor::from_slice(ids, (1, n), &self.device)?;
        let (hidden, ckpt) = if differentiable && self.checkpoint_layers {
            let (h, c) = model.forward_varlen_checkpointed(&ids, std::sync::Arc::new(varlen))?;
            (h, Some(c))
        } else {
            (model.forward_varlen(&ids, &varlen)?, None)
        };
        Ok((hidden.squeeze(0)?, ckpt))
    }
}
