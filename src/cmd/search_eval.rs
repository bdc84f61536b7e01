//! `mtrl search-eval`: retrieval baselines of both tools on a judged query set.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use mtrl_core::Config;
use mtrl_search::metrics::{evaluate_run, RunSummary};
use mtrl_search::{queries, Qrels, SearchIndex};
use serde::Serialize;

use super::common::{load_config, open_index, print_build_report};

#[derive(clap::Args, Debug)]
pub struct SearchEvalArgs {
    #[arg(long, short)]
    pub config: PathBuf,
    /// Query file (TSV `id<TAB>text` or JSONL); defaults to [search.eval] queries.
    #[arg(long)]
    pub queries: Option<PathBuf>,
    /// Qrels file (TREC or TSV); defaults to [search.eval] qrels.
    #[arg(long)]
    pub qrels: Option<PathBuf>,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Serialize)]
pub struct ToolScores {
    pub tool: String,
    #[serde(flatten)]
    pub summary: RunSummary,
}

#[derive(Debug, Serialize)]
pub struct EvalReport {
    pub name: String,
    pub docs: usize,
    pub queries_file: PathBuf,
    pub qrels_file: PathBuf,
    /// Judged queries that had no text in the query file (scored 0).
    pub queries: usize,
    pub tools: Vec<ToolScores>,
}

/// Runs every judged query through both tools (top 100) and scores the runs.
pub fn evaluate(
    cfg: &Config,
    index: &SearchIndex,
    queries_file: &Path,
    qrels_file: &Path,
) -> Result<EvalReport> {
    let qs = queries::load(queries_file)?;
    let qrels = Qrels::load(qrels_file)?;
    let judged: Vec<_> = qs
        .iter()
        .filter(|q| qrels.for_query(&q.id).is_some())
        .collect();
    let mut tools = Vec::new();
    for name in ["bm25", "vector"] {
        let tool = index.retriever(name).context("unknown tool")?;
        let mut run = HashMap::new();
        for q in &judged {
            let hits = tool.search(&q.text, 100)?;
            run.insert(
                q.id.clone(),
                hits.into_iter().map(|h| h.doc_id).collect::<Vec<_>>(),
            );
        }
        tools.push(ToolScores {
            tool: name.to_string(),
            summary: evaluate_run(&run, &qrels),
        });
    }
    Ok(EvalReport {
        name: cfg.name.clone(),
        docs: index.corpus().len(),
        queries_file: queries_file.to_path_buf(),
        qrels_file: qrels_file.to_path_buf(),
        queries: qrels.num_queries(),
        tools,
    })
}

/// The report as a Markdown table.
pub fn print_table(r: &EvalReport) {
    println!(
        "{}: {} documents, {} judged queries",
        r.name, r.docs, r.queries
    );
    println!();
    println!("| tool   | nDCG@10 | recall@100 | MRR@10 | P@10   |");
    println!("|--------|---------|------------|--------|--------|");
    for t in &r.tools {
        let m = &t.summary.mean;
        println!(
            "| {:<6} | {:.4}  | {:.4}     | {:.4} | {:.4} |",
            t.tool, m.ndcg_at_10, m.recall_at_100, m.mrr_at_10, m.precision_at_10
        );
    }
    if let Some(t) = r.tools.first() {
        if !t.summary.without_relevant.is_empty() {
            println!(
                "\n{} judged queries have no relevant document (scored 0): {}",
                t.summary.without_relevant.len(),
                t.summary.without_relevant.join(", ")
            );
        }
        if !t.summary.missing_from_run.is_empty() {
            println!(
                "\n{} judged queries are missing from the query file (scored 0): {}",
                t.summary.missing_from_run.len(),
                t.summary.missing_from_run.join(", ")
            );
        }
    }
}

pub fn run(args: &SearchEvalArgs) -> Result<()> {
    let cfg = load_config(Some(&args.config))?;
    let search = cfg.search()?;
    let eval = search.eval.as_ref();
    let queries_file = args
        .queries
        .clone()
        .or_else(|| eval.map(|e| e.queries.clone()))
        .with_context(|| {
            format!(
                "no --queries given and {} has no [search.eval] queries",
                cfg.source.display()
            )
        })?;
    let qrels_file = args
        .qrels
        .clone()
        .or_else(|| eval.map(|e| e.qrels.clone()))
        .with_context(|| {
            format!(
                "no --qrels given and {} has no [search.eval] qrels",
                cfg.source.display()
            )
        })?;
    let (index, build) = open_index(&cfg, args.json)?;
    let report = evaluate(&cfg, &index, &queries_file, &qrels_file)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_build_report(&build);
        println!();
        print_table(&report);
    }
    Ok(())
}
