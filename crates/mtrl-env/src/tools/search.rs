//! `bm25_search(query, k)` / `vector_search(query, k)`: a search tool over any retriever.
//!
//! The response is a JSON array `[{"doc_id", "title", "snippet"}, …]`, best first, each snippet
//! cut to `snippet_words` words (after the search crate's own `snippet_chars` cut). JSON because
//! models read it well and scripted policies parse it exactly. `env.hits` picks a shorter form:
//! `[{"doc_id", "title"}, …]` or the bare ids `["12", "884", …]`.

use std::sync::Arc;

use mtrl_core::config::HitFormat;
use mtrl_search::{Hit, Retriever, SearchIndex};
use serde_json::{json, Value};

use crate::tool::{function_schema, Args, Tool, ToolError, ToolOutput};

/// One of a [`SearchIndex`]'s retrievers (`bm25` or `vector`), shareable as `Arc<dyn Retriever>`.
pub struct IndexRetriever {
    index: Arc<SearchIndex>,
    which: &'static str,
}

impl IndexRetriever {
    /// `which` is `"bm25"` or `"vector"`; `None` for any other name.
    pub fn new(index: Arc<SearchIndex>, which: &str) -> Option<IndexRetriever> {
        let which = match which {
            "bm25" => "bm25",
            "vector" => "vector",
            _ => return None,
        };
        Some(IndexRetriever { index, which })
    }
}

impl Retriever for IndexRetriever {
    fn name(&self) -> &'static str {
        self.which
    }

    fn search(&self, query: &str, k: usize) -> mtrl_search::Result<Vec<Hit>> {
        match self.which {
            "bm25" => self.index.bm25().search(query, k),
            _ => self.index.vector().search(query, k),
        }
    }
}

/// A search tool.
pub struct SearchTool {
    name: String,
    description: String,
    retriever: Arc<dyn Retriever>,
    default_k: usize,
    max_k: usize,
    snippet_words: usize,
    format: HitFormat,
    optional_query: bool,
}

impl SearchTool {
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        retriever: Arc<dyn Retriever>,
        default_k: usize,
        max_k: usize,
        snippet_words: usize,
    ) -> SearchTool {
        SearchTool {
            name: name.into(),
            description: description.into(),
            retriever,
            default_k: default_k.clamp(1, max_k.max(1)),
            max_k: max_k.max(1),
            snippet_words,
            format: HitFormat::Full,
            optional_query: false,
        }
    }

    /// Marks `query` optional in the schema: the environment searches for the task's question
    /// when a call leaves it out (`env.default_query`, see [`crate::shortcuts`]).
    pub fn with_optional_query(mut self, optional: bool) -> SearchTool {
        self.optional_query = optional;
        self
    }

    /// Shows hits in `format` (default [`HitFormat::Full`]).
    pub fn with_format(mut self, format: HitFormat) -> SearchTool {
        const FULL: &str = "with id, title and a snippet.";
        let shown = match format {
            HitFormat::Full => FULL,
            HitFormat::Titles => "with id and title.",
            HitFormat::Ids => "as a list of document ids.",
        };
        self.description = self.description.replace(FULL, shown);
        self.format = format;
        self
    }

    /// The same tool over `f(retriever)` (e.g. a memoizing wrapper).
    pub fn map_retriever(
        mut self,
        f: impl FnOnce(Arc<dyn Retriever>) -> Arc<dyn Retriever>,
    ) -> Self {
        self.retriever = f(self.retriever);
        self
    }

    /// `bm25_search` over the index's BM25 retriever.
    pub fn bm25(index: Arc<SearchIndex>, default_k: usize, max_k: usize, words: usize) -> Self {
        let r = IndexRetriever {
            index,
            which: "bm25",
        };
        SearchTool::new(
            "bm25_search",
            "Keyword search (BM25) over the document collection. Returns the best matching documents with id, title and a snippet.",
            Arc::new(r),
            default_k,
            max_k,
            words,
        )
    }

    /// `vector_search` over the index's embedding retriever.
    pub fn vector(index: Arc<SearchIndex>, default_k: usize, max_k: usize, words: usize) -> Self {
        let r = IndexRetriever {
            index,
            which: "vector",
        };
        SearchTool::new(
            "vector_search",
            "Semantic (embedding) search over the document collection. Returns the most similar documents with id, title and a snippet.",
            Arc::new(r),
            default_k,
            max_k,
            words,
        )
    }
}

/// The first `words` whitespace-separated words of `text`, with `…` when cut.
pub fn cut_words(text: &str, words: usize) -> String {
    let mut it = text.split_whitespace();
    let kept: Vec<&str> = it.by_ref().take(words).collect();
    let mut s = kept.join(" ");
    if it.next().is_some() && !s.ends_with('…') {
        s.push('…');
    }
    s
}

impl Tool for SearchTool {
    fn name(&self) -> &str {
        &self.name
    }

    fn schema(&self) -> Value {
        function_schema(
            &self.name,
            &self.description,
            json!({
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": if self.optional_query {
                        "The search query (default: the user's question)."
                    } else {
                        "The search query."
                    }},
                    "k": {
                        "type": "integer",
                        "description": format!("Number of results (1 to {}, default {}).", self.max_k, self.default_k),
                    }
                },
                "required": if self.optional_query { json!([]) } else { json!(["query"]) }
            }),
        )
    }

    fn call(&self, arguments: &Value) -> Result<ToolOutput, ToolError> {
        let args = Args::new(&self.name, arguments, &["query", "k"])?;
        let query = args.string("query")?;
        let k = args
            .opt_int_in("k", 1, self.max_k)?
            .unwrap_or(self.default_k);
        let hits = self
            .retriever
            .search(query, k)
            .map_err(|e| ToolError::Fatal(e.into()))?;
        let list: Vec<Value> = hits
            .iter()
            .map(|h| match self.format {
                HitFormat::Full => {
                    json!({"doc_id": h.doc_id, "title": h.title, "snippet": cut_words(&h.snippet, self.snippet_words)})
                }
                HitFormat::Titles => json!({"doc_id": h.doc_id, "title": h.title}),
                HitFormat::Ids => json!(h.doc_id),
            })
            .collect();
        let ids = hits.into_iter().map(|h| h.doc_id).collect();
        Ok(ToolOutput::text(Value::Array(list).to_string()).with_ids(ids))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed;

    impl Retriever for Fixed {
        fn name(&self) -> &'static str {
            "fixed"
        }
        fn search(&self, _q: &str, k: usize) -> mtrl_search::Result<Vec<Hit>> {
            Ok((0..k)
                .map(|i| Hit {
                    doc_id: format!("d{i}"),
                    score: 1.0,
                    title: "T".into(),
                    snippet: "one two three four".into(),
                })
                .collect())
        }
    }

    #[test]
    fn lists_hits_and_checks_k() {
        let t = SearchTool::new("s", "d", Arc::new(Fixed), 2, 5, 2);
        let out = t.call(&json!({"query": "x"})).unwrap();
        let v: Value = serde_json::from_str(&out.content).unwrap();
        assert_eq!(v.as_array().unwrap().len(), 2);
        assert_eq!(v[1]["doc_id"], "d1");
        assert_eq!(out.ids, vec!["d0", "d1"]);
        assert_eq!(v[0]["snippet"], "one two…");
        assert!(t.call(&json!({"query": "x", "k": 6})).is_err());
        assert!(t.call(&json!({"query": "x", "k": 0})).is_err());
        assert!(t.call(&json!({"k": 1})).is_err());
        assert_eq!(t.schema()["function"]["name"], "s");
        assert_eq!(cut_words("a  b", 5), "a b");
    }

    #[test]
    fn shorter_hit_formats() {
        let t = SearchTool::new("s", "d", Arc::new(Fixed), 2, 5, 2).with_format(HitFormat::Ids);
        let out = t.call(&json!({"query": "x"})).unwrap();
        assert_eq!(out.content, r#"["d0","d1"]"#);
        assert_eq!(crate::scripted::hit_ids(&out.content), vec!["d0", "d1"]);
        let t = SearchTool::new("s", "d", Arc::new(Fixed), 1, 5, 2).with_format(HitFormat::Titles);
        let out = t.call(&json!({"query": "x"})).unwrap();
        assert_eq!(out.content, r#"[{"doc_id":"d0","title":"T"}]"#);
    }
}
