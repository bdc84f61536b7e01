//! Retrieval baselines of both tools on a judged query set (`mtrl search-eval`): every judged
//! query through `bm25` and `vector` (top 100), scored with the trec_eval conventions of
//! [`crate::metrics`]. The report renders as a Markdown table ([`std::fmt::Display`]) or JSON.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::error::Result;
use crate::metrics::{evaluate_run, RunSummary};
use crate::{queries, Qrels, SearchIndex};

/// The scores of one tool.
#[derive(Debug, Serialize)]
pub struct ToolScores {
    pub tool: String,
    #[serde(flatten)]
    pub summary: RunSummary,
}

/// Both tools' scores on one query set.
#[derive(Debug, Serialize)]
pub struct ToolEvalReport {
    pub name: String,
    pub docs: usize,
    pub queries_file: PathBuf,
    pub qrels_file: PathBuf,
    /// Judged queries (those without text in the query file are scored 0).
    pub queries: usize,
    pub tools: Vec<ToolScores>,
}

/// Runs every judged query through both tools (top 100) and scores the runs.
pub fn evaluate_tools(
    name: &str,
    index: &SearchIndex,
    queries_file: &Path,
    qrels_file: &Path,
) -> Result<ToolEvalReport> {
    let qs = queries::load(queries_file)?;
    let qrels = Qrels::load(qrels_file)?;
    let judged: Vec<_> = qs
        .iter()
        .filter(|q| qrels.for_query(&q.id).is_some())
        .collect();
    let mut tools = Vec::new();
    for tool in [index.bm25() as &dyn crate::Retriever, index.vector()] {
        let mut run = HashMap::new();
        for q in &judged {
            let hits = tool.search(&q.text, 100)?;
            run.insert(
                q.id.clone(),
                hits.into_iter().map(|h| h.doc_id).collect::<Vec<_>>(),
            );
        }
        tools.push(ToolScores {
            tool: tool.name().to_string(),
            summary: evaluate_run(&run, &qrels),
        });
    }
    Ok(ToolEvalReport {
        name: name.to_string(),
        docs: index.corpus().len(),
        queries_file: queries_file.to_path_buf(),
        qrels_file: qrels_file.to_path_buf(),
        queries: qrels.num_queries(),
        tools,
    })
}

impl std::fmt::Display for ToolEvalReport {
    /// The report as a Markdown table, with the queries scored 0 listed below it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "{}: {} documents, {} judged queries\n",
            self.name, self.docs, self.queries
        )?;
        writeln!(f, "| tool   | nDCG@10 | recall@100 | MRR@10 | P@10   |")?;
        writeln!(f, "|--------|---------|------------|--------|--------|")?;
        for t in &self.tools {
            let m = &t.summary.mean;
            writeln!(
                f,
                "| {:<6} | {:.4}  | {:.4}     | {:.4} | {:.4} |",
                t.tool, m.ndcg_at_10, m.recall_at_100, m.mrr_at_10, m.precision_at_10
            )?;
        }
        let Some(t) = self.tools.first() else {
            return Ok(());
        };
        if !t.summary.without_relevant.is_empty() {
            writeln!(
                f,
                "\n{} judged queries have no relevant document (scored 0): {}",
                t.summary.without_relevant.len(),
                t.summary.without_relevant.join(", ")
            )?;
        }
        if !t.summary.missing_from_run.is_empty() {
            writeln!(
                f,
                "\n{} judged queries are missing from the query file (scored 0): {}",
                t.summary.missing_from_run.len(),
                t.summary.missing_from_run.join(", ")
            )?;
        }
        Ok(())
    }
}
