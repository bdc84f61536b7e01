//! LoRA through the binary: `mtrl export --merge` writes PEFT's merged model (the fixture's
//! `merged/`, within 1e-6), `mtrl export` without it re-writes the adapter (tensors byte for
//! byte), and `mtrl eval --model BASE --adapter DIR` evaluates the adapter — greedily the same
//! episodes as the exported merged model — on the first Cranfield test tasks.

mod common;
use common::{cranfield_config, json, mtrl, prepared_cranfield, repo};

fn max_diff(a: &candle_core::Tensor, b: &candle_core::Tensor) -> f32 {
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

#[test]
fn export_and_eval_an_adapter() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let fx = repo().join("tests/fixtures");
    let base = fx.join("tiny-qwen3");
    let adapter = fx.join("lora/tiny-qwen3/adapter");
    let (base_s, adapter_s) = (base.to_str().unwrap(), adapter.to_str().unwrap());

    let merged = d.join("merged");
    let args = [
        "export",
        "--model",
        base_s,
        "--adapter",
        adapter_s,
        "--merge",
    ];
    let (ok, out, err) = mtrl(&[&args[..], &["--out", merged.to_str().unwrap()]].concat());
    assert!(ok, "{err}");
    assert_eq!(json(&out)["adapter_parameters"], 16_384);
    let dev = candle_core::Device::Cpu;
    let ours = candle_core::safetensors::load(merged.join("model.safetensors"), &dev).unwrap();
    let peft =
        candle_core::safetensors::load(fx.join("lora/tiny-qwen3/merged/model.safetensors"), &dev)
            .unwrap();
    assert_eq!(ours.len(), peft.len());
    for (name, t) in &ours {
        assert!(max_diff(t, &peft[name]) < 1e-6, "{name}");
    }
    assert!(merged.join("tokenizer.json").is_file() && merged.join("config.json").is_file());
    // Not into a folder that holds something.
    let (ok, _, err) = mtrl(&[&args[..], &["--out", merged.to_str().unwrap()]].concat());
    assert!(!ok && err.contains("not empty"), "{err}");

    let copy = d.join("adapter-copy");
    let (ok, _, err) = mtrl(&[
        "export",
        "--model",
        base_s,
        "--adapter",
        adapter_s,
        "--out",
        copy.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let file = "adapter_model.safetensors";
    assert!(std::fs::read(copy.join(file)).unwrap() == std::fs::read(adapter.join(file)).unwrap());
    let cfg: serde_json::Value =
        json(&std::fs::read_to_string(copy.join("adapter_config.json")).unwrap());
    assert_eq!(cfg["base_model_name_or_path"].as_str(), Some(base_s));
    assert_eq!(
        (cfg["r"].as_u64(), cfg["lora_alpha"].as_u64()),
        (Some(8), Some(16))
    );

    // Evaluation: the adapter on its base against the exported merged model.
    let split = prepared_cranfield(d);
    let cfg = cranfield_config(
        d,
        "cran",
        "eval.toml",
        &format!(
            "[data]\ntrain = '{s}/train.jsonl'\ntest = '{s}/test.jsonl'\n[env]\nmax_turns = 2\n\
             max_tokens_per_turn = 8\nmax_context_tokens = 1024\n",
            s = split.display()
        ),
    );
    let out_dir = d.join("eval");
    let (ok, stdout, err) = mtrl(&[
        "eval",
        "--config",
        cfg.to_str().unwrap(),
        "--model",
        base_s,
        "--adapter",
        adapter_s,
        "--baseline",
        merged.to_str().unwrap(),
        "--k",
        "0",
        "--limit",
        "3",
        "--out",
        out_dir.to_str().unwrap(),
        "--quiet",
    ]);
    assert!(ok, "{err}");
    assert!(stdout.contains("| cran/test | 3 | tuned |"), "{stdout}");
    let report = json(&std::fs::read_to_string(out_dir.join("eval.json")).unwrap());
    let runs = report["datasets"][0]["runs"].as_array().unwrap().clone();
    let run = |l: &str| runs.iter().find(|r| r["label"] == l).unwrap().clone();
    let (tuned, merged_run) = (run("tuned"), run("base"));
    assert!(
        tuned["source"]
            .as_str()
            .unwrap_or_default()
            .contains("adapter"),
        "{tuned}"
    );
    for (a, b) in tuned["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .zip(merged_run["tasks"].as_array().unwrap())
    {
        assert_eq!((&a["reward"], &a["tokens"]), (&b["reward"], &b["tokens"]));
    }
    // --adapter without --model is refused.
    let (ok, _, err) = mtrl(&[
        "eval",
        "--config",
        cfg.to_str().unwrap(),
        "--adapter",
        adapter_s,
        "--quiet",
    ]);
    assert!(!ok && err.contains("--adapter"), "{err}");
}
