//! The candle BERT embedder against the published all-MiniLM-L6-v2 outputs (golden values from
//! `shared/models/all-minilm-l6-v2/README.md`, computed independently with numpy and matching the
//! sentence-transformers example). The weights come from `scripts/fetch-embedder.sh`, which the
//! test command (`scripts/test.sh`) runs first.

use std::path::PathBuf;

use mtrl_search::{BertEmbedder, Embedder};

fn model_dir() -> PathBuf {
    let dir = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../models/all-minilm-l6-v2"
    ));
    assert!(
        dir.join("model.safetensors").is_file(),
        "{} has no weights: run scripts/fetch-embedder.sh (scripts/test.sh does)",
        dir.display()
    );
    dir
}

fn cos(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[test]
fn minilm_matches_published_values() {
    let e = BertEmbedder::load(&model_dir(), &candle_core::Device::Cpu, 256, 8).unwrap();
    assert_eq!(e.dim(), 384);
    let v = e
        .embed(&[
            "A man is eating food.",
            "A man is eating a piece of bread.",
            "The new movie is awesome.",
            "This is an example sentence",
        ])
        .unwrap();
    assert!(
        (cos(&v[0], &v[1]) - 0.7553).abs() < 1e-3,
        "{}",
        cos(&v[0], &v[1])
    );
    assert!(
        (cos(&v[0], &v[2]) - (-0.0461)).abs() < 1e-3,
        "{}",
        cos(&v[0], &v[2])
    );
    let want = [0.0677, 0.0635, 0.0487, 0.0793, 0.0374];
    for (got, want) in v[3].iter().zip(want) {
        assert!((got - want).abs() < 1e-3, "{:?}", &v[3][..5]);
    }
    for x in &v {
        assert!((cos(x, x) - 1.0).abs() < 1e-5);
    }
}

#[test]
fn batching_and_padding_do_not_change_vectors() {
    let e = BertEmbedder::load(&model_dir(), &candle_core::Device::Cpu, 256, 4).unwrap();
    let texts = [
        "short",
        "a considerably longer sentence about supersonic wing flutter and heat transfer",
        "medium length text here",
        "",
        "🚀 emoji and \"quotes\" (brackets)",
    ];
    let batched = e.embed(&texts).unwrap();
    for (t, b) in texts.iter().zip(&batched) {
        let single = e.embed(&[t]).unwrap().pop().unwrap();
        let diff = single
            .iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        assert!(diff < 1e-4, "{t:?}: {diff}");
    }
}

#[test]
fn missing_files_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let err = BertEmbedder::load(dir.path(), &candle_core::Device::Cpu, 256, 4)
        .err()
        .unwrap();
    let msg = err.to_string();
    assert!(
        msg.contains("config.json") && msg.contains("fetch-embedder"),
        "{msg}"
    );
    std::fs::copy(
        model_dir().join("config.json"),
        dir.path().join("config.json"),
    )
    .unwrap();
    std::fs::write(dir.path().join("model.safetensors"), b"not safetensors").unwrap();
    let msg = BertEmbedder::load(dir.path(), &candle_core::Device::Cpu, 256, 4)
        .err()
        .unwrap()
        .to_string();
    assert!(
        msg.contains("model.safetensors") || msg.contains("safetensors"),
        "{msg}"
    );
}
