//! `mtrl bench model` on a checkpoint folder's own weights (`--model`; a `.gguf` is in
//! tests/real_qwen.rs) and on a config's shape with random weights (`--config`): the JSON names what
//! was measured.

mod common;
use common::{json, mtrl, repo};

fn bench(source: &[&str]) -> (bool, String, String) {
    let mut args = vec!["bench", "model"];
    args.extend_from_slice(source);
    args.extend_from_slice(&[
        "--phases",
        "prefill,decode",
        "--batch-sizes",
        "1,2",
        "--prompt-len",
        "8",
        "--new-tokens",
        "4",
        "--repeats",
        "1",
    ]);
    mtrl(&args)
}

#[test]
fn bench_model_measures_a_checkpoint_or_a_config_shape() {
    let tiny = repo().join("tests/fixtures/tiny-qwen2");
    let (ok, out, err) = bench(&["--model", tiny.to_str().unwrap()]);
    assert!(ok, "{err}");
    let r = json(&out);
    assert_eq!(r["model_type"], "qwen2", "{r}");
    assert!(r["prefill_tokens_per_s"].as_f64().unwrap() > 0.0);
    assert_eq!(r["decode"].as_array().unwrap().len(), 2);
    let shape = repo().join("bench/bench-small.json");
    let (ok, out, err) = bench(&["--config", shape.to_str().unwrap()]);
    assert!(ok, "{err}");
    let r = json(&out);
    assert_eq!(r["model_type"], "qwen3", "{r}");
    assert_eq!(r["num_parameters"], 5_245_440, "{r}");
    // Exactly one source.
    let (ok, _, err) = bench(&[
        "--model",
        tiny.to_str().unwrap(),
        "--config",
        shape.to_str().unwrap(),
    ]);
    assert!(
        !ok && err.contains("--config") && err.contains("--model"),
        "{err}"
    );
    let (ok, _, err) = bench(&[]);
    assert!(!ok && err.contains("--config"), "{err}");
}
