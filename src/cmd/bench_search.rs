//! `mtrl bench search`: index build speed, query throughput and latency, and HNSW recall against
//! exact search, as one JSON object (`mtrl_eval::bench_search`).

use std::path::PathBuf;

use anyhow::Result;
use mtrl_eval::bench_search::BenchSearchOptions;
use mtrl_train::telemetry::IndexBar;

use super::common::{load_config, print_pretty};

#[derive(clap::Args, Debug)]
pub struct BenchSearchArgs {
    /// TOML config with a [search] section (and [search.eval] queries).
    #[arg(long, short)]
    pub config: PathBuf,
    /// Query file; defaults to [search.eval] queries.
    #[arg(long)]
    pub queries: Option<PathBuf>,
    /// Concurrent tasks for the throughput run.
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    /// Hits per query.
    #[arg(short, long, default_value_t = 10)]
    pub k: usize,
    /// Passes over the query set in each throughput run.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Reuse the configured index instead of timing a fresh build in a temporary folder.
    #[arg(long)]
    pub skip_build: bool,
    /// ef_search values for the recall sweep (the configured one is always included).
    #[arg(long, value_delimiter = ',', default_value = "16,32,64,128,256")]
    pub ef_sweep: Vec<usize>,
    /// Documents embedded (twice) for the embedder's documents/s figure; 0 skips it.
    #[arg(long, default_value_t = 2000)]
    pub embed_docs: usize,
    /// The peer's JSON (`bench/search_peers.py --out FILE`): adds both sides and ratios.
    #[arg(long)]
    pub peer: Option<PathBuf>,
}

pub fn run(args: &BenchSearchArgs) -> Result<()> {
    let cfg = load_config(Some(&args.config))?;
    let opts = BenchSearchOptions {
        queries: args.queries.clone(),
        concurrency: args.concurrency,
        k: args.k,
        rounds: args.rounds,
        skip_build: args.skip_build,
        ef_sweep: args.ef_sweep.clone(),
        embed_docs: args.embed_docs,
        peer: args.peer.clone(),
    };
    let report = mtrl_eval::bench_search::bench_search(&cfg, &opts, &mut IndexBar::new(false))?;
    print_pretty(&report)
}
