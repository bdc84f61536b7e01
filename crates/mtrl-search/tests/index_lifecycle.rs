//! `SearchIndex::open_or_build`: reuse, rebuild on change, damaged files, concurrent search, and the
//! real Cranfield collection end to end.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use mtrl_core::Config;
use mtrl_search::index::NoProgress;
use mtrl_search::metrics::evaluate_run;
use mtrl_search::{queries, Qrels, Retriever, SearchIndex};

fn config(dir: &Path, corpus: &Path, extra: &str) -> Config {
    let text = format!(
        "[search]\ncorpus = '{}'\nindex_dir = '{}'\nembedder = 'hash'\n{extra}",
        corpus.display(),
        dir.join("index").display()
    );
    Config::from_toml_str(&text, &dir.join("t.toml")).unwrap()
}

fn write_corpus(dir: &Path, n: usize) -> PathBuf {
    let p = dir.join("docs.jsonl");
    let topics = [
        "wing flutter",
        "heat transfer",
        "shock wave",
        "boundary layer",
        "jet noise",
    ];
    let lines: Vec<String> = (0..n)
        .map(|i| {
            format!(
                "{{\"id\": \"d{i}\", \"title\": \"doc {i}\", \"text\": \"{} study number {i}\"}}",
                topics[i % topics.len()]
            )
        })
        .collect();
    std::fs::write(&p, lines.join("\n")).unwrap();
    p
}

fn actions(report: &mtrl_search::BuildReport) -> Vec<(String, String)> {
    report
        .parts
        .iter()
        .map(|p| (p.part.clone(), p.action.clone()))
        .collect()
}

fn all(action: &str) -> Vec<(String, String)> {
    ["bm25", "embeddings", "graph"]
        .iter()
        .map(|p| (p.to_string(), action.to_string()))
        .collect()
}

#[test]
fn second_open_reuses_and_changes_rebuild() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = write_corpus(dir.path(), 50);
    let cfg = config(dir.path(), &corpus, "");
    let (_, r1) = SearchIndex::open_or_build(cfg.search().unwrap(), &mut NoProgress).unwrap();
    assert_eq!(actions(&r1), all("built"));
    let (idx, r2) = SearchIndex::open_or_build(cfg.search().unwrap(), &mut NoProgress).unwrap();
    assert_eq!(actions(&r2), all("reused"));
    assert_eq!(
        idx.bm25().search("shock", 3).unwrap()[0]
            .title
            .split(' ')
            .next(),
        Some("doc")
    );

    // Changing only HNSW settings rebuilds only the graph.
    let cfg_m = config(dir.path(), &corpus, "[search.vector]\nm = 8\n");
    let (_, r3) = SearchIndex::open_or_build(cfg_m.search().unwrap(), &mut NoProgress).unwrap();
    assert_eq!(r3.parts[2].action, "built");
    assert_eq!(r3.parts[0].action, "reused");
    assert_eq!(r3.parts[1].action, "reused");

    // Changing the corpus file rebuilds everything.
    write_corpus(dir.path(), 51);
    let (idx, r4) = SearchIndex::open_or_build(cfg_m.search().unwrap(), &mut NoProgress).unwrap();
    assert_eq!(actions(&r4), all("built"));
    assert_eq!(idx.corpus().len(), 51);
}

#[test]
fn damaged_graph_is_detected_and_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = write_corpus(dir.path(), 40);
    let cfg = config(dir.path(), &corpus, "");
    SearchIndex::open_or_build(cfg.search().unwrap(), &mut NoProgress).unwrap();
    let graph = dir.path().join("index/graph/hnsw.graph");
    let mut bytes = std::fs::read(&graph).unwrap();
    bytes.truncate(bytes.len() / 2);
    std::fs::write(&graph, bytes).unwrap();
    let (idx, r) = SearchIndex::open_or_build(cfg.search().unwrap(), &mut NoProgress).unwrap();
    assert_eq!(r.parts[2].action, "built");
    assert!(
        r.parts[2].reason.as_deref().unwrap().contains("checksum"),
        "{:?}",
        r.parts[2]
    );
    assert_eq!(idx.vector().search("jet noise", 1).unwrap().len(), 1);
}

#[test]
fn bad_corpus_row_names_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("docs.jsonl");
    std::fs::write(
        &p,
        "{\"id\": \"a\", \"text\": \"x\"}\n{\"id\": \"a\", \"text\": \"y\"}\n",
    )
    .unwrap();
    let cfg = config(dir.path(), &p, "");
    let msg = SearchIndex::open_or_build(cfg.search().unwrap(), &mut NoProgress)
        .err()
        .unwrap()
        .to_string();
    assert!(
        msg.contains("docs.jsonl line 2") && msg.contains("duplicate"),
        "{msg}"
    );
}

#[test]
fn many_threads_search_one_index() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = write_corpus(dir.path(), 200);
    let cfg = config(dir.path(), &corpus, "");
    let (idx, _) = SearchIndex::open_or_build(cfg.search().unwrap(), &mut NoProgress).unwrap();
    let idx = Arc::new(idx);
    let expected_bm25 = idx.bm25().search("heat transfer", 10).unwrap();
    let expected_vec = idx.vector().search("heat transfer", 10).unwrap();
    std::thread::scope(|s| {
        for _ in 0..16 {
            let idx = idx.clone();
            let (eb, ev) = (&expected_bm25, &expected_vec);
            s.spawn(move || {
                for _ in 0..20 {
                    assert_eq!(&idx.bm25().search("heat transfer", 10).unwrap(), eb);
                    assert_eq!(&idx.vector().search("heat transfer", 10).unwrap(), ev);
                }
            });
        }
    });
}

#[test]
fn cranfield_bm25_is_in_the_expected_range() {
    let root = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "[search]\ncorpus = '{}'\nindex_dir = '{}'\nembedder = 'hash'\nskip_bad_rows = true\n[search.columns]\nid = 'doc_id'\n",
        root.join("data/cranfield/docs.jsonl").display(),
        dir.path().join("idx").display()
    );
    let cfg = Config::from_toml_str(&text, &dir.path().join("c.toml")).unwrap();
    let (idx, report) = SearchIndex::open_or_build(cfg.search().unwrap(), &mut NoProgress).unwrap();
    // Docs 471 and 995 are empty in the source collection: skipped and reported.
    assert_eq!(report.docs, 1398);
    assert_eq!(report.ingest.skipped, 2);
    assert_eq!(
        report
            .ingest
            .examples
            .iter()
            .map(|e| e.0)
            .collect::<Vec<_>>(),
        vec![471, 995]
    );
    let qs = queries::load(&root.join("data/cranfield/queries.tsv")).unwrap();
    let qrels = Qrels::load(&root.join("data/cranfield/qrels.trec")).unwrap();
    assert_eq!(
        (qs.len(), qrels.num_queries(), qrels.num_judgments()),
        (225, 225, 1837)
    );
    let run: HashMap<String, Vec<String>> = qs
        .iter()
        .map(|q| {
            let hits = idx.bm25().search(&q.text, 100).unwrap();
            (q.id.clone(), hits.into_iter().map(|h| h.doc_id).collect())
        })
        .collect();
    let s = evaluate_run(&run, &qrels);
    // The collection README's plain BM25 (k1 0.9, b 0.4) scores 0.334; tantivy's BM25 with
    // stemming and stop words lands near it. A broken analyzer, ranking or metric falls far below.
    assert!(
        s.mean.ndcg_at_10 > 0.30 && s.mean.ndcg_at_10 < 0.50,
        "{:?}",
        s.mean
    );
    assert!(s.mean.recall_at_100 > 0.6, "{:?}", s.mean);
}
