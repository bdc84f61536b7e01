//! The backward of a training forward ([`TokenLogprobs`]): the chunked head's exact gradients,
//! then the decoder's through the surrogate `Σ lm_head·dW + Σ hidden·dh` (see the parent module),
//! then, with activation checkpointing, the layers recomputed one at a time.

use candle_core::backprop::GradStore;
use candle_core::{DType, Tensor, Var};

use super::TokenLogprobs;
use crate::cpu::logits::{chunk_grads, dlogits, logits};
use crate::cpu::{self, uninit};
use crate::error::{ModelError, Result};
use crate::host;
use crate::transformer::leaves_only;

impl TokenLogprobs {
    /// The value of `loss_fn` of these log-probs (a `[b, t_len - 1]` tensor that records
    /// gradients; a scalar loss) and the parameter gradients through it. Requires a forward with
    /// `differentiable = true`.
    ///
    /// The loss comes back as a detached f32 scalar on the device: reading it is the caller's
    /// choice (the learner reads it with its other diagnostics, once per micro-batch).
    pub fn loss_and_grads(
        &self,
        loss_fn: impl FnOnce(&Tensor) -> candle_core::Result<Tensor>,
    ) -> Result<(Tensor, GradStore)> {
        let lp = Var::from_tensor(&self.logprobs)?;
        let loss = loss_fn(lp.as_tensor())?;
        let g = match loss.backward()?.get(lp.as_tensor()) {
            Some(g) => g.clone(),
            None => lp.as_tensor().zeros_like()?,
        };
        Ok((loss.detach().to_dtype(DType::F32)?, self.backward(&g)?))
    }

    /// Gradients of every parameter given `grad` = dL/dlogp `[b, t_len - 1]` (invalid entries are
    /// ignored). Requires a forward with `differentiable = true`.
    pub fn backward(&self, grad: &Tensor) -> Result<GradStore> {
        let (b, t) = self.shape;
        if grad.dims() != [b, t - 1] {
            return Err(ModelError::InvalidArgument(format!(
                "gradient has shape {:?}, expected [{b}, {}]",
                grad.dims(),
                t - 1
            )));
        }
        let dev = self.hidden.device().clone();
        // dL/dlogp at the computed rows, in `rows` order, gathered on the device.
        let g_rows = if self.rows.is_empty() {
            None
        } else {
            let at: Vec<u32> = self
                .rows
                .iter()
                .map(|&r| ((r as usize / t) * (t - 1) + r as usize % t) as u32)
                .collect();
            let at = Tensor::from_vec(at, self.rows.len(), &dev)?;
            let g = grad.to_dtype(DType::F32)?.to_device(&dev)?.flatten_all()?;
            Some(g.index_select(&at, 0)?)
        };
        let wd = self.lm_head.detach();
        let hd = self.hidden.detach();
        let vocab = wd.dim(0)?;
        let fast = cpu::handles(wd.device(), wd.dtype())
            && self.chunks.len() == self.rows.len().div_ceil(self.chunk_rows);
        let inv_t = (1.0 / self.temperature) as f32;
        let hs = hd.dim(1)?;
        // CPU fast path: the products write into these (dh rows in chunk order, dw accumulated).
        // A frozen head (LoRA) gets no gradient: only the hidden states' is computed.
        let head_grad = self.lm_head.track_op();
        // The CPU kernels take the gradient as a host slice (a copy: this is the CPU).
        let g_host = match (&g_rows, fast) {
            (Some(g), true) => host::vec1::<f32>(g)?,
            _ => Vec::new(),
        };
        let (mut dh_buf, mut dw_buf) = if fast {
            let dw = if head_grad {
                vec![0f32; vocab * hs]
            } else {
                Vec::new()
            };
            (uninit(self.rows.len() * hs), dw)
        } else {
            (Vec::new(), Vec::new())
        };
        let mut dh_chunks = Vec::new();
        let mut dw: Option<Tensor> = None;
        let mut start = 0;
        let mut ci = 0;
        while start < self.rows.len() {
            let n = self.chunk_rows.min(self.rows.len() - start);
            let hc = hd.narrow(0, start, n)?;
            if fast {
                let (lse, z) = &self.chunks[ci];
                let z = match z {
                    Some(z) => z.clone(),
                    None => logits(&hc, &wd)?,
                };
                let tg = &self.targets[start..start + n];
                let dz = dlogits(&z, lse, tg, &g_host[start..start + n], inv_t)?;
                let dh = &mut dh_buf[start * hs..(start + n) * hs];
                chunk_grads(&dz, &wd, &hc, dh, &mut dw_buf, ci > 0)?;
            } else {
                // dz = g · (onehot − p) / T in the weights' dtype, one kernel over the chunk's
                // recomputed logits with the forward's log-sum-exps (no one-hot is built).
                let (Some(g), Some(tg), Some(lse)) = (&g_rows, &self.targets_d, self.lse_d.get(ci))
                else {
                    break;
                };
                let z = hc.matmul(&wd.t()?)?;
                let dz_w = crate::logprob_head::dlogits(
                    &z,
                    lse,
                    &tg.narrow(0, start, n)?,
                    &g.narrow(0, start, n)?,
                    inv_t,
                )?;
                dh_chunks.push(dz_w.matmul(&wd)?);
                if head_grad {
                    // In the weights' dtype (bf16 on a GPU: tensor cores, f32 accumulation, as
                    // PyTorch's autocast does), summed over chunks in f32.
                    let dwc = dz_w.t()?.matmul(&hc)?.to_dtype(DType::F32)?;
                    dw = Some(match dw {
                        None => dwc,
                        Some(acc) => (acc + dwc)?,
                    });
                }
            }
            start += n;
            ci += 1;
        }
        if fast {
            if head_grad {
                dw = Some(Tensor::from_vec(dw_buf, (vocab, hs), &dev)?);
            }
            if !self.rows.is_empty() {
                dh_chunks.push(Tensor::from_vec(dh_buf, (self.rows.len(), hs), &dev)?);
            }
        }
        let surrogate = self.surrogate(head_grad, dw, &dh_chunks, &dev)?;
        let mut grads = surrogate.backward()?;
        if let Some(r) = &self.recompute {
            r.backward(&mut grads)?;
        }
        Ok(leaves_only(&grads, &self.params))
    }

    /// `Σ lm_head·dW + Σ hidden·dh` (each factor detached but the parameter side): its backward
    /// hands the gradients on to the graph. Without a head gradient (frozen head) only the hidden
    /// term.
    fn surrogate(
        &self,
        head_grad: bool,
        dw: Option<Tensor>,
        dh_chunks: &[Tensor],
        dev: &candle_core::Device,
    ) -> Result<Tensor> {
        let mut out = if head_grad {
            let head = self.lm_head.to_dtype(DType::F32)?;
            let dw = match dw {
                Some(dw) => dw,
                None => Tensor::zeros(head.dims(), DType::F32, dev)?,
            };
            Some((head * dw)?.sum_all()?)
        } else {
            None
        };
        if !dh_chunks.is_empty() {
            let dh = Tensor::cat(dh_chunks, 0)?.detach();
            let sh = (self.hidden.to_dtype(DType::F32)? * dh.to_dtype(DType::F32)?)?.sum_all()?;
            out = Some(match out {
                Some(s) => (s + sh)?,
                None => sh,
            });
        }
        Ok(match out {
            Some(s) => s,
            None => Tensor::zeros((), DType::F32, dev)?,
        })
    }
}
