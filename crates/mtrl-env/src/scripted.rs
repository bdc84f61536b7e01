//! Scripted baselines: agents that drive the environment without a model, through the same tool
//! calls a model would write. They are the retrieval baselines of every results table and make
//! environment tests real without a model.
//!
//! - `bm25-once`: `bm25_search(query, k = final_k)`, then `submit` the ids in rank order;
//! - `vector-once`: the same with `vector_search`;
//! - `hybrid-rrf`: both searches in one message (k = `depth`), then `submit` the reciprocal-rank
//!   fusion (score = Σ 1 / (60 + rank), ties by first appearance, BM25 list first).
//!
//! They read only `Observation::query` and the tool responses, never the judgments.

use std::collections::HashMap;

use mtrl_core::ToolCall;
use serde_json::{json, Value};

use crate::env::{Action, Agent, Observation};
use crate::error::{EnvError, Result};
use crate::parser::format_tool_call;
use crate::search_env::last_tool_results;

/// RRF's rank constant (Cormack et al. 2009).
pub const RRF_K: f64 = 60.0;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Baseline {
    Bm25Once,
    VectorOnce,
    HybridRrf,
}

impl Baseline {
    pub const ALL: [Baseline; 3] = [
        Baseline::Bm25Once,
        Baseline::VectorOnce,
        Baseline::HybridRrf,
    ];

    pub fn parse(name: &str) -> Option<Baseline> {
        Baseline::ALL.into_iter().find(|b| b.name() == name)
    }

    pub fn name(&self) -> &'static str {
        match self {
            Baseline::Bm25Once => "bm25-once",
            Baseline::VectorOnce => "vector-once",
            Baseline::HybridRrf => "hybrid-rrf",
        }
    }
}

/// A scripted agent.
pub struct ScriptedAgent {
    kind: Baseline,
    final_k: usize,
    depth: usize,
}

impl ScriptedAgent {
    /// `final_k`: ids submitted; `depth`: results per search for the fusion (hybrid only).
    pub fn new(kind: Baseline, final_k: usize, depth: usize) -> ScriptedAgent {
        ScriptedAgent {
            kind,
            final_k,
            depth: depth.max(final_k),
        }
    }
}

/// Doc ids of a search tool response (a JSON array of hits, or of bare ids); anything else gives
/// none.
pub fn hit_ids(content: &str) -> Vec<String> {
    match serde_json::from_str::<Value>(content) {
        Ok(Value::Array(hits)) => hits
            .iter()
            .filter_map(|h| h.get("doc_id").unwrap_or(h).as_str().map(str::to_string))
            .collect(),
        _ => Vec::new(),
    }
}

/// Reciprocal-rank fusion of ranked lists.
pub fn rrf(lists: &[Vec<String>]) -> Vec<String> {
    let mut order: Vec<String> = Vec::new();
    let mut score: HashMap<String, f64> = HashMap::new();
    for list in lists {
        for (rank0, id) in list.iter().enumerate() {
            let s = score.entry(id.clone()).or_insert_with(|| {
                order.push(id.clone());
                0.0
            });
            *s += 1.0 / (RRF_K + rank0 as f64 + 1.0);
        }
    }
    // Stable sort: equal scores keep first-appearance order.
    order.sort_by(|a, b| score[b].total_cmp(&score[a]));
    order
}

fn call(name: &str, arguments: Value) -> String {
    format_tool_call(&ToolCall {
        name: name.into(),
        arguments,
    })
}

impl Agent for ScriptedAgent {
    fn act(&mut self, obs: &Observation) -> Result<Action> {
        let query = obs
            .query
            .as_deref()
            .ok_or_else(|| EnvError::Agent("scripted policies need the task's query".into()))?;
        if obs.turn == 0 {
            let text = match self.kind {
                Baseline::Bm25Once => {
                    call("bm25_search", json!({"query": query, "k": self.final_k}))
                }
                Baseline::VectorOnce => {
                    call("vector_search", json!({"query": query, "k": self.final_k}))
                }
                Baseline::HybridRrf => format!(
                    "{}\n{}",
                    call("bm25_search", json!({"query": query, "k": self.depth})),
                    call("vector_search", json!({"query": query, "k": self.depth}))
                ),
            };
            return Ok(Action::text(text));
        }
        let lists: Vec<Vec<String>> = last_tool_results(&obs.messages)
            .into_iter()
            .map(|(_, content)| hit_ids(content))
            .collect();
        let mut ids = match self.kind {
            Baseline::HybridRrf => rrf(&lists),
            _ => lists.into_iter().next().unwrap_or_default(),
        };
        ids.truncate(self.final_k);
        Ok(Action::text(call("submit", json!({"doc_ids": ids}))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(ids: &[&str]) -> Vec<String> {
        ids.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn rrf_hand_worked() {
        // a: 1/61 + 1/63; b: 1/62 + 1/61; c: 1/63; d: 1/62.
        // b (0.032522) > a (0.032266) > d (0.016129) > c (0.015873).
        let fused = rrf(&[v(&["a", "b", "c"]), v(&["b", "d", "a"])]);
        assert_eq!(fused, v(&["b", "a", "d", "c"]));
        // Ties keep first appearance.
        assert_eq!(rrf(&[v(&["x"]), v(&["y"])]), v(&["x", "y"]));
    }

    #[test]
    fn names_round_trip_and_ids_parse() {
        for b in Baseline::ALL {
            assert_eq!(Baseline::parse(b.name()), Some(b));
        }
        assert_eq!(hit_ids(r#"[{"doc_id":"3"},{"x":1}]"#), v(&["3"]));
        assert!(hit_ids("error: bad").is_empty());
    }
}
