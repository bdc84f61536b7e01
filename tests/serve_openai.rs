//! The official `openai` Python client against `mtrl serve` on the tiny Qwen3 fixture (the
//! checks are in tests/python/openai_client.py): chat with tools, logprobs, streaming, text
//! completions, `/sample`, errors, and a captured trajectory read back; and the flags that let
//! `mtrl serve` listen beyond loopback.

mod common;

use std::process::Command;

#[test]
fn the_openai_client_talks_to_mtrl_serve() {
    let fixture = common::repo().join("tests/fixtures/tiny-qwen3");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mtrl"));
    cmd.args([
        "serve",
        "--model",
        fixture.to_str().unwrap(),
        "--addr",
        "127.0.0.1:0",
        "--token",
        "sesame",
    ]);
    let (_server, url) = common::start_server(cmd);
    let out = Command::new(common::agent_python())
        .arg(common::repo().join("tests/python/openai_client.py"))
        .args([&url, "sesame"])
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    let figures: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(figures["model"], "tiny-qwen3");
}

/// `--addr` beyond loopback needs `--allow-remote` and a token; refused before anything binds
/// (the model is not even loaded).
#[test]
fn a_remote_addr_needs_allow_remote_and_a_token() {
    let fixture = common::repo().join("tests/fixtures/tiny-qwen3");
    let serve = |extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_mtrl"))
            .args(["serve", "--model", fixture.to_str().unwrap()])
            .args(extra)
            .env_remove("MTRL_SERVE_TOKEN")
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    let e = serve(&["--addr", "0.0.0.0:0"]);
    assert!(
        e.contains("not a loopback address") && e.contains("--allow-remote"),
        "{e}"
    );
    let e = serve(&["--addr", "0.0.0.0:0", "--allow-remote"]);
    assert!(e.contains("--allow-remote needs --token"), "{e}");
}
