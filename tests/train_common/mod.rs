//! Shared by the `mtrl train` end-to-end tests: a config for the one-token `pick` task over the
//! fixture tokenizer and a seeded random tiny Qwen3, written into a temp dir.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn fixtures() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures"))
}

/// Writes `dir/train.toml`; `extra` replaces keys by appending to sections (see callers).
pub fn write_config(dir: &Path, rollout: &str, train: &str, checkpoint: &str) -> PathBuf {
    let f = fixtures();
    let text = format!(
        r#"name = "e2e"
[model]
path = "random:tiny"
tokenizer = "{tok}"
[data]
train = "{tasks}"
validation_fraction = 0.0
[rollout]
environment = "pick"
temperature = 1.0
top_k = 16
{rollout}
[algorithm]
loss = "ppo"
advantage = "grpo"
max_staleness = 0
[train]
lr = 0.01
grad_clip = 1.0
seed = 0
{train}
[checkpoint]
dir = "{ckpt}"
{checkpoint}
"#,
        tok = f.join("tiny-qwen3").display(),
        tasks = f.join("pick/tasks.jsonl").display(),
        ckpt = dir.join("run").display(),
    );
    let path = dir.join("train.toml");
    std::fs::write(&path, text).unwrap();
    path
}

pub fn mtrl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mtrl"))
        .args(args)
        .output()
        .unwrap()
}

/// Runs `mtrl train --quiet` and panics with its stderr when it fails.
pub fn train(config: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["train", "--quiet", "--config", config.to_str().unwrap()];
    args.extend_from_slice(extra);
    let out = mtrl(&args);
    assert!(
        out.status.success(),
        "mtrl train failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

pub fn records(run: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}
