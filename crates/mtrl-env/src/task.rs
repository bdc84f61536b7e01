//! A task: one episode's input. For the built-in search environment the row's `prompt` is JSON
//! `{"query": "…", "qrels": {"doc_id": grade, …}}` with optional `messages` (prepended to the
//! conversation, e.g. few-shot turns), `answers` (reference answers for exact-match) and
//! `metadata` (kept, not interpreted).
//!
//! Invariant: the raw prompt is kept as-is (`Task::prompt`), so custom environments can interpret
//! it their own way; [`SearchTask::parse`] is the built-in interpretation.

use std::collections::HashMap;

use mtrl_core::Message;
use serde::Deserialize;
use serde_json::Value;

use crate::error::{EnvError, Result};

/// A task row: an id and the raw prompt column.
#[derive(Debug, Clone, PartialEq)]
pub struct Task {
    pub id: String,
    /// The `prompt` column (else the first column), as a string: JSON objects are serialised.
    pub prompt: String,
}

/// The built-in search environment's reading of a task prompt.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SearchTask {
    pub id: String,
    pub query: String,
    /// Judgments: doc id → grade (grades ≤ 0 are non-relevant).
    pub qrels: HashMap<String, i32>,
    /// Reference answers for QA-style rewards.
    pub answers: Vec<String>,
    /// Messages placed between the system prompt and the user query.
    pub messages: Vec<Message>,
    pub metadata: Option<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PromptSpec {
    query: String,
    #[serde(default)]
    qrels: HashMap<String, Value>,
    #[serde(default)]
    answers: Vec<String>,
    #[serde(default)]
    answer: Option<String>,
    #[serde(default)]
    messages: Vec<Message>,
    #[serde(default)]
    metadata: Option<Value>,
}

impl SearchTask {
    /// Parses a task's prompt; errors name the task and what was expected.
    pub fn parse(task: &Task) -> Result<SearchTask> {
        let bad = |message: String| EnvError::BadTask {
            task: task.id.clone(),
            message,
        };
        let spec: PromptSpec = serde_json::from_str(&task.prompt).map_err(|e| {
            bad(format!(
                "prompt is not {{\"query\": …, \"qrels\": {{…}}}} JSON: {e}"
            ))
        })?;
        if spec.query.trim().is_empty() {
            return Err(bad("empty query".into()));
        }
        let mut qrels = HashMap::with_capacity(spec.qrels.len());
        for (doc, grade) in spec.qrels {
            let g = match &grade {
                Value::Number(n) => n.as_i64().or_else(|| {
                    n.as_f64()
                        .filter(|f| f.fract() == 0.0 && f.abs() < 1e9)
                        .map(|f| f as i64)
                }),
                Value::String(s) => s.trim().parse().ok(),
                Value::Bool(b) => Some(*b as i64),
                _ => None,
            };
            let g = g
                .and_then(|g| i32::try_from(g).ok())
                .ok_or_else(|| bad(format!("grade of `{doc}` is not an integer: {grade}")))?;
            qrels.insert(doc, g);
        }
        let mut answers = spec.answers;
        answers.extend(spec.answer);
        Ok(SearchTask {
            id: task.id.clone(),
            query: spec.query,
            qrels,
            answers,
            messages: spec.messages,
            metadata: spec.metadata,
        })
    }

    /// The prompt JSON of a query with judgments (what `mtrl data prepare` writes).
    pub fn prompt_json(query: &str, qrels: &HashMap<String, i32>) -> String {
        // A struct and a BTreeMap: the key order is fixed whatever serde_json's features.
        #[derive(serde::Serialize)]
        struct Prompt<'a> {
            query: &'a str,
            qrels: std::collections::BTreeMap<&'a str, i32>,
        }
        let p = Prompt {
            query,
            qrels: qrels.iter().map(|(d, g)| (d.as_str(), *g)).collect(),
        };
        serde_json::to_string(&p).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(prompt: &str) -> Task {
        Task {
            id: "t1".into(),
            prompt: prompt.into(),
        }
    }

    #[test]
    fn parses_query_and_grades() {
        let t = SearchTask::parse(&task(
            r#"{"query":"wings","qrels":{"d1":2,"d2":"1","d3":1.0},"answer":"x","metadata":{"a":1}}"#,
        ))
        .unwrap();
        assert_eq!(t.query, "wings");
        assert_eq!(t.qrels["d1"], 2);
        assert_eq!(t.qrels["d2"], 1);
        assert_eq!(t.qrels["d3"], 1);
        assert_eq!(t.answers, vec!["x".to_string()]);
        let json = SearchTask::prompt_json("q", &t.qrels);
        assert_eq!(json, r#"{"query":"q","qrels":{"d1":2,"d2":1,"d3":1}}"#);
    }

    #[test]
    fn bad_prompts_name_the_task() {
        for p in [
            "not json",
            r#"{"qrels":{}}"#,
            r#"{"query":"  "}"#,
            r#"{"query":"q","qrels":{"d":"high"}}"#,
            r#"{"query":"q","qrels":{"d":1.5}}"#,
            r#"{"query":"q","extra":1}"#,
        ] {
            let msg = SearchTask::parse(&task(p)).unwrap_err().to_string();
            assert!(msg.starts_with("task t1:"), "{p}: {msg}");
        }
    }
}
