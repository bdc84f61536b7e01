//! The multi-turn rollout workload, side by side on the paged engine and the legacy one
//! (`mtrl bench engine`): `episodes` concurrent conversations of `calls` model calls each; a call
//! generates exactly `new_tokens` tokens (sampled at T = 1, no stop ids), then `tool_tokens` of
//! "tool response" are appended and the next call is submitted at once (tools take no time here,
//! so the figure is the engine's alone). Random weights of a given shape, one warm-up run, then
//! the best of `repeats` timed runs per engine, alternating engines so drift hits both alike.
//!
//! Reported per engine: wall time, episodes/s, sampled tokens/s, prompt tokens run through the
//! model per episode (the legacy engine re-prefills the whole conversation at every call; the paged
//! one only what its session does not hold) — and the ratios, paged over legacy.

use std::time::Instant;

use candle_core::{DType, Device};
use serde::Serialize;

use crate::bench::ids;
use crate::config::Config;
use crate::engine::{Completion, Engine, EngineOptions, GenerationRequest, LegacyEngine, Stepper};
use crate::error::Result;
use crate::policy::Policy;
use crate::sampler::SamplingParams;

/// The workload.
#[derive(Debug, Clone, Serialize)]
pub struct EngineBenchOptions {
    pub episodes: usize,
    pub calls: usize,
    pub prompt_tokens: usize,
    pub tool_tokens: usize,
    pub new_tokens: usize,
    /// Sequences per step (both engines).
    pub max_batch: usize,
    /// The paged engine's prefill chunk.
    pub prefill_chunk_tokens: usize,
    /// The paged engine's attention.
    #[serde(serialize_with = "attention_name")]
    pub attention: crate::EngineAttention,
    pub repeats: usize,
}

fn attention_name<S: serde::Serializer>(
    a: &crate::EngineAttention,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(a.name())
}

/// One engine's figures (best run).
#[derive(Debug, Clone, Serialize)]
pub struct EngineFigures {
    pub wall_s: f64,
    pub episodes_per_s: f64,
    pub sampled_tokens_per_s: f64,
    pub prefill_tokens_per_episode: f64,
    /// Engine steps of the run.
    pub steps: u64,
    /// The paged engine's work counters (legacy: absent).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine_counters: Option<String>,
}

/// The comparison (printed as one JSON object).
#[derive(Debug, Clone, Serialize)]
pub struct EngineBenchReport {
    pub bench: &'static str,
    pub model_type: String,
    pub device: String,
    pub dtype: String,
    pub workload: EngineBenchOptions,
    pub paged: EngineFigures,
    pub legacy: EngineFigures,
    /// paged / legacy episodes per second.
    pub episodes_per_s_ratio: f64,
    /// legacy / paged prompt tokens per episode: what keeping sessions resident saves.
    pub kv_reuse_factor: f64,
}

/// Runs the workload once; returns (wall seconds, sampled tokens, prompt tokens fed).
fn workload(
    e: &mut dyn Stepper,
    o: &EngineBenchOptions,
    vocab: usize,
) -> Result<(f64, u64, u64, u64)> {
    let req = |episode: usize, call: usize, prompt: Vec<u32>| GenerationRequest {
        prompt,
        sampling: SamplingParams {
            seed: (episode * 1000 + call) as u64,
            ..Default::default()
        },
        max_new_tokens: o.new_tokens,
        session: Some(episode as u64),
        ..Default::default()
    };
    let mut ctx: Vec<Vec<u32>> = (0..o.episodes)
        .map(|i| ids(o.prompt_tokens, vocab, 7 + i as u64))
        .collect();
    let mut owner = std::collections::HashMap::new();
    let mut calls = vec![0usize; o.episodes];
    let start = Instant::now();
    let mut fed = 0u64;
    for (i, c) in ctx.iter().enumerate() {
        fed += c.len() as u64;
        owner.insert(e.submit(req(i, 0, c.clone()))?, i);
    }
    let (mut sampled, mut live, mut steps) = (0u64, o.episodes, 0u64);
    while live > 0 {
        let out = e.step()?;
        steps += 1;
        sampled += out.tokens.len() as u64;
        for Completion { seq, tokens, .. } in out.finished {
            let Some(i) = owner.remove(&seq) else {
                continue;
            };
            calls[i] += 1;
            ctx[i].extend(tokens);
            if calls[i] == o.calls {
                live -= 1;
                continue;
            }
            let salt = 100_000 + (i * 100 + calls[i]) as u64;
            ctx[i].extend(ids(o.tool_tokens, vocab, salt));
            fed += ctx[i].len() as u64;
            owner.insert(e.submit(req(i, calls[i], ctx[i].clone()))?, i);
        }
    }
    Ok((start.elapsed().as_secs_f64(), sampled, fed, steps))
}

/// Runs the comparison with random weights of `cfg`'s shape.
pub fn run(
    cfg: Config,
    dtype: DType,
    device: &Device,
    o: &EngineBenchOptions,
) -> Result<EngineBenchReport> {
    let vocab = cfg.vocab_size;
    let model_type = format!("{:?}", cfg.family);
    let policy = Policy::random(cfg, dtype, device)?;
    let (mut paged, mut legacy): (Option<EngineFigures>, Option<EngineFigures>) = (None, None);
    let best = |slot: &mut Option<EngineFigures>, f: EngineFigures| {
        if slot.as_ref().is_none_or(|b| f.wall_s < b.wall_s) {
            *slot = Some(f);
        }
    };
    for rep in 0..=o.repeats.max(1) {
        let opts = EngineOptions {
            prefill_chunk_tokens: o.prefill_chunk_tokens,
            attention: o.attention,
            ..EngineOptions::new(o.max_batch)
        };
        let mut e = Engine::with_options(policy.clone(), None, 0, opts)?;
        let (wall, sampled, _, steps) = workload(&mut e, o, vocab)?;
        device.synchronize()?;
        let c = e.counters();
        let mut f = figures(o, wall, sampled, c.prefill_tokens, steps);
        f.engine_counters = Some(format!("{c:?}"));
        let mut l = LegacyEngine::new(policy.clone(), None, 0, o.max_batch);
        let (lwall, lsampled, lfed, lsteps) = workload(&mut l, o, vocab)?;
        device.synchronize()?;
        if rep > 0 {
            best(&mut paged, f);
            best(&mut legacy, figures(o, lwall, lsampled, lfed, lsteps));
        }
    }
    let (Some(paged), Some(legacy)) = (paged, legacy) else {
        return Err(crate::error::ModelError::InvalidArgument(
            "bench engine: no timed run".into(),
        ));
    };
    Ok(EngineBenchReport {
        bench: "engine",
        model_type,
        device: format!("{device:?}"),
        dtype: format!("{dtype:?}"),
        workload: o.clone(),
        episodes_per_s_ratio: paged.episodes_per_s / legacy.episodes_per_s,
        kv_reuse_factor: legacy.prefill_tokens_per_episode / paged.prefill_tokens_per_episode,
        paged,
        legacy,
    })
}

fn figures(
    o: &EngineBenchOptions,
    wall: f64,
    sampled: u64,
    prefill: u64,
    steps: u64,
) -> EngineFigures {
    EngineFigures {
        wall_s: wall,
        episodes_per_s: o.episodes as f64 / wall,
        sampled_tokens_per_s: sampled as f64 / wall,
        prefill_tokens_per_episode: prefill as f64 / o.episodes as f64,
        steps,
        engine_counters: None,
    }
}
