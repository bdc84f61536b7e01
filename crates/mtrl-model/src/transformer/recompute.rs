//! Activation checkpointing per layer ("gradient checkpointing" in transformers): the packed
//! training forward keeps each layer's input and nothing else; the backward recomputes one layer
//! at a time from its input, with its graph, and backpropagates through it alone.
//!
//! Memory: a full graph holds every layer's activations at once (for a 0.6B model and 16k tokens,
//! tens of GB); checkpointed, it holds `layers × [T, hidden]` inputs plus one layer's graph. The
//! price is one more forward of the decoder per step (about a third more arithmetic).
//!
//! Exactness: the recompute runs the same kernels on the same input as the forward, and LoRA
//! dropout draws the same masks (the shared call counter is reset to its value at the layer's
//! start), so the gradients are those of the full graph up to summation order.
//!
//! The chain: the head's backward gives the gradient of the last layer's output `g_N` (the input
//! of the final norm, a leaf [`Var`]); for `l = N−1 … 0` the layer is recomputed on a leaf copy
//! of its input and `Σ y_l · stopgrad(g_{l+1})` is backpropagated, which yields the layer's
//! parameter gradients and `g_l`; the embedding last (`Σ embed(ids) · stopgrad(g_0)`). Each
//! partial store is trimmed to the layer's parameters ([`leaves_only`]) and summed into one (the
//! tied embedding gets both of its uses).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use candle_core::backprop::GradStore;
use candle_core::{DType, Result, Tensor, Var};

use super::{Angles, Transformer, VarLen};

/// What the backward of a checkpointed forward needs.
pub(crate) struct Checkpointed {
    model: Transformer,
    ids: Tensor,
    rope: Angles,
    varlen: Arc<VarLen>,
    /// Each layer's input (no graph); `None` below the lowest layer the backward reaches.
    inputs: Vec<Option<Tensor>>,
    /// LoRA dropout's call counter at each layer's start, and after the last.
    calls: Option<(Arc<AtomicU64>, Vec<u64>, u64)>,
    /// The leaf the final norm was applied to.
    last: Tensor,
}

impl Transformer {
    /// [`Self::forward_varlen`] keeping only the layer inputs: the returned hidden states record
    /// the final norm alone; [`Checkpointed::backward`] does the rest.
    pub(crate) fn forward_varlen_checkpointed(
        &self,
        ids: &Tensor,
        v: Arc<VarLen>,
    ) -> Result<(Tensor, Checkpointed)> {
        let rope = v.angles(&self.rope)?;
        let counter = self.dropout_calls();
        let mut at = Vec::with_capacity(self.layers.len());
        let mut inputs = Vec::with_capacity(self.layers.len());
        let mut x = self.embed_ids(ids)?.detach();
        let lowest = self.lowest_trained();
        for (i, l) in self.layers.iter().enumerate() {
            if let Some(c) = &counter {
                at.push(c.load(Ordering::Relaxed));
            }
            inputs.push((i >= lowest).then(|| x.clone()));
            x = self.layer_varlen(l, x, &rope, &v)?.detach();
        }
        let last = Var::from_tensor(&x)?.as_tensor().clone();
        let hidden = self.be.rms_norm(&last, &self.norm, self.eps)?;
        let calls = counter.map(|c| {
            let end = c.load(Ordering::Relaxed);
            (c, at, end)
        });
        Ok((
            hidden,
            Checkpointed {
                model: self.clone(),
                ids: ids.clone(),
                rope,
                varlen: v,
                inputs,
                calls,
                last,
            },
        ))
    }

    /// The lowest layer the backward must reach: 0 when the embedding trains, else the lowest
    /// layer with a trainable tensor (an adapter on the upper layers only: the backward stops
    /// there).
    fn lowest_trained(&self) -> usize {
        if self.embed.track_op() {
            return 0;
        }
        self.layers
            .iter()
            .position(|l| l.parameters().iter().any(Tensor::is_variable))
            .unwrap_or(self.layers.len())
    }

    /// The call counter LoRA dropout draws its masks from (shared by every adapted layer), if
    /// this view applies dropout.
    fn dropout_calls(&self) -> Option<Arc<AtomicU64>> {
        self.layers.iter().find_map(|l| {
            let a = &l.attn;
            let m = &l.mlp;
            [&a.q, &a.k, &a.v, &a.o, &m.gate, &m.up, &m.down]
                .into_iter()
                .find_map(|lin| lin.lora.as_ref()?.dropout.as_ref().map(|d| d.calls.clone()))
        })
    }
}

impl Checkpointed {
    /// Completes `grads` (from a backward that reached the final norm's input) with the gradients
    /// of every layer and of the embedding (see the module docs).
    pub(crate) fn backward(&self, grads: &mut GradStore) -> Result<()> {
        let Some(mut g) = grads.remove(&self.last) else {
            return Ok(());
        };
        let m = &self.model;
        let lowest = m.lowest_trained();
        for (l, layer) in m.layers.iter().enumerate().skip(lowest).rev() {
            if let Some((c, at, _)) = &self.calls {
                c.store(at[l], Ordering::Relaxed);
            }
            // The lowest layer's input needs no gradient when the embedding takes none (LoRA).
            let want_dx = l > lowest || m.embed.track_op();
            let Some(input) = &self.inputs[l] else {
                candle_core::bail!("recompute: layer {l}'s input was not kept")
            };
            let x = if want_dx {
                Var::from_tensor(input)?.as_tensor().clone()
            } else {
                input.clone()
            };
            let y = m.layer_varlen(layer, x.clone(), &self.rope, &self.varlen)?;
            let part = backward_through(&y, &g)?;
            if want_dx {
                g = match part.get(&x) {
                    Some(g) => g.detach(),
                    None => x.zeros_like()?,
                };
            }
            grads.extend(leaves_only(&part, &layer.parameters()))?;
        }
        if let Some((c, _, end)) = &self.calls {
            c.store(*end, Ordering::Relaxed);
        }
        if m.embed.track_op() {
            let e = m.embed_ids(&self.ids)?;
            let part = backward_through(&e, &g)?;
            grads.extend(leaves_only(&part, std::slice::from_ref(&m.embed)))?;
        }
        Ok(())
    }
}

/// The gradients under `y` given `dL/dy = g`: the backward of `Σ y · stopgrad(g)` (in f32, or
/// f64 for an f64 model), untrimmed.
fn backward_through(y: &Tensor, g: &Tensor) -> Result<GradStore> {
    let dt = if y.dtype() == DType::F64 {
        DType::F64
    } else {
        DType::F32
    };
    (y.to_dtype(dt)? * g.detach().to_dtype(dt)?)?
        .sum_all()?
        .backward()
}

/// The gradients of `params` alone, detached. candle's backward also stores a gradient for every
/// constant factor of a product (`grad · y` for a RoPE table, a dropout mask, the surrogate's
/// stop-gradient side), and a parameter's gradient may itself be a product with an activation:
/// such a tensor holds `y` and, through it, the graph under `y`, which would then live as long as
/// the store.
pub(crate) fn leaves_only(grads: &GradStore, params: &[Tensor]) -> GradStore {
    let mut out = GradStore::default();
    for p in params {
        if let Some(g) = grads.get(p) {
            out.insert(p, g.detach());
        }
    }
    out
}
