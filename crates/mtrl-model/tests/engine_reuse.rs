//! The paged engine: keys/values kept across turns (sessions), the paged forward against a full
//! re-prefill, eviction and preemption under a tiny store, chunked prefill, log-probs.

mod common;

use candle_core::{DType, Device, Tensor};
use common::*;
use mtrl_model::kv_pool::{KvPool, SeqBlocks};
use mtrl_model::transformer::paged::{PagedBatch, Segment};
use mtrl_model::{Completion, Engine, EngineOptions, GenerationRequest, Policy, SamplingParams};

fn policy(kind: &str, dev: &Device, dt: DType) -> Policy {
    Policy::load(&model_dir(kind), dt, dev).unwrap()
}

fn req(
    prompt: Vec<u32>,
    n: usize,
    sampling: SamplingParams,
    session: Option<u64>,
) -> GenerationRequest {
    GenerationRequest {
        prompt,
        sampling,
        max_new_tokens: n,
        session,
        ..Default::default()
    }
}

fn sampled(seed: u64) -> SamplingParams {
    SamplingParams {
        temperature: 1.0,
        seed,
        ..Default::default()
    }
}

/// Logits of every row of `tokens` appended after `past` stored positions of `kv`.
fn paged_logits(p: &Policy, pool: &mut KvPool, kv: &mut SeqBlocks, tokens: &[u32]) -> Tensor {
    let start = kv.len();
    assert!(pool.reserve(kv, start + tokens.len()).unwrap());
    let seg = Segment {
        start,
        len: tokens.len(),
        slots: kv.slots(start + tokens.len()).collect(),
    };
    let mut b = PagedBatch {
        ids: tokens.to_vec(),
        outputs: (0..tokens.len() as u32).collect(),
        ..Default::default()
    };
    if tokens.len() == 1 {
        b.decode.push(seg);
    } else {
        b.prefill.push(seg);
    }
    let h = p.inference().forward_paged(&b, pool).unwrap().unwrap();
    kv.set_len(start + tokens.len());
    p.inference().logits(&h).unwrap()
}

fn reuse_matches_full_prefill(kind: &str, dt: DType) {
    let dev = Device::Cpu;
    let p = policy(kind, &dev, dt);
    // bf16 rounds every op's output: the same rows in another order differ in their last bits.
    let (tol_cache, tol_train) = if dt == DType::BF16 {
        (0.1, 0.1)
    } else {
        (1e-5, 1e-4)
    };
    let cfg = p.config().clone();
    let (kv, d) = (cfg.num_key_value_heads, cfg.head_dim);
    let turn1: Vec<u32> = (0..37).map(|i| (i * 7 + 3) % 500).collect();
    let turn2: Vec<u32> = (0..21).map(|i| (i * 11 + 5) % 500).collect();
    let mut pool = KvPool::new(cfg.num_hidden_layers, kv, d, 1024, dt, &dev).unwrap();
    // Another sequence in the store, so slots are not simply 0..n.
    let mut other = SeqBlocks::default();
    paged_logits(&p, &mut pool, &mut other, &[9, 8, 7, 6, 5]);
    let mut kv = SeqBlocks::default();
    paged_logits(&p, &mut pool, &mut kv, &turn1);
    let appended = paged_logits(&p, &mut pool, &mut kv, &turn2);
    let one = paged_logits(&p, &mut pool, &mut kv, &[42]);
    let full: Vec<u32> = turn1.iter().chain(&turn2).chain(&[42]).copied().collect();
    let mut fresh = SeqBlocks::default();
    let all = paged_logits(&p, &mut pool, &mut fresh, &full);
    let n1 = turn1.len();
    let want = all.narrow(0, n1, turn2.len()).unwrap();
    let d = max_abs_diff(&appended, &want, None);
    assert!(
        d < tol_cache,
        "{kind} {dt:?}: appended turn vs full prefill, max diff {d}"
    );
    let d = max_abs_diff(&one, &all.narrow(0, full.len() - 1, 1).unwrap(), None);
    assert!(
        d < tol_cache,
        "{kind} {dt:?}: decode row vs full prefill, max diff {d}"
    );
    // and the training forward (no cache at all) agrees
    let ids = Tensor::from_slice(&full, (1, full.len()), &dev).unwrap();
    let pos = Tensor::arange(0u32, full.len() as u32, &dev)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    let h = p.inference().forward_hidden(&ids, &pos, None).unwrap();
    let train = p.inference().logits(&h.squeeze(0).unwrap()).unwrap();
    let d = max_abs_diff(&all, &train, None);
    assert!(
        d < tol_train,
        "{kind} {dt:?}: paged prefill vs uncached forward, max diff {d}"
    );
}

fn qwen3_turn_reuse_equals_full_prefill(dt: DType) {
    reuse_matches_full_prefill("qwen3", dt);
}

fn qwen2_turn_reuse_equals_full_prefill(dt: DType) {
    reuse_matches_full_prefill("qwen2", dt);
}

/// A 3-turn conversation per session: each turn's prompt is the previous context plus a
/// "tool response"; returns every turn's completion. `keep`: send the session with the requests.
fn talk(e: &mut Engine, sessions: &[u64], sampling: bool, keep: bool) -> Vec<Vec<Completion>> {
    let mut ctx: Vec<Vec<u32>> = sessions
        .iter()
        .map(|&s| {
            (0..30)
                .map(|i| ((s * 31 + i * 13) % 480 + 10) as u32)
                .collect()
        })
        .collect();
    let mut out = vec![Vec::new(); sessions.len()];
    for turn in 0..3u64 {
        let reqs = sessions
            .iter()
            .zip(&ctx)
            .map(|(&s, c)| {
                let sp = if sampling {
                    sampled(s * 10 + turn)
                } else {
                    SamplingParams::greedy()
                };
                req(c.clone(), 6, sp, keep.then_some(s))
            })
            .collect();
        for (i, c) in e.generate(reqs).unwrap().into_iter().enumerate() {
            ctx[i].extend(&c.tokens);
            ctx[i].extend((0..17).map(|k| ((turn * 5 + k) % 300 + 40) as u32));
            out[i].push(c);
        }
    }
    out
}

fn conversations(e: &mut Engine, sessions: &[u64], sampling: bool) -> Vec<Vec<Completion>> {
    talk(e, sessions, sampling, true)
}

fn engine(dt: DType, opts: EngineOptions) -> Engine {
    Engine::with_options(policy("qwen3", &Device::Cpu, dt), None, 0, opts).unwrap()
}

fn sessions_reuse_prefixes_and_change_no_token(dt: DType) {
    let sessions = [1u64, 2, 3, 4];
    let mut plain = engine(dt, EngineOptions::new(8));
    // Without sessions: every turn is prefilled from scratch.
    // bf16 rounds keys/values computed in another step's company differently, enough to move a
    // sampled token across a boundary of its draw: there the check is on greedy tokens.
    let sampling = dt != DType::BF16;
    let mut ctx_free = Vec::new();
    for s in sessions {
        let c = talk(&mut plain, &[s], sampling, false);
        ctx_free.push(c.into_iter().next().unwrap());
    }
    let base = plain.counters();
    let mut reuse = engine(dt, EngineOptions::new(8));
    let with = conversations(&mut reuse, &sessions, sampling);
    for (a, b) in with.iter().zip(&ctx_free) {
        for (x, y) in a.iter().zip(b) {
            assert_eq!(x.tokens, y.tokens);
            for (l, m) in x.logprobs.iter().zip(&y.logprobs) {
                // bf16: the reused prefix was computed in other rows' company than a re-prefill.
                let tol = if dt == DType::BF16 { 0.1 } else { 1e-5 };
                assert!((l - m).abs() < tol, "{dt:?}: {l} vs {m}");
            }
        }
    }
    let c = reuse.counters();
    assert_eq!(base.reused_tokens, 0);
    assert!(c.reused_tokens > 0, "{c:?}");
    assert_eq!(
        c.prefill_tokens + c.reused_tokens,
        base.prefill_tokens + base.reused_tokens,
        "same prompts in both runs"
    );
    assert!(
        c.prefill_tokens * 2 < base.prefill_tokens,
        "{c:?} vs {base:?}"
    );
    assert_eq!(reuse.num_parked(), sessions.len());
    for s in sessions {
        reuse.release(s);
    }
    assert_eq!(reuse.num_parked(), 0);
    assert_eq!(
        reuse.resident_tokens().0,
        0,
        "released sessions free the store"
    );
}

fn a_tiny_store_evicts_and_preempts_without_changing_tokens(dt: DType) {
    let sessions = [5u64, 6, 7, 8, 9, 10];
    let big = conversations(&mut engine(dt, EngineOptions::new(6)), &sessions, true);
    let mut small = engine(
        dt,
        EngineOptions {
            kv_cache_tokens: Some(160),
            ..EngineOptions::new(6)
        },
    );
    let got = conversations(&mut small, &sessions, true);
    let c = small.counters();
    assert!(c.preempted > 0 && c.evicted_sessions > 0, "{c:?}");
    for (a, b) in got.iter().zip(&big) {
        for (x, y) in a.iter().zip(b) {
            assert_eq!(x.tokens, y.tokens, "eviction changed a sequence");
        }
    }
    assert!(small.resident_tokens().0 <= 160);
}

fn chunked_prefill_changes_steps_not_tokens(dt: DType) {
    let sessions = [11u64, 12, 13];
    let mut whole = engine(dt, EngineOptions::new(4));
    let a = conversations(&mut whole, &sessions, false);
    let mut chunked = engine(
        dt,
        EngineOptions {
            prefill_chunk_tokens: 4,
            ..EngineOptions::new(4)
        },
    );
    let b = conversations(&mut chunked, &sessions, false);
    for (x, y) in a.iter().flatten().zip(b.iter().flatten()) {
        assert_eq!(x.tokens, y.tokens);
    }
    assert!(chunked.counters().forwards > whole.counters().forwards + 10);
}

fn logprobs_match_the_learner_and_truncation_is_reported(dt: DType) {
    let dev = Device::Cpu;
    let prompt: Vec<u32> = vec![1992, 306, 263, 198, 559, 296, 220];
    let plain = SamplingParams {
        temperature: 0.9,
        seed: 4,
        ..Default::default()
    };
    let truncated = SamplingParams {
        top_k: 12,
        top_p: 0.8,
        ..plain.clone()
    };
    let mut e = engine(dt, EngineOptions::new(4));
    let out = e
        .generate(vec![
            req(prompt.clone(), 12, plain, None),
            req(prompt.clone(), 12, truncated, None),
        ])
        .unwrap();
    let p = policy("qwen3", &dev, dt);
    for (k, c) in out.iter().enumerate() {
        let lp = learner_logprobs(&p, &prompt, &c.tokens, 0.9);
        for (i, &want) in c.logprobs.iter().enumerate() {
            let got = lp[i];
            assert!(
                (got - want).abs() < logprob_tol(dt),
                "{dt:?} token {i}: learner {got} vs engine {want}"
            );
            let t = c.truncated_logprobs[i];
            if k == 0 {
                assert!((t - want).abs() < 1e-6, "untruncated: {t} vs {want}");
            } else {
                assert!(
                    t >= want - 1e-6,
                    "truncation can only raise a kept token's log-prob"
                );
            }
        }
    }
    assert!(out[1]
        .truncated_logprobs
        .iter()
        .zip(&out[1].logprobs)
        .any(|(t, l)| t - l > 1e-3));
}

fn a_sequence_is_bit_identical_whatever_joins_its_step(dt: DType) {
    let p = |seed| SamplingParams {
        temperature: 1.0,
        top_k: 16,
        seed,
        ..Default::default()
    };
    let prompts: Vec<Vec<u32>> = (0..6u32)
        .map(|i| {
            (0..(20 + 17 * i))
                .map(|k| (k * 7 + i * 31) % 400 + 5)
                .collect()
        })
        .collect();
    let alone: Vec<Completion> = prompts
        .iter()
        .enumerate()
        .map(|(i, pr)| {
            let mut e = engine(
                dt,
                EngineOptions {
                    prefill_chunk_tokens: 64,
                    ..EngineOptions::new(1)
                },
            );
            e.generate(vec![req(pr.clone(), 3, p(i as u64), None)])
                .unwrap()
                .remove(0)
        })
        .collect();
    let mut e = engine(
        dt,
        EngineOptions {
            prefill_chunk_tokens: 64,
            ..EngineOptions::new(6)
        },
    );
    let reqs = prompts
        .iter()
        .enumerate()
        .map(|(i, pr)| req(pr.clone(), 3, p(i as u64), None))
        .collect();
    let together = e.generate(reqs).unwrap();
    for (a, b) in alone.iter().zip(&together) {
        assert_eq!(a.tokens, b.tokens);
        assert_eq!(a.logprobs, b.logprobs, "bits differ with batch-mates");
    }
}

/// Issue 43, defect 3: a sequence in flight during a weight update parks keys/values that the
/// old weights computed; its session's next turn must prefill under the new weights, never reuse
/// them (a turn's prompt is always prefilled by the weights that sample it). A session parked
/// after the update reuses as before.
fn keys_values_never_cross_a_weight_update(dt: DType) {
    let mut e = engine(dt, EngineOptions::new(8));
    let weights: std::collections::HashMap<String, Tensor> = policy("qwen3", &Device::Cpu, dt)
        .named_parameters()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_tensor().clone()))
        .collect();
    let prompt: Vec<u32> = (0..30).map(|i| (i * 13 % 480 + 10) as u32).collect();
    e.submit(req(prompt.clone(), 8, SamplingParams::greedy(), Some(7)))
        .unwrap();
    // Prefill and a first token under version 0, then the update while the sequence decodes.
    let mut done = Vec::new();
    let mut sampled = 0;
    while sampled < 2 {
        let out = e.step().unwrap();
        sampled += out.tokens.len();
        done.extend(out.finished);
    }
    e.update_weights(1, &weights).unwrap();
    while e.num_unfinished() > 0 {
        done.extend(e.step().unwrap().finished);
    }
    let first = done.pop().unwrap();
    assert_eq!(first.versions.first(), Some(&0));
    assert_eq!(first.versions.last(), Some(&1), "{:?}", first.versions);
    let before = e.counters().reused_tokens;
    let mut next = prompt.clone();
    next.extend(&first.tokens);
    next.extend([41, 42, 43]);
    let second = e
        .generate(vec![req(
            next.clone(),
            4,
            SamplingParams::greedy(),
            Some(7),
        )])
        .unwrap();
    assert_eq!(
        e.counters().reused_tokens,
        before,
        "positions computed by version 0 were reused under version 1"
    );
    // That turn ran wholly under version 1: its session is reused by the next turn.
    next.extend(&second[0].tokens);
    next.extend([44, 45]);
    e.generate(vec![req(next, 4, SamplingParams::greedy(), Some(7))])
        .unwrap();
    assert!(e.counters().reused_tokens > before);
}

per_kernels!(
    qwen3_turn_reuse_equals_full_prefill,
    qwen2_turn_reuse_equals_full_prefill,
    sessions_reuse_prefixes_and_change_no_token,
    a_tiny_store_evicts_and_preempts_without_changing_tokens,
    chunked_prefill_changes_steps_not_tokens,
    logprobs_match_the_learner_and_truncation_is_reported,
    a_sequence_is_bit_identical_whatever_joins_its_step,
    keys_values_never_cross_a_weight_update,
);

/// After every scenario above has run in this process (a test binary is one process; this one
/// runs them again to be independent of the order): the chunks without an output row, the mixed
/// decode + prefill steps, session reuse, eviction and preemption launched nothing empty.
#[test]
fn no_op_ran_on_zero_elements() {
    for dt in [DType::F32, DType::F64, DType::BF16] {
        chunked_prefill_changes_steps_not_tokens(dt);
        a_tiny_store_evicts_and_preempts_without_changing_tokens(dt);
    }
    assert_eq!(mtrl_model::host::empty_launches(), 0);
}

/// An engine step reads from the device once when it samples (ids and log-probs together) and
/// not at all when it only prefills a prompt chunk; on the candle backend (what CUDA runs) as on
/// the CPU kernels.
fn one_read_per_sampling_step(dt: DType) {
    let mut e = engine(
        dt,
        EngineOptions {
            prefill_chunk_tokens: 8,
            ..EngineOptions::new(4)
        },
    );
    for s in 0..3u64 {
        let prompt: Vec<u32> = (0..20 + 7 * s)
            .map(|i| ((s * 31 + i * 13) % 480 + 10) as u32)
            .collect();
        e.submit(req(prompt, 5, sampled(s), None)).unwrap();
    }
    let (mut sampling, mut silent) = (0, 0);
    while e.num_unfinished() > 0 {
        let before = mtrl_model::host::reads();
        let out = e.step().unwrap();
        let reads = mtrl_model::host::reads() - before;
        if out.tokens.is_empty() {
            assert_eq!(
                reads, 0,
                "{dt:?}: a step that sampled nothing read {reads} times"
            );
            silent += 1;
        } else {
            assert_eq!(reads, 1, "{dt:?}: a sampling step read {reads} times");
            sampling += 1;
        }
    }
    assert!(
        sampling >= 5 && silent >= 1,
        "{sampling} sampling, {silent} silent steps"
    );
}

per_kernels!(one_read_per_sampling_step);
