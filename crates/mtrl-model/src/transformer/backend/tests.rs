//! The candle backend's training view with mtrl's fused RMSNorm and SwiGLU (on CUDA the kernels;
//! here their CPU twins, forced) against its spelled ops: the same log-probs, loss and parameter
//! gradients, with and without activation checkpointing (which replays each layer's forward in
//! the backward, so every op's backward runs on a forward of its own).

use std::collections::BTreeMap;

use candle_core::{DType, Device, Tensor};

use crate::policy::Policy;

/// The tiny Qwen3 fixture (the golden tests' model) in `dtype`.
fn policy(dtype: DType) -> Policy {
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/tiny-qwen3"
    );
    Policy::load(std::path::Path::new(dir), dtype, &Device::Cpu).unwrap()
}

/// `(log-probs, loss, gradients by name)` of Σ w·logp over two right-padded rows.
fn run(p: &Policy) -> (Vec<f32>, f32, BTreeMap<String, Vec<f32>>) {
    let dev = Device::Cpu;
    let (b, t) = (2usize, 9usize);
    let ids: Vec<u32> = (0..b * t).map(|i| (i as u32 * 37 + 5) % 900).collect();
    let mut att = vec![1u32; b * t];
    att[t + 6..].fill(0);
    let w: Vec<f32> = (0..b * (t - 1))
        .map(|i| 0.25 + (i % 5) as f32 * 0.1)
        .collect();
    let ids = Tensor::from_vec(ids, (b, t), &dev).unwrap();
    let att = Tensor::from_vec(att, (b, t), &dev).unwrap();
    let w = Tensor::from_vec(w, (b, t - 1), &dev).unwrap();
    let fwd = crate::token_logprobs(p, &ids, Some(&att), 1.0, true, 1 << 20).unwrap();
    let (loss, grads) = fwd
        .loss_and_grads(|lp| (lp.to_dtype(DType::F32)? * &w)?.sum_all())
        .unwrap();
    let lp = fwd
        .logprobs
        .to_dtype(DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    let g = p
        .named_parameters()
        .iter()
        .filter_map(|(n, v)| {
            let g = grads.get(v)?.to_dtype(DType::F32).ok()?;
            Some((n.clone(), g.flatten_all().ok()?.to_vec1().ok()?))
        })
        .collect();
    (lp, loss.to_scalar::<f32>().unwrap(), g)
}

fn gap(a: &[f32], b: &[f32]) -> f32 {
    let scale = b.iter().fold(1e-30f32, |m, x| m.max(x.abs()));
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

/// f64: the fused ops equal the spelled ones to the spelling's own f32 norm arithmetic. bf16:
/// each rounds differently (the spelling its chain of bf16 and f32 ops, the fused ops once from
/// f32), so both are held to the f64 model and the fused ops must be no further from it.
#[test]
fn fused_norm_and_swiglu_give_the_spelled_gradients() {
    let truth = run(&policy(DType::F64));
    for dtype in [DType::F64, DType::BF16] {
        let mut p = policy(dtype);
        for checkpointing in [false, true] {
            p.set_activation_checkpointing(checkpointing);
            let spelled = run(&p);
            let fused = {
                let _twins = super::force_fused_twins();
                run(&p)
            };
            let what = format!("{dtype:?} checkpointing {checkpointing}");
            assert_eq!(
                fused.2.keys().collect::<Vec<_>>(),
                spelled.2.keys().collect::<Vec<_>>()
            );
            assert!(fused.2.keys().any(|k| k.contains("q_norm")));
            let mut pairs = vec![("log-probs".to_string(), &fused.0, &spelled.0, &truth.0)];
            for (name, g) in &spelled.2 {
                pairs.push((name.clone(), &fused.2[name], g, &truth.2[name]));
            }
            for (name, f, s, t) in pairs {
                if dtype == DType::F64 {
                    let e = gap(f, s);
                    assert!(e < 1e-6, "{what}: {name} differs by {e}");
                } else {
                    let (ef, es) = (gap(f, t), gap(s, t));
                    assert!(
                        ef <= 1.5 * es + 1e-3,
                        "{what}: {name}: fused {ef} from the f64 model, spelled {es}"
                    );
                }
            }
        }
    }
}
