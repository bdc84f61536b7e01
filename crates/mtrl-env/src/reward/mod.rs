//! Rewards: pure functions of a task and its final answer (no IO, no state).
//!
//! Built-ins, one file each: [`NdcgAt`], [`RecallAt`], [`ExactMatch`], [`WeightedSum`]. The
//! failure reward is not a reward function: the environment substitutes it for any failed episode.

mod exact_match;
mod ndcg;
mod recall;
mod weighted;

use mtrl_core::config::{RewardChoice, RewardKind};

pub use exact_match::{normalize_answer, ExactMatch};
pub use ndcg::NdcgAt;
pub use recall::RecallAt;
pub use weighted::WeightedSum;

use crate::task::SearchTask;
use crate::tool::Answer;

/// A reward function. Must be pure: the same task and answer always give the same score.
pub trait Reward: Send + Sync {
    /// Name used in reports (`ndcg@10`).
    fn name(&self) -> String;
    /// The score of `answer` for `task`.
    fn score(&self, task: &SearchTask, answer: &Answer) -> f64;
    /// Named parts of the score, for reports (a sum lists its terms); defaults to the score.
    fn components(&self, task: &SearchTask, answer: &Answer) -> Vec<(String, f64)> {
        vec![(self.name(), self.score(task, answer))]
    }
}

/// The reward function for one configured name.
pub fn from_kind(kind: RewardKind) -> Box<dyn Reward> {
    match kind {
        RewardKind::Ndcg(k) => Box::new(NdcgAt(k)),
        RewardKind::Recall(k) => Box::new(RecallAt(k)),
        RewardKind::ExactMatch => Box::new(ExactMatch),
    }
}

/// The reward of an `[env] reward = …` setting: one function, or a weighted sum.
pub fn from_choice(choice: &RewardChoice) -> Box<dyn Reward> {
    match choice.terms.as_slice() {
        [(kind, w)] if *w == 1.0 => from_kind(*kind),
        terms => Box::new(WeightedSum::new(
            terms.iter().map(|(k, w)| (from_kind(*k), *w)).collect(),
        )),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::HashMap;

    use super::*;

    /// Judgments {d1: 3, d3: 2, d4: 1, d5: -1}; IDCG@10 = 3 + 2/log2(3) + 1/2 = 4.761859507…
    pub fn task() -> SearchTask {
        let qrels: HashMap<String, i32> = [("d1", 3), ("d3", 2), ("d4", 1), ("d5", -1)]
            .into_iter()
            .map(|(d, g)| (d.to_string(), g))
            .collect();
        SearchTask {
            id: "t".into(),
            query: "q".into(),
            qrels,
            answers: vec!["The Eiffel Tower".into()],
            ..SearchTask::default()
        }
    }

    pub fn answer(ids: &[&str]) -> Answer {
        Answer {
            doc_ids: ids.iter().map(|s| s.to_string()).collect(),
            text: None,
        }
    }

    #[test]
    fn choice_builds_single_or_sum() {
        let one = from_choice(&RewardChoice {
            terms: vec![(RewardKind::Ndcg(10), 1.0)],
        });
        assert_eq!(one.name(), "ndcg@10");
        let sum = from_choice(&RewardChoice {
            terms: vec![(RewardKind::Ndcg(10), 0.5), (RewardKind::Recall(2), 0.5)],
        });
        assert_eq!(sum.name(), "0.5*ndcg@10+0.5*recall@2");
        assert_eq!(sum.components(&task(), &answer(&["d1"])).len(), 2);
    }
}
