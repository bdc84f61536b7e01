//! The twin against candle's spelling and its autograd, the kernels (under the CUDA emulation,
//! `mtrl-kernels`' `emu`) against the twin, and the errors.

use candle_core::{DType, Device, Tensor, Var, WithDType, D};

use super::{rms_norm, twin};

/// The spelling the op replaces (the candle backend's training view), computing in f64 for f64
/// (the backend's computes in f32 whatever the dtype).
fn spelled(x: &Tensor, w: &Tensor, eps: f64) -> Tensor {
    let dtype = x.dtype();
    let x = match dtype {
        DType::F64 => x.clone(),
        _ => x.to_dtype(DType::F32).unwrap(),
    };
    let var = x.sqr().unwrap().mean_keepdim(D::Minus1).unwrap();
    let normed = x
        .broadcast_div(&(var + eps).unwrap().sqrt().unwrap())
        .unwrap();
    normed.to_dtype(dtype).unwrap().broadcast_mul(w).unwrap()
}

/// `(y, dx, dw)` of `f` on `[2, 3, d]` inputs, the gradients of Σ c·y.
fn run(f: impl Fn(&Tensor, &Tensor) -> Tensor, dtype: DType, d: usize) -> (Tensor, Tensor, Tensor) {
    let dev = Device::Cpu;
    let n = 6 * d;
    let vals = |k: usize, s: f32, o: f32| -> Vec<f32> {
        (0..k)
            .map(|i| (((i * 7919 + 13) % 1009) as f32 / 1009.0 - 0.5) * s + o)
            .collect()
    };
    let x = Var::from_tensor(
        &Tensor::from_vec(vals(n, 4.0, 0.0), (2, 3, d), &dev)
            .unwrap()
            .to_dtype(dtype)
            .unwrap(),
    )
    .unwrap();
    let w = Var::from_tensor(
        &Tensor::from_vec(vals(d, 1.0, 1.0), d, &dev)
            .unwrap()
            .to_dtype(dtype)
            .unwrap(),
    )
    .unwrap();
    let c = Tensor::from_vec(vals(n, 2.0, 0.1), (2, 3, d), &dev).unwrap();
    let y = f(x.as_tensor(), w.as_tensor());
    let loss = (y.to_dtype(DType::F32).unwrap() * c)
        .unwrap()
        .sum_all()
        .unwrap();
    let g = loss.backward().unwrap();
    let dx = g.get(x.as_tensor()).unwrap().clone();
    let dw = g.get(w.as_tensor()).unwrap().clone();
    (y, dx, dw)
}

fn max_rel(a: &Tensor, b: &Tensor) -> f64 {
    let (a, b) = (
        a.to_dtype(DType::F64).unwrap(),
        b.to_dtype(DType::F64).unwrap(),
    );
    let scale = b
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f64>()
        .unwrap();
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f64>()
        .unwrap()
        / scale.max(1e-30)
}

/// The op (its twin on the CPU) against the spelling and candle's autograd of it: `y`, `dx`,
/// `dw` in f64 and f32 to rounding, in bf16 to its ulp (both round `x · rstd` and the product
/// to bf16; the gradients differ in where they round: the spelling's chain in bf16 and f32, the
/// op in f64 then once).
#[test]
fn twin_equals_the_spelling_and_its_autograd() {
    for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-5), (DType::BF16, 2e-2)] {
        for d in [8usize, 40, 128] {
            let want = run(|x, w| spelled(x, w, 1e-6), dtype, d);
            let got = run(|x, w| rms_norm(x, w, 1e-6).unwrap(), dtype, d);
            for (what, a, b) in [
                ("y", &got.0, &want.0),
                ("dx", &got.1, &want.1),
                ("dw", &got.2, &want.2),
            ] {
                assert_eq!(a.dims(), b.dims());
                let e = max_rel(a, b);
                assert!(e < tol, "{dtype:?} d {d} {what}: {e}");
            }
        }
    }
}

/// The three kernels' source, run under the emulation, against the twin: rows shorter than a
/// warp, of a block's width and longer (the threads stride), more rows than the `dw` row groups,
/// in f32, bf16 and f16.
#[test]
fn kernels_under_emulation_equal_the_twin() {
    fn check<T: WithDType>(sfx: &str, n: usize, d: usize) {
        let vals = |k: usize, s: f32, o: f32| -> Vec<T> {
            (0..k)
                .map(|i| {
                    T::from_f64(((((i * 7919 + 13) % 1009) as f32 / 1009.0 - 0.5) * s + o) as f64)
                })
                .collect()
        };
        let (x, w, dy) = (
            vals(n * d, 4.0, 0.0),
            vals(d, 1.0, 1.0),
            vals(n * d, 2.0, 0.1),
        );
        let eps = 1e-6f32;
        let (want_y, want_rstd) = twin::forward(&x, &w, d, eps);
        let want_dx = twin::dx(&x, &w, &dy, &want_rstd, d);
        let (geo_dw, groups) = mtrl_kernels::rms_norm_dw_geometry(n, d).unwrap();
        let want_dw = twin::dw(&x, &dy, &want_rstd, d, groups);
        let rows = mtrl_kernels::rms_norm_rows_geometry(n, d).unwrap();
        let (mut y, mut rstd) = (vec![T::zero(); n * d], vec![0f32; n]);
        let rstd32: Vec<f32> = want_rstd.iter().map(|&r| r as f32).collect();
        let (mut dx, mut partial) = (vec![T::zero(); n * d], vec![0f32; groups * d]);
        // SAFETY (all three): the arguments follow `rms_norm.cu`'s signatures; x, y, dy, dx hold
        // n · d elements, w d, rstd n, partial groups · d (the geometry's grid y).
        unsafe {
            mtrl_kernels::emu::Launch::new(&format!("rms_norm_fwd_{sfx}"))
                .slice(&x)
                .slice(&w)
                .slice_mut(&mut y)
                .slice_mut(&mut rstd)
                .u32(d as u32)
                .f32(eps)
                .run(rows)
                .unwrap();
            mtrl_kernels::emu::Launch::new(&format!("rms_norm_bwd_dx_{sfx}"))
                .slice(&x)
                .slice(&w)
                .slice(&dy)
                .slice(&rstd32)
                .slice_mut(&mut dx)
                .u32(d as u32)
                .run(rows)
                .unwrap();
            mtrl_kernels::emu::Launch::new(&format!("rms_norm_bwd_dw_{sfx}"))
                .slice(&x)
                .slice(&dy)
                .slice(&rstd32)
                .slice_mut(&mut partial)
                .u32(n as u32)
                .u32(d as u32)
                .run(geo_dw)
                .unwrap();
        }
        let rel = |a: &[f64], b: &[f64]| {
            let scale = b.iter().fold(1e-30f64, |m, x| m.max(x.abs()));
            a.iter().zip(b).fold(0f64, |m, (x, y)| m.max((x - y).abs())) / scale
        };
        let v = |s: &[T]| s.iter().map(|x| x.to_f64()).collect::<Vec<_>>();
        let v32 = |s: &[f32]| s.iter().map(|&x| x as f64).collect::<Vec<_>>();
        // The kernel computes in f32, the twin in f64: outputs agree to an ulp of the dtype.
        let tol = match sfx {
            "f32" => 1e-5,
            "f16" => 2e-3,
            _ => 1e-2,
        };
        for (what, e) in [
            ("y", rel(&v(&y), &v(&want_y))),
            ("rstd", rel(&v32(&rstd), &want_rstd)),
            ("dx", rel(&v(&dx), &v(&want_dx))),
            ("dw", rel(&v32(&partial), &want_dw)),
        ] {
            assert!(e < tol, "{sfx} n {n} d {d} {what}: {e}");
        }
    }
    for (n, d) in [(5usize, 8usize), (7, 40), (600, 128), (3, 1024)] {
        check::<f32>("f32", n, d);
        check::<half::bf16>("bf16", n, d);
        check::<half::f16>("f16", n, d);
    }
}

#[test]
fn a_weight_that_does_not_match_is_an_error() {
    let dev = Device::Cpu;
    let x = Tensor::zeros((3, 8), DType::F32, &dev).unwrap();
    let w = Tensor::ones(7, DType::F32, &dev).unwrap();
    let e = rms_norm(&x, &w, 1e-6).unwrap_err().to_string();
    assert!(e.contains("rms norm"), "{e}");
}
