//! Shared by the CLI end-to-end tests: run the real `mtrl` binary, locate the repository.

#![allow(dead_code)]

use std::path::PathBuf;
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
