//! A varied scripted teacher: the source of warm-start (SFT) trajectories for policies trained
//! from scratch.
//!
//! The teacher is not good or bad on purpose; it *explores*. Each episode draws one search
//! strategy ([`Strategy`]) from the same distribution for every query — nothing depends on the
//! query's words — and plays it through the real tools:
//! - 1 to `max_searches` searches, each with a tool drawn uniformly from `tools` and `k` uniform in
//!   `1..=max_k`; all of them in one message with probability `p_one_message`, else one per turn;
//! - then `submit`: the hits of every search numbered in order (the first search's hits 1…k₁, the
//!   next ones k₁+1…), ordered by rank (concatenated), or round-robin across the searches with
//!   probability `p_interleave` (when there are two or more), then reversed or shuffled with
//!   probability `p_reorder`; the first `n` of them, `n` uniform in `1..=min(hits, final_k)`.
//!   With `env.submit_hits` the submit lists those ranks (`{"hits": [1, 4, 2, …]}`), or, with
//!   probability `p_top` when the list is not reordered, names the same choice in the compact form
//!   `{"top": n}` / `{"top": n, "interleave": true}` (the first `n` *distinct* hits). With
//!   probability `p_rrf` (drawn last) a submit of two or more searches is fused by reciprocal
//!   rank instead (`{"top": n, "rrf": true}`; needs `env.submit_rrf`), as `hybrid-rrf` does.
//!
//! SFT on these episodes gives a policy that samples many strategies; which of them pays (which
//! tool or mix, how many hits, which order) is what RL has to find. [`Strategy`] is also a
//! scripted agent of its own ([`FixedStrategy`]): the best fixed strategy the teacher knows is a
//! baseline (see [`best_fixed`](crate::best_fixed)).
//!
//! Choices are a pure function of the episode seed: the same teacher writes the same file. Like
//! the baselines it reads only `Observation::query` and tool responses, never judgments.

use mtrl_core::rng::SplitMix64;
use mtrl_core::{Role, ToolCall};
use serde_json::{json, Value};

use crate::env::{Action, Agent, Observation};
use crate::error::{EnvError, Result};
use crate::parser::format_tool_call;
use crate::scripted::{hit_ids, rrf};
use crate::shortcuts::{round_robin, Order};

/// The teacher's action space and how it samples it.
#[derive(Debug, Clone, PartialEq)]
pub struct TeacherSpec {
    /// Search tools to draw from.
    pub tools: Vec<String>,
    /// Searches per episode: uniform in `1..=max_searches`.
    pub max_searches: usize,
    /// `k` of a search: uniform in `1..=max_k`.
    pub max_k: usize,
    /// Hits submitted: uniform in `1..=min(hits seen, final_k)`.
    pub final_k: usize,
    /// Probability that all searches go in one message (else one per turn).
    pub p_one_message: f64,
    /// Probability of a round-robin order across searches (two or more), else rank order.
    pub p_interleave: f64,
    /// Probability of reversing (half) or shuffling (half) the submitted order.
    pub p_reorder: f64,
    /// Search with the query's content words only (stop words and punctuation dropped), as a
    /// keyword-search user would; BM25 drops those words anyway.
    pub keyword_queries: bool,
    /// Leave `query` out of search calls (the environment searches for the question; needs
    /// `env.default_query`).
    pub omit_query: bool,
    /// Submit by rank, `{"hits": [1, …]}` (needs `env.submit_hits`).
    pub submit_hits: bool,
    /// Probability that a submit that is not reordered is written `{"top": n}` (with
    /// `"interleave": true` for round-robin) instead of listing ranks (needs `submit_hits`).
    pub p_top: f64,
    /// Probability that a submit of two or more searches is fused by reciprocal rank (written
    /// `{"top": n, "rrf": true}` in the compact form; needs `env.submit_rrf`).
    pub p_rrf: f64,
}

impl Default for TeacherSpec {
    fn default() -> Self {
        TeacherSpec {
            tools: vec!["bm25_search".into(), "vector_search".into()],
            max_searches: 2,
            max_k: 10,
            final_k: 10,
            p_one_message: 0.5,
            p_interleave: 0.5,
            p_reorder: 0.2,
            keyword_queries: true,
            omit_query: false,
            submit_hits: false,
            p_top: 0.0,
            p_rrf: 0.0,
        }
    }
}

/// What is done to the submitted list after ordering it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reorder {
    None,
    Reversed,
    /// Shuffled with this seed.
    Shuffled(u64),
}

/// One episode's plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Strategy {
    /// (tool, k) of each search, in order.
    pub searches: Vec<(String, usize)>,
    pub one_message: bool,
    /// How the searches' hits are merged: concatenated in call order, round-robin (1st of each,
    /// then 2nd of each, …) or fused by reciprocal rank (two or more searches).
    pub order: Order,
    pub reorder: Reorder,
    /// Hits submitted (fewer when the searches returned fewer).
    pub submit: usize,
    /// Written `{"top": submit}` (the first distinct hits) rather than as a list of ranks.
    pub top: bool,
}

impl Strategy {
    /// A strategy drawn from `spec`'s distribution.
    pub fn sample(spec: &TeacherSpec, seed: u64) -> Strategy {
        let mut rng = SplitMix64(seed ^ 0x7ea_c4e2);
        let n = 1 + rng.below(spec.max_searches.max(1));
        let searches = (0..n)
            .map(|_| {
                let tool = spec.tools[rng.below(spec.tools.len())].clone();
                (tool, 1 + rng.below(spec.max_k.max(1)))
            })
            .collect();
        let one_message = rng.next_f64() < spec.p_one_message;
        let interleave = n > 1 && rng.next_f64() < spec.p_interleave;
        let reorder = if rng.next_f64() >= spec.p_reorder {
            Reorder::None
        } else if rng.next_f64() < 0.5 {
            Reorder::Reversed
        } else {
            Reorder::Shuffled(rng.next_u64())
        };
        // Drawn here, capped by the hits actually seen when submitting.
        let submit = 1 + rng.below(spec.final_k.max(1));
        // Drawn last, so that `p_top` leaves every other choice of the seed as it was.
        let top = spec.submit_hits && reorder == Reorder::None && rng.next_f64() < spec.p_top;
        // After everything else, so that `p_rrf = 0` leaves every strategy of a seed as it was.
        let rrf = n > 1 && spec.p_rrf > 0.0 && rng.next_f64() < spec.p_rrf;
        let order = Order::of(rrf, interleave);
        Strategy {
            searches,
            one_message,
            order,
            reorder,
            submit,
            top,
        }
    }

    /// A short name, e.g. `bm25:10+vector:5 interleaved top10`, `vector:3 ranked reversed top2`.
    pub fn name(&self) -> String {
        let tools: Vec<String> = self
            .searches
            .iter()
            .map(|(t, k)| format!("{}:{k}", t.trim_end_matches("_search")))
            .collect();
        let mut order = match self.order {
            Order::Rrf => "fused",
            Order::RoundRobin => "interleaved",
            Order::Calls => "ranked",
        }
        .to_string();
        match self.reorder {
            Reorder::None => {}
            Reorder::Reversed => order.push_str(" reversed"),
            Reorder::Shuffled(_) => order.push_str(" shuffled"),
        }
        let form = if self.top { " (as top)" } else { "" };
        format!("{} {order} top{}{form}", tools.join("+"), self.submit)
    }

    /// The 1-based global ranks to submit, given each search's hits (fused by reciprocal rank:
    /// each id at the rank of its first appearance).
    pub fn ranks_of(&self, lists: &[Vec<String>]) -> Vec<usize> {
        if self.order != Order::Rrf {
            let lens: Vec<usize> = lists.iter().map(Vec::len).collect();
            return self.ranks(&lens);
        }
        let all: Vec<&String> = lists.iter().flatten().collect();
        let fused: Vec<usize> = rrf(lists)
            .iter()
            .filter_map(|id| all.iter().position(|x| *x == id).map(|i| i + 1))
            .collect();
        self.arrange(fused)
    }

    /// The 1-based global ranks to submit, given how many hits each search returned (rank order
    /// or round-robin; see [`Strategy::ranks_of`] for fused lists).
    pub fn ranks(&self, lens: &[usize]) -> Vec<usize> {
        let ranks: Vec<usize> = if self.order == Order::RoundRobin {
            round_robin(lens)
        } else {
            (1..=lens.iter().sum()).collect()
        };
        self.arrange(ranks)
    }

    /// `ranks` reordered and cut to `submit`.
    fn arrange(&self, mut ranks: Vec<usize>) -> Vec<usize> {
        match self.reorder {
            Reorder::None => {}
            Reorder::Reversed => ranks.reverse(),
            Reorder::Shuffled(seed) => {
                let mut rng = SplitMix64(seed);
                for i in (1..ranks.len()).rev() {
                    ranks.swap(i, rng.below(i + 1));
                }
            }
        }
        ranks.truncate(self.submit);
        ranks
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

/// Plays one [`Strategy`] (make a new one per episode).
pub struct FixedStrategy {
    strategy: Strategy,
    keyword_queries: bool,
    omit_query: bool,
    submit_hits: bool,
    /// Searches made so far.
    done: usize,
}

impl FixedStrategy {
    /// Plays `strategy` with the argument conventions of `spec`.
    pub fn new(strategy: Strategy, spec: &TeacherSpec) -> FixedStrategy {
        FixedStrategy {
            strategy,
            keyword_queries: spec.keyword_queries,
            omit_query: spec.omit_query,
            submit_hits: spec.submit_hits,
            done: 0,
        }
    }

    pub fn strategy(&self) -> &Strategy {
        &self.strategy
    }
}

impl Agent for FixedStrategy {
    fn act(&mut self, obs: &Observation) -> Result<Action> {
        let query = obs
            .query
            .as_deref()
            .ok_or_else(|| EnvError::Agent("the teacher needs the task's query".into()))?;
        if obs.turn == 0 {
            self.done = 0;
        }
        let s = &self.strategy;
        if self.done < s.searches.len() {
            let q = if self.keyword_queries {
                keywords(query)
            } else {
                query.to_string()
            };
            let take = if s.one_message { s.searches.len() } else { 1 };
            let calls: Vec<String> = s.searches[self.done..self.done + take]
                .iter()
                .map(|(tool, k)| {
                    let args = if self.omit_query {
                        json!({"k": k})
                    } else {
                        json!({"query": q, "k": k})
                    };
                    call(tool, args)
                })
                .collect();
            self.done += take;
            return Ok(Action::text(calls.join("\n")));
        }
        // The compact form names the choice; the environment resolves it against the hits.
        if self.submit_hits && s.top {
            let args = match s.order {
                Order::Rrf => json!({"top": s.submit, "rrf": true}),
                Order::RoundRobin => json!({"top": s.submit, "interleave": true}),
                Order::Calls => json!({"top": s.submit}),
            };
            return Ok(Action::text(call("submit", args)));
        }
        // Every search's hits, in call order (error responses hold none).
        let lists: Vec<Vec<String>> = obs
            .messages
            .iter()
            .filter(|m| m.role == Role::Tool && m.name.as_deref() != Some("submit"))
            .map(|m| hit_ids(&m.content))
            .collect();
        let ranks = s.ranks_of(&lists);
        if self.submit_hits {
            return Ok(Action::text(call("submit", json!({"hits": ranks}))));
        }
        let all: Vec<&String> = lists.iter().flatten().collect();
        let ids: Vec<&String> = ranks.iter().map(|&r| all[r - 1]).collect();
        Ok(Action::text(call("submit", json!({"doc_ids": ids}))))
    }
}

/// One teacher episode's agent: a strategy drawn from the spec (make a new one per episode).
pub struct Teacher(FixedStrategy);

impl Teacher {
    /// `seed` should differ per episode (e.g. a hash of the run seed, the task and the sample).
    pub fn new(spec: TeacherSpec, seed: u64) -> Teacher {
        Teacher(FixedStrategy::new(Strategy::sample(&spec, seed), &spec))
    }

    pub fn strategy(&self) -> &Strategy {
        self.0.strategy()
    }
}

impl Agent for Teacher {
    fn act(&mut self, obs: &Observation) -> Result<Action> {
        self.0.act(obs)
    }
}

#[cfg(test)]
mod tests;
