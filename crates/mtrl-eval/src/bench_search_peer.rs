//! `mtrl bench search --peer FILE`: our figures next to the Python peer's
//! (`bench/search_peers.py`: sentence-transformers, hnswlib, bm25s), one row per figure with both
//! values and the ratio. Rows whose figure is missing on either side are left out; the peer file
//! is read as written, nothing is estimated.

use std::path::Path;

use serde_json::{json, Value};

use crate::error::{EvalError, Result};

/// One comparison: `ratio` = ours / peer, so above 1 is better for a rate and below 1 is better
/// for a time or a size (`better` says which).
fn row(figure: &str, ours: Option<f64>, peer: Option<f64>, better: &str) -> Option<Value> {
    let (o, p) = (ours?, peer?);
    (p > 0.0)
        .then(|| json!({"figure": figure, "mtrl": o, "peer": p, "ratio": o / p, "better": better}))
}

fn num(v: &Value, path: &[&str]) -> Option<f64> {
    path.iter().try_fold(v, |v, k| v.get(k))?.as_f64()
}

/// Adds `peer` (the file as read) and `vs_peer` (the rows) to `report`.
pub fn with_peer(mut report: Value, path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|source| EvalError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let peer: Value = serde_json::from_str(text.trim())
        .map_err(|e| EvalError::Invalid(format!("{}: not the peer's JSON: {e}", path.display())))?;
    if peer.get("peer").and_then(Value::as_str) != Some("search") {
        return Err(EvalError::Invalid(format!(
            "{}: no `\"peer\": \"search\"` key (write it with bench/search_peers.py)",
            path.display()
        )));
    }
    let r = &report;
    let graph_s = r["build"]["parts"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["part"] == "graph"))
        .and_then(|p| p["seconds"].as_f64());
    let docs = num(r, &["docs"]);
    let mut rows: Vec<Option<Value>> = vec![
        row(
            "MiniLM document encoding, docs/s",
            num(r, &["embedder_bench", "docs_per_s"]),
            num(&peer, &["minilm_encode_docs_per_s"]),
            "higher",
        ),
        row(
            "MiniLM one query, mean ms",
            num(r, &["embedder_bench", "query", "mean_ms"]),
            num(&peer, &["minilm_query_ms"]),
            "lower",
        ),
        row(
            "MiniLM one query, p50 ms",
            num(r, &["embedder_bench", "query", "p50_ms"]),
            num(&peer, &["minilm_query_p50_ms"]),
            "lower",
        ),
        row(
            "vector tool one query (encode + search) p50 ms vs peer encode alone",
            num(r, &["tools", "vector", "single_thread", "p50_ms"]),
            num(&peer, &["minilm_query_p50_ms"]).or(num(&peer, &["minilm_query_ms"])),
            "lower",
        ),
        row(
            "HNSW build, s",
            graph_s,
            num(&peer, &["hnswlib_build_s"])
                .or_else(|| Some(docs? / num(&peer, &["hnswlib_build_vectors_per_s"])?)),
            "lower",
        ),
        row(
            "BM25 one query at a time (ranking, analysis included), QPS vs bm25s numba",
            num(r, &["tools", "bm25", "ranking_single_thread", "qps"]),
            num(&peer, &["bm25s_numba", "qps_one_at_a_time"]),
            "higher",
        ),
        row(
            "BM25 nDCG@10",
            num(r, &["bm25_ndcg_at_10"]),
            num(&peer, &["bm25s_ndcg_at_10"]),
            "higher",
        ),
        row(
            "peak RSS, indexing, MiB",
            num(r, &["rss", "index_peak_mb"]),
            num(&peer, &["rss_mb", "index_peak"]),
            "lower",
        ),
        row(
            "peak RSS, serving, MiB",
            num(r, &["rss", "serve_peak_mb"]),
            num(&peer, &["rss_mb", "serve_peak"]),
            "lower",
        ),
    ];
    let ours_sweep = r["hnsw"]["sweep"].as_array().cloned().unwrap_or_default();
    for p in peer["hnswlib"].as_array().into_iter().flatten() {
        let Some(ef) = p["ef_search"].as_u64() else {
            continue;
        };
        let Some(o) = ours_sweep
            .iter()
            .find(|o| o["ef_search"].as_u64() == Some(ef))
        else {
            continue;
        };
        rows.push(row(
            &format!("HNSW top-k QPS one query at a time, ef {ef}"),
            o["graph_qps"].as_f64(),
            p["qps"].as_f64(),
            "higher",
        ));
        rows.push(row(
            &format!("HNSW recall@k, ef {ef}"),
            o["recall_at_k"].as_f64(),
            p["recall_at_k"].as_f64(),
            "higher",
        ));
    }
    let rows: Vec<Value> = rows.into_iter().flatten().collect();
    report["vs_peer"] = Value::Array(rows);
    report["peer"] = peer;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_pair_figures_and_skip_missing_ones() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("peer.json");
        std::fs::write(
            &p,
            r#"{"peer": "search", "minilm_encode_docs_per_s": 100.0,
                "hnswlib": [{"ef_search": 64, "recall_at_k": 0.99, "qps": 1000.0}],
                "bm25s_numba": {"qps_one_at_a_time": 2000.0}}"#,
        )
        .unwrap();
        let ours = json!({"embedder_bench": {"docs_per_s": 150.0},
            "hnsw": {"sweep": [{"ef_search": 64, "recall_at_k": 0.995, "graph_qps": 1500.0}]},
            "tools": {"bm25": {"ranking_single_thread": {"qps": 3000.0}}}});
        let out = with_peer(ours, &p).unwrap();
        let rows = out["vs_peer"].as_array().unwrap();
        assert_eq!(rows.len(), 4, "{rows:?}");
        assert_eq!(rows[0]["ratio"], json!(1.5));
        assert!(rows
            .iter()
            .any(|r| r["figure"].as_str().unwrap().contains("ef 64")));
        std::fs::write(&p, "{\"peer\": \"model\"}").unwrap();
        let err = with_peer(json!({}), &p).unwrap_err().to_string();
        assert!(err.contains("peer.json"), "{err}");
        std::fs::write(&p, "not json").unwrap();
        assert!(with_peer(json!({}), &p).is_err());
    }
}
