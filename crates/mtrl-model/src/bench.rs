//! Model throughput benchmark (`mtrl bench model`): random weights of a given config shape,
//! prefill tokens/s, decode tokens/s at several batch sizes, and training tokens/s
//! (forward + backward through the chunked log-prob path) on `[train_batch, train_len]`.
//!
//! Methodology mirrors `bench/torch_ref.py`: one warm-up, then the best of `repeats` timed runs;
//! every timed region ends with `Device::synchronize`, so asynchronous GPU work is inside it.
//! `generate_tokens_per_s` is `B·N / wall` including prefill, the peer's generation figure;
//! `decode_tokens_per_s` excludes the prefill step. `train_tokens_per_s` has no optimizer step;
//! `train_step_tokens_per_s` (only when the caller passes an optimizer hook, as `mtrl bench model`
//! does with the learner's AdamW) includes it, like the peer's figure.
//!
//! Memory: candle has no allocator statistics, so on CUDA the report carries the device-wide
//! used memory (`cuMemGetInfo`: total − free, all processes, CUDA context included) sampled after
//! every decode step, backward pass and optimizer step — a lower bound of the true peak, which
//! `scripts/gpu-check.sh` measures by sampling `nvidia-smi` beside the process.
use std::time::Instant;

use std::collections::BTreeMap;

use candle_core::{DType, Device, Tensor};
use serde::Serialize;

use crate::config::Config;
use crate::engine::{Engine, EngineOptions, GenerationRequest};
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
    /// Rows per forward/backward of the training batch (gradients summed in f32 across them, as
    /// the learner does); 0 = the whole batch at once.
    pub train_micro_batch: usize,
    /// Rows of decreasing length (row `i` of `train_len · (1 − i / (2·train_batch))` tokens,
    /// right-padded): the learner's case, where packing skips the padding. Tokens/s count the
    /// rows' own tokens.
    pub train_ragged: bool,
    pub repeats: usize,
    /// Which figures to measure (one process per phase gives per-phase peak memory).
    pub prefill: bool,
    pub decode: bool,
    pub train: bool,
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions {
            batch_sizes: vec![1, 8, 32],
            prompt_len: 64,
            new_tokens: 64,
            train_len: 256,
            train_batch: 8,
            train_micro_batch: 0,
            train_ragged: false,
            repeats: 2,
            prefill: true,
            decode: true,
            train: true,
        }
    }
}

/// Called once per training batch with the f32 gradients by parameter name, summed over the
/// micro-batches (the binary runs the learner's AdamW here); its time counts in
/// `train_step_tokens_per_s`.
pub type OptimizerHook<'a> = &'a mut dyn FnMut(&Policy, &BTreeMap<String, Tensor>) -> Result<()>;

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
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefill_tokens_per_s: Option<f64>,
    pub decode: Vec<DecodeReport>,
    pub train_batch: usize,
    pub train_micro_batch: usize,
    pub train_len: usize,
    /// The rows' own tokens per training batch (`train_batch · train_len` unless ragged).
    pub train_tokens: usize,
    pub train_ragged: bool,
    /// Per-layer activation checkpointing of the training forward.
    pub train_checkpointing: bool,
    /// Whether the training forward attended fused (`--attention`, see `AttentionKernel`).
    pub train_fused_attention: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub train_tokens_per_s: Option<f64>,
    /// Forward + backward + optimizer step (only with an optimizer hook).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub train_step_tokens_per_s: Option<f64>,
    /// CUDA only: max device-wide used memory seen at the sample points, in MiB (see module doc).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_mem_used_mib: Option<f64>,
    /// CPU only: this process's peak resident memory over the training phase, in MiB (VmHWM
    /// after resetting it when the phase starts; the weights and optimizer state included).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub train_peak_rss_mib: Option<f64>,
}

/// Device-wide used memory in bytes (CUDA only; `None` on CPU or if the driver call fails).
pub fn device_mem_used(device: &Device) -> Option<u64> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(d) = device {
        let (free, total) = d.cuda_stream().context().mem_get_info().ok()?;
        return Some(total.saturating_sub(free) as u64);
    }
    let _ = device;
    None
}

/// Running maximum of [`device_mem_used`].
#[derive(Default)]
struct MemPeak(Option<u64>);

impl MemPeak {
    fn sample(&mut self, device: &Device) {
        if let Some(u) = device_mem_used(device) {
            self.0 = Some(self.0.map_or(u, |p| p.max(u)));
        }
    }
}

/// Deterministic pseudo-random token ids (no RNG dependency on the bench path).
pub(crate) fn ids(n: usize, vocab: usize, salt: u64) -> Vec<u32> {
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

/// Runs the benchmark for `cfg` with random weights (training figure without optimizer).
pub fn run_bench(
    cfg: Config,
    dtype: DType,
    device: &Device,
    opts: &BenchOptions,
) -> Result<BenchReport> {
    run_bench_with(cfg, dtype, device, opts, None)
}

/// [`run_bench`], plus `train_step_tokens_per_s` when `optimizer` is given.
pub fn run_bench_with(
    cfg: Config,
    dtype: DType,
    device: &Device,
    opts: &BenchOptions,
    optimizer: Option<OptimizerHook<'_>>,
) -> Result<BenchReport> {
    let policy = Policy::random(cfg, dtype, device)?;
    run_bench_on(&policy, device, opts, optimizer)
}

/// [`run_bench_with`] on a loaded policy (a real checkpoint's own weights).
pub fn run_bench_on(
    policy: &Policy,
    device: &Device,
    opts: &BenchOptions,
    optimizer: Option<OptimizerHook<'_>>,
) -> Result<BenchReport> {
    let vocab = policy.config().vocab_size;
    let dtype = policy.dtype();
    let num_parameters = policy
        .named_parameters()
        .values()
        .map(|v| v.elem_count())
        .sum();
    let mut mem = MemPeak::default();
    mem.sample(device);
    let prefill_tokens_per_s = if opts.prefill {
        Some(prefill(policy, device, opts, vocab)?)
    } else {
        None
    };
    let mut decode = Vec::new();
    if opts.decode {
        for &b in &opts.batch_sizes {
            decode.push(decode_at(policy, device, opts, vocab, b, &mut mem)?);
        }
    }
    let (mut train_tokens_per_s, mut train_step_tokens_per_s) = (None, None);
    let (tb, tl) = (opts.train_batch, opts.train_len);
    let lens: Vec<usize> = (0..tb)
        .map(|i| match opts.train_ragged {
            true => (tl - i * tl / (2 * tb)).max(2),
            false => tl,
        })
        .collect();
    let train_tokens: usize = lens.iter().sum();
    let mut train_peak_rss_mib = None;
    if opts.train {
        let train_ids = Tensor::from_vec(ids(tb * tl, vocab, 7), (tb, tl), device)?;
        let att: Vec<u32> = lens
            .iter()
            .flat_map(|&l| (0..tl).map(move |j| u32::from(j < l)))
            .collect();
        let att = Tensor::from_vec(att, (tb, tl), device)?;
        let mb = match opts.train_micro_batch {
            0 => tb,
            n => n.min(tb),
        };
        let cpu_peak = device.is_cpu() && mtrl_core::mem::reset_peak_rss();
        let run = |hook: Option<&mut OptimizerHook<'_>>, mem: &mut MemPeak| -> Result<f64> {
            let start = Instant::now();
            let mut acc: BTreeMap<String, Tensor> = BTreeMap::new();
            for r0 in (0..tb).step_by(mb) {
                let n = mb.min(tb - r0);
                let rows = train_ids.narrow(0, r0, n)?;
                let mask = att.narrow(0, r0, n)?;
                // Σ log p / tokens: the mean over the rows' own positions.
                let scale = 1.0 / train_tokens as f64;
                let (_, _, grads) = logprobs_and_grads(policy, &rows, Some(&mask), 1.0, |lp| {
                    (lp.sum_all()? * scale)?.neg()
                })?;
                mem.sample(device);
                for (name, var) in policy.named_parameters() {
                    if let Some(g) = grads.get(var) {
                        let g = g.to_dtype(DType::F32)?;
                        let sum = match acc.remove(name) {
                            Some(prev) => (prev + g)?,
                            None => g,
                        };
                        acc.insert(name.clone(), sum);
                    }
                }
            }
            device.synchronize()?;
            mem.sample(device);
            if let Some(h) = hook {
                h(policy, &acc)?;
                device.synchronize()?;
                mem.sample(device);
            }
            Ok(train_tokens as f64 / start.elapsed().as_secs_f64())
        };
        train_tokens_per_s = Some(best_of(opts.repeats, || run(None, &mut mem))?);
        if let Some(mut h) = optimizer {
            train_step_tokens_per_s = Some(best_of(opts.repeats, || run(Some(&mut h), &mut mem))?);
        }
        if cpu_peak {
            train_peak_rss_mib = mtrl_core::mem::rss_mb().map(|(peak, _)| peak);
        }
    }
    Ok(BenchReport {
        model_type: format!("{:?}", policy.config().family).to_lowercase(),
        num_parameters,
        device: device_name(device),
        dtype: format!("{dtype:?}").to_lowercase(),
        prompt_len: opts.prompt_len,
        new_tokens: opts.new_tokens,
        prefill_tokens_per_s,
        decode,
        train_batch: opts.train_batch,
        train_micro_batch: match opts.train_micro_batch {
            0 => opts.train_batch,
            n => n.min(opts.train_batch),
        },
        train_len: opts.train_len,
        train_tokens,
        train_ragged: opts.train_ragged,
        train_checkpointing: policy.activation_checkpointing(),
        train_fused_attention: policy.attends_fused(),
        train_tokens_per_s,
        train_step_tokens_per_s,
        device_mem_used_mib: mem.0.map(|b| b as f64 / (1u64 << 20) as f64),
        train_peak_rss_mib,
    })
}

fn device_name(device: &Device) -> String {
    match device.location() {
        candle_core::DeviceLocation::Cpu => "cpu".to_string(),
        candle_core::DeviceLocation::Cuda { gpu_id } => format!("cuda:{gpu_id}"),
        candle_core::DeviceLocation::Metal { gpu_id } => format!("metal:{gpu_id}"),
    }
}

/// Single-sequence cached prefills of `prompt_len` tokens (8 sequences per run).
fn prefill(policy: &Policy, device: &Device, opts: &BenchOptions, vocab: usize) -> Result<f64> {
    let model = policy.inference().clone();
    let layers = policy.config().num_hidden_layers;
    let pb = 8; // as the peer (bench/torch_ref.py --prefill): 8 sequences, one at a time
    best_of(opts.repeats, || {
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
        device.synchronize()?;
        Ok((pb * opts.prompt_len) as f64 / start.elapsed().as_secs_f64())
    })
}

/// `b` greedy sequences through the engine: decode-only and whole-generation figures.
fn decode_at(
    policy: &Policy,
    device: &Device,
    opts: &BenchOptions,
    vocab: usize,
    b: usize,
    mem: &mut MemPeak,
) -> Result<DecodeReport> {
    let mut best = (0f64, 0f64);
    for rep in 0..=opts.repeats.max(1) {
        // One prefill step for all prompts, as the peer and the figure's definition assume.
        let eo = EngineOptions {
            prefill_chunk_tokens: b * opts.prompt_len,
            ..EngineOptions::new(b)
        };
        let mut engine = Engine::with_options(policy.clone(), None, 0, eo)?;
        for i in 0..b {
            engine.submit(GenerationRequest {
                prompt: ids(opts.prompt_len, vocab, 1000 + i as u64),
                sampling: SamplingParams::greedy(),
                max_new_tokens: opts.new_tokens,
                stop_token_ids: vec![],
                stop_strings: vec![],
                session: None,
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
            mem.sample(device);
        }
        device.synchronize()?;
        let wall = start.elapsed().as_secs_f64();
        if rep > 0 {
            let d = decoded as f64 / (wall - first).max(1e-9);
            let g = (b * opts.new_tokens) as f64 / wall;
            best = (best.0.max(d), best.1.max(g));
        }
    }
    Ok(DecodeReport {
        batch: b,
        decode_tokens_per_s: best.0,
        generate_tokens_per_s: best.1,
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
            train_batch: 3,
            train_micro_batch: 2,
            repeats: 1,
            ..BenchOptions::default()
        };
        let mut calls = 0;
        let mut hook = |p: &Policy, g: &BTreeMap<String, Tensor>| -> Result<()> {
            assert!(p
                .named_parameters()
                .keys()
                .all(|k| g[k].dtype() == DType::F32));
            calls += 1;
            Ok(())
        };
        let r = run_bench_with(
            cfg.clone(),
            DType::F32,
            &Device::Cpu,
            &opts,
            Some(&mut hook),
        )
        .unwrap();
        assert_eq!(calls, 2, "warm-up + one timed run");
        assert_eq!(r.decode.len(), 2);
        assert!(r.prefill_tokens_per_s.unwrap() > 0.0 && r.train_tokens_per_s.unwrap() > 0.0);
        assert!(r.train_step_tokens_per_s.unwrap() > 0.0);
        assert_eq!(r.device, "cpu");
        assert_eq!((r.train_batch, r.train_micro_batch), (3, 2));
        assert!(r.device_mem_used_mib.is_none());
        assert!(r
            .decode
            .iter()
            .all(|d| d.decode_tokens_per_s > 0.0 && d.generate_tokens_per_s > 0.0));
        assert!(serde_json::to_string(&r)
            .unwrap()
            .contains("train_tokens_per_s"));
    }
}

#[cfg(test)]
mod phase_tests {
    use super::*;

    #[test]
    fn phases_can_be_skipped() {
        let cfg = Config::from_value(
            serde_json::json!({"model_type": "qwen3", "vocab_size": 64, "hidden_size": 16, "intermediate_size": 32,
                "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
                "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": true}),
            std::path::Path::new("c"),
        )
        .unwrap();
        let opts = BenchOptions {
            batch_sizes: vec![2],
            prompt_len: 4,
            new_tokens: 2,
            train_len: 8,
            train_batch: 2,
            train_micro_batch: 0,
            train_ragged: true,
            repeats: 1,
            prefill: false,
            decode: false,
            train: true,
        };
        let r = run_bench(cfg, DType::BF16, &Device::Cpu, &opts).unwrap();
        assert!(r.prefill_tokens_per_s.is_none() && r.decode.is_empty());
        assert!(r.train_step_tokens_per_s.is_none());
        let json = serde_json::to_string(&r).unwrap();
        assert!(!json.contains("prefill_tokens_per_s"), "{json}");
        assert!(json.contains("\"dtype\":\"bf16\""), "{json}");
        // Ragged rows of 8 and 8 − 8/4 tokens: the figure counts the rows' own tokens.
        assert_eq!((r.train_tokens, r.train_ragged), (14, true));
        if mtrl_core::mem::reset_peak_rss() {
            assert!(r.train_peak_rss_mib.is_some_and(|m| m > 0.0), "{json}");
        }
    }
}
