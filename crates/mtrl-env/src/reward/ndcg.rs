//! nDCG@k of the submitted ranking against the task's graded judgments (trec_eval conventions via
//! `mtrl_search::metrics`: gain = positive grade, log2 discount, ideal from all judged documents,
//! repeated ids count once at their first position; unjudged ids gain 0).

use super::Reward;
use crate::task::SearchTask;
use crate::tool::Answer;

/// nDCG at cut-off `.0`.
#[derive(Debug, Clone, Copy)]
pub struct NdcgAt(pub usize);

impl Reward for NdcgAt {
    fn name(&self) -> String {
        format!("ndcg@{}", self.0)
    }

    fn score(&self, task: &SearchTask, answer: &Answer) -> f64 {
        let ranked: Vec<&str> = answer.doc_ids.iter().map(String::as_str).collect();
        mtrl_search::metrics::ndcg_at_k(&ranked, &task.qrels, self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reward::tests::{answer, task};

    fn close(a: f64, b: f64) {
        assert!((a - b).abs() < 1e-12, "{a} vs {b}");
    }

    #[test]
    fn hand_worked() {
        let t = task();
        let idcg = 3.0 + 2.0 / 3f64.log2() + 0.5;
        // [d1, d2, d3]: DCG = 3/1 + 0 + 2/log2(4) = 4.
        close(
            NdcgAt(10).score(&t, &answer(&["d1", "d2", "d3"])),
            4.0 / idcg,
        );
        // Duplicates removed: [d3, d3, d1] = [d3, d1]: DCG = 2 + 3/log2(3).
        close(
            NdcgAt(10).score(&t, &answer(&["d3", "d3", "d1"])),
            (2.0 + 3.0 / 3f64.log2()) / idcg,
        );
        // k = 1: ideal is 3; d3 first gives 2/3.
        close(NdcgAt(1).score(&t, &answer(&["d3", "d1"])), 2.0 / 3.0);
        close(NdcgAt(10).score(&t, &answer(&["d5", "x"])), 0.0);
        close(NdcgAt(10).score(&t, &answer(&[])), 0.0);
        close(NdcgAt(10).score(&t, &answer(&["d1", "d3", "d4"])), 1.0);
    }
}
