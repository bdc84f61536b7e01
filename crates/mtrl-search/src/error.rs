//! Errors of corpus ingest, indexing, embedding and search.

use std::path::PathBuf;

/// Result alias of `mtrl-search`.
pub type Result<T> = std::result::Result<T, SearchError>;

/// Everything that can go wrong in `mtrl-search`. Messages name the file and line or key involved.
#[derive(Debug, thiserror::Error)]
pub enum SearchError {
    #[error("cannot {action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A malformed row in a corpus, query or qrels file.
    #[error("{path} line {line}: {message}")]
    BadRow {
        path: PathBuf,
        line: u64,
        message: String,
    },
    #[error("{path} line {line}: duplicate document id `{id}` (first seen on line {first_line})")]
    DuplicateId {
        path: PathBuf,
        line: u64,
        id: String,
        first_line: u64,
    },
    #[error("{path}: unsupported file type (expected {expected})")]
    UnsupportedFormat {
        path: PathBuf,
        expected: &'static str,
    },
    #[error("{path}: no usable rows")]
    Empty { path: PathBuf },
    #[error("BM25 index {path}: {source}")]
    Tantivy {
        path: PathBuf,
        #[source]
        source: tantivy::TantivyError,
    },
    #[error("vector index {path}: {message}")]
    VectorIndex { path: PathBuf, message: String },
    #[error("index {path} is damaged: {message}")]
    Corrupt { path: PathBuf, message: String },
    #[error("embedder {path}: {message}")]
    Embedder { path: PathBuf, message: String },
    #[error("embedder forward pass failed: {0}")]
    Candle(#[from] candle_core::Error),
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

impl SearchError {
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> SearchError {
        let path = path.into();
        move |source| SearchError::Io {
            action,
            path,
            source,
        }
    }
}
