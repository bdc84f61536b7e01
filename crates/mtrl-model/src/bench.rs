//! Model throughput benchmark (`mtrl bench model`): random weights of a given config shape,
//! prefill tokens/s, decode tokens/s at several batch sizes, and training tokens/s
//! (forward + backward through the chunked log-prob path) on `[train_batch, train_len]`.
//!
//! Methodology mirrors `bench/torch_ref.py`: one warm-up, then the best of `repeats` timed runs.
//! `generate_tokens_per_s` is `B·N / wall` including prefill, the peer's generation figure;
//! `decode_tokens_per_s` excludes the prefill step. The training figure has no optimizer step
//! (the peer's includes AdamW, a few ms for 5 M parameters).

use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use serde::Serialize;

use crate::config::Config;
use crate::engine::{Engine, GenerationRequest};
use crate::error::Result;
use crate::kv_cache::KvCache;
use crate::logprobs::logprobs_and_grads;
use crate::policy::Policy;
use crate::sampler::SamplingParams;

/// What to measure.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    pub batch_sizes: Vec<usize>,
    pub prompt_len: usize,
    pub new_tokens: usize,
    pub train_len: usize,
    pub train_batch: usize,
    pub repeats: usize,
}

/// Decode figures at one batch size.
#[derive(Debug, Clone, Serialize)]
pub struct DecodeReport {
    pub batch: usize,
    pub decode_tokens_per_s: f64,
    pub generate_tokens_per_s: f64,
}

/// The benchmark result (printed as one JSON object).
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub model_type: String,
    pub num_parameters: usize,
    pub device: String,
    pub dtype: String,
    pub prompt_len: usize,
    pub new_tokens: usize,
    pub prefill_tokens_per_s: f64,
    pub decode: Vec<DecodeReport>,
    pub train_batch: usize,
    pub train_len: usize,
    pub train_tokens_per_s: f64,
}

/// Deterministic pseudo-random token ids (no RNG dependency on the bench path).
fn ids(n: usize, vocab: usize, salt: u64) -> Vec<u32> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ salt;
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 33) % vocab as u64) as u32
        })
        .collect()
}

fn best_of<F: FnMut() -> Result<f64>>(repeats: usize, mut f: F) -> Result<f64> {
    f()?; // warm-up
    let mut best = 0f64;
    for _ in 0..repeats.max(1) {
        best = best.max(f()?);
    }
    Ok(best)
}

/// Runs the benchmark for `cfg` with random weights.
pub fn run_bench(
    cfg: Config,
    dtype: DType,
    device: &Device,
    opts: &BenchOptions,
) -> Result<BenchReport> {
    let vocab = cfg.vocab_size;
    let policy = Policy::random(cfg, dtype, device)?;
    let num_parameters = policy
        .named_parameters()
        .values()
        .map(|v| v.elem_count())
        .sum();
    let model = policy.inference().clone();
    let layers = policy.config().num_hidden_layers;
    let pb = opts.batch_sizes.iter().copied().max().unwrap_or(8).min(8);
    let prefill_tokens_per_s = best_of(opts.repeats, || {
        let start = Instant::now();
        for b in 0..pb {
            let mut cache = KvCache::new(layers);
            let t = Tensor::from_vec(
                ids(opts.prompt_len, vocab, b as u64),
                (1, opts.prompt_len),
                device,
            )?;
            let h = model.forward_cached(&t, &mut cache)?;
            let _ = model
                .logits(&h.narrow(1, opts.prompt_len - 1, 1)?)?
                .to_dtype(DType::F32)?
                .flatten_all()?
                .to_vec1::<f32>()?;
        }
        Ok((pb * opts.prompt_len) as f64 / start.elapsed().as_secs_f64())
    })?;
    let mut decode = Vec::new();
    for &b in &opts.batch_sizes {
        let mut best = (0f64, 0f64);
        for rep in 0..=opts.repeats.max(1) {
            let mut engine = Engine::new(policy.clone(), None, 0, b);
            for i in 0..b {
                engine.submit(GenerationRequest {
                    prompt: ids(opts.prompt_len, vocab, 1000 + i as u64),
                    sampling: SamplingParams::greedy(),
                    max_new_tokens: opts.new_tokens,
                    stop_token_ids: vec![],
                    stop_strings: vec![],
                })?;
            }
            let start = Instant::now();
            let mut first = 0f64;
            let mut decoded = 0usize;
            let mut steps = 0;
            while engine.num_unfinished() > 0 {
                let out = engine.step()?;
                if steps == 0 {
                    first = start.elapsed().as_secs_f64();
                } else {
                    decoded += out.tokens.len();
                }
                steps += 1;
            }
            let wall = start.elapsed().as_secs_f64();
            if rep > 0 {
                let d = decoded as f64 / (wall - first).max(1e-9);
                let g = (b * opts.new_tokens) as f64 / wall;
                best = (best.0.max(d), best.1.max(g));
            }
        }
        decode.push(DecodeReport {
            batch: b,
            decode_tokens_per_s: best.0,
            generate_tokens_per_s: best.1,
        });
    }
    let (tb, tl) = (opts.train_batch, opts.train_len);
    let train_ids = Tensor::from_vec(ids(tb * tl, vocab, 7), (tb, tl), device)?;
    let train_tokens_per_s = best_of(opts.repeats, || {
        let start = Instant::now();
        let (_, _, grads) =
            logprobs_and_grads(&policy, &train_ids, None, 1.0, |lp| lp.mean_all()?.neg())?;
        drop(grads);
        Ok((tb * tl) as f64 / start.elapsed().as_secs_f64())
    })?;
    Ok(BenchReport {
        model_type: format!("{:?}", policy.config().family).to_lowercase(),
        num_parameters,
        device: format!("{device:?}"),
        dtype: format!("{dtype:?}").to_lowercase(),
        prompt_len: opts.prompt_len,
        new_tokens: opts.new_tokens,
        prefill_tokens_per_s,
        decode,
        train_batch: tb,
        train_len: tl,
        train_tokens_per_s,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiny_bench_runs_and_reports() {
        let cfg = Config::from_value(
            serde_json::json!({"model_type": "qwen3", "vocab_size": 64, "hidden_size": 16, "intermediate_size": 32,
                "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
                "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": true}),
            std::path::Path::new("c"),
        )
        .unwrap();
        let opts = BenchOptions {
            batch_sizes: vec![1, 3],
            prompt_len: 4,
            new_tokens: 3,
            train_len: 8,
            train_batch: 2,
            repeats: 1,
        };
        let r = run_bench(cfg, DType::F32, &Device::Cpu, &opts).unwrap();
        assert_eq!(r.decode.len(), 2);
        assert!(r.prefill_tokens_per_s > 0.0 && r.train_tokens_per_s > 0.0);
        assert!(r
            .decode
            .iter()
            .all(|d| d.decode_tokens_per_s > 0.0 && d.generate_tokens_per_s > 0.0));
        assert!(serde_json::to_string(&r)
            .unwrap()
            .contains("train_tokens_per_s"));
    }
}
