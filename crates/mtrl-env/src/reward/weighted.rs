//! A weighted sum of rewards: `Σ wᵢ · rᵢ`.

use super::Reward;
use crate::task::SearchTask;
use crate::tool::Answer;

pub struct WeightedSum {
    terms: Vec<(Box<dyn Reward>, f64)>,
}

impl WeightedSum {
    pub fn new(terms: Vec<(Box<dyn Reward>, f64)>) -> WeightedSum {
        WeightedSum { terms }
    }
}

impl Reward for WeightedSum {
    fn name(&self) -> String {
        self.terms
            .iter()
            .map(|(r, w)| format!("{w}*{}", r.name()))
            .collect::<Vec<_>>()
            .join("+")
    }

    fn score(&self, task: &SearchTask, answer: &Answer) -> f64 {
        self.terms
            .iter()
            .map(|(r, w)| w * r.score(task, answer))
            .sum()
    }

    fn components(&self, task: &SearchTask, answer: &Answer) -> Vec<(String, f64)> {
        self.terms
            .iter()
            .map(|(r, _)| (r.name(), r.score(task, answer)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reward::tests::{answer, task};
    use crate::reward::{NdcgAt, RecallAt};

    #[test]
    fn hand_worked() {
        let t = task();
        let sum = WeightedSum::new(vec![
            (Box::new(NdcgAt(1)), 0.5),
            (Box::new(RecallAt(2)), 2.0),
        ]);
        // [d3, d1]: nDCG@1 = 2/3, recall@2 = 2/3 → 0.5·2/3 + 2·2/3 = 5/3.
        let s = sum.score(&t, &answer(&["d3", "d1"]));
        assert!((s - 5.0 / 3.0).abs() < 1e-12, "{s}");
        assert_eq!(sum.components(&t, &answer(&[])).len(), 2);
    }
}
