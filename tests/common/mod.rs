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

/// The fetched Qwen2.5-Coder-0.5B-Instruct GGUF (`MTRL_QWEN_GGUF` overrides the place;
/// `scripts/test.sh` fetches it).
pub fn qwen_gguf() -> PathBuf {
    let p = std::env::var_os("MTRL_QWEN_GGUF").map_or_else(
        || repo().join("models/qwen2.5-coder-0.5b-instruct/model.gguf"),
        PathBuf::from,
    );
    assert!(
        p.is_file(),
        "{} is missing: run scripts/fetch-qwen.sh (scripts/test.sh does)",
        p.display()
    );
    p
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

/// Cranfield's train/validation/test task files, prepared by `mtrl data prepare` from a
/// [`cranfield_config`] into `dir/data`; returns the split folder (`dir/data/cran`).
pub fn prepared_cranfield(dir: &Path) -> PathBuf {
    let base = cranfield_config(dir, "cran", "base.toml", "");
    let data = dir.join("data");
    let (ok, _, err) = mtrl(&[
        "data",
        "prepare",
        "--config",
        base.to_str().unwrap(),
        "--out",
        data.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    data.join("cran")
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
    // The indexes (with the real embedder, the slow part to build) are shared by the tests that
    // run the demo config, in cargo's per-target temporary folder; the index manifest rebuilds
    // them when the corpus or settings change.
    let index = Path::new(env!("CARGO_TARGET_TMPDIR")).join("index");
    let mut text = text
        .replace("\"../data/", &format!("\"{}/data/", root.display()))
        .replace("\"../models/", &format!("\"{}/models/", root.display()))
        .replace("\"../runs/index/", &format!("\"{}/", index.display()))
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

/// The Python of the pinned agent venv (`scripts/agent-venv.sh`): `MTRL_AGENT_PYTHON` when set
/// (scripts/test.sh installs the venv and sets it), else the venv if installed; otherwise the
/// test fails saying what to run (tests never reach the network).
pub fn agent_python() -> PathBuf {
    if let Ok(p) = std::env::var("MTRL_AGENT_PYTHON") {
        return PathBuf::from(p);
    }
    let out = Command::new("bash")
        .arg(repo().join("scripts/agent-venv.sh"))
        .arg("--no-install")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the agent venv is not installed: run scripts/agent-venv.sh (or scripts/test.sh)\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// A child process killed when dropped.
pub struct Child(pub std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `cmd` (stdout piped) and waits for its `… listening on http://ADDR` line; returns the
/// child and `http://ADDR`.
pub fn start_server(mut cmd: Command) -> (Child, String) {
    use std::io::BufRead;
    cmd.stdout(std::process::Stdio::piped());
    let mut child = Child(cmd.spawn().unwrap());
    let out = child.0.stdout.take().unwrap();
    let mut lines = std::io::BufReader::new(out).lines();
    loop {
        let line = lines
            .next()
            .unwrap_or_else(|| panic!("the server exited before listening"))
            .unwrap();
        if let Some(i) = line.find("listening on ") {
            let url = line[i + "listening on ".len()..].trim().to_string();
            // Keep draining stdout so the child never blocks on a full pipe.
            std::thread::spawn(move || for _ in lines.by_ref() {});
            return (child, url);
        }
    }
}
