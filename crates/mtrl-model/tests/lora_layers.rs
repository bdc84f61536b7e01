//! An adapter on some decoder layers only (PEFT's `layers_to_transform`), and log-probs computed
//! at the loss positions only (`token_logprobs_at`): the same numbers as the full computation,
//! trainable weights and gradients only where they should be, PEFT's files round-tripped, a layer
//! the model lacks refused by name.

mod common;

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};
use common::*;
use mtrl_model::lora::{self, LoraSpec};
use mtrl_model::{logprobs_and_grads, logprobs_and_grads_at, token_logprobs, Policy};

fn spec(layers: Option<Vec<usize>>) -> LoraSpec {
    LoraSpec {
        rank: 4,
        alpha: 8.0,
        targets: lora::TARGETS.map(String::from).to_vec(),
        dropout: 0.0,
        rslora: false,
        layers,
    }
}

fn base() -> Policy {
    Policy::load(&model_dir("qwen2"), DType::F32, &Device::Cpu).unwrap()
}

/// Seeded adapter tensors with a non-zero `B`, so the adapter changes the output.
fn tensors(s: &LoraSpec, seed: u64) -> HashMap<String, Tensor> {
    let p = base();
    let mut t = lora::init(p.config(), s, seed, DType::F32, &Device::Cpu).unwrap();
    let mut rng = mtrl_core::rng::SplitMix64(seed);
    for (k, v) in t.iter_mut() {
        if k.contains("lora_B") {
            let n = v.elem_count();
            let vals: Vec<f32> = (0..n)
                .map(|_| (rng.next_f64() as f32 - 0.5) * 0.2)
                .collect();
            *v = Tensor::from_vec(vals, v.dims(), &Device::Cpu).unwrap();
        }
    }
    t
}

fn ids() -> Tensor {
    let v: Vec<u32> = (0..24).map(|i| (i * 37 + 5) % 2000).collect();
    Tensor::from_vec(v, (2, 12), &Device::Cpu).unwrap()
}

#[test]
fn an_adapter_on_one_layer_is_a_full_adapter_with_the_others_zero() {
    let one = spec(Some(vec![1]));
    let t1 = tensors(&one, 3);
    assert!(
        t1.keys().all(|k| k.contains("layers.1.")),
        "{:?}",
        t1.keys()
    );
    // The same layer-1 tensors in an adapter on every layer whose layer 0 has B = 0.
    let all = spec(None);
    let mut tall = lora::init(base().config(), &all, 9, DType::F32, &Device::Cpu).unwrap();
    for (k, v) in &t1 {
        tall.insert(k.clone(), v.clone());
    }
    let p1 = base().with_lora(one, Some(t1), 0).unwrap();
    let pall = base().with_lora(all, Some(tall), 0).unwrap();
    let (a, b) = (
        token_logprobs(&p1, &ids(), None, 1.0, true, 1000).unwrap(),
        token_logprobs(&pall, &ids(), None, 1.0, true, 1000).unwrap(),
    );
    let d = max_abs_diff(&a.logprobs, &b.logprobs, None);
    // A zero B adds exact zeros, but the packed kernels group the sums differently.
    assert!(d < 1e-4, "logprobs differ by {d}");
    let plain = token_logprobs(&base(), &ids(), None, 1.0, false, 1000).unwrap();
    assert!(
        max_abs_diff(&a.logprobs, &plain.logprobs, None) > 1e-4,
        "the adapter changed nothing"
    );
    // Only layer 1's pairs train, and each gets its gradient.
    assert_eq!(p1.named_parameters().len(), 14);
    let (_, _, g) = logprobs_and_grads(&p1, &ids(), None, 1.0, |lp| lp.mean_all()?.neg()).unwrap();
    for (name, v) in p1.named_parameters() {
        assert!(name.contains("layers.1."), "{name}");
        let n: f32 = g
            .get(v.as_tensor())
            .unwrap_or_else(|| panic!("no gradient for {name}"))
            .abs()
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar()
            .unwrap();
        assert!(n > 0.0, "{name}: zero gradient");
    }
}

#[test]
fn peft_files_keep_the_layers() {
    let one = spec(Some(vec![1]));
    let p = base()
        .with_lora(one.clone(), Some(tensors(&one, 4)), 0)
        .unwrap();
    let d = tempfile::tempdir().unwrap();
    p.save(d.path(), DType::F32).unwrap();
    let cfg: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(d.path().join("adapter_config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(cfg["layers_to_transform"], serde_json::json!([1]));
    let back = base().load_adapter(d.path()).unwrap();
    assert_eq!(back.lora(), Some(&one));
    let (a, b) = (
        token_logprobs(&p, &ids(), None, 1.0, false, 1000).unwrap(),
        token_logprobs(&back, &ids(), None, 1.0, false, 1000).unwrap(),
    );
    assert_eq!(max_abs_diff(&a.logprobs, &b.logprobs, None), 0.0);
    // PEFT also writes a single index; a layer the model lacks is refused by name.
    let mut c = cfg.clone();
    c["layers_to_transform"] = serde_json::json!(1);
    std::fs::write(d.path().join("adapter_config.json"), c.to_string()).unwrap();
    assert_eq!(base().load_adapter(d.path()).unwrap().lora(), Some(&one));
    c["layers_to_transform"] = serde_json::json!([1, 7]);
    std::fs::write(d.path().join("adapter_config.json"), c.to_string()).unwrap();
    let e = base().load_adapter(d.path()).unwrap_err().to_string();
    assert!(
        e.contains("layers_to_transform") && e.contains("layer 7"),
        "{e}"
    );
    let e = base()
        .with_lora(spec(Some(vec![2])), None, 0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("layers_to_transform") && e.contains("2"), "{e}");
}

#[test]
fn logprobs_at_the_loss_positions_equal_the_full_computation() {
    let s = spec(None);
    let p = base()
        .with_lora(s.clone(), Some(tensors(&s, 5)), 0)
        .unwrap();
    let ids = ids();
    // The loss reads positions 4..9 of row 0 and 7..11 of row 1.
    let mut need = vec![0f32; 2 * 11];
    need[4..9].fill(1.0);
    need[11 + 7..22].fill(1.0);
    let need = Tensor::from_vec(need, (2, 11), &Device::Cpu).unwrap();
    let loss = |lp: &Tensor| lp.mul(&need)?.sum_all()?.neg();
    let (la, fa, ga) = logprobs_and_grads(&p, &ids, None, 0.7, loss).unwrap();
    let (lb, fb, gb) = logprobs_and_grads_at(&p, &ids, None, Some(&need), 0.7, loss).unwrap();
    assert!((la - lb).abs() < 1e-5, "{la} vs {lb}");
    assert!(max_abs_diff(&fa.logprobs, &fb.logprobs, Some(&need)) < 1e-6);
    assert_eq!(
        max_abs_diff(&fb.valid_mask, &need, None),
        0.0,
        "valid only where needed"
    );
    for (name, v) in p.named_parameters() {
        let d = max_abs_diff(
            ga.get(v.as_tensor()).unwrap(),
            gb.get(v.as_tensor()).unwrap(),
            None,
        );
        assert!(d < 1e-6, "{name}: gradients differ by {d}");
    }
    let bad = Tensor::zeros((2, 12), DType::F32, &Device::Cpu).unwrap();
    let e = logprobs_and_grads_at(&p, &ids, None, Some(&bad), 1.0, loss)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("[2, 11]"), "{e}");
}
