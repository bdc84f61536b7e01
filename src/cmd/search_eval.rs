//! `mtrl search-eval`: retrieval baselines of both tools on a judged query set
//! (`mtrl_search::tool_eval`), as a Markdown table or JSON.

use std::path::PathBuf;

use anyhow::{Context, Result};
use mtrl_search::tool_eval::evaluate_tools;
use mtrl_train::setup::open_index;

use super::common::{load_config, print_pretty};

#[derive(clap::Args, Debug)]
pub struct SearchEvalArgs {
    /// TOML config with a [search] section.
    #[arg(long, short)]
    pub config: PathBuf,
    /// Query file (TSV `id<TAB>text` or JSONL); defaults to [search.eval] queries.
    #[arg(long)]
    pub queries: Option<PathBuf>,
    /// Qrels file (TREC or TSV); defaults to [search.eval] qrels.
    #[arg(long)]
    pub qrels: Option<PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &SearchEvalArgs) -> Result<()> {
    let cfg = load_config(Some(&args.config))?;
    let eval = cfg.search()?.eval.as_ref();
    let src = cfg.source.display();
    let queries_file = args
        .queries
        .clone()
        .or_else(|| eval.map(|e| e.queries.clone()))
        .with_context(|| format!("no --queries given and {src} has no [search.eval] queries"))?;
    let qrels_file = args
        .qrels
        .clone()
        .or_else(|| eval.map(|e| e.qrels.clone()))
        .with_context(|| format!("no --qrels given and {src} has no [search.eval] qrels"))?;
    let (index, build) = open_index(&cfg, args.json)?;
    let report = evaluate_tools(&cfg.name, &index, &queries_file, &qrels_file)?;
    if args.json {
        return print_pretty(&report);
    }
    eprintln!("{build}");
    println!();
    print!("{report}");
    Ok(())
}
