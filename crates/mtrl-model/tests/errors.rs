//! Bad input gives clear errors, never a panic.

mod common;

use std::path::Path;

use candle_core::{DType, Device, Tensor};
use common::*;
use mtrl_model::{load_pretrained, parse_dtype, Engine, GenerationRequest, Policy, SamplingParams};

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dst = to.join(e.file_name());
        std::fs::copy(e.path(), &dst).unwrap();
        let mut perm = std::fs::metadata(&dst).unwrap().permissions();
        #[allow(clippy::permissions_set_readonly_false)]
        perm.set_readonly(false);
        std::fs::set_permissions(&dst, perm).unwrap();
    }
}

fn err(dir: &Path) -> String {
    Policy::load(dir, DType::F32, &Device::Cpu)
        .unwrap_err()
        .to_string()
}

#[test]
fn bad_dtype_string() {
    assert!(parse_dtype("float8")
        .unwrap_err()
        .to_string()
        .contains("float8"));
}

#[test]
fn other_architecture_and_unsupported_keys() {
    let d = tempfile::tempdir().unwrap();
    copy_dir(&model_dir("qwen3"), d.path());
    let cfg_path = d.path().join("config.json");
    let orig: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    for (key, val, needle) in [
        ("model_type", serde_json::json!("llama"), "model_type"),
        (
            "rope_scaling",
            serde_json::json!({"rope_type": "yarn", "factor": 4.0}),
            "rope_scaling.rope_type",
        ),
        (
            "use_sliding_window",
            serde_json::json!(true),
            "use_sliding_window",
        ),
        ("num_experts", serde_json::json!(64), "num_experts"),
    ] {
        let mut c = orig.clone();
        c[key] = val;
        std::fs::write(&cfg_path, serde_json::to_string(&c).unwrap()).unwrap();
        let e = err(d.path());
        assert!(e.contains(needle), "{key}: {e}");
    }
}

#[test]
fn missing_and_truncated_shards() {
    let d = tempfile::tempdir().unwrap();
    copy_dir(&model_dir("qwen3"), d.path());
    let t =
        candle_core::safetensors::load(d.path().join("model.safetensors"), &Device::Cpu).unwrap();
    std::fs::remove_file(d.path().join("model.safetensors")).unwrap();
    let names: Vec<String> = t.keys().cloned().collect();
    let (a, b) = names.split_at(names.len() / 2);
    let mut map = serde_json::Map::new();
    for (shard, part) in [
        ("model-00001-of-00002.safetensors", a),
        ("model-00002-of-00002.safetensors", b),
    ] {
        let sub: std::collections::HashMap<String, Tensor> =
            part.iter().map(|n| (n.clone(), t[n].clone())).collect();
        candle_core::safetensors::save(&sub, d.path().join(shard)).unwrap();
        for n in part {
            map.insert(n.clone(), serde_json::json!(shard));
        }
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": map});
    std::fs::write(
        d.path().join("model.safetensors.index.json"),
        index.to_string(),
    )
    .unwrap();
    // sharded checkpoint loads and matches the single-file logits
    let p = Policy::load(d.path(), DType::F32, &Device::Cpu).unwrap();
    let q = Policy::load(&model_dir("qwen3"), DType::F32, &Device::Cpu).unwrap();
    let ids = Tensor::new(&[[1u32, 2, 3, 4]], &Device::Cpu).unwrap();
    assert_eq!(
        max_abs_diff(
            &p.forward(&ids, None, None).unwrap(),
            &q.forward(&ids, None, None).unwrap(),
            None
        ),
        0.0
    );
    // truncated shard
    let s2 = d.path().join("model-00002-of-00002.safetensors");
    let bytes = std::fs::read(&s2).unwrap();
    std::fs::write(&s2, &bytes[..bytes.len() / 2]).unwrap();
    let e = err(d.path());
    assert!(
        e.contains("model-00002-of-00002.safetensors") && e.contains("truncated"),
        "{e}"
    );
    // missing shard
    std::fs::remove_file(&s2).unwrap();
    let e = err(d.path());
    assert!(
        e.contains("model-00002-of-00002.safetensors") && e.contains("missing"),
        "{e}"
    );
}

#[test]
fn nan_weights_are_refused() {
    let d = tempfile::tempdir().unwrap();
    copy_dir(&model_dir("qwen2"), d.path());
    let path = d.path().join("model.safetensors");
    let mut t = candle_core::safetensors::load(&path, &Device::Cpu).unwrap();
    let w = t["model.norm.weight"].to_vec1::<f32>().unwrap();
    let mut w2 = w.clone();
    w2[3] = f32::NAN;
    t.insert(
        "model.norm.weight".into(),
        Tensor::new(w2, &Device::Cpu).unwrap(),
    );
    candle_core::safetensors::save(&t, &path).unwrap();
    let e = err(d.path());
    assert!(
        e.contains("model.norm.weight") && e.contains("non-finite"),
        "{e}"
    );
}

#[test]
fn tokenizer_vocab_must_fit_embedding() {
    let d = tempfile::tempdir().unwrap();
    copy_dir(&model_dir("qwen3"), d.path());
    let cfg_path = d.path().join("config.json");
    let mut c: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    c["vocab_size"] = serde_json::json!(1500);
    std::fs::write(&cfg_path, c.to_string()).unwrap();
    // the checkpoint's embedding no longer matches config.json either: shape error names the tensor
    let e = err(d.path());
    assert!(e.contains("model.embed_tokens.weight"), "{e}");
    let tok = mtrl_model::Tokenizer::from_dir(d.path()).unwrap();
    assert!(tok
        .check_vocab(1500)
        .unwrap_err()
        .to_string()
        .contains("2000"));
    assert!(load_pretrained(&model_dir("qwen3"), DType::F32, &Device::Cpu).is_ok());
}

#[test]
fn prompts_longer_than_context() {
    let p = Policy::load(&model_dir("qwen3"), DType::F32, &Device::Cpu).unwrap();
    let max = p.config().max_position_embeddings;
    let long = Tensor::zeros((1, max + 1), DType::U32, &Device::Cpu).unwrap();
    assert!(p
        .forward(&long, None, None)
        .unwrap_err()
        .to_string()
        .contains("context window"));
    let mut e = Engine::new(p, None, 0, 1).unwrap();
    let r = GenerationRequest {
        prompt: vec![1; max],
        sampling: SamplingParams::greedy(),
        max_new_tokens: 1,
        stop_token_ids: vec![],
        stop_strings: vec![],
        session: None,
    };
    assert!(e
        .submit(r.clone())
        .unwrap_err()
        .to_string()
        .contains("context window"));
    let r2 = GenerationRequest {
        prompt: vec![5000],
        ..r.clone()
    };
    assert!(e.submit(r2).unwrap_err().to_string().contains("vocabulary"));
    let r3 = GenerationRequest {
        prompt: vec![5],
        sampling: SamplingParams {
            top_p: 2.0,
            ..Default::default()
        },
        ..r
    };
    assert!(e.submit(r3).unwrap_err().to_string().contains("top_p"));
}
