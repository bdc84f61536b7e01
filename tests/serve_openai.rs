//! The official `openai` Python client against `mtrl serve` on the tiny Qwen3 fixture (the
//! checks are in tests/python/openai_client.py): chat with tools, logprobs, streaming, text
//! completions, `/sample`, errors, and a captured trajectory read back.

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
