//! The best fixed strategy the teacher knows: a baseline that picks, on one task split, the
//! [`Strategy`] with the highest mean reward among the teacher's strategies that can be best.
//!
//! Candidates: each tool alone at `k = max_k`; each ordered pair of different tools at every
//! `(k₁, k₂)` in `1..=max_k`, ranked (concatenated) or interleaved, and fused by reciprocal rank
//! when the teacher fuses (`p_rrf > 0`); all in one message and
//! submitting `final_k` hits — in the compact `{"top": final_k}` form when the teacher writes it
//! (`p_top > 0`), which skips repeated ids and so never scores less than listing the ranks.
//! Submitting fewer hits or reordering never raises nDCG@k in expectation, and a third search
//! repeats one of the two lists, so the rest of the teacher's space is left out. Every candidate is played as real episodes through the environment's tools; the
//! searches are memoized (the same question and `k` give the same hits), which makes the sweep
//! cheap.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use mtrl_core::EnvConfig;
use mtrl_search::{Hit, Retriever, SearchIndex};

use crate::env::run_episode;
use crate::error::Result;
use crate::reward;
use crate::search_env::{standard_tools_over, SearchEnv};
use crate::shortcuts::Order;
use crate::task::Task;
use crate::teacher::{FixedStrategy, Reorder, Strategy, TeacherSpec};

/// A retriever that remembers every (query, k) it answered.
struct Memo {
    inner: Arc<dyn Retriever>,
    seen: Mutex<HashMap<(String, usize), Vec<Hit>>>,
}

impl Retriever for Memo {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn search(&self, query: &str, k: usize) -> mtrl_search::Result<Vec<Hit>> {
        let key = (query.to_string(), k);
        if let Some(h) = self.seen.lock().expect("memo lock").get(&key) {
            return Ok(h.clone());
        }
        let hits = self.inner.search(query, k)?;
        self.seen
            .lock()
            .expect("memo lock")
            .insert(key, hits.clone());
        Ok(hits)
    }
}

/// The candidate strategies (see the module docs).
pub fn candidates(spec: &TeacherSpec) -> Vec<Strategy> {
    let one = |searches: Vec<(String, usize)>, order: Order| Strategy {
        searches,
        one_message: true,
        order,
        reorder: Reorder::None,
        submit: spec.final_k,
        top: spec.submit_hits && spec.p_top > 0.0,
    };
    let mut out: Vec<Strategy> = spec
        .tools
        .iter()
        .map(|t| one(vec![(t.clone(), spec.max_k)], Order::Calls))
        .collect();
    for a in &spec.tools {
        for b in spec.tools.iter().filter(|b| *b != a) {
            for k1 in 1..=spec.max_k {
                for k2 in 1..=spec.max_k {
                    let s = vec![(a.clone(), k1), (b.clone(), k2)];
                    out.push(one(s.clone(), Order::Calls));
                    if spec.p_rrf > 0.0 {
                        out.push(one(s.clone(), Order::Rrf));
                    }
                    out.push(one(s, Order::RoundRobin));
                }
            }
        }
    }
    out
}

/// The candidate with the highest mean reward on `tasks` (ties: the first candidate), and that
/// mean.
pub fn best_fixed(
    cfg: &EnvConfig,
    index: Arc<SearchIndex>,
    spec: &TeacherSpec,
    tasks: &[Task],
) -> Result<(Strategy, f64)> {
    let memo = |r: Arc<dyn Retriever>| -> Arc<dyn Retriever> {
        Arc::new(Memo {
            inner: r,
            seen: Mutex::new(HashMap::new()),
        })
    };
    let tools = standard_tools_over(cfg, index, memo);
    let reward = Arc::from(reward::from_choice(&cfg.reward));
    let mut env = SearchEnv::new(cfg.clone(), tools, reward)?;
    let mut best: Option<(Strategy, f64)> = None;
    for s in candidates(spec) {
        let mut total = 0.0;
        for t in tasks {
            let mut agent = FixedStrategy::new(s.clone(), spec);
            total += run_episode(&mut env, &mut agent, t)?.reward;
        }
        let mean = total / tasks.len().max(1) as f64;
        if best.as_ref().is_none_or(|(_, m)| mean > *m) {
            best = Some((s, mean));
        }
    }
    Ok(best.expect("at least one candidate"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_cover_singles_and_every_pair() {
        let spec = TeacherSpec {
            max_k: 3,
            ..TeacherSpec::default()
        };
        let c = candidates(&spec);
        // 2 singles + 2 ordered pairs × 9 (k₁, k₂) × 2 orders.
        assert_eq!(c.len(), 2 + 2 * 9 * 2);
        assert!(c.iter().all(|s| s.submit == spec.final_k && s.one_message));
        assert_eq!(c[0].searches, vec![("bm25_search".to_string(), 3)]);
        assert!(c.iter().all(|s| s.order != Order::Rrf));
        // A fusing teacher adds the fused form of every pair.
        let fusing = TeacherSpec { p_rrf: 0.5, ..spec };
        let c = candidates(&fusing);
        assert_eq!(c.len(), 2 + 2 * 9 * 3);
        assert_eq!(c.iter().filter(|s| s.order == Order::Rrf).count(), 2 * 9);
    }
}
