//! With the `cuda` feature: every `src/*.cu` to PTX with nvcc (`$CUDA_ROOT/bin/nvcc` or the one on
//! `PATH`) for `compute_$CUDA_COMPUTE_CAP` (default 90: H100/H200), as candle's kernels are built.
//! With `flash-attn` as well: FlashAttention-2's varlen causal forward and backward (bf16, head
//! dims 64 and 128) from the flash-attn sources `scripts/setup-cuda.sh` unpacks
//! (`$MTRL_FLASH_ATTN_SRC`), with `flash/api.cu`, into a static library (SASS for
//! `sm_$CUDA_COMPUTE_CAP`). Each object is kept under `$MTRL_KERNEL_CACHE_DIR` (default: the
//! build's `OUT_DIR`) by a hash of its inputs, so a rebuild after `cargo clean` or in another
//! target dir reuses it. With `emu`: the same `src/*.cu` as host C++ under `emu/include/cuda_emu.h`
//! (the CUDA subset they use, on host threads) into a static library, so tests run the kernels
//! on a CPU. Without `cuda` or `emu`: nothing (the crate is then empty), so CPU builds never need
//! CUDA.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The `src/*.cu` files, each compiled to `$OUT_DIR/<name>.ptx`.
const KERNELS: &[&str] = &[
    "kv_write",
    "paged_attention",
    "logprob_head",
    "rms_norm",
    "swiglu",
];

/// The FlashAttention-2 translation units taken (under `csrc/flash_attn/src`).
const FLASH_UNITS: &[&str] = &[
    "flash_fwd_hdim64_bf16_causal_sm80.cu",
    "flash_fwd_hdim128_bf16_causal_sm80.cu",
    "flash_bwd_hdim64_bf16_causal_sm80.cu",
    "flash_bwd_hdim128_bf16_causal_sm80.cu",
];

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-changed=src");
    println!("cargo::rerun-if-changed=flash");
    for v in [
        "CUDA_COMPUTE_CAP",
        "CUDA_ROOT",
        "MTRL_FLASH_ATTN_SRC",
        "MTRL_KERNEL_CACHE_DIR",
        "MTRL_NVCC_JOBS",
    ] {
        println!("cargo::rerun-if-env-changed={v}");
    }
    if std::env::var_os("CARGO_FEATURE_EMU").is_some() {
        emu();
    }
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    let cap = std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "90".into());
    let cuda_root = std::env::var_os("CUDA_ROOT").map(PathBuf::from);
    let nvcc = cuda_root
        .as_ref()
        .map(|r| r.join("bin/nvcc"))
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
            .unwrap_or_else(|e| no_nvcc(&nvcc, &e));
        assert!(status.success(), "mtrl-kernels: nvcc failed on {src}");
    }
    if std::env::var_os("CARGO_FEATURE_FLASH_ATTN").is_some() {
        flash(&nvcc, cuda_root.as_deref(), &cap, &out);
    }
}

/// The kernels under the CUDA emulation: one unit per kernel file (`emu/<name>.cpp` includes
/// `src/<name>.cu`) and the launcher, as `libmtrl_kernels_emu.a`.
fn emu() {
    println!("cargo::rerun-if-changed=emu");
    let mut b = cc::Build::new();
    b.cpp(true)
        .std("c++17")
        .opt_level(2)
        .include("emu/include")
        .flag_if_supported("-pthread")
        .flag_if_supported("-Wno-unknown-pragmas");
    for name in KERNELS {
        b.file(format!("emu/{name}.cpp"));
    }
    b.file("emu/runtime.cpp").compile("mtrl_kernels_emu");
    println!("cargo::rustc-link-lib=pthread");
}

fn no_nvcc(nvcc: &Path, e: &std::io::Error) -> ! {
    panic!(
        "mtrl-kernels: cannot run {} ({e}); the cuda feature needs nvcc \
         (scripts/setup-cuda.sh, then . ~/.cache/mtrl/cu13/env.sh)",
        nvcc.display()
    )
}

/// FNV-1a over `bytes`, continuing `h`.
fn fnv(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

/// A hash of every file directly under `dir` with one of `exts` (sorted by name).
fn hash_dir(mut h: u64, dir: &Path, exts: &[&str]) -> u64 {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("mtrl-kernels: cannot read {}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension()
                .and_then(|x| x.to_str())
                .is_some_and(|x| exts.contains(&x))
        })
        .collect();
    files.sort();
    for f in files {
        h = fnv(h, f.file_name().unwrap_or_default().as_encoded_bytes());
        h = fnv(h, &std::fs::read(&f).unwrap_or_default());
    }
    h
}

/// Builds `libmtrl_flash.a` in `out` and tells cargo to link it (see the module docs).
fn flash(nvcc: &Path, cuda_root: Option<&Path>, cap: &str, out: &Path) {
    let Some(src) = std::env::var_os("MTRL_FLASH_ATTN_SRC").map(PathBuf::from) else {
        panic!(
            "mtrl-kernels: the flash-attn feature needs the FlashAttention-2 sources: run \
             scripts/setup-cuda.sh, then . ~/.cache/mtrl/cu13/env.sh (sets MTRL_FLASH_ATTN_SRC)"
        )
    };
    let fa = src.join("csrc/flash_attn/src");
    let cutlass = src.join("csrc/cutlass/include");
    for d in [&fa, &cutlass] {
        assert!(
            d.is_dir(),
            "mtrl-kernels: {} is missing (MTRL_FLASH_ATTN_SRC={}); rerun scripts/setup-cuda.sh",
            d.display(),
            src.display()
        );
    }
    let here = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let shim = here.join("flash/shim");
    let cache = std::env::var_os("MTRL_KERNEL_CACHE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| out.join("flash-obj"));
    std::fs::create_dir_all(&cache)
        .unwrap_or_else(|e| panic!("mtrl-kernels: cannot create {}: {e}", cache.display()));
    let mut flags: Vec<String> = [
        "-O3",
        "-std=c++17",
        "--expt-relaxed-constexpr",
        "--expt-extended-lambda",
        "--use_fast_math",
        "-U__CUDA_NO_HALF_OPERATORS__",
        "-U__CUDA_NO_HALF_CONVERSIONS__",
        "-U__CUDA_NO_BFLOAT16_OPERATORS__",
        "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
        "-U__CUDA_NO_BFLOAT162_OPERATORS__",
        "-U__CUDA_NO_BFLOAT162_CONVERSIONS__",
        "-Xcompiler",
        "-fPIC",
    ]
    .map(String::from)
    .to_vec();
    flags.push(format!("-gencode=arch=compute_{cap},code=sm_{cap}"));
    for inc in [&shim, &fa, &cutlass] {
        flags.push(format!("-I{}", inc.display()));
    }
    // Every header the units may include: a change to any rebuilds them all.
    let mut common = fnv(0xcbf2_9ce4_8422_2325, flags.join(" ").as_bytes());
    common = hash_dir(common, &fa, &["h", "cuh"]);
    for d in [
        "flash/shim/c10/cuda",
        "flash/shim/ATen/cuda",
        "flash/shim/ATen/cuda/detail",
    ] {
        common = hash_dir(common, &here.join(d), &["h", "cuh"]);
    }
    let units: Vec<PathBuf> = FLASH_UNITS
        .iter()
        .map(|u| fa.join(u))
        .chain(std::iter::once(here.join("flash/api.cu")))
        .collect();
    let jobs: Vec<(PathBuf, PathBuf)> = units
        .iter()
        .map(|u| {
            let h = fnv(
                common,
                &std::fs::read(u)
                    .unwrap_or_else(|e| panic!("mtrl-kernels: cannot read {}: {e}", u.display())),
            );
            let stem = u.file_stem().unwrap_or_default().to_string_lossy();
            (u.clone(), cache.join(format!("{stem}-{h:016x}.o")))
        })
        .collect();
    let todo: Vec<&(PathBuf, PathBuf)> = jobs.iter().filter(|(_, o)| !o.exists()).collect();
    // Each unit takes ~2 min and up to ~6 GB in nvcc: as many at once as there are cores, unless
    // MTRL_NVCC_JOBS says fewer.
    let width = std::env::var("MTRL_NVCC_JOBS")
        .ok()
        .and_then(|j| j.parse::<usize>().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    for batch in todo.chunks(width) {
        std::thread::scope(|s| {
            for (unit, obj) in batch {
                let flags = &flags;
                s.spawn(move || {
                    let tmp = obj.with_extension("o.part");
                    let status = Command::new(nvcc)
                        .args(flags)
                        .arg("-c")
                        .arg(unit)
                        .arg("-o")
                        .arg(&tmp)
                        .status()
                        .unwrap_or_else(|e| no_nvcc(nvcc, &e));
                    assert!(
                        status.success(),
                        "mtrl-kernels: nvcc failed on {}",
                        unit.display()
                    );
                    std::fs::rename(&tmp, obj).unwrap_or_else(|e| {
                        panic!("mtrl-kernels: cannot keep {}: {e}", obj.display())
                    });
                });
            }
        });
    }
    let lib = out.join("libmtrl_flash.a");
    let _ = std::fs::remove_file(&lib);
    let status = Command::new("ar")
        .arg("crs")
        .arg(&lib)
        .args(jobs.iter().map(|(_, o)| o))
        .status()
        .unwrap_or_else(|e| panic!("mtrl-kernels: cannot run ar: {e}"));
    assert!(
        status.success(),
        "mtrl-kernels: ar failed on {}",
        lib.display()
    );
    println!("cargo::rustc-link-search=native={}", out.display());
    println!("cargo::rustc-link-lib=static=mtrl_flash");
    // The CUDA runtime linked statically: the GPU machine need not have libcudart on its path.
    // (`lib` in NVIDIA's wheels, `lib64` in a system toolkit such as the CUDA images.)
    if let Some(root) = cuda_root {
        for sub in ["lib", "lib64"] {
            println!(
                "cargo::rustc-link-search=native={}",
                root.join(sub).display()
            );
        }
    }
    println!("cargo::rustc-link-lib=static=cudart_static");
    for l in ["stdc++", "rt", "dl", "pthread"] {
        println!("cargo::rustc-link-lib=dylib={l}");
    }
}
