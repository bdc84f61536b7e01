//! The twin against candle's spelling and its autograd, the kernels (under the CUDA emulation)
//! against the twin, and the errors.

use candle_core::{DType, Device, Tensor, Var, WithDType};

use super::{swiglu, twin};

fn vals(k: usize, s: f32, o: f32) -> Vec<f32> {
    (0..k)
        .map(|i| (((i * 7919 + 13) % 1009) as f32 / 1009.0 - 0.5) * s + o)
        .collect()
}

/// `(y, dg, du)` of `f`, the gradients of Σ c·y, on `[3, 70]` inputs.
fn run(f: impl Fn(&Tensor, &Tensor) -> Tensor, dtype: DType) -> (Tensor, Tensor, Tensor) {
    let dev = Device::Cpu;
    let t = |v: Vec<f32>| {
        Tensor::from_vec(v, (3, 70), &dev)
            .unwrap()
            .to_dtype(dtype)
            .unwrap()
    };
    let g = Var::from_tensor(&t(vals(210, 12.0, 0.0))).unwrap();
    let u = Var::from_tensor(&t(vals(210, 3.0, 0.2))).unwrap();
    let c = Tensor::from_vec(vals(210, 2.0, 0.1), (3, 70), &dev).unwrap();
    let y = f(g.as_tensor(), u.as_tensor());
    let loss = (y.to_dtype(DType::F32).unwrap() * c)
        .unwrap()
        .sum_all()
        .unwrap();
    let grads = loss.backward().unwrap();
    (
        y,
        grads.get(g.as_tensor()).unwrap().clone(),
        grads.get(u.as_tensor()).unwrap().clone(),
    )
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

/// The op (its twin on the CPU) against `g.silu() · u` and candle's autograd of it, in f64 and
/// f32 to rounding and in bf16 to its ulp (the spelling rounds silu(g) before the product).
#[test]
fn twin_equals_the_spelling_and_its_autograd() {
    for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-5), (DType::BF16, 2e-2)] {
        let want = run(|g, u| (g.silu().unwrap() * u).unwrap(), dtype);
        let got = run(|g, u| swiglu(g, u).unwrap(), dtype);
        for (what, a, b) in [
            ("y", &got.0, &want.0),
            ("dg", &got.1, &want.1),
            ("du", &got.2, &want.2),
        ] {
            let e = max_rel(a, b);
            assert!(e < tol, "{dtype:?} {what}: {e}");
        }
    }
}

/// The kernels' source, run under the emulation, against the twin: more elements than one block
/// and not a multiple of it, in f32, bf16 and f16.
#[test]
fn kernels_under_emulation_equal_the_twin() {
    fn check<T: WithDType>(sfx: &str, tol: f64) {
        let n = 1000;
        let conv = |v: Vec<f32>| {
            v.into_iter()
                .map(|x| T::from_f64(x as f64))
                .collect::<Vec<T>>()
        };
        let (g, u, dy) = (
            conv(vals(n, 12.0, 0.0)),
            conv(vals(n, 3.0, 0.2)),
            conv(vals(n, 2.0, 0.1)),
        );
        let (want_y, want_b) = (twin::forward(&g, &u), twin::backward(&g, &u, &dy));
        let (mut y, mut b) = (vec![T::zero(); n], vec![T::zero(); 2 * n]);
        let geo = mtrl_kernels::swiglu_geometry(n).unwrap();
        // SAFETY: the arguments follow `swiglu.cu`'s signatures; g, u, dy, y hold n elements,
        // the backward's output 2n.
        unsafe {
            mtrl_kernels::emu::Launch::new(&format!("swiglu_fwd_{sfx}"))
                .slice(&g)
                .slice(&u)
                .slice_mut(&mut y)
                .u32(n as u32)
                .run(geo)
                .unwrap();
            mtrl_kernels::emu::Launch::new(&format!("swiglu_bwd_{sfx}"))
                .slice(&g)
                .slice(&u)
                .slice(&dy)
                .slice_mut(&mut b)
                .u32(n as u32)
                .run(geo)
                .unwrap();
        }
        let rel = |a: &[T], b: &[T]| {
            let scale = b.iter().fold(1e-30f64, |m, x| m.max(x.to_f64().abs()));
            a.iter()
                .zip(b)
                .fold(0f64, |m, (x, y)| m.max((x.to_f64() - y.to_f64()).abs()))
                / scale
        };
        let (ey, eb) = (rel(&y, &want_y), rel(&b, &want_b));
        assert!(ey < tol && eb < tol, "{sfx}: y {ey}, backward {eb}");
    }
    check::<f32>("f32", 1e-5);
    check::<half::bf16>("bf16", 1e-2);
    check::<half::f16>("f16", 2e-3);
}

#[test]
fn operands_that_differ_are_an_error() {
    let dev = Device::Cpu;
    let g = Tensor::zeros((3, 8), DType::F32, &dev).unwrap();
    let u = Tensor::zeros((3, 7), DType::F32, &dev).unwrap();
    let e = swiglu(&g, &u).unwrap_err().to_string();
    assert!(e.contains("swiglu"), "{e}");
}
