//! `mtrl bench train --lora`: LoRA against full fine-tuning on one model shape, side by side, with
//! random weights — the training step (forward + backward + clip + AdamW) time and what it keeps
//! (trainable parameters, optimizer-state bytes), the weight publish to the engine (bytes, time:
//! the learner's device copy plus the engine's write, and for a merged adapter its re-merge), and
//! the engine's greedy decode throughput with the adapter unmerged and merged.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use mtrl_learner::{clip_global_norm, AdamW, AdamWConfig};
use mtrl_model::{
    logprobs_and_grads, Engine, GenerationRequest, LoraServing, LoraSpec, Policy, SamplingParams,
};
use serde_json::{json, Value};

use crate::error::Result;

/// What to run.
#[derive(Debug, Clone)]
pub struct LoraBench {
    pub model: mtrl_model::Config,
    pub spec: LoraSpec,
    pub dtype: DType,
    pub device: Device,
    /// Training batch: rows × tokens.
    pub rows: usize,
    pub len: usize,
    /// Timed repeats (after one warm-up); the best is reported.
    pub repeats: usize,
    /// Decode: sequences in one batch, prompt tokens, new tokens.
    pub batch: usize,
    pub prompt: usize,
    pub new_tokens: usize,
}

fn ids(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut r = mtrl_core::rng::SplitMix64(seed);
    (0..n).map(|_| r.below(vocab) as u32).collect()
}

fn best(repeats: usize, mut f: impl FnMut() -> Result<f64>) -> Result<f64> {
    f()?;
    let mut b = f64::INFINITY;
    for _ in 0..repeats.max(1) {
        b = b.min(f()?);
    }
    Ok(b)
}

fn params(p: &Policy) -> usize {
    p.named_parameters().values().map(|v| v.elem_count()).sum()
}

fn bytes(p: &Policy) -> usize {
    p.named_parameters()
        .values()
        .map(|v| v.elem_count() * v.dtype().size_in_bytes())
        .sum()
}

/// Seconds of one training step of `p` on `batch`, best of `repeats`; the optimizer after it.
fn train_step(p: &Policy, batch: &Tensor, repeats: usize) -> Result<(f64, AdamW)> {
    let mut opt = AdamW::new(AdamWConfig::default());
    let s = best(repeats, || {
        let t0 = Instant::now();
        let (_, _, g) = logprobs_and_grads(p, batch, None, 1.0, |lp| lp.mean_all()?.neg())?;
        let mut grads = BTreeMap::new();
        for (name, var) in p.named_parameters() {
            if let Some(t) = g.get(var.as_tensor()) {
                grads.insert(name.clone(), t.to_dtype(DType::F32)?);
            }
        }
        clip_global_norm(&mut grads, 1.0)?;
        opt.step(p.named_parameters(), &grads, 1e-4)?;
        p.device().synchronize()?;
        Ok(t0.elapsed().as_secs_f64())
    })?;
    Ok((s, opt))
}

/// Seconds of one publish: the learner's copies of its trainable tensors, then the engine's write.
fn publish(learner: &Policy, engine: &mut Policy, repeats: usize) -> Result<f64> {
    best(repeats, || {
        let t0 = Instant::now();
        let mut w = HashMap::new();
        for (n, v) in learner.named_parameters() {
            w.insert(n.clone(), v.as_tensor().detach().copy()?);
        }
        learner.device().synchronize()?;
        engine.set_weights(&w)?;
        engine.device().synchronize()?;
        Ok(t0.elapsed().as_secs_f64())
    })
}

/// Greedy decode tokens/s of an engine over `p`.
fn decode(p: Policy, b: &LoraBench, repeats: usize) -> Result<f64> {
    let vocab = p.config().vocab_size;
    let mut e = Engine::new(p, None, 0, b.batch)?;
    // Every run generates the same count (no stop tokens), so the fastest run's rate is the best.
    let mut tokens = 0usize;
    let s = best(repeats, || {
        let reqs = (0..b.batch)
            .map(|i| GenerationRequest {
                prompt: ids(b.prompt, vocab, 100 + i as u64),
                sampling: SamplingParams::greedy(),
                max_new_tokens: b.new_tokens,
                stop_token_ids: vec![],
                stop_strings: vec![],
                session: None,
            })
            .collect();
        let t0 = Instant::now();
        let out = e.generate(reqs)?;
        tokens = out.iter().map(|c| c.tokens.len()).sum();
        Ok(t0.elapsed().as_secs_f64())
    })?;
    Ok(tokens as f64 / s)
}

/// The side-by-side report.
pub fn bench_lora(b: &LoraBench) -> Result<Value> {
    let vocab = b.model.vocab_size;
    let batch = Tensor::from_vec(ids(b.rows * b.len, vocab, 7), (b.rows, b.len), &b.device)?;
    let full = Policy::random(b.model.clone(), b.dtype, &b.device)?;
    let (full_step, full_opt) = train_step(&full, &batch, b.repeats)?;
    let mut full_engine = full.fork()?;
    let full_publish = publish(&full, &mut full_engine, b.repeats)?;
    let full_decode = decode(full_engine, b, b.repeats)?;
    let base_params = params(&full);
    let full_bytes = bytes(&full);
    let lora = full.with_lora(b.spec.clone(), None, 0)?;
    let (lora_step, lora_opt) = train_step(&lora, &batch, b.repeats)?;
    let mut unmerged = lora.fork()?;
    let unmerged_publish = publish(&lora, &mut unmerged, b.repeats)?;
    let mut merged = lora.fork()?;
    merged.set_lora_serving(LoraServing::Merged)?;
    let merged_publish = publish(&lora, &mut merged, b.repeats)?;
    let unmerged_decode = decode(unmerged, b, b.repeats)?;
    let merged_decode = decode(merged, b, b.repeats)?;
    let adapter_params = params(&lora);
    let tokens = (b.rows * b.len) as f64;
    Ok(json!({
        "device": format!("{:?}", b.device.location()),
        "dtype": format!("{:?}", b.dtype).to_lowercase(),
        "rank": b.spec.rank,
        "alpha": b.spec.alpha,
        "targets": b.spec.targets,
        "train_batch": [b.rows, b.len],
        "full": {
            "trainable_parameters": base_params,
            "step_s": full_step,
            "train_tokens_per_s": tokens / full_step,
            "optimizer_state_bytes": full_opt.state_bytes(),
            "publish_bytes": full_bytes,
            "publish_s": full_publish,
            "decode_tokens_per_s": full_decode,
        },
        "lora": {
            "trainable_parameters": adapter_params,
            "step_s": lora_step,
            "train_tokens_per_s": tokens / lora_step,
            "optimizer_state_bytes": lora_opt.state_bytes(),
            "publish_bytes": bytes(&lora),
            "publish_s_unmerged": unmerged_publish,
            "publish_s_merged": merged_publish,
            "decode_tokens_per_s_unmerged": unmerged_decode,
            "decode_tokens_per_s_merged": merged_decode,
        },
        "ratios_lora_over_full": {
            "step_s": lora_step / full_step,
            "optimizer_state_bytes": lora_opt.state_bytes() as f64 / full_opt.state_bytes().max(1) as f64,
            "publish_bytes": bytes(&lora) as f64 / full_bytes.max(1) as f64,
            "publish_s_unmerged": unmerged_publish / full_publish,
            "publish_s_merged": merged_publish / full_publish,
            "decode_unmerged": unmerged_decode / full_decode,
            "decode_merged": merged_decode / full_decode,
        },
        "decode": {"batch": b.batch, "prompt": b.prompt, "new_tokens": b.new_tokens},
    }))
}
