//! `mtrl bench search`: index build speed, query throughput and latency (one thread, and N
//! concurrent tokio tasks), and HNSW recall@k against exact brute-force search, as one JSON
//! object. A benchmark, not a test: nothing here asserts on time.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use mtrl_core::Config;
use mtrl_search::index::Progress;
use mtrl_search::vector::{Embeddings, EMBEDDINGS_FILE};
use mtrl_search::{queries, Retriever, SearchIndex};
use serde_json::{json, Value};

use crate::error::{EvalError, Result};

/// What to measure.
#[derive(Debug, Clone)]
pub struct BenchSearchOptions {
    /// Query file; defaults to `[search.eval]` queries.
    pub queries: Option<PathBuf>,
    /// Concurrent tasks for the throughput run.
    pub concurrency: usize,
    pub k: usize,
    /// Passes over the query set in each throughput run.
    pub rounds: usize,
    /// Reuse the configured index instead of timing a fresh build in a temporary folder.
    pub skip_build: bool,
    /// ef_search values for the recall sweep (the configured one is always included).
    pub ef_sweep: Vec<usize>,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn latency_stats(mut lat_ms: Vec<f64>, wall_s: f64) -> Value {
    lat_ms.sort_by(f64::total_cmp);
    json!({
        "queries": lat_ms.len(),
        "qps": lat_ms.len() as f64 / wall_s,
        "p50_ms": percentile(&lat_ms, 0.50),
        "p99_ms": percentile(&lat_ms, 0.99),
        "mean_ms": lat_ms.iter().sum::<f64>() / lat_ms.len().max(1) as f64,
    })
}

fn single_thread(tool: &dyn Retriever, texts: &[String], k: usize, rounds: usize) -> Result<Value> {
    let mut lat = Vec::with_capacity(texts.len() * rounds);
    let t0 = Instant::now();
    for _ in 0..rounds {
        for q in texts {
            let t = Instant::now();
            tool.search(q, k)?;
            lat.push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    Ok(latency_stats(lat, t0.elapsed().as_secs_f64()))
}

fn concurrent(
    index: &Arc<SearchIndex>,
    tool: &'static str,
    texts: &Arc<Vec<String>>,
    k: usize,
    rounds: usize,
    tasks: usize,
) -> Result<Value> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|source| EvalError::Io {
            path: "tokio runtime".into(),
            source,
        })?;
    let total = texts.len() * rounds;
    let next = Arc::new(AtomicUsize::new(0));
    let t0 = Instant::now();
    let lat: Vec<f64> = rt.block_on(async {
        let mut handles = Vec::with_capacity(tasks);
        for _ in 0..tasks {
            let (index, texts, next) = (index.clone(), texts.clone(), next.clone());
            handles.push(tokio::spawn(async move {
                let mut lat = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= total {
                        break;
                    }
                    let (index, texts) = (index.clone(), texts.clone());
                    let t = Instant::now();
                    let r = tokio::task::spawn_blocking(move || {
                        let Some(tool) = index.retriever(tool) else {
                            return Ok(0);
                        };
                        tool.search(&texts[i % texts.len()], k).map(|h| h.len())
                    })
                    .await;
                    if !matches!(r, Ok(Ok(_))) {
                        return Err(EvalError::Invalid(
                            "search failed in a concurrent task".into(),
                        ));
                    }
                    lat.push(t.elapsed().as_secs_f64() * 1e3);
                }
                Ok::<_, EvalError>(lat)
            }));
        }
        let mut all = Vec::new();
        for h in handles {
            all.extend(
                h.await
                    .map_err(|e| EvalError::Invalid(format!("search task: {e}")))??,
            );
        }
        Ok::<_, EvalError>(all)
    })?;
    let mut v = latency_stats(lat, t0.elapsed().as_secs_f64());
    v["tasks"] = json!(tasks);
    Ok(v)
}

/// Runs the benchmark on the config's `[search]` section; `progress` shows the index build.
pub fn bench_search(
    cfg: &Config,
    args: &BenchSearchOptions,
    progress: &mut dyn Progress,
) -> Result<Value> {
    let mut search = cfg.search()?.clone();
    let queries_file = args
        .queries
        .clone()
        .or_else(|| search.eval.as_ref().map(|e| e.queries.clone()))
        .ok_or_else(|| {
            EvalError::Invalid(format!(
                "{}: no queries to bench (give a query file or set [search.eval] queries)",
                cfg.source.display()
            ))
        })?;
    let texts: Vec<String> = queries::load(&queries_file)?
        .into_iter()
        .map(|q| q.text)
        .collect();
    let _tmp;
    if !args.skip_build {
        let t = tempfile::Builder::new()
            .prefix("mtrl-bench-index")
            .tempdir()
            .map_err(|source| EvalError::Io {
                path: std::env::temp_dir(),
                source,
            })?;
        search.index_dir = t.path().to_path_buf();
        _tmp = t;
    }
    let t0 = Instant::now();
    let (mut index, build) = SearchIndex::open_or_build(&search, progress)?;
    let build_s = t0.elapsed().as_secs_f64();
    let docs = build.docs as f64;
    let parts: Vec<Value> = build
        .parts
        .iter()
        .map(|p| json!({"part": p.part, "action": p.action, "seconds": p.seconds, "docs_per_s": docs / p.seconds.max(1e-9)}))
        .collect();

    // Recall of the HNSW graph against exact search, on the query embeddings.
    let emb = Embeddings::load(&search.index_dir.join("embeddings").join(EMBEDDINGS_FILE))?;
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let qvecs = index.vector().embedder().embed(&refs)?;
    let t = Instant::now();
    let exact: Vec<Vec<usize>> = qvecs
        .iter()
        .map(|q| {
            emb.exact_search(q, args.k)
                .into_iter()
                .map(|x| x.0)
                .collect()
        })
        .collect();
    let exact_qps = qvecs.len() as f64 / t.elapsed().as_secs_f64();
    let mut sweep = args.ef_sweep.clone();
    sweep.push(search.vector.ef_search);
    sweep.sort_unstable();
    sweep.dedup();
    let mut recall = Vec::new();
    for &ef in &sweep {
        index.vector_mut().set_ef_search(ef);
        let t = Instant::now();
        let mut hit = 0usize;
        let mut total = 0usize;
        for (q, ex) in qvecs.iter().zip(&exact) {
            let approx: Vec<usize> = index
                .vector()
                .search_vector(q, args.k)
                .into_iter()
                .map(|x| x.0)
                .collect();
            hit += approx.iter().filter(|a| ex.contains(a)).count();
            total += ex.len();
        }
        let secs = t.elapsed().as_secs_f64();
        recall.push(json!({
            "ef_search": ef,
            "recall_at_k": hit as f64 / total.max(1) as f64,
            "graph_qps": qvecs.len() as f64 / secs,
            "configured": ef == search.vector.ef_search,
        }));
    }
    index.vector_mut().set_ef_search(search.vector.ef_search);
    let configured_recall = recall
        .iter()
        .find(|r| r["configured"] == json!(true))
        .map(|r| r["recall_at_k"].clone());

    let index = Arc::new(index);
    let texts = Arc::new(texts);
    let mut tools = serde_json::Map::new();
    for name in ["bm25", "vector"] {
        let Some(tool) = index.retriever(name) else {
            continue;
        };
        tools.insert(
            name.into(),
            json!({
                "single_thread": single_thread(tool, &texts, args.k, args.rounds)?,
                "concurrent": concurrent(&index, name, &texts, args.k, args.rounds, args.concurrency)?,
            }),
        );
    }
    let report = json!({
        "bench": "search",
        "config": cfg.source,
        "docs": build.docs,
        "embedder": build.embedder,
        "queries": texts.len(),
        "k": args.k,
        "threads_available": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "build": {"total_seconds": build_s, "docs_per_s": docs / build_s, "parts": parts},
        "hnsw": {"m": search.vector.m, "ef_construction": search.vector.ef_construction,
                 "ef_search": search.vector.ef_search, "recall_at_k": configured_recall,
                 "exact_qps": exact_qps, "sweep": recall},
        "tools": tools,
    });
    Ok(report)
}
