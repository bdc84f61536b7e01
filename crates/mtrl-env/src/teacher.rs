//! An imperfect scripted teacher: the source of warm-start (SFT) trajectories for policies trained
//! from scratch.
//!
//! It behaves like a plausible but flawed agent, on purpose, so that RL after imitation has
//! something visible to fix:
//! - **tool choice**: it calls the `weak_tool` (e.g. `vector_search` with the hashing embedder)
//!   with probability `p_weak`, else the `strong_tool`;
//! - **stopping**: after its first search it either submits the first `submit_k` ids, or keeps
//!   searching (alternating the two tools, same query) until the turn budget runs out — a failed
//!   episode. It keeps searching with probability `p_loop_trigger` when the query's first word is
//!   one of `trigger_words`, else with probability `p_loop`.
//!
//! With `p_weak > 0.5` and `p_loop_trigger > 0.5`, the *most likely* behaviour a student imitates
//! is the bad one (what greedy decoding of the imitating policy does), while sampling still visits
//! the better actions often enough for RL to find them.
//!
//! Choices are a pure function of (seed, query, sample): the same teacher writes the same file.
//! Like the baselines it reads only `Observation::query` and tool responses, never judgments.

use mtrl_core::ToolCall;
use serde_json::{json, Value};

use crate::env::{Action, Agent, Observation};
use crate::error::{EnvError, Result};
use crate::parser::format_tool_call;
use crate::scripted::hit_ids;
use crate::search_env::last_tool_results;
use mtrl_core::rng::{hash_str, SplitMix64};

/// The teacher's flaws and sizes.
#[derive(Debug, Clone, PartialEq)]
pub struct TeacherSpec {
    pub strong_tool: String,
    pub weak_tool: String,
    /// Probability of searching with `weak_tool`.
    pub p_weak: f64,
    /// Probability of searching on until the turn budget runs out (query not triggered).
    pub p_loop: f64,
    /// The same for queries whose first word is in `trigger_words`.
    pub p_loop_trigger: f64,
    pub trigger_words: Vec<String>,
    /// `k` of each search call.
    pub search_k: usize,
    /// Ids submitted (the first of the first search's hits).
    pub submit_k: usize,
    /// Search with the query's content words only (stop words and punctuation dropped), as a
    /// keyword-search user would; BM25 drops those words anyway.
    pub keyword_queries: bool,
    /// Leave `query` out of search calls (the environment searches for the question; needs
    /// `env.default_query`).
    pub omit_query: bool,
    /// Submit by rank, `{"hits": [1, …]}` (needs `env.submit_hits`).
    pub submit_hits: bool,
}

impl Default for TeacherSpec {
    fn default() -> Self {
        TeacherSpec {
            strong_tool: "bm25_search".into(),
            weak_tool: "vector_search".into(),
            p_weak: 0.6,
            p_loop: 0.1,
            p_loop_trigger: 0.7,
            trigger_words: vec!["what".into()],
            search_k: 5,
            submit_k: 5,
            keyword_queries: true,
            omit_query: false,
            submit_hits: false,
        }
    }
}

/// One teacher episode's agent (make a new one per episode).
pub struct Teacher {
    spec: TeacherSpec,
    seed: u64,
    plan: Option<(bool, bool)>,
}

impl Teacher {
    /// `seed` should differ per sample of the same task (e.g. hash of run seed and sample index).
    pub fn new(spec: TeacherSpec, seed: u64) -> Teacher {
        Teacher {
            spec,
            seed,
            plan: None,
        }
    }

    /// (uses the weak tool, keeps searching) for `query`.
    pub fn plan(&self, query: &str) -> (bool, bool) {
        let mut rng = SplitMix64(hash_str(self.seed, query));
        let weak = rng.next_f64() < self.spec.p_weak;
        let first = query
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_lowercase();
        let p = if self.spec.trigger_words.contains(&first) {
            self.spec.p_loop_trigger
        } else {
            self.spec.p_loop
        };
        (weak, rng.next_f64() < p)
    }
}

/// Common English function words (a short list: what a keyword-search user leaves out).
const STOP: &[&str] = &[
    "a", "an", "and", "are", "as", "at", "be", "been", "by", "can", "do", "does", "for", "from",
    "has", "have", "how", "in", "into", "is", "it", "its", "of", "on", "or", "such", "that", "the",
    "their", "there", "these", "this", "to", "was", "were", "what", "when", "where", "which",
    "while", "who", "why", "will", "with", "would", "must", "any", "some", "should", "than",
];

/// The content words of `query`, in order (all of it when nothing is left).
pub fn keywords(query: &str) -> String {
    let words: Vec<&str> = query
        .split_whitespace()
        .filter(|w| w.chars().any(char::is_alphanumeric))
        .filter(|w| !STOP.contains(&w.to_lowercase().as_str()))
        .collect();
    if words.is_empty() {
        query.trim().to_string()
    } else {
        words.join(" ")
    }
}

fn call(name: &str, arguments: Value) -> String {
    format_tool_call(&ToolCall {
        name: name.into(),
        arguments,
    })
}

impl Agent for Teacher {
    fn act(&mut self, obs: &Observation) -> Result<Action> {
        let query = obs
            .query
            .as_deref()
            .ok_or_else(|| EnvError::Agent("the teacher needs the task's query".into()))?;
        let (weak, keeps_searching) = match self.plan {
            Some(p) => p,
            None => {
                let p = self.plan(query);
                self.plan = Some(p);
                p
            }
        };
        let s = &self.spec;
        let (first, other) = if weak {
            (&s.weak_tool, &s.strong_tool)
        } else {
            (&s.strong_tool, &s.weak_tool)
        };
        let q = if s.keyword_queries {
            keywords(query)
        } else {
            query.to_string()
        };
        let args = if s.omit_query {
            json!({"k": s.search_k})
        } else {
            json!({"query": q, "k": s.search_k})
        };
        if obs.turn == 0 {
            return Ok(Action::text(call(first, args)));
        }
        if keeps_searching {
            let tool = if obs.turn % 2 == 1 { other } else { first };
            return Ok(Action::text(call(tool, args)));
        }
        let mut ids = last_tool_results(&obs.messages)
            .into_iter()
            .map(|(_, content)| hit_ids(content))
            .next()
            .unwrap_or_default();
        ids.truncate(s.submit_k);
        if s.submit_hits {
            let ranks: Vec<usize> = (1..=ids.len()).collect();
            return Ok(Action::text(call("submit", json!({"hits": ranks}))));
        }
        Ok(Action::text(call("submit", json!({"doc_ids": ids}))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyword_queries_drop_function_words_and_punctuation() {
        assert_eq!(
            keywords("what are the structural problems of high speed flight ."),
            "structural problems high speed flight"
        );
        assert_eq!(keywords("what is ."), "what is .");
    }

    #[test]
    fn plans_are_deterministic_and_follow_the_probabilities() {
        let spec = TeacherSpec::default();
        let queries: Vec<String> = (0..2000).map(|i| format!("what is flow {i}")).collect();
        let others: Vec<String> = (0..2000).map(|i| format!("how is flow {i}")).collect();
        let t = Teacher::new(spec.clone(), 7);
        let frac = |qs: &[String], pick: fn((bool, bool)) -> bool| {
            qs.iter().filter(|q| pick(t.plan(q))).count() as f64 / qs.len() as f64
        };
        assert!((frac(&queries, |p| p.1) - 0.7).abs() < 0.04);
        assert!((frac(&others, |p| p.1) - 0.1).abs() < 0.03);
        assert!((frac(&others, |p| p.0) - 0.6).abs() < 0.04);
        assert_eq!(
            t.plan("what a"),
            Teacher::new(spec.clone(), 7).plan("what a")
        );
        let differs = queries
            .iter()
            .filter(|q| t.plan(q) != Teacher::new(spec.clone(), 8).plan(q))
            .count();
        assert!(differs > 500);
    }
}
