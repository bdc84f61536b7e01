//! hnsw_rs (the graph library the vector tool was first built on) against mtrl's own HNSW, on
//! the same unit vectors, same M / ef_construction, one query at a time on one thread: build
//! seconds, QPS and recall@10 against exact search at ef 16…256. The measurement behind the
//! design note in `src/vector/hnsw.rs`.
//!
//! cargo run --release -p mtrl-search --example hnsw_compare -- \
//!     INDEX_DIR/embeddings/embeddings.f32 MODEL_DIR QUERIES.tsv

use std::sync::Arc;
use std::time::Instant;

use hnsw_rs::prelude::{DistCosine, DistDot, Hnsw};
use mtrl_search::embed::BertEmbedder;
use mtrl_search::vector::Embeddings;
use mtrl_search::{queries, Embedder};

fn recall(found: &[Vec<usize>], exact: &[Vec<usize>]) -> f64 {
    let hit: usize = found
        .iter()
        .zip(exact)
        .map(|(f, e)| f.iter().filter(|x| e.contains(x)).count())
        .sum();
    hit as f64 / exact.iter().map(Vec::len).sum::<usize>().max(1) as f64
}

fn sweep(
    name: &str,
    build_s: f64,
    search: &dyn Fn(&[f32], usize) -> Vec<usize>,
    qs: &[Vec<f32>],
    exact: &[Vec<usize>],
) {
    for ef in [16, 32, 64, 128, 256] {
        let found: Vec<Vec<usize>> = qs.iter().map(|q| search(q, ef)).collect();
        let t = Instant::now();
        for _ in 0..5 {
            for q in qs {
                std::hint::black_box(search(q, ef));
            }
        }
        let qps = 5.0 * qs.len() as f64 / t.elapsed().as_secs_f64();
        println!(
            "{{\"impl\": \"{name}\", \"build_s\": {build_s:.3}, \"ef\": {ef}, \"qps\": {qps:.0}, \"recall_at_10\": {:.4}}}",
            recall(&found, exact)
        );
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, emb, model, queries_file] = args.as_slice() else {
        eprintln!("usage: hnsw_compare EMBEDDINGS.f32 MODEL_DIR QUERIES");
        std::process::exit(2);
    };
    let emb = Embeddings::load(emb.as_ref()).expect("embeddings");
    let e = BertEmbedder::load(model.as_ref(), &candle_core::Device::Cpu, 256, 64).expect("model");
    let texts: Vec<String> = queries::load(queries_file.as_ref())
        .expect("queries")
        .into_iter()
        .map(|q| q.text)
        .collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let qs = e.embed(&refs).expect("embed");
    let exact: Vec<Vec<usize>> = qs
        .iter()
        .map(|q| emb.exact_search(q, 10).into_iter().map(|x| x.0).collect())
        .collect();
    let rows: Vec<Vec<f32>> = (0..emb.len()).map(|i| emb.row(i).to_vec()).collect();
    let with_ids: Vec<(&Vec<f32>, usize)> = rows.iter().zip(0..).collect();

    let t = Instant::now();
    let cos: Hnsw<f32, DistCosine> = Hnsw::new(16, emb.len(), 16, 200, DistCosine {});
    cos.parallel_insert(&with_ids);
    let b = t.elapsed().as_secs_f64();
    sweep(
        "hnsw_rs DistCosine",
        b,
        &|q, ef| cos.search(q, 10, ef).into_iter().map(|n| n.d_id).collect(),
        &qs,
        &exact,
    );

    // hnsw_rs's DistDot asserts `1 − a·b ≥ 0`, which f32 rounding breaks for unit vectors
    // (a·a can come out a hair above 1): it panics on these embeddings.
    let t = Instant::now();
    let built = std::panic::catch_unwind(|| {
        let dot: Hnsw<f32, DistDot> = Hnsw::new(16, emb.len(), 16, 200, DistDot {});
        dot.parallel_insert(&with_ids);
        dot
    });
    let b = t.elapsed().as_secs_f64();
    match built {
        Ok(dot) => sweep("hnsw_rs DistDot", b, &|q, ef| dot.search(q, 10, ef).into_iter().map(|n| n.d_id).collect(), &qs, &exact),
        Err(_) => println!("{{\"impl\": \"hnsw_rs DistDot\", \"error\": \"panicked while building (assertion dot >= 0)\"}}"),
    }

    let dir = tempfile::tempdir().expect("tmp");
    let t = Instant::now();
    mtrl_search::vector::build_graph(dir.path(), &emb, 16, 200, true).expect("build");
    let b = t.elapsed().as_secs_f64();
    let corpus = Arc::new(
        mtrl_search::Corpus::from_documents(
            (0..emb.len())
                .map(|i| mtrl_search::Document {
                    id: i.to_string(),
                    title: String::new(),
                    text: "x".into(),
                })
                .collect(),
        )
        .expect("corpus"),
    );
    let mut idx =
        mtrl_search::VectorIndex::open(dir.path(), corpus, Arc::new(e), Arc::new(emb), 64, 10)
            .expect("open");
    let cell = std::cell::RefCell::new(&mut idx);
    sweep(
        "mtrl",
        b,
        &|q, ef| {
            let mut i = cell.borrow_mut();
            i.set_ef_search(ef);
            i.search_vector(q, 10).into_iter().map(|x| x.0).collect()
        },
        &qs,
        &exact,
    );
}
