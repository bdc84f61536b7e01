//! recall@k: the fraction of the task's relevant documents (grade > 0) in the top k of the
//! submitted ranking (repeats count once). A task without relevant documents scores 0.

use super::Reward;
use crate::task::SearchTask;
use crate::tool::Answer;

#[derive(Debug, Clone, Copy)]
pub struct RecallAt(pub usize);

impl Reward for RecallAt {
    fn name(&self) -> String {
        format!("recall@{}", self.0)
    }

    fn score(&self, task: &SearchTask, answer: &Answer) -> f64 {
        let ranked: Vec<&str> = answer.doc_ids.iter().map(String::as_str).collect();
        mtrl_search::metrics::recall_at_k(&ranked, &task.qrels, self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reward::tests::{answer, task};

    #[test]
    fn hand_worked() {
        let t = task();
        // Relevant: d1, d3, d4 (d5 has grade -1).
        assert_eq!(
            RecallAt(2).score(&t, &answer(&["d2", "d1", "d3"])),
            1.0 / 3.0
        );
        assert_eq!(
            RecallAt(3).score(&t, &answer(&["d2", "d1", "d3"])),
            2.0 / 3.0
        );
        assert_eq!(
            RecallAt(10).score(&t, &answer(&["d1", "d1", "d5"])),
            1.0 / 3.0
        );
        assert_eq!(RecallAt(10).score(&t, &answer(&["d4", "d3", "d1"])), 1.0);
    }
}
