//! One clipped AdamW step on the LoRA adapter of the tiny fixtures reproduces PEFT + PyTorch's
//! `lora_after` and `logprobs_after_step` (tests/fixtures/lora, tolerances from its README), with
//! this crate's clipping and optimizer over the policy's trainable parameters, which are the 28
//! adapter tensors and nothing else. Also: the optimizer state is the adapter's only.

mod common;

use std::collections::{BTreeMap, HashMap};

use candle_core::{DType, Device, Tensor};
use common::{fixtures, max_diff};
use mtrl_learner::{clip_global_norm, AdamW, AdamWConfig};
use mtrl_model::{logprobs_and_grads, token_logprobs, Policy};

fn loss_of(lp: &Tensor, mask: &Tensor, adv: &Tensor) -> candle_core::Result<Tensor> {
    let n = mask.sum_all()?.to_scalar::<f32>()? as f64;
    let a = adv.unsqueeze(1)?.broadcast_as(lp.shape())?;
    ((a * lp)? * mask)?.sum_all()?.neg()? / n
}

fn lora_step(kind: &str) {
    let dev = Device::Cpu;
    let dir = fixtures().join("lora").join(format!("tiny-{kind}"));
    let p = Policy::load(&fixtures().join(format!("tiny-{kind}")), DType::F32, &dev)
        .unwrap()
        .load_adapter(&dir.join("adapter"))
        .unwrap();
    let g: HashMap<String, Tensor> =
        candle_core::safetensors::load(dir.join("golden.safetensors"), &dev).unwrap();
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("golden.json")).unwrap()).unwrap();
    let ts = &meta["train_step"];
    let (ids, am, mask, adv) = (
        &g["train.input_ids"],
        &g["train.attention_mask"],
        &g["train.loss_mask"],
        &g["train.advantages"],
    );
    let (loss, _, grads) =
        logprobs_and_grads(&p, ids, Some(am), 1.0, |lp| loss_of(lp, mask, adv)).unwrap();
    assert!(
        (loss as f64 - ts["loss"].as_f64().unwrap()).abs() < 1e-5,
        "{kind} loss {loss}"
    );
    let mut gmap: BTreeMap<String, Tensor> = BTreeMap::new();
    for (name, var) in p.named_parameters() {
        gmap.insert(name.clone(), grads.get(var.as_tensor()).unwrap().clone());
    }
    assert_eq!(gmap.len(), 28);
    let (norm, coef) = clip_global_norm(&mut gmap, 1.0).unwrap();
    let want = ts["grad_norm_before_clipping"].as_f64().unwrap();
    assert!(
        ((norm - want) / want).abs() < 1e-4,
        "{kind} norm {norm} vs {want}"
    );
    let want = ts["clip_coef"].as_f64().unwrap();
    assert!(
        ((coef - want) / want).abs() < 1e-4,
        "{kind} coef {coef} vs {want}"
    );
    let mut opt = AdamW::new(AdamWConfig {
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.01,
        ..AdamWConfig::default()
    });
    opt.step(p.named_parameters(), &gmap, 1e-2).unwrap();
    for (name, var) in p.named_parameters() {
        let d = max_diff(
            var.as_tensor(),
            &g[&format!("train.lora_after.{name}")],
            None,
        );
        assert!(d < 1e-4, "{kind} lora_after {name}: {d}");
    }
    let lp = token_logprobs(&p, ids, Some(am), 1.0, false, 1 << 20).unwrap();
    let d = max_diff(&lp.logprobs, &g["train.logprobs_after_step"], Some(mask));
    assert!(d < 1e-4, "{kind} logprobs_after_step {d}");
    let after = loss_of(&lp.logprobs, mask, adv)
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    let want = ts["after_step"]["loss"].as_f64().unwrap();
    assert!(
        (after as f64 - want).abs() < 1e-4,
        "{kind} after-step loss {after} vs {want}"
    );
    // The optimizer holds moments for the adapter only: 2 × 16,384 f32 values.
    let out = tempfile::tempdir().unwrap();
    opt.save(out.path()).unwrap();
    let st =
        candle_core::safetensors::load(out.path().join("optimizer.safetensors"), &dev).unwrap();
    let values: usize = st.values().map(|t| t.elem_count()).sum();
    assert_eq!(
        values,
        2 * 16_384,
        "{kind}: optimizer state {values} values"
    );
}

#[test]
fn qwen3_lora_adamw_step() {
    lora_step("qwen3");
}

#[test]
fn qwen2_lora_adamw_step() {
    lora_step("qwen2");
}

/// The same step in bf16 (the candle path CUDA takes, frozen base without weight gradients): the
/// adapter keeps f32 masters, and lands within bf16's precision of PyTorch's f32 step — Adam's first
/// step is about `lr·sign(g)`, so an element whose tiny gradient flips sign in bf16 lands 2·lr away.
#[test]
fn qwen3_lora_adamw_step_in_bf16() {
    let dev = Device::Cpu;
    let dir = fixtures().join("lora/tiny-qwen3");
    let p = Policy::load(&fixtures().join("tiny-qwen3"), DType::BF16, &dev)
        .unwrap()
        .load_adapter(&dir.join("adapter"))
        .unwrap();
    let g: HashMap<String, Tensor> =
        candle_core::safetensors::load(dir.join("golden.safetensors"), &dev).unwrap();
    let (ids, am, mask, adv) = (
        &g["train.input_ids"],
        &g["train.attention_mask"],
        &g["train.loss_mask"],
        &g["train.advantages"],
    );
    let (_, _, grads) = logprobs_and_grads(&p, ids, Some(am), 1.0, |lp| {
        loss_of(&lp.to_dtype(DType::F32)?, mask, adv)
    })
    .unwrap();
    let mut gmap: BTreeMap<String, Tensor> = BTreeMap::new();
    for (name, var) in p.named_parameters() {
        let gr = grads
            .get(var.as_tensor())
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap();
        gmap.insert(name.clone(), gr);
    }
    clip_global_norm(&mut gmap, 1.0).unwrap();
    let mut opt = AdamW::new(AdamWConfig {
        weight_decay: 0.01,
        ..AdamWConfig::default()
    });
    opt.step(p.named_parameters(), &gmap, 1e-2).unwrap();
    let (mut close, mut total) = (0usize, 0usize);
    for name in p.named_parameters().keys() {
        let master = opt
            .master(name)
            .expect("an f32 master for every bf16 adapter tensor");
        assert_eq!(master.dtype(), DType::F32);
        let want = &g[&format!("train.lora_after.{name}")];
        let d = (master - want)
            .unwrap()
            .abs()
            .unwrap()
            .flatten_all()
            .unwrap();
        let d = d.to_vec1::<f32>().unwrap();
        close += d.iter().filter(|x| **x < 2e-3).count();
        total += d.len();
    }
    let frac = close as f64 / total as f64;
    eprintln!("bf16: {close} of {total} adapter elements within 2e-3 of the f32 step");
    assert!(frac > 0.95, "only {frac:.3} of the adapter within 2e-3");
}
