//! What a policy *does*, measured from its trajectories: tool mix, searches per episode, `k`,
//! hits submitted and turns — so a results table shows the learned strategy, not just a score.

use mtrl_core::trajectory::ToolCallRecord;
use mtrl_core::Trajectory;
use serde::{Deserialize, Serialize};

use crate::report::EvalReport;

/// Means over a set of episodes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StrategyStats {
    pub episodes: usize,
    /// Successful search calls per episode.
    pub searches: f64,
    /// Share of those calls that were `bm25_search`.
    pub bm25_share: f64,
    /// Share of episodes that searched with both tools.
    pub both_tools: f64,
    /// Share of submitting episodes whose submit fused the searches (`"rrf": true`). Absent from
    /// reports written before the fusion action: read as 0.
    #[serde(default)]
    pub fused: f64,
    /// Mean `k` of the search calls that gave one.
    pub mean_k: f64,
    /// Ids in the submitted list (episodes that submitted).
    pub hits_submitted: f64,
    /// Share of episodes that submitted.
    pub submitted: f64,
    pub turns: f64,
}

impl StrategyStats {
    pub fn of<'a>(trajs: impl IntoIterator<Item = &'a Trajectory>) -> StrategyStats {
        let (mut n, mut searches, mut bm25, mut both, mut turns) = (0usize, 0usize, 0usize, 0, 0);
        let (mut ks, mut k_sum, mut subs, mut hits, mut fused) = (0usize, 0.0, 0usize, 0usize, 0);
        for t in trajs {
            n += 1;
            turns += t.turns as usize;
            let calls: Vec<_> = t
                .tool_calls
                .iter()
                .filter(|c| c.error.is_none() && c.name.ends_with("_search"))
                .collect();
            searches += calls.len();
            let b = calls.iter().filter(|c| c.name == "bm25_search").count();
            bm25 += b;
            if b > 0 && b < calls.len() {
                both += 1;
            }
            for c in &calls {
                if let Some(k) = c.arguments.get("k").and_then(|k| k.as_f64()) {
                    ks += 1;
                    k_sum += k;
                }
            }
            if let Some(a) = &t.answer {
                subs += 1;
                hits += a.len();
                let rrf = |c: &ToolCallRecord| {
                    c.error.is_none() && c.name == "submit" && c.arguments["rrf"] == true
                };
                if t.tool_calls.iter().any(rrf) {
                    fused += 1;
                }
            }
        }
        let per = |x: usize, d: usize| if d == 0 { 0.0 } else { x as f64 / d as f64 };
        StrategyStats {
            episodes: n,
            searches: per(searches, n),
            bm25_share: per(bm25, searches),
            both_tools: per(both, n),
            fused: per(fused, subs),
            mean_k: if ks == 0 { 0.0 } else { k_sum / ks as f64 },
            hits_submitted: per(hits, subs),
            submitted: per(subs, n),
            turns: per(turns, n),
        }
    }
}

impl EvalReport {
    /// The strategy table in Markdown: one row per run and decoding (greedy, and sampled when
    /// attempts were run).
    pub fn strategy_markdown(&self) -> String {
        let mut out = String::from(
            "| benchmark | model | decoding | searches | bm25 share | both tools | fused | mean k | hits submitted | submitted | turns |\n\
             |---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        for d in &self.datasets {
            for r in &d.runs {
                let mut rows = vec![("greedy", r.strategy.as_ref())];
                if r.sampled_strategy.is_some() {
                    rows.push(("sampled", r.sampled_strategy.as_ref()));
                }
                for (how, s) in rows {
                    let Some(s) = s else { continue };
                    out.push_str(&format!(
                        "| {} | {} | {how} | {:.2} | {:.2} | {:.2} | {:.2} | {:.1} | {:.1} | {:.2} | {:.2} |\n",
                        d.benchmark,
                        r.label,
                        s.searches,
                        s.bm25_share,
                        s.both_tools,
                        s.fused,
                        s.mean_k,
                        s.hits_submitted,
                        s.submitted,
                        s.turns
                    ));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn call(name: &str, k: Option<u64>, error: bool) -> ToolCallRecord {
        ToolCallRecord {
            turn: 1,
            name: name.into(),
            arguments: k.map_or(json!({}), |k| json!({ "k": k })),
            result_ids: Vec::new(),
            latency_ms: 0.0,
            error: error.then(|| "bad".to_string()),
        }
    }

    #[test]
    fn counts_tools_k_hits_and_turns() {
        let mut a = Trajectory::new("a");
        a.tool_calls = vec![
            call("bm25_search", Some(10), false),
            call("vector_search", Some(4), false),
            call("vector_search", Some(9), true),
            call("submit", None, false),
        ];
        a.tool_calls[3].arguments = json!({"top": 3, "rrf": true});
        a.answer = Some(vec!["1".into(), "2".into(), "3".into()]);
        a.turns = 2;
        let mut b = Trajectory::new("b");
        b.tool_calls = vec![call("bm25_search", None, false)];
        b.turns = 4;
        let s = StrategyStats::of([&a, &b]);
        assert_eq!(s.episodes, 2);
        assert_eq!(s.searches, 1.5);
        assert!((s.bm25_share - 2.0 / 3.0).abs() < 1e-12);
        assert_eq!(s.both_tools, 0.5);
        assert_eq!(s.mean_k, 7.0);
        assert_eq!(s.hits_submitted, 3.0);
        assert_eq!(s.submitted, 0.5);
        assert_eq!(s.fused, 1.0, "the one submitting episode fused");
        let mut c = a.clone();
        c.tool_calls[3].arguments = json!({"top": 3, "rrf": false});
        assert_eq!(StrategyStats::of([&a, &c]).fused, 0.5);
        assert_eq!(s.turns, 3.0);
    }
}
