//! Bad adapter folders get errors naming the file and the field or tensor, never a panic: a PEFT
//! feature we do not compute, a wrong rank for the tensors, a missing or extra tensor, a missing
//! or truncated weights file, malformed JSON.

mod common;

use std::path::Path;

use candle_core::{DType, Device};
use common::*;
use mtrl_model::Policy;

fn adapter_src() -> std::path::PathBuf {
    fixtures().join("lora/tiny-qwen3/adapter")
}

/// A copy of the fixture adapter with `edit` applied to its config.
fn edited(dir: &Path, edit: impl Fn(&mut serde_json::Value)) {
    std::fs::create_dir_all(dir).unwrap();
    let src = adapter_src();
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("adapter_config.json")).unwrap())
            .unwrap();
    edit(&mut cfg);
    std::fs::write(dir.join("adapter_config.json"), cfg.to_string()).unwrap();
    std::fs::copy(
        src.join("adapter_model.safetensors"),
        dir.join("adapter_model.safetensors"),
    )
    .unwrap();
}

fn load_err(base: &str, dir: &Path) -> String {
    Policy::load(&model_dir(base), DType::F32, &Device::Cpu)
        .unwrap()
        .load_adapter(dir)
        .unwrap_err()
        .to_string()
}

#[test]
fn unsupported_fields_are_named() {
    let t = tempfile::tempdir().unwrap();
    for (key, value) in [
        ("use_dora", serde_json::json!(true)),
        ("lora_bias", serde_json::json!(true)),
        ("fan_in_fan_out", serde_json::json!(true)),
        ("rank_pattern", serde_json::json!({"q_proj": 4})),
        ("modules_to_save", serde_json::json!(["lm_head"])),
        ("layers_pattern", serde_json::json!("blocks")),
        ("peft_type", serde_json::json!("IA3")),
        ("bias", serde_json::json!("all")),
        ("target_modules", serde_json::json!(".*proj")),
        ("target_modules", serde_json::json!(["lm_head"])),
    ] {
        let d = t.path().join(key);
        let _ = std::fs::remove_dir_all(&d);
        edited(&d, |c| c[key] = value.clone());
        let e = load_err("qwen3", &d);
        assert!(
            e.contains("adapter_config.json") && e.contains(key),
            "{key}: {e}"
        );
    }
}

#[test]
fn tensor_mismatches_are_named() {
    let t = tempfile::tempdir().unwrap();
    // The config says rank 4, the tensors have rank 8.
    let d = t.path().join("rank");
    edited(&d, |c| c["r"] = serde_json::json!(4));
    let e = load_err("qwen3", &d);
    assert!(
        e.contains("adapter_model.safetensors") && e.contains("lora_A") && e.contains("rank 4"),
        "{e}"
    );
    // Fewer targets than tensors: the extra tensors are named.
    let d = t.path().join("targets");
    edited(&d, |c| c["target_modules"] = serde_json::json!(["q_proj"]));
    let e = load_err("qwen3", &d);
    assert!(e.contains("is not a LoRA tensor"), "{e}");
    // A missing weights file is named.
    let d = t.path().join("nofile");
    edited(&d, |_| {});
    std::fs::remove_file(d.join("adapter_model.safetensors")).unwrap();
    let e = load_err("qwen3", &d);
    assert!(e.contains("adapter_model.safetensors"), "{e}");
    // A truncated weights file.
    let d = t.path().join("trunc");
    edited(&d, |_| {});
    let bytes = std::fs::read(d.join("adapter_model.safetensors")).unwrap();
    std::fs::write(
        d.join("adapter_model.safetensors"),
        &bytes[..bytes.len() / 2],
    )
    .unwrap();
    let e = load_err("qwen3", &d);
    assert!(
        e.contains("adapter_model.safetensors") && e.contains("truncated"),
        "{e}"
    );
    // Malformed JSON.
    let d = t.path().join("json");
    edited(&d, |_| {});
    std::fs::write(d.join("adapter_config.json"), "{\"r\": 8,").unwrap();
    let e = load_err("qwen3", &d);
    assert!(
        e.contains("adapter_config.json") && e.contains("json"),
        "{e}"
    );
}

#[test]
fn an_adapter_folder_is_not_a_model() {
    let e = Policy::load(&adapter_src(), DType::F32, &Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("LoRA adapter folder") && e.contains("adapter"),
        "{e}"
    );
    // A dropout outside [0, 1) is named as PEFT's key.
    let t = tempfile::tempdir().unwrap();
    edited(t.path(), |c| c["lora_dropout"] = serde_json::json!(1.5));
    let e = load_err("qwen3", t.path());
    assert!(e.contains("lora_dropout"), "{e}");
}
