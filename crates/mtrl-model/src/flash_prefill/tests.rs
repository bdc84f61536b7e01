//! The twin against the candle spelling, and the errors.

use candle_core::{DType, Device, Tensor};

use super::{attend, PrefixRows};

/// See [`super::check_against_gathered`]: f32, f64 and bf16 (outputs of magnitude ≤ 1; a wrong
/// row, head or causal limit is off by O(1)).
#[test]
fn twin_equals_the_gathered_spelling() {
    for (dtype, tol) in [(DType::F32, 1e-5), (DType::F64, 1e-5), (DType::BF16, 5e-2)] {
        let diff = super::check_against_gathered(&Device::Cpu, dtype).unwrap();
        assert!(diff < tol, "{dtype:?}: twin vs candle spelling {diff}");
    }
}

#[test]
fn rows_that_do_not_fit_are_an_error() {
    let dev = Device::Cpu;
    let q = Tensor::zeros((3, 4, 8), DType::F32, &dev).unwrap();
    let k = Tensor::zeros((5, 2, 8), DType::F32, &dev).unwrap();
    // More queries than keys in a row.
    let rows = PrefixRows::new(&[(3, 2), (0, 3)], &dev).unwrap();
    let e = attend(&q, &k, &k, &rows).unwrap_err().to_string();
    assert!(e.contains("do not fit"), "{e}");
    // Rows that do not cover the keys.
    let rows = PrefixRows::new(&[(3, 4)], &dev).unwrap();
    let e = attend(&q, &k, &k, &rows).unwrap_err().to_string();
    assert!(e.contains("do not fit"), "{e}");
    // Heads not a multiple of the KV heads.
    let k3 = Tensor::zeros((5, 3, 8), DType::F32, &dev).unwrap();
    let rows = PrefixRows::new(&[(3, 5)], &dev).unwrap();
    let e = attend(&q, &k3, &k3, &rows).unwrap_err().to_string();
    assert!(e.contains("prefill attention"), "{e}");
}
