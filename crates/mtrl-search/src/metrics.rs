//! IR metrics over graded judgments, following trec_eval's conventions.
//!
//! - gain of a document = its grade when positive, else 0 (unjudged documents gain 0);
//! - discount at 1-based rank r = log2(r + 1);
//! - the ideal ranking sorts *all* judged documents of the query by gain (not just retrieved ones);
//! - a document is relevant when its grade is > 0 (recall, MRR, precision);
//! - a document id repeated in a ranking counts once, at its first position;
//! - a query with no relevant document scores 0 on every metric and is listed in
//!   [`RunSummary::without_relevant`] so the caller can report it.
//!
//! Pure functions: no IO, no allocation beyond small sets.

use std::collections::{HashMap, HashSet};

use serde::Serialize;

use crate::qrels::Qrels;

fn gain(grade: Option<&i32>) -> f64 {
    grade.map(|g| (*g).max(0) as f64).unwrap_or(0.0)
}

fn discount(rank0: usize) -> f64 {
    ((rank0 + 2) as f64).log2()
}

/// The ranking with later repeats of an id removed.
fn dedup<'a>(ranked: &[&'a str]) -> Vec<&'a str> {
    let mut seen = HashSet::with_capacity(ranked.len());
    ranked.iter().copied().filter(|d| seen.insert(*d)).collect()
}

/// nDCG@k of a ranking against one query's judgments.
pub fn ndcg_at_k(ranked: &[&str], judged: &HashMap<String, i32>, k: usize) -> f64 {
    let ranked = dedup(ranked);
    let dcg: f64 = ranked
        .iter()
        .take(k)
        .enumerate()
        .map(|(i, d)| gain(judged.get(*d)) / discount(i))
        .sum();
    let mut ideal: Vec<f64> = judged
        .values()
        .map(|g| gain(Some(g)))
        .filter(|g| *g > 0.0)
        .collect();
    ideal.sort_by(|a, b| b.total_cmp(a));
    let idcg: f64 = ideal
        .iter()
        .take(k)
        .enumerate()
        .map(|(i, g)| g / discount(i))
        .sum();
    if idcg > 0.0 {
        dcg / idcg
    } else {
        0.0
    }
}

fn num_relevant(judged: &HashMap<String, i32>) -> usize {
    judged.values().filter(|g| **g > 0).count()
}

fn relevant_in_top(ranked: &[&str], judged: &HashMap<String, i32>, k: usize) -> usize {
    dedup(ranked)
        .iter()
        .take(k)
        .filter(|d| judged.get(**d).is_some_and(|g| *g > 0))
        .count()
}

/// Fraction of the query's relevant documents found in the top k.
pub fn recall_at_k(ranked: &[&str], judged: &HashMap<String, i32>, k: usize) -> f64 {
    match num_relevant(judged) {
        0 => 0.0,
        n => relevant_in_top(ranked, judged, k) as f64 / n as f64,
    }
}

/// Fraction of the top k positions holding a relevant document (k in the denominator, as
/// trec_eval's P@k).
pub fn precision_at_k(ranked: &[&str], judged: &HashMap<String, i32>, k: usize) -> f64 {
    if k == 0 {
        return 0.0;
    }
    relevant_in_top(ranked, judged, k) as f64 / k as f64
}

/// Reciprocal rank of the first relevant document within the top k (0 when none).
pub fn mrr_at_k(ranked: &[&str], judged: &HashMap<String, i32>, k: usize) -> f64 {
    dedup(ranked)
        .iter()
        .take(k)
        .position(|d| judged.get(*d).is_some_and(|g| *g > 0))
        .map(|i| 1.0 / (i + 1) as f64)
        .unwrap_or(0.0)
}

/// The standard retrieval figures of one query.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct QueryScores {
    pub ndcg_at_10: f64,
    pub recall_at_100: f64,
    pub mrr_at_10: f64,
    pub precision_at_10: f64,
}

impl QueryScores {
    pub fn compute(ranked: &[&str], judged: &HashMap<String, i32>) -> QueryScores {
        QueryScores {
            ndcg_at_10: ndcg_at_k(ranked, judged, 10),
            recall_at_100: recall_at_k(ranked, judged, 100),
            mrr_at_10: mrr_at_k(ranked, judged, 10),
            precision_at_10: precision_at_k(ranked, judged, 10),
        }
    }
}

/// Mean scores of a run over the judged queries.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RunSummary {
    pub queries: usize,
    pub mean: QueryScores,
    /// Queries judged but with no relevant document (scored 0).
    pub without_relevant: Vec<String>,
    /// Judged queries absent from the run (scored 0).
    pub missing_from_run: Vec<String>,
}

/// Averages [`QueryScores`] over every judged query; `run` maps query id → ranking.
pub fn evaluate_run(run: &HashMap<String, Vec<String>>, qrels: &Qrels) -> RunSummary {
    let mut s = RunSummary::default();
    let mut sum = QueryScores::default();
    for qid in qrels.query_ids() {
        let judged = qrels.for_query(qid).cloned().unwrap_or_default();
        s.queries += 1;
        if num_relevant(&judged) == 0 {
            s.without_relevant.push(qid.to_string());
        }
        let Some(ranking) = run.get(qid) else {
            s.missing_from_run.push(qid.to_string());
            continue;
        };
        let ranked: Vec<&str> = ranking.iter().map(String::as_str).collect();
        let q = QueryScores::compute(&ranked, &judged);
        sum.ndcg_at_10 += q.ndcg_at_10;
        sum.recall_at_100 += q.recall_at_100;
        sum.mrr_at_10 += q.mrr_at_10;
        sum.precision_at_10 += q.precision_at_10;
    }
    if s.queries > 0 {
        let n = s.queries as f64;
        s.mean = QueryScores {
            ndcg_at_10: sum.ndcg_at_10 / n,
            recall_at_100: sum.recall_at_100 / n,
            mrr_at_10: sum.mrr_at_10 / n,
            precision_at_10: sum.precision_at_10 / n,
        };
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    // Hand-worked: judged {d1:3, d3:2, d4:1, d5:-1}.
    // IDCG@10 = 3/log2(2) + 2/log2(3) + 1/log2(4) = 4.7618595071429155.
    fn judged() -> HashMap<String, i32> {
        [("d1", 3), ("d3", 2), ("d4", 1), ("d5", -1)]
            .into_iter()
            .map(|(d, g)| (d.to_string(), g))
            .collect()
    }

    fn close(a: f64, b: f64) {
        assert!((a - b).abs() < 1e-12, "{a} vs {b}");
    }

    #[test]
    fn ndcg_hand_worked() {
        let j = judged();
        // DCG = 3/1 + 0/log2(3) + 2/log2(4) = 4 → 4 / 4.76185950714 = 0.84000798301585...
        close(ndcg_at_k(&["d1", "d2", "d3"], &j, 10), 0.8400079830158563);
        // Only d4 at rank 3: 0.5 / 4.76185950714.
        close(ndcg_at_k(&["x", "y", "d4"], &j, 10), 0.10500099787698204);
        close(ndcg_at_k(&["x", "y", "d4"], &j, 2), 0.0);
        // k = 1 ideal is 3 → a perfect first hit scores 1.
        close(ndcg_at_k(&["d1"], &j, 1), 1.0);
        // Perfect ranking scores 1; a negative grade gains nothing.
        close(ndcg_at_k(&["d1", "d3", "d4", "d5"], &j, 10), 1.0);
        // Repeats count once: [d1, d1, d3] is the same as [d1, d3].
        close(
            ndcg_at_k(&["d1", "d1", "d3"], &j, 10),
            (3.0 + 2.0 / 3f64.log2()) / 4.7618595071429155,
        );
    }

    #[test]
    fn recall_mrr_precision_hand_worked() {
        let j = judged();
        close(recall_at_k(&["d1", "d2", "d3"], &j, 100), 2.0 / 3.0);
        close(recall_at_k(&["d1", "d2", "d3"], &j, 1), 1.0 / 3.0);
        close(mrr_at_k(&["x", "y", "d4"], &j, 10), 1.0 / 3.0);
        close(mrr_at_k(&["x", "y", "d4"], &j, 2), 0.0);
        close(mrr_at_k(&["d5", "d3"], &j, 10), 0.5);
        close(precision_at_k(&["d1", "d2"], &j, 2), 0.5);
        close(precision_at_k(&["d1"], &j, 10), 0.1);
    }

    #[test]
    fn no_relevant_scores_zero_and_is_reported() {
        let none: HashMap<String, i32> = [("d".to_string(), 0)].into_iter().collect();
        close(ndcg_at_k(&["d"], &none, 10), 0.0);
        close(recall_at_k(&["d"], &none, 10), 0.0);
        let mut q = Qrels::new();
        q.insert("a", "d1", 1);
        q.insert("b", "d", 0);
        q.insert("c", "d1", 2);
        let run: HashMap<String, Vec<String>> = [
            ("a".to_string(), vec!["d1".to_string()]),
            ("b".to_string(), vec!["d".to_string()]),
        ]
        .into_iter()
        .collect();
        let s = evaluate_run(&run, &q);
        assert_eq!(s.queries, 3);
        assert_eq!(s.without_relevant, vec!["b"]);
        assert_eq!(s.missing_from_run, vec!["c"]);
        close(s.mean.ndcg_at_10, 1.0 / 3.0);
        close(s.mean.mrr_at_10, 1.0 / 3.0);
    }
}
