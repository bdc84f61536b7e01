//! Shared by the CLI end-to-end tests: run the real `mtrl` binary, locate the repository.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs `mtrl ARGS`: (success, stdout, stderr).
pub fn mtrl(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_mtrl"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The repository root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A config named `name` for Cranfield with the hashing embedder, indexed in `dir`, written to
/// `dir/file`, with `extra` TOML appended.
pub fn cranfield_config(dir: &Path, name: &str, file: &str, extra: &str) -> PathBuf {
    let data = repo().join("data/cranfield");
    let cfg = dir.join(file);
    std::fs::write(
        &cfg,
        format!(
            "name = '{name}'\n[search]\ncorpus = '{}'\nindex_dir = '{}'\nembedder = 'hash'\n\
             skip_bad_rows = true\n[search.columns]\nid = 'doc_id'\n[search.eval]\nqueries = '{}'\n\
             qrels = '{}'\n{extra}",
            data.join("docs.jsonl").display(),
            dir.join("index").display(),
            data.join("queries.tsv").display(),
            data.join("qrels.trec").display()
        ),
    )
    .unwrap();
    cfg
}

/// Parses command output as JSON, showing the text when it is not.
pub fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// `configs/demo.toml` with every path moved into `dir` (corpus and model shape stay in the
/// repository) and each `(from, to)` text swapped; a `from` the config no longer has is an error,
/// so a test cannot silently run other settings than it names. Written to `dir/demo.toml`.
pub fn demo_config(dir: &Path, swaps: &[(&str, &str)]) -> PathBuf {
    let root = repo();
    let text = std::fs::read_to_string(root.join("configs/demo.toml")).unwrap();
    let mut text = text
        .replace("\"../data/", &format!("\"{}/data/", root.display()))
        .replace("\"../runs/", &format!("\"{}/", dir.display()));
    let model = format!("\"{}/configs/demo-model.json\"", root.display());
    let mut all = vec![("\"demo-model.json\"", model.as_str())];
    all.extend_from_slice(swaps);
    for (from, to) in all {
        assert!(
            text.contains(from),
            "configs/demo.toml no longer has `{from}`"
        );
        text = text.replace(from, to);
    }
    assert!(!text.contains("\"../"), "a relative path was left: {text}");
    let cfg = dir.join("demo.toml");
    std::fs::write(&cfg, text).unwrap();
    cfg
}
