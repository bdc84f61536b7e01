//! `mtrl bench search`: index build speed, embedder speed (documents/s, one-query latency), query
//! throughput and latency of both tools (one thread, and N concurrent tokio tasks — for the
//! vector tool with and without query batching), HNSW recall@k against exact brute-force search,
//! and peak RSS of indexing and of serving, as one JSON object; with a peer's JSON
//! (`bench/search_peers.py`) the figures side by side with ratios (`bench_search_peer.rs`).
//! A benchmark, not a test: nothing here asserts on time.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use mtrl_core::Config;
use mtrl_search::index::Progress;
use mtrl_search::vector::QueryBatching;
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
    /// Documents for the embedder's documents/s figure (the first N of the corpus, embedded
    /// twice, the better pass counts); 0 skips it.
    pub embed_docs: usize,
    /// The peer's JSON (`bench/search_peers.py`): adds a side-by-side `vs_peer` table.
    pub peer: Option<PathBuf>,
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

/// The hit ids of one search.
fn ids(tool: &dyn Retriever, q: &str, k: usize) -> Result<Vec<String>> {
    Ok(tool.search(q, k)?.into_iter().map(|h| h.doc_id).collect())
}

/// Whether every query, searched by `tasks` threads at once through the batcher, returns the
/// same hits as it did alone and unbatched.
fn same_hits_concurrently(
    index: &Arc<SearchIndex>,
    texts: &Arc<Vec<String>>,
    want: &[Vec<String>],
    k: usize,
    tasks: usize,
) -> Result<bool> {
    let next = AtomicUsize::new(0);
    let got: Vec<Vec<(usize, Vec<String>)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..tasks.max(1))
            .map(|_| {
                s.spawn(|| {
                    let mut out = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= texts.len() {
                            return Ok(out);
                        }
                        out.push((i, ids(index.vector(), &texts[i], k)?));
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(EvalError::Invalid("search thread panicked".into())))
            })
            .collect::<Result<_>>()
    })?;
    Ok(got.into_iter().flatten().all(|(i, hits)| hits == want[i]))
}

/// Embedder speed: documents/s over the first `n` documents (two passes, the better one), and
/// one-query-at-a-time embedding latency.
fn bench_embedder(index: &SearchIndex, queries: &[String], n: usize) -> Result<Value> {
    let e = index.vector().embedder();
    let mut out = json!({"id": e.id()});
    if n > 0 {
        let docs: Vec<String> = index
            .corpus()
            .documents()
            .iter()
            .take(n)
            .map(|d| d.indexed_text())
            .collect();
        let refs: Vec<&str> = docs.iter().map(String::as_str).collect();
        let mut best = f64::MAX;
        for _ in 0..2 {
            let t = Instant::now();
            e.embed(&refs)?;
            best = best.min(t.elapsed().as_secs_f64());
        }
        out["docs"] = json!(refs.len());
        out["docs_per_s"] = json!(refs.len() as f64 / best);
    }
    let mut lat = Vec::with_capacity(queries.len());
    let t = Instant::now();
    for q in queries {
        let t = Instant::now();
        e.embed(&[q.as_str()])?;
        lat.push(t.elapsed().as_secs_f64() * 1e3);
    }
    out["query"] = latency_stats(lat, t.elapsed().as_secs_f64());
    Ok(out)
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
    let before_build = mtrl_core::mem::rss_mb();
    let peak_reset = mtrl_core::mem::reset_peak_rss();
    let t0 = Instant::now();
    let (mut index, build) = SearchIndex::open_or_build(&search, progress)?;
    let build_s = t0.elapsed().as_secs_f64();
    let after_build = mtrl_core::mem::rss_mb();
    let docs = build.docs as f64;
    let parts: Vec<Value> = build
        .parts
        .iter()
        .map(|p| json!({"part": p.part, "action": p.action, "seconds": p.seconds, "docs_per_s": docs / p.seconds.max(1e-9)}))
        .collect();

    let serve_reset = mtrl_core::mem::reset_peak_rss();
    let embedder_report = bench_embedder(&index, &texts, args.embed_docs)?;

    // Recall of the HNSW graph against exact search, on the query embeddings.
    let emb = index.vector().embeddings();
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

    // Ranking alone, one query at a time, analysis included (what bm25s' retrieve times).
    let t = Instant::now();
    let mut lat = Vec::with_capacity(texts.len() * args.rounds);
    for _ in 0..args.rounds {
        for q in &texts {
            let t = Instant::now();
            index.bm25().search_ords(q, args.k)?;
            lat.push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    let bm25_rank = latency_stats(lat, t.elapsed().as_secs_f64());

    // Vector tool: unbatched first (each search embeds its own query), then through the batcher.
    let configured = QueryBatching {
        max_batch: search.vector.query_batch,
        max_wait: std::time::Duration::from_micros(search.vector.query_batch_wait_us),
    };
    index.vector_mut().set_query_batching(QueryBatching {
        max_batch: 1,
        ..configured
    });
    let vector_single = single_thread(index.vector(), &texts, args.k, args.rounds)?;
    let unbatched_hits: Vec<Vec<String>> = texts
        .iter()
        .map(|q| ids(index.vector(), q, args.k))
        .collect::<Result<_>>()?;
    let index = Arc::new(index);
    let texts = Arc::new(texts);
    let vector_unbatched = concurrent(
        &index,
        "vector",
        &texts,
        args.k,
        args.rounds,
        args.concurrency,
    )?;
    let mut index = Arc::try_unwrap(index)
        .map_err(|_| EvalError::Invalid("search index still shared after the run".into()))?;
    index.vector_mut().set_query_batching(configured);
    let index = Arc::new(index);
    let vector_batched = concurrent(
        &index,
        "vector",
        &texts,
        args.k,
        args.rounds,
        args.concurrency,
    )?;
    let stats = index.vector().batch_stats();
    let same = same_hits_concurrently(&index, &texts, &unbatched_hits, args.k, args.concurrency)?;
    let bm25 = index.bm25();
    let tools = json!({
        "bm25": {
            "single_thread": single_thread(bm25, &texts, args.k, args.rounds)?,
            "ranking_single_thread": bm25_rank,
            "concurrent": concurrent(&index, "bm25", &texts, args.k, args.rounds, args.concurrency)?,
        },
        "vector": {
            "single_thread": vector_single,
            "concurrent_unbatched": vector_unbatched,
            "concurrent": vector_batched,
            "query_batch": search.vector.query_batch,
            "query_batch_wait_us": search.vector.query_batch_wait_us,
            "mean_batch": stats.map(|s| s.texts as f64 / s.batches.max(1) as f64),
            "batched_hits_equal_unbatched": same,
        },
    });
    let after_serve = mtrl_core::mem::rss_mb();
    // Quality next to speed: nDCG@10 of both tools on the judged queries, when configured.
    let mut quality = serde_json::Map::new();
    if let Some(e) = &search.eval {
        let r = mtrl_search::tool_eval::evaluate_tools("bench", &index, &e.queries, &e.qrels)?;
        for t in r.tools {
            quality.insert(
                format!("{}_ndcg_at_10", t.tool),
                json!(t.summary.mean.ndcg_at_10),
            );
        }
    }
    let rss = json!({
        "method": if peak_reset && serve_reset { "VmHWM after /proc/self/clear_refs 5" } else { "VmHWM (peak since process start)" },
        "before_build_mb": before_build.map(|r| r.1),
        "index_peak_mb": after_build.map(|r| r.0),
        "after_build_mb": after_build.map(|r| r.1),
        "serve_peak_mb": after_serve.map(|r| r.0),
    });
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
        "embedder_bench": embedder_report,
        "tools": tools,
        "rss": rss,
    });
    let mut report = report;
    if let Some(o) = report.as_object_mut() {
        o.extend(quality);
    }
    match &args.peer {
        Some(p) => crate::bench_search_peer::with_peer(report, p),
        None => Ok(report),
    }
}
