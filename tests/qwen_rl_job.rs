//! The multi-turn RL job of the real Qwen2.5-Coder-0.5B-Instruct, end to end at CI size:
//! `configs/qwen2.5-0.5b-search-rl.toml` with its budgets cut (12 Cranfield queries, the hashing
//! embedder, one SFT step of two conversations, one RL step of one group of two, two test tasks)
//! through `mtrl train --config` — teacher, LoRA SFT in the model's own chat template, RL from that
//! adapter, evaluation of base / sft / tuned against the scripted baselines — then a rerun, which
//! keeps the finished SFT stage and resumes RL instead of redoing them.

mod common;

use std::path::{Path, PathBuf};

use common::{json, mtrl, repo};

/// The fetched GGUF ([`common::qwen_gguf`]).
fn gguf() -> PathBuf {
    common::qwen_gguf()
}

/// Cranfield's first `n` queries and their judgments.
fn mini_collection(dir: &Path, n: usize) -> (PathBuf, PathBuf) {
    let data = repo().join("data/cranfield");
    let q = std::fs::read_to_string(data.join("queries.tsv")).unwrap();
    let mut lines = q.lines();
    let mut out = vec![lines.next().unwrap().to_string()];
    let mut ids = Vec::new();
    for l in lines.take(n) {
        ids.push(l.split('\t').next().unwrap().to_string());
        out.push(l.to_string());
    }
    let queries = dir.join("queries.tsv");
    std::fs::write(&queries, out.join("\n") + "\n").unwrap();
    let r = std::fs::read_to_string(data.join("qrels.trec")).unwrap();
    let kept: Vec<&str> = r
        .lines()
        .filter(|l| ids.iter().any(|i| l.split_whitespace().next() == Some(i)))
        .collect();
    let qrels = dir.join("qrels.trec");
    std::fs::write(&qrels, kept.join("\n") + "\n").unwrap();
    (queries, qrels)
}

/// The shipped config at CI size, every path absolute, written into `dir`.
fn small_config(dir: &Path) -> PathBuf {
    let src = repo().join("configs/qwen2.5-0.5b-search-rl.toml");
    let mut t: toml::Table = std::fs::read_to_string(&src).unwrap().parse().unwrap();
    let (queries, qrels) = mini_collection(dir, 12);
    let s = |p: PathBuf| toml::Value::String(p.display().to_string());
    let set = |t: &mut toml::Table, path: &[&str], v: toml::Value| {
        let mut cur = t;
        for k in &path[..path.len() - 1] {
            cur = cur.get_mut(*k).unwrap().as_table_mut().unwrap();
        }
        cur.insert(path[path.len() - 1].to_string(), v);
    };
    let i = |v: i64| toml::Value::Integer(v);
    set(&mut t, &["model", "path"], s(gguf()));
    let cranfield = repo().join("data/cranfield/docs.jsonl");
    set(&mut t, &["search", "corpus"], s(cranfield));
    set(&mut t, &["search", "index_dir"], s(dir.join("index")));
    set(
        &mut t,
        &["search", "embedder"],
        toml::Value::String("hash".into()),
    );
    set(&mut t, &["search", "eval", "queries"], s(queries));
    set(&mut t, &["search", "eval", "qrels"], s(qrels));
    for split in ["train", "validation", "test"] {
        set(
            &mut t,
            &["data", split],
            s(dir.join(format!("data/{split}.jsonl"))),
        );
    }
    set(
        &mut t,
        &["sft", "trajectories"],
        s(dir.join("teacher.jsonl")),
    );
    set(&mut t, &["sft", "output"], s(dir.join("sft")));
    set(&mut t, &["sft", "max_steps"], i(1));
    set(&mut t, &["sft", "batch_size"], i(2));
    set(&mut t, &["checkpoint", "dir"], s(dir.join("rl")));
    set(&mut t, &["env", "max_turns"], i(2));
    set(&mut t, &["env", "max_tokens_per_turn"], i(48));
    set(&mut t, &["rollout", "group_size"], i(2));
    set(&mut t, &["rollout", "rollout_max_concurrency"], i(2));
    set(&mut t, &["train", "global_batch_size"], i(1));
    set(&mut t, &["train", "max_steps"], i(1));
    set(&mut t, &["train", "val_every"], i(1));
    set(&mut t, &["train", "val_tasks"], i(1));
    set(&mut t, &["checkpoint", "every_steps"], i(1));
    let path = dir.join("job.toml");
    std::fs::write(&path, toml::to_string(&t).unwrap()).unwrap();
    path
}

#[test]
fn the_job_runs_every_stage_on_the_real_model_and_resumes() {
    let t = tempfile::tempdir().unwrap();
    let cfg = small_config(t.path());
    let (ok, out, err) = mtrl(&["train", "--config", cfg.to_str().unwrap(), "--quiet"]);
    assert!(ok, "{err}");
    for stage in [
        "3/6 teacher episodes",
        "4/6 warm start (SFT)",
        "5/6 multi-turn RL",
        "6/6 evaluation on the test split",
    ] {
        assert!(err.contains(stage), "{stage}: {err}");
    }
    // The SFT adapter: PEFT's files on the last four layers, from the teacher's conversations.
    let sft = t.path().join("sft");
    let a = json(&std::fs::read_to_string(sft.join("adapter_config.json")).unwrap());
    assert_eq!(
        a["layers_to_transform"],
        serde_json::json!([20, 21, 22, 23])
    );
    assert_eq!(a["r"], 16);
    let done = json(&std::fs::read_to_string(sft.join("sft-done.json")).unwrap());
    assert_eq!(done["steps"], 1);
    // RL started from it and checkpointed its adapter.
    let step = t.path().join("rl/step-00000001/policy");
    assert!(step.join("adapter_model.safetensors").is_file());
    // The report: base, sft and tuned against every scripted baseline, tuned compared with each.
    let report = json(&std::fs::read_to_string(t.path().join("rl/eval/eval.json")).unwrap());
    let ds = &report["datasets"][0];
    let labels: Vec<&str> = ds["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["label"].as_str().unwrap())
        .collect();
    for l in [
        "base",
        "sft",
        "tuned",
        "bm25-once",
        "vector-once",
        "hybrid-rrf",
        "teacher-best",
    ] {
        assert!(labels.contains(&l), "{l}: {labels:?}");
    }
    let pairs: Vec<(String, String)> = ds["comparisons"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["a"].to_string(), c["b"].to_string()))
        .collect();
    assert!(
        pairs.contains(&("\"tuned\"".into(), "\"base\"".into()))
            && pairs.contains(&("\"tuned\"".into(), "\"sft\"".into())),
        "{pairs:?}"
    );
    assert!(out.contains("tuned") && out.contains("eval.md"), "{out}");
    // A rerun keeps the SFT stage and resumes RL (already at its last step).
    let metrics = std::fs::read_to_string(t.path().join("rl/metrics.jsonl")).unwrap();
    let (ok, _, err) = mtrl(&["train", "--config", cfg.to_str().unwrap(), "--quiet"]);
    assert!(ok, "{err}");
    assert!(err.contains("kept:"), "{err}");
    let again = std::fs::read_to_string(t.path().join("rl/metrics.jsonl")).unwrap();
    assert_eq!(metrics, again, "RL ran again instead of resuming");
}

fn json_ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// Greedy continuations of the goldens' prompts under `policy`.
fn greedy(policy: mtrl_model::Policy, g: &serde_json::Value) -> Vec<(String, Vec<u32>, Vec<f32>)> {
    let prompts = g["prompts"].as_array().unwrap();
    let requests = prompts
        .iter()
        .map(|p| mtrl_model::GenerationRequest {
            prompt: json_ids(&p["input_ids"]),
            sampling: mtrl_model::SamplingParams::greedy(),
            max_new_tokens: p["greedy_ids"].as_array().unwrap().len(),
            stop_token_ids: vec![],
            stop_strings: vec![],
            session: None,
        })
        .collect();
    let mut engine = mtrl_model::Engine::new(policy, None, 0, 8).unwrap();
    let out = engine.generate(requests).unwrap();
    prompts
        .iter()
        .zip(out)
        .map(|(p, c)| {
            (
                p["name"].as_str().unwrap().to_string(),
                c.tokens,
                c.logprobs,
            )
        })
        .collect()
}

/// The tuned adapter of a run of the job (`tests/fixtures/qwen2.5-rl-adapter/adapter`, PEFT's
/// files, `layers_to_transform` included): on the GGUF base and as the merged checkpoint of
/// `mtrl export --merge`, mtrl's greedy output equals what PEFT (the adapter on transformers' GGUF
/// base) and transformers (loading the merged folder) produce — goldens.json, from generate.py.
#[test]
fn the_tuned_adapter_and_its_merged_export_match_peft_and_transformers() {
    use candle_core::{DType, Device};
    let fx = repo().join("tests/fixtures/qwen2.5-rl-adapter");
    let g = json(&std::fs::read_to_string(fx.join("goldens.json")).unwrap());
    let adapter = fx.join("adapter");
    let t = tempfile::tempdir().unwrap();
    let merged = t.path().join("merged");
    let (ok, _, err) = mtrl(&[
        "export",
        "--model",
        gguf().to_str().unwrap(),
        "--adapter",
        adapter.to_str().unwrap(),
        "--out",
        merged.to_str().unwrap(),
        "--merge",
    ]);
    assert!(ok, "{err}");
    let on_base = mtrl_model::Policy::load(&gguf(), DType::F32, &Device::Cpu)
        .unwrap()
        .load_adapter(&adapter)
        .unwrap();
    let flat = mtrl_model::Policy::load(&merged, DType::F32, &Device::Cpu).unwrap();
    assert!(flat.lora().is_none());
    for (which, policy) in [("adapter on the GGUF", on_base), ("merged export", flat)] {
        for ((name, ids, lps), p) in greedy(policy, &g)
            .into_iter()
            .zip(g["prompts"].as_array().unwrap())
        {
            assert_eq!(
                ids,
                json_ids(&p["greedy_ids"]),
                "{which}, {name}: {:?}",
                p["greedy_text"]
            );
            let want: Vec<f32> = p["greedy_logprobs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect();
            let d = lps
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max);
            assert!(d < 1e-3, "{which}, {name}: greedy log-prob diff {d}");
        }
    }
}
