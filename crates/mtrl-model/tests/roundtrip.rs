//! Save as an HF checkpoint and load back: identical logits, HF names, tokenizer files copied.

mod common;

use candle_core::{DType, Device, Tensor};
use common::*;
use mtrl_model::Policy;

fn case(dev: &Device, kind: &str) {
    let p = Policy::load(&model_dir(kind), DType::F32, dev).unwrap();
    let d = tempfile::tempdir().unwrap();
    p.save(d.path(), DType::F32).unwrap();
    for f in [
        "model.safetensors",
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        assert!(d.path().join(f).exists(), "{f} not written");
    }
    let saved =
        candle_core::safetensors::load(d.path().join("model.safetensors"), &Device::Cpu).unwrap();
    let orig =
        candle_core::safetensors::load(model_dir(kind).join("model.safetensors"), &Device::Cpu)
            .unwrap();
    let mut a: Vec<_> = saved.keys().cloned().collect();
    let mut b: Vec<_> = orig.keys().cloned().collect();
    a.sort();
    b.sort();
    assert_eq!(a, b, "HF tensor names");
    let q = Policy::load(d.path(), DType::F32, dev).unwrap();
    let ids = Tensor::new(&[[3u32, 1, 4, 1, 5, 9, 2, 6]], dev).unwrap();
    let la = p.forward(&ids, None, None).unwrap();
    let lb = q.forward(&ids, None, None).unwrap();
    assert_eq!(max_abs_diff(&la, &lb, None), 0.0);
    // bf16 save → load keeps argmax
    let d2 = tempfile::tempdir().unwrap();
    p.save(d2.path(), DType::BF16).unwrap();
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d2.path().join("config.json")).unwrap())
            .unwrap();
    assert_eq!(cfg["torch_dtype"], "bfloat16");
    let r = Policy::load(d2.path(), DType::BF16, dev).unwrap();
    let lc = r
        .forward(&ids, None, None)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap();
    let d = max_abs_diff(&la, &lc, None);
    let am_a = ids_vec(&la.argmax(2).unwrap());
    let am_c = ids_vec(&lc.argmax(2).unwrap());
    let agree = am_a.iter().zip(&am_c).filter(|(x, y)| x == y).count();
    eprintln!(
        "{kind} bf16 round trip: max|dlogit| {d}, argmax agreement {agree}/{}",
        am_a.len()
    );
    assert!(
        d < 2.0 && agree * 4 >= am_a.len() * 3,
        "bf16 diff {d}, agreement {agree}"
    );
}

#[test]
fn save_load_round_trip() {
    for dev in devices() {
        case(&dev, "qwen3");
        case(&dev, "qwen2");
    }
}
