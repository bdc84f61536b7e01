//! Retrieval for mtrl's search agent: corpus ingest, a BM25 tool (tantivy), a vector tool (HNSW
//! over sentence embeddings from a candle BERT or a hashing embedder), and IR metrics.
//!
//! The agent calls tools by name with free text written by a model, so the query path is built to
//! never fail on text: BM25 queries are analysed into plain terms (no query language), and the
//! vector tool embeds whatever it gets. Both tools implement [`Retriever`], return [`Hit`]s and are
//! `Send + Sync`: one index serves every rollout task at once.
//!
//! [`SearchIndex::open_or_build`] owns the on-disk layout of `index_dir`: a `manifest.json`
//! (with `format_version`) records which corpus (sha256), settings and embedder each part was
//! built from; a part whose inputs changed is rebuilt, the rest is reused. Every part is written to
//! a temporary folder and renamed into place, and the manifest is written last, so a crash
//! mid-build never leaves an index that looks valid.
//!
//! Invariants: no tokio here (callers put blocking work on their own threads); no network; pure
//! metric functions in [`metrics`] do no IO.

pub mod bm25;
pub mod corpus;
pub mod embed;
pub mod error;
pub mod index;
mod kernels;
pub mod metrics;
mod packed;
pub mod qrels;
pub mod queries;
mod readers;
pub mod tool_eval;
pub mod vector;

use serde::Serialize;

pub use bm25::Bm25Index;
pub use corpus::{Corpus, Document, IngestReport};
pub use embed::{BertEmbedder, Embedder, HashEmbedder};
pub use error::{Result, SearchError};
pub use index::{BuildReport, Progress, SearchIndex};
pub use qrels::Qrels;
pub use queries::Query;
pub use vector::VectorIndex;

/// One search result, as shown to the agent and on the command line.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Hit {
    pub doc_id: String,
    pub score: f32,
    pub title: String,
    pub snippet: String,
}

/// A search tool over one corpus. Implementations are safe to share across threads.
pub trait Retriever: Send + Sync {
    /// Short tool name (`bm25`, `vector`).
    fn name(&self) -> &'static str;
    /// The `k` best documents for `query`, best first. Never fails on unusual text; `k = 0` or an
    /// empty query give no hits.
    fn search(&self, query: &str, k: usize) -> Result<Vec<Hit>>;
}

/// Cuts `text` to at most `max_chars` characters at a word boundary, adding `…` when cut.
pub fn snippet(text: &str, max_chars: usize) -> String {
    if text.chars().count() <= max_chars {
        return text.to_string();
    }
    let cut: String = text.chars().take(max_chars).collect();
    let cut = match cut.rfind(char::is_whitespace) {
        Some(i) if i > max_chars / 2 => cut[..i].to_string(),
        _ => cut,
    };
    format!("{}…", cut.trim_end())
}

#[cfg(test)]
mod tests {
    use super::snippet;

    #[test]
    fn snippet_cuts_at_word_boundary() {
        assert_eq!(snippet("short", 10), "short");
        assert_eq!(snippet("alpha beta gamma delta", 12), "alpha beta…");
        // Multi-byte characters are counted as characters, never split.
        assert_eq!(snippet("ééééé", 3), "ééé…");
    }
}
