//! Shared by the learner's golden tests: the fixture folder and the masked max difference.
#![allow(dead_code)]

use std::path::PathBuf;

use candle_core::{DType, Tensor};

pub fn fixtures() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures"))
}

/// Max |a - b| (as f32), over the entries where `mask` is nonzero when given.
pub fn max_diff(a: &Tensor, b: &Tensor, mask: Option<&Tensor>) -> f32 {
    let d = (a.to_dtype(DType::F32).unwrap() - b.to_dtype(DType::F32).unwrap())
        .unwrap()
        .abs()
        .unwrap();
    let d = match mask {
        Some(m) => d.mul(&m.to_dtype(DType::F32).unwrap()).unwrap(),
        None => d,
    };
    d.flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}
