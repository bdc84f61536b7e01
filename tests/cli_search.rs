//! End-to-end tests of the search commands through the real `mtrl` binary.

use std::path::{Path, PathBuf};

mod common;
use common::{mtrl, repo};

/// A config over the real MuSiQue-100 collection with the hashing embedder, indexed in `dir`.
fn musique_config(dir: &Path) -> PathBuf {
    let data = repo().join("data/musique-hipporag100");
    let cfg = dir.join("musique.toml");
    std::fs::write(
        &cfg,
        format!(
            "name = 'musique-test'\n[search]\ncorpus = '{}'\nindex_dir = '{}'\nembedder = 'hash'\n\
             [search.columns]\nid = 'doc_id'\n[search.eval]\nqueries = '{}'\nqrels = '{}'\n",
            data.join("corpus.jsonl").display(),
            dir.join("index").display(),
            data.join("queries.jsonl").display(),
            data.join("qrels.tsv").display()
        ),
    )
    .unwrap();
    cfg
}

#[test]
fn index_search_and_eval_on_musique() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = musique_config(dir.path());
    let cfg = cfg.to_str().unwrap();

    let (ok, out, err) = mtrl(&["index", "--config", cfg, "--json"]);
    assert!(ok, "{err}");
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["docs"], 1890);
    assert!(report["parts"]
        .as_array()
        .unwrap()
        .iter()
        .all(|p| p["action"] == "built"));
    let (ok, out, _) = mtrl(&["index", "--config", cfg, "--json"]);
    assert!(ok);
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(report["parts"]
        .as_array()
        .unwrap()
        .iter()
        .all(|p| p["action"] == "reused"));

    let (ok, out, err) = mtrl(&[
        "search",
        "--config",
        cfg,
        "-k",
        "3",
        "--json",
        "Journal of Psychotherapy Integration",
    ]);
    assert!(ok, "{err}");
    let hits: serde_json::Value = serde_json::from_str(&out).unwrap();
    let hits = hits.as_array().unwrap();
    assert_eq!(hits.len(), 3);
    assert!(
        hits[0]["title"]
            .as_str()
            .unwrap()
            .contains("Journal of Psychotherapy Integration"),
        "{hits:?}"
    );
    for key in ["doc_id", "score", "title", "snippet"] {
        assert!(hits[0].get(key).is_some(), "{key}");
    }
    let (ok, out, _) = mtrl(&[
        "search",
        "--config",
        cfg,
        "--tool",
        "vector",
        "-k",
        "2",
        "🚀 \"((title: AND",
    ]);
    assert!(ok);
    assert!(out.contains("1. ["), "{out}");

    let (ok, out, err) = mtrl(&["search-eval", "--config", cfg, "--json"]);
    assert!(ok, "{err}");
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(r["queries"], 100);
    let bm25 = r["tools"][0]["mean"]["ndcg_at_10"].as_f64().unwrap();
    // The collection README's plain BM25 sanity value is 0.581.
    assert!(bm25 > 0.45 && bm25 < 0.75, "{bm25}");
    let (ok, out, _) = mtrl(&["search-eval", "--config", cfg]);
    assert!(ok);
    assert!(
        out.contains("| bm25   |") && out.contains("| vector |"),
        "{out}"
    );
}

#[test]
fn config_errors_name_file_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("bad.toml");
    std::fs::write(
        &cfg,
        "[search]\ncorpus = 'c.jsonl'\nindex_dir = 'i'\nembeder = 'hash'\n",
    )
    .unwrap();
    let (ok, _, err) = mtrl(&["index", "--config", cfg.to_str().unwrap()]);
    assert!(!ok);
    assert!(err.contains("bad.toml") && err.contains("embeder"), "{err}");
    assert!(!err.contains("panicked"), "{err}");

    std::fs::write(
        &cfg,
        "[search]\ncorpus = 'missing.jsonl'\nindex_dir = 'i'\n",
    )
    .unwrap();
    let (ok, _, err) = mtrl(&["index", "--config", cfg.to_str().unwrap()]);
    assert!(!ok);
    assert!(err.contains("missing.jsonl"), "{err}");

    let (ok, _, err) = mtrl(&[
        "index",
        "--config",
        dir.path().join("nope.toml").to_str().unwrap(),
    ]);
    assert!(!ok);
    assert!(err.contains("nope.toml"), "{err}");
}

#[test]
fn bad_corpus_row_fails_with_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("docs.tsv");
    std::fs::write(&corpus, "id\ttext\n1\tfine\n2\n").unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(
        &cfg,
        format!(
            "[search]\ncorpus = '{}'\nindex_dir = 'idx'\n",
            corpus.display()
        ),
    )
    .unwrap();
    let (ok, _, err) = mtrl(&["index", "--config", cfg.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        err.contains("docs.tsv line 3") && err.contains("expected 2 fields"),
        "{err}"
    );
}

#[test]
fn bench_search_prints_json() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = musique_config(dir.path());
    let (ok, out, err) = mtrl(&[
        "bench",
        "search",
        "--config",
        cfg.to_str().unwrap(),
        "--rounds",
        "1",
        "--concurrency",
        "8",
        "--ef-sweep",
        "16,64",
    ]);
    assert!(ok, "{err}");
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(r["docs"], 1890);
    let recall = r["hnsw"]["recall_at_k"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&recall) && recall > 0.8, "{recall}");
    for tool in ["bm25", "vector"] {
        for mode in ["single_thread", "concurrent"] {
            let v = &r["tools"][tool][mode];
            assert_eq!(v["queries"], 100, "{tool} {mode}");
            assert!(v["qps"].as_f64().unwrap() > 0.0);
            assert!(v["p99_ms"].as_f64().unwrap() >= v["p50_ms"].as_f64().unwrap());
        }
    }
}
