//! `submit(doc_ids, answer?)`: the final answer, a ranked list of document ids (and, for QA
//! tasks, an optional answer text).
//!
//! The list is cleaned before scoring: ids are trimmed, later duplicates dropped, ids the corpus
//! does not know dropped (when a corpus is attached) and the list cut to `final_k`. An empty list
//! is a valid (zero-scoring) answer; a missing or mistyped `doc_ids` is an error the model can fix.
//! With [`SubmitExcess::Refuse`] (`env.submit_excess = "refuse"`) a list of more than `final_k`
//! entries is such an error too, so the length of the list is the model's choice and writing past
//! `final_k` is never free.

use std::collections::HashSet;
use std::sync::Arc;

use mtrl_core::config::SubmitExcess;
use mtrl_search::Corpus;
use serde_json::{json, Value};

use crate::tool::{function_schema, Answer, Args, Tool, ToolError, ToolOutput};

pub struct SubmitTool {
    final_k: usize,
    corpus: Option<Arc<Corpus>>,
    hits: bool,
    rrf: bool,
    excess: SubmitExcess,
}

impl SubmitTool {
    /// `corpus`: when given, ids it does not contain are ignored.
    pub fn new(final_k: usize, corpus: Option<Arc<Corpus>>) -> SubmitTool {
        SubmitTool {
            final_k,
            corpus,
            hits: false,
            rrf: false,
            excess: SubmitExcess::Cut,
        }
    }

    /// What a list of more than `final_k` entries gets (`env.submit_excess`).
    pub fn with_excess(mut self, excess: SubmitExcess) -> SubmitTool {
        self.excess = excess;
        self
    }

    /// Lists `hits` (ranks into the episode's search results, numbered in call order) and
    /// `top`/`interleave` (the first distinct hits) in the schema; the environment resolves them
    /// into `doc_ids` (`env.submit_hits`, see [`crate::shortcuts`]).
    pub fn with_hits(mut self, hits: bool) -> SubmitTool {
        self.hits = hits;
        self
    }

    /// Also lists `rrf` (with `top`: reciprocal-rank fusion of the searches) in the schema
    /// (`env.submit_rrf`; needs `with_hits`).
    pub fn with_rrf(mut self, rrf: bool) -> SubmitTool {
        self.rrf = rrf;
        self
    }
}

/// Trims, de-duplicates (first occurrence wins), drops unknown ids and cuts to `k`; returns the
/// kept ids and the dropped unknown ones.
pub fn clean_ids(
    ids: &[String],
    known: impl Fn(&str) -> bool,
    k: usize,
) -> (Vec<String>, Vec<String>) {
    let mut seen = HashSet::new();
    let mut kept = Vec::new();
    let mut unknown = Vec::new();
    for id in ids {
        let id = id.trim();
        if id.is_empty() || !seen.insert(id.to_string()) {
            continue;
        }
        if known(id) {
            if kept.len() < k {
                kept.push(id.to_string());
            }
        } else {
            unknown.push(id.to_string());
        }
    }
    (kept, unknown)
}

impl Tool for SubmitTool {
    fn name(&self) -> &str {
        "submit"
    }

    fn schema(&self) -> Value {
        let refuse = self.excess == SubmitExcess::Refuse;
        let limit = if refuse {
            format!("at most {}", self.final_k)
        } else {
            format!("at most {} are scored", self.final_k)
        };
        let mut properties = json!({
            "doc_ids": {
                "type": "array",
                "items": {"type": "string"},
                "description": format!("Document ids, most relevant first ({limit})."),
            }
        });
        if refuse {
            properties["doc_ids"]["maxItems"] = self.final_k.into();
        }
        let mut required = json!(["doc_ids"]);
        if self.hits {
            properties["hits"] = json!({
                "type": "array",
                "items": {"type": "integer"},
                "description": "Instead of doc_ids: 1-based ranks of the hits shown so far (every search numbered in order, the second continuing after the first), most relevant first.",
            });
            if refuse {
                properties["hits"]["maxItems"] = self.final_k.into();
                properties["hits"]["description"] = format!(
                    "Instead of doc_ids: 1-based ranks of the hits shown so far (every search numbered in order, the second continuing after the first), most relevant first ({limit})."
                )
                .into();
            }
            properties["top"] = json!({
                "type": "integer",
                "minimum": 1,
                "description": format!("Instead of doc_ids or hits: submit the first `top` distinct hits shown so far ({limit})."),
            });
            if refuse {
                properties["top"]["maximum"] = self.final_k.into();
            }
            properties["interleave"] = json!({
                "type": "boolean",
                "description": "With `top`: take the hits round-robin across the searches (1st of each, then 2nd of each, …) instead of one search after the other.",
            });
            if self.rrf {
                properties["rrf"] = json!({
                    "type": "boolean",
                    "description": "With `top`: fuse the searches by reciprocal rank (hits found by several searches first, then by rank) instead of one search after the other.",
                });
            }
            required = json!([]);
        }
        function_schema(
            "submit",
            "Submit the final answer: the ids of the most relevant documents, best first. This ends the episode.",
            json!({"type": "object", "properties": properties, "required": required}),
        )
    }

    fn call(&self, arguments: &Value) -> Result<ToolOutput, ToolError> {
        let args = Args::new("submit", arguments, &["doc_ids", "answer"])?;
        let text = args.opt_string("answer")?.map(str::to_string);
        let ids = if text.is_some() && !args.has("doc_ids") {
            Vec::new()
        } else {
            args.id_list("doc_ids")?
        };
        if self.excess == SubmitExcess::Refuse && ids.len() > self.final_k {
            return Err(ToolError::Invalid(format!(
                "submit takes at most {} documents; {} were listed",
                self.final_k,
                ids.len()
            )));
        }
        let corpus = self.corpus.clone();
        let known = |id: &str| corpus.as_ref().is_none_or(|c| c.ord_of(id).is_some());
        let (doc_ids, unknown) = clean_ids(&ids, known, self.final_k);
        let mut content = format!("submitted {} documents", doc_ids.len());
        if !unknown.is_empty() {
            content.push_str(&format!("; ignored unknown ids: {}", unknown.join(", ")));
        }
        Ok(ToolOutput {
            content,
            ids: doc_ids.clone(),
            answer: Some(Answer { doc_ids, text }),
        })
    }

    fn is_final(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cleans_the_list() {
        let ids: Vec<String> = ["a", " b", "a", "zz", "c", "d"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let (kept, unknown) = clean_ids(&ids, |id| id != "zz", 3);
        assert_eq!(kept, vec!["a", "b", "c"]);
        assert_eq!(unknown, vec!["zz"]);
    }

    #[test]
    fn submit_checks_arguments() {
        let t = SubmitTool::new(2, None);
        let out = t.call(&json!({"doc_ids": ["x", 5, "x", "y"]})).unwrap();
        assert_eq!(out.answer.unwrap().doc_ids, vec!["x", "5"]);
        assert!(t.call(&json!({})).is_err());
        assert!(t.call(&json!({"doc_ids": {"a": 1}})).is_err());
        let empty = t.call(&json!({"doc_ids": []})).unwrap();
        assert!(empty.answer.unwrap().doc_ids.is_empty());
        let qa = t.call(&json!({"answer": "Paris"})).unwrap().answer.unwrap();
        assert_eq!(qa.text.as_deref(), Some("Paris"));
        assert!(t.is_final());
    }

    #[test]
    fn refuse_rejects_a_list_longer_than_final_k_and_cut_scores_its_head() {
        let ids = json!({"doc_ids": ["a", "b", "c"]});
        let cut = SubmitTool::new(2, None);
        assert_eq!(
            cut.call(&ids).unwrap().answer.unwrap().doc_ids,
            vec!["a", "b"]
        );
        assert!(
            cut.schema()["function"]["parameters"]["properties"]["doc_ids"]
                .get("maxItems")
                .is_none()
        );
        let refuse = SubmitTool::new(2, None).with_excess(SubmitExcess::Refuse);
        match refuse.call(&ids) {
            Err(ToolError::Invalid(m)) => {
                assert!(m.contains("at most 2") && m.contains("3"), "{m}")
            }
            other => panic!("{:?}", other.map(|o| o.content)),
        }
        // Duplicates count: the list the model wrote is what is bounded.
        assert!(refuse.call(&json!({"doc_ids": ["a", "a", "a"]})).is_err());
        let two = refuse.call(&json!({"doc_ids": ["a", "b"]})).unwrap();
        assert_eq!(two.answer.unwrap().doc_ids, vec!["a", "b"]);
        let schema = refuse.with_hits(true).schema();
        let props = &schema["function"]["parameters"]["properties"];
        assert_eq!(props["doc_ids"]["maxItems"], 2);
        assert_eq!(props["hits"]["maxItems"], 2);
        assert_eq!(props["top"]["maximum"], 2);
        assert!(props["interleave"].is_object());
        let plain = SubmitTool::new(2, None).schema();
        assert!(plain["function"]["parameters"]["properties"]
            .get("top")
            .is_none());
    }
}
