//! Tiny GGUF files written with candle's own writer: conversion round trip, every refusal names
//! its key or tensor, the `.gguf` cache folder.

use super::*;
use candle_core::quantized::{gguf_file, GgmlDType, QTensor};

use crate::{Policy, Tokenizer};

const H: usize = 64;
const LAYERS: usize = 2;

/// GPT-2's byte → printable-char map (what byte-level BPE vocabularies are written in).
fn byte_chars() -> Vec<char> {
    let mut bs: Vec<u32> = (33..=126).chain(0xA1..=0xAC).chain(0xAE..=0xFF).collect();
    let mut cs = bs.clone();
    let mut n = 0;
    for b in 0..256u32 {
        if !bs.contains(&b) {
            bs.push(b);
            cs.push(256 + n);
            n += 1;
        }
    }
    let mut out = vec![' '; 256];
    for (b, c) in bs.iter().zip(cs) {
        out[*b as usize] = char::from_u32(c).unwrap();
    }
    out
}

struct Spec {
    meta: Vec<(String, gguf_file::Value)>,
    tensors: Vec<(String, QTensor)>,
}

fn s(x: &str) -> gguf_file::Value {
    gguf_file::Value::String(x.into())
}

/// A 2-layer Qwen2 in Q8_0 (norms and biases f32) with a 262-token byte-level vocabulary.
fn spec(tied: bool) -> Spec {
    let chars = byte_chars();
    let mut tokens: Vec<String> = chars.iter().map(|c| c.to_string()).collect();
    let mut types = vec![1i32; 256];
    tokens.push("Ġt".into()); // merge 1
    types.push(1);
    tokens.push("he".into()); // merge 2
    types.push(1);
    for (t, ty) in [("<|endoftext|>", 3), ("<|im_end|>", 3), ("<tool_call>", 4)] {
        tokens.push(t.into());
        types.push(ty);
    }
    tokens.push("[PAD261]".into());
    types.push(5);
    let vocab = tokens.len();
    let arr = |v: Vec<gguf_file::Value>| gguf_file::Value::Array(v);
    let meta: Vec<(String, gguf_file::Value)> = vec![
        ("general.architecture".into(), s("qwen2")),
        ("general.name".into(), s("tiny test")),
        ("qwen2.block_count".into(), gguf_file::Value::U32(LAYERS as u32)),
        ("qwen2.context_length".into(), gguf_file::Value::U32(256)),
        ("qwen2.embedding_length".into(), gguf_file::Value::U32(H as u32)),
        ("qwen2.feed_forward_length".into(), gguf_file::Value::U32(128)),
        ("qwen2.attention.head_count".into(), gguf_file::Value::U32(2)),
        ("qwen2.attention.head_count_kv".into(), gguf_file::Value::U32(1)),
        ("qwen2.rope.freq_base".into(), gguf_file::Value::F32(1e6)),
        ("qwen2.attention.layer_norm_rms_epsilon".into(), gguf_file::Value::F32(1e-6)),
        ("tokenizer.ggml.model".into(), s("gpt2")),
        ("tokenizer.ggml.pre".into(), s("qwen2")),
        ("tokenizer.ggml.tokens".into(), arr(tokens.iter().map(|t| s(t)).collect())),
        ("tokenizer.ggml.token_type".into(), arr(types.into_iter().map(gguf_file::Value::I32).collect())),
        ("tokenizer.ggml.merges".into(), arr(vec![s("Ġ t"), s("h e")])),
        ("tokenizer.ggml.eos_token_id".into(), gguf_file::Value::U32(259)),
        ("tokenizer.ggml.padding_token_id".into(), gguf_file::Value::U32(258)),
        ("tokenizer.ggml.add_bos_token".into(), gguf_file::Value::Bool(false)),
        ("tokenizer.chat_template".into(), s("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}")),
    ];
    let dev = Device::Cpu;
    let q = |shape: &[usize], ty: GgmlDType, seed: usize| {
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n)
            .map(|i| (((i * 7919 + seed * 104729) % 1000) as f32 / 1000.0 - 0.5) * 0.1)
            .collect();
        QTensor::quantize(&Tensor::from_vec(v, shape, &dev).unwrap(), ty).unwrap()
    };
    let ones = |n: usize| {
        QTensor::quantize(&Tensor::ones(n, DType::F32, &dev).unwrap(), GgmlDType::F32).unwrap()
    };
    let mut tensors = vec![
        (
            "token_embd.weight".to_string(),
            q(&[vocab, H], GgmlDType::Q8_0, 1),
        ),
        ("output_norm.weight".to_string(), ones(H)),
    ];
    if !tied {
        tensors.push(("output.weight".into(), q(&[vocab, H], GgmlDType::Q8_0, 2)));
    }
    for l in 0..LAYERS {
        let p = format!("blk.{l}");
        let seed = 10 + l * 20;
        tensors.extend([
            (format!("{p}.attn_norm.weight"), ones(H)),
            (format!("{p}.ffn_norm.weight"), ones(H)),
            (
                format!("{p}.attn_q.weight"),
                q(&[H, H], GgmlDType::Q8_0, seed),
            ),
            (
                format!("{p}.attn_q.bias"),
                q(&[H], GgmlDType::F32, seed + 1),
            ),
            (
                format!("{p}.attn_k.weight"),
                q(&[32, H], GgmlDType::Q8_0, seed + 2),
            ),
            (
                format!("{p}.attn_k.bias"),
                q(&[32], GgmlDType::F32, seed + 3),
            ),
            (
                format!("{p}.attn_v.weight"),
                q(&[32, H], GgmlDType::Q4_0, seed + 4),
            ),
            (
                format!("{p}.attn_v.bias"),
                q(&[32], GgmlDType::F32, seed + 5),
            ),
            (
                format!("{p}.attn_output.weight"),
                q(&[H, H], GgmlDType::Q8_0, seed + 6),
            ),
            (
                format!("{p}.ffn_gate.weight"),
                q(&[128, H], GgmlDType::Q8_0, seed + 7),
            ),
            (
                format!("{p}.ffn_up.weight"),
                q(&[128, H], GgmlDType::Q8_0, seed + 8),
            ),
            (
                format!("{p}.ffn_down.weight"),
                q(&[H, 128], GgmlDType::Q5_0, seed + 9),
            ),
        ]);
    }
    Spec { meta, tensors }
}

fn write(spec: &Spec, path: &Path) {
    let mut f = std::fs::File::create(path).unwrap();
    let meta: Vec<(&str, &gguf_file::Value)> =
        spec.meta.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let ts: Vec<(&str, &QTensor)> = spec.tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    gguf_file::write(&mut f, &meta, &ts).unwrap();
}

fn err_of(edit: impl FnOnce(&mut Spec)) -> String {
    let dir = tempfile::tempdir().unwrap();
    let mut sp = spec(false);
    edit(&mut sp);
    let path = dir.path().join("m.gguf");
    write(&sp, &path);
    match convert(&path, &dir.path().join("out"), DType::F32) {
        Ok(()) => panic!("converted a file it should refuse"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn converts_to_a_folder_every_loader_reads() {
    let dir = tempfile::tempdir().unwrap();
    let sp = spec(false);
    let path = dir.path().join("m.gguf");
    write(&sp, &path);
    let out = dir.path().join("hf");
    convert(&path, &out, DType::F32).unwrap();
    let cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(cfg["model_type"], "qwen2");
    assert_eq!(cfg["head_dim"], 32);
    assert_eq!(cfg["rms_norm_eps"], 1e-6);
    assert_eq!(cfg["rope_theta"], 1e6);
    assert_eq!(cfg["tie_word_embeddings"], false);
    assert_eq!(cfg["eos_token_id"], 259);
    let p = Policy::load(&out, DType::F32, &Device::Cpu).unwrap();
    // The dequantised values are the stored ones, under HF names.
    let (_, want) = sp
        .tensors
        .iter()
        .find(|(n, _)| n == "blk.1.ffn_down.weight")
        .unwrap();
    let got = p.named_parameters()["model.layers.1.mlp.down_proj.weight"]
        .as_tensor()
        .clone();
    let diff = (got - want.dequantize(&Device::Cpu).unwrap())
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap();
    assert_eq!(diff.to_scalar::<f32>().unwrap(), 0.0);
    let lm = p.named_parameters()["lm_head.weight"].as_tensor().clone();
    let emb = p.named_parameters()["model.embed_tokens.weight"]
        .as_tensor()
        .clone();
    assert!(
        lm.sub(&emb)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap()
            > 0.0
    );
    let tok = Tokenizer::from_dir(&out).unwrap();
    // Added tokens are split out before BPE; merges apply.
    let ids = tok.encode("the<tool_call> t<|im_end|>").unwrap();
    assert_eq!(ids, vec![116, 257, 260, 256, 259]);
    assert_eq!(
        tok.decode(&ids, false).unwrap(),
        "the<tool_call> t<|im_end|>"
    );
}

#[test]
fn a_missing_output_head_ties_the_embedding() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    write(&spec(true), &path);
    convert(&path, &dir.path().join("hf"), DType::BF16).unwrap();
    let p = Policy::load(&dir.path().join("hf"), DType::BF16, &Device::Cpu).unwrap();
    assert!(p.config().tie_word_embeddings);
    assert!(!p.named_parameters().contains_key("lm_head.weight"));
}

#[test]
fn refusals_name_the_key_or_tensor() {
    let set = |k: &'static str, v: gguf_file::Value| {
        move |sp: &mut Spec| match sp.meta.iter_mut().find(|(n, _)| n == k) {
            Some(e) => e.1 = v,
            None => sp.meta.push((k.into(), v)),
        }
    };
    for (edit, want) in [
        (
            Box::new(set("qwen2.rope.scaling.type", s("yarn"))) as Box<dyn FnOnce(&mut Spec)>,
            "qwen2.rope.scaling.type",
        ),
        (
            Box::new(set(
                "qwen2.attention.sliding_window",
                gguf_file::Value::U32(4096),
            )),
            "qwen2.attention.sliding_window",
        ),
        (
            Box::new(set("general.architecture", s("llama"))),
            "general.architecture",
        ),
        (
            Box::new(set("tokenizer.ggml.pre", s("llama-bpe"))),
            "tokenizer.ggml.pre",
        ),
        (
            Box::new(set("tokenizer.ggml.model", s("llama"))),
            "tokenizer.ggml.model",
        ),
        (
            Box::new(set(
                "tokenizer.ggml.add_bos_token",
                gguf_file::Value::Bool(true),
            )),
            "tokenizer.ggml.add_bos_token",
        ),
        (
            Box::new(set("qwen2.rope.dimension_count", gguf_file::Value::U32(16))),
            "qwen2.rope.dimension_count",
        ),
        (
            Box::new(set(
                "tokenizer.ggml.eos_token_id",
                gguf_file::Value::U32(9999),
            )),
            "tokenizer.ggml.eos_token_id",
        ),
        (
            Box::new(|sp: &mut Spec| sp.meta.retain(|(k, _)| k != "qwen2.block_count")),
            "qwen2.block_count",
        ),
        (
            Box::new(|sp: &mut Spec| {
                let t = sp.tensors[1].1.dequantize(&Device::Cpu).unwrap();
                sp.tensors.push((
                    "rope_freqs.weight".into(),
                    QTensor::quantize(&t, GgmlDType::F32).unwrap(),
                ));
            }),
            "rope_freqs.weight",
        ),
        (
            Box::new(|sp: &mut Spec| sp.tensors.retain(|(k, _)| k != "blk.1.attn_k.bias")),
            "model.layers.1.self_attn.k_proj.bias",
        ),
        (
            Box::new(|sp: &mut Spec| {
                let t = sp
                    .tensors
                    .iter()
                    .find(|(k, _)| k == "blk.1.attn_q.bias")
                    .unwrap()
                    .1
                    .dequantize(&Device::Cpu)
                    .unwrap();
                sp.tensors.push((
                    "blk.01.attn_q.bias".into(),
                    QTensor::quantize(&t, GgmlDType::F32).unwrap(),
                ));
            }),
            "blk.01.attn_q.bias",
        ),
        (
            Box::new(set(
                "tokenizer.ggml.padding_token_id",
                gguf_file::Value::I32(-1),
            )),
            "tokenizer.ggml.padding_token_id",
        ),
        (
            Box::new(set(
                "qwen2.attention.head_count_kv",
                gguf_file::Value::U32(3),
            )),
            "num_key_value_heads",
        ),
    ] {
        let e = err_of(edit);
        assert!(e.contains(want), "{want}: {e}");
    }
    // Descriptive keys are accepted.
    let dir = tempfile::tempdir().unwrap();
    let mut sp = spec(false);
    sp.meta.push(("general.license".into(), s("apache-2.0")));
    sp.meta.push(("quantize.imatrix.file".into(), s("x.dat")));
    write(&sp, &dir.path().join("m.gguf"));
    convert(
        &dir.path().join("m.gguf"),
        &dir.path().join("o"),
        DType::F32,
    )
    .unwrap();
    // Not a GGUF at all.
    std::fs::write(dir.path().join("bad.gguf"), b"GGUF but not really").unwrap();
    let e = Gguf::open(&dir.path().join("bad.gguf"))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("bad.gguf") && e.contains("GGUF"), "{e}");
}

#[test]
fn a_gguf_path_is_converted_once_and_again_when_it_changes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    write(&spec(false), &path);
    let d = checkpoint_dir(&path).unwrap();
    assert_eq!(d, dir.path().join("m.mtrl"));
    assert!(d.join("tokenizer.json").is_file() && !d.join("model.safetensors").exists());
    assert_eq!(source_of(&d), Some(path.clone()));
    let mtime = |d: &Path| {
        std::fs::metadata(d.join("config.json"))
            .unwrap()
            .modified()
            .unwrap()
    };
    let before = mtime(&d);
    assert_eq!(checkpoint_dir(&path).unwrap(), d);
    assert_eq!(
        before,
        mtime(&d),
        "an unchanged source is not converted again"
    );
    // Through the ordinary loaders: the weights straight from the file, the same values as a
    // converted folder's.
    let p = Policy::load(&path, DType::F32, &Device::Cpu).unwrap();
    assert!(!p.config().tie_word_embeddings);
    assert_eq!(p.source_dir(), Some(d.as_path()));
    convert(&path, &dir.path().join("hf"), DType::F32).unwrap();
    let q = Policy::load(&dir.path().join("hf"), DType::F32, &Device::Cpu).unwrap();
    for (name, v) in p.named_parameters() {
        let w = q.named_parameters()[name].as_tensor();
        let diff = (v.as_tensor() - w)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap();
        assert_eq!(diff.to_scalar::<f32>().unwrap(), 0.0, "{name}");
    }
    Tokenizer::from_dir(&path).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    write(&spec(true), &path);
    checkpoint_dir(&path).unwrap();
    let p = Policy::load(&path, DType::F32, &Device::Cpu).unwrap();
    assert!(
        p.config().tie_word_embeddings,
        "a changed source is converted again"
    );
    assert_eq!(checkpoint_dir(dir.path()).unwrap(), dir.path());
    // Several loaders at once (MPI ranks, parallel tests): one converts, all get a whole folder.
    std::thread::sleep(std::time::Duration::from_millis(20));
    write(&spec(false), &path);
    let loaders: Vec<_> = (0..3)
        .map(|_| {
            let path = path.clone();
            std::thread::spawn(move || Policy::load(&path, DType::F32, &Device::Cpu).map(|_| ()))
        })
        .collect();
    for l in loaders {
        l.join().unwrap().unwrap();
    }
    // A folder of that name that mtrl did not write is never deleted.
    let other = tempfile::tempdir().unwrap();
    let src = other.path().join("x.gguf");
    write(&spec(false), &src);
    std::fs::create_dir(other.path().join("x.mtrl")).unwrap();
    std::fs::write(other.path().join("x.mtrl/model.safetensors"), b"mine").unwrap();
    let e = checkpoint_dir(&src).unwrap_err().to_string();
    assert!(e.contains("x.mtrl") && e.contains("in the way"), "{e}");
    assert!(other.path().join("x.mtrl/model.safetensors").is_file());
}
