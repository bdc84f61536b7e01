//! Embedding latency of single queries and throughput of a batch, for profiling the CPU BERT
//! path: `cargo run --release -p mtrl-search --example embed_latency -- MODEL_DIR QUERIES [N]`.
use std::time::Instant;

use mtrl_search::embed::BertEmbedder;
use mtrl_search::{queries, Embedder};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let e =
        BertEmbedder::load(args[1].as_ref(), &candle_core::Device::Cpu, 256, 64).expect("model");
    let texts: Vec<String> = queries::load(args[2].as_ref())
        .expect("queries")
        .into_iter()
        .map(|q| q.text)
        .collect();
    let rounds: usize = args.get(3).and_then(|n| n.parse().ok()).unwrap_or(3);
    for _ in 0..rounds {
        let t = Instant::now();
        for q in &texts {
            std::hint::black_box(e.embed(&[q.as_str()]).expect("embed"));
        }
        let one = t.elapsed().as_secs_f64() * 1e3 / texts.len() as f64;
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let t = Instant::now();
        std::hint::black_box(e.embed(&refs).expect("embed"));
        let all = t.elapsed().as_secs_f64() * 1e3 / texts.len() as f64;
        println!("one at a time {one:.2} ms/query, all at once {all:.2} ms/query");
    }
}
