//! With the `cuda` feature: every `src/*.cu` to PTX with nvcc (`$CUDA_ROOT/bin/nvcc` or the one on
//! `PATH`) for `compute_$CUDA_COMPUTE_CAP` (default 90: H100/H200), as candle's kernels are built.
//! Without it: nothing (the crate is then empty), so CPU builds never need CUDA.

use std::path::PathBuf;
use std::process::Command;

/// The `src/*.cu` files, each compiled to `$OUT_DIR/<name>.ptx`.
const KERNELS: &[&str] = &["kv_write", "paged_decode"];

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-changed=src");
    println!("cargo::rerun-if-env-changed=CUDA_COMPUTE_CAP");
    println!("cargo::rerun-if-env-changed=CUDA_ROOT");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    let cap = std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "90".into());
    let nvcc = std::env::var_os("CUDA_ROOT")
        .map(|r| PathBuf::from(r).join("bin/nvcc"))
        .filter(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("nvcc"));
    for name in KERNELS {
        let src = format!("src/{name}.cu");
        let ptx = out.join(format!("{name}.ptx"));
        let status = Command::new(&nvcc)
            .args([
                "--ptx",
                "-O3",
                "-std=c++17",
                &format!("-arch=compute_{cap}"),
            ])
            .arg(&src)
            .arg("-o")
            .arg(&ptx)
            .status()
            .unwrap_or_else(|e| {
                panic!(
                    "mtrl-kernels: cannot run {} ({e}); the cuda feature needs nvcc \
                     (scripts/setup-cuda.sh, then . ~/.cache/mtrl/cu13/env.sh)",
                    nvcc.display()
                )
            });
        assert!(status.success(), "mtrl-kernels: nvcc failed on {src}");
    }
}
