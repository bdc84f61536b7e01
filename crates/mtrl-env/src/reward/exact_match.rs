//! Exact match for QA-style answers: 1 when the submitted answer text equals one of the task's
//! reference answers after SQuAD-style normalisation (lowercase, punctuation and the articles
//! a/an/the removed, whitespace collapsed), else 0. No answer text scores 0.

use super::Reward;
use crate::task::SearchTask;
use crate::tool::Answer;

#[derive(Debug, Clone, Copy)]
pub struct ExactMatch;

/// Lowercase, drop punctuation and articles, collapse whitespace.
pub fn normalize_answer(s: &str) -> String {
    let lower: String = s
        .to_lowercase()
        .chars()
        .map(|c| if c.is_alphanumeric() { c } else { ' ' })
        .collect();
    lower
        .split_whitespace()
        .filter(|w| !matches!(*w, "a" | "an" | "the"))
        .collect::<Vec<_>>()
        .join(" ")
}

impl Reward for ExactMatch {
    fn name(&self) -> String {
        "exact_match".into()
    }

    fn score(&self, task: &SearchTask, answer: &Answer) -> f64 {
        let Some(text) = &answer.text else {
            return 0.0;
        };
        let got = normalize_answer(text);
        let hit = task.answers.iter().any(|a| normalize_answer(a) == got);
        if hit {
            1.0
        } else {
            0.0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reward::tests::task;

    fn ans(t: &str) -> Answer {
        Answer {
            doc_ids: vec![],
            text: Some(t.into()),
        }
    }

    #[test]
    fn hand_worked() {
        let t = task(); // reference: "The Eiffel Tower"
        assert_eq!(ExactMatch.score(&t, &ans("eiffel tower")), 1.0);
        assert_eq!(ExactMatch.score(&t, &ans("  The EIFFEL-tower. ")), 1.0);
        assert_eq!(ExactMatch.score(&t, &ans("Eiffel")), 0.0);
        assert_eq!(ExactMatch.score(&t, &Answer::default()), 0.0);
        assert_eq!(normalize_answer("An apple, a day!"), "apple day");
    }
}
