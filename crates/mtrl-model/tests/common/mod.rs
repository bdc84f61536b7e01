//! Shared helpers for the crate tests: fixture paths, golden tensors, comparisons, devices.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::PathBuf;

use candle_core::{DType, Device, Tensor};
use mtrl_model::{GenerationRequest, SamplingParams};

pub fn fixtures() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures"))
}

pub fn model_dir(kind: &str) -> PathBuf {
    fixtures().join(format!("tiny-{kind}"))
}

pub fn golden(kind: &str) -> (HashMap<String, Tensor>, serde_json::Value) {
    let dir = fixtures().join("golden").join(format!("tiny-{kind}"));
    let t = candle_core::safetensors::load(dir.join("golden.safetensors"), &Device::Cpu).unwrap();
    let j =
        serde_json::from_str(&std::fs::read_to_string(dir.join("golden.json")).unwrap()).unwrap();
    (t, j)
}

/// Max |a - b| over entries where `mask` (same shape, or None) is nonzero.
pub fn max_abs_diff(a: &Tensor, b: &Tensor, mask: Option<&Tensor>) -> f32 {
    let a = a
        .to_device(&Device::Cpu)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap();
    let b = b
        .to_device(&Device::Cpu)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap();
    assert_eq!(a.dims(), b.dims(), "shape mismatch");
    let a = a.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let b = b.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let m: Vec<f32> = match mask {
        Some(m) => m
            .to_dtype(DType::F32)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap(),
        None => vec![1.0; a.len()],
    };
    a.iter()
        .zip(&b)
        .zip(&m)
        .filter(|(_, m)| **m != 0.0)
        .map(|((x, y), _)| (x - y).abs())
        .fold(0.0, f32::max)
}

pub fn ids_vec(t: &Tensor) -> Vec<u32> {
    t.to_dtype(DType::U32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

/// Devices to run every `case` on: cpu, and cuda:0 with the `cuda` feature.
pub fn devices() -> Vec<Device> {
    #[allow(unused_mut)]
    let mut d = vec![Device::Cpu];
    #[cfg(feature = "cuda")]
    d.push(Device::new_cuda(0).expect("cuda feature enabled but no cuda device"));
    d
}

/// A greedy request for `n` new tokens after `prompt`: no stops, no session.
pub fn greedy_request(prompt: Vec<u32>, n: usize) -> GenerationRequest {
    GenerationRequest {
        prompt,
        sampling: SamplingParams::greedy(),
        max_new_tokens: n,
        stop_token_ids: vec![],
        stop_strings: vec![],
        session: None,
    }
}

/// Tolerance of an engine log-prob against the learner's in `dtype` (the engine's paged forward
/// and the learner's padded one round differently; in bf16 they agree within 2e-4 on the tiny
/// fixtures, the bound leaves 5× margin).
pub fn logprob_tol(dtype: DType) -> f32 {
    match dtype {
        DType::F64 => 1e-5,
        DType::BF16 | DType::F16 => 1e-3,
        _ => 1e-4,
    }
}

/// One `#[test]` per kernel set for each scenario `fn name(dtype: DType)`: `cpu_f32` runs the
/// CPU f32 kernels (`cpu::CpuF32`); `candle_f64` and `candle_bf16` run candle's ops, the backend
/// CUDA runs (one ragged pass per engine step, the device sampler), here on the CPU.
#[macro_export]
macro_rules! per_kernels {
    ($($f:ident),* $(,)?) => {
        $(
            mod $f {
                #[test]
                fn cpu_f32() {
                    super::$f(candle_core::DType::F32)
                }
                #[test]
                fn candle_f64() {
                    super::$f(candle_core::DType::F64)
                }
                #[test]
                fn candle_bf16() {
                    super::$f(candle_core::DType::BF16)
                }
            }
        )*
    };
}

/// The learner's log-probs (inference view, temperature `t`) of each of `tokens` after `prompt`:
/// what the engine reports for a completion, computed the learner's way.
pub fn learner_logprobs(
    p: &mtrl_model::Policy,
    prompt: &[u32],
    tokens: &[u32],
    t: f64,
) -> Vec<f32> {
    let full: Vec<u32> = prompt.iter().chain(tokens).copied().collect();
    let ids = Tensor::from_slice(&full, (1, full.len()), p.device()).unwrap();
    let lp = mtrl_model::token_logprobs(p, &ids, None, t, false, 1 << 20).unwrap();
    let lp: Vec<f32> = lp
        .logprobs
        .squeeze(0)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .to_vec1()
        .unwrap();
    lp[prompt.len() - 1..].to_vec()
}
