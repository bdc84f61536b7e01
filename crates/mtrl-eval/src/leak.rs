//! Leakage check: evaluation prompts never enter training.
//!
//! A test task leaks when its content also appears in a training file. Content, not ids: two
//! collections may both have a query `1`, and a copied row may carry a new id. For a search task
//! the content is its query text, lower-cased with runs of whitespace collapsed (so a re-exported
//! or re-spaced copy still matches); for any other prompt, the whole prompt text normalised the
//! same way. The whole of each training file is compared, validation hold-outs included (they
//! are drawn from the same rows).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use mtrl_env::{load_tasks, SearchTask, Task};

use crate::error::{EvalError, Result};
use crate::tasks::TestSet;

/// A test task whose content is also in a training file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overlap {
    pub test_file: PathBuf,
    pub test_task: String,
    pub train_file: PathBuf,
    pub train_task: String,
}

fn normalise(s: &str) -> String {
    s.split_whitespace()
        .map(str::to_lowercase)
        .collect::<Vec<_>>()
        .join(" ")
}

/// What two tasks must share to be the same prompt (see the module docs).
pub fn content_key(task: &Task) -> String {
    match SearchTask::parse(task) {
        Ok(t) => format!("query:{}", normalise(&t.query)),
        Err(_) => format!("prompt:{}", normalise(&task.prompt)),
    }
}

/// Every (test task, training task) pair with the same content.
pub fn find_overlaps(
    test: &[TestSet],
    train_files: &[PathBuf],
    skip_bad_rows: bool,
) -> Result<Vec<Overlap>> {
    let mut train: HashMap<String, Vec<(usize, String)>> = HashMap::new();
    for (f, path) in train_files.iter().enumerate() {
        let (tasks, _) = load_tasks(path, skip_bad_rows)?;
        for t in tasks {
            train.entry(content_key(&t)).or_default().push((f, t.id));
        }
    }
    let mut out = Vec::new();
    for set in test {
        for t in &set.tasks {
            for (f, id) in train.get(&content_key(t)).into_iter().flatten() {
                out.push(Overlap {
                    test_file: set.path.clone(),
                    test_task: t.id.clone(),
                    train_file: train_files[*f].clone(),
                    train_task: id.clone(),
                });
            }
        }
    }
    Ok(out)
}

/// Errors naming the files (and a few tasks) when any test task appears in a training file.
pub fn refuse_overlaps(
    test: &[TestSet],
    train_files: &[PathBuf],
    skip_bad_rows: bool,
) -> Result<()> {
    let overlaps = find_overlaps(test, train_files, skip_bad_rows)?;
    if overlaps.is_empty() {
        return Ok(());
    }
    let mut by_files: BTreeMap<(PathBuf, PathBuf), Vec<&Overlap>> = BTreeMap::new();
    for o in &overlaps {
        by_files
            .entry((o.test_file.clone(), o.train_file.clone()))
            .or_default()
            .push(o);
    }
    let parts: Vec<String> = by_files
        .iter()
        .map(|((test, train), os)| {
            let examples: Vec<String> = os
                .iter()
                .take(3)
                .map(|o| format!("test `{}` = train `{}`", o.test_task, o.train_task))
                .collect();
            format!(
                "{} shares {} task(s) with training file {} (e.g. {})",
                test.display(),
                os.len(),
                train.display(),
                examples.join(", ")
            )
        })
        .collect();
    Err(EvalError::Leak(format!(
        "refusing to evaluate: test prompts also appear in the training data (compared by query \
         text): {}",
        parts.join("; ")
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(id: &str, query: &str) -> Task {
        Task {
            id: id.into(),
            prompt: format!(r#"{{"query": "{query}", "qrels": {{"d1": 1}}}}"#),
        }
    }

    #[test]
    fn matches_by_content_not_id() {
        let dir = tempfile::tempdir().unwrap();
        let train = dir.path().join("train.jsonl");
        std::fs::write(
            &train,
            "{\"id\": \"t7\", \"prompt\": {\"query\": \"Boundary  LAYER flow\", \"qrels\": {\"d9\": 2}}}\n\
             {\"id\": \"q2\", \"prompt\": {\"query\": \"something else\", \"qrels\": {\"d1\": 1}}}\n",
        )
        .unwrap();
        let test = vec![TestSet {
            name: "t".into(),
            path: dir.path().join("test.jsonl"),
            tasks: vec![task("q1", "boundary layer flow"), task("q2", "wings")],
        }];
        let o = find_overlaps(&test, std::slice::from_ref(&train), false).unwrap();
        assert_eq!(o.len(), 1);
        assert_eq!(
            (o[0].test_task.as_str(), o[0].train_task.as_str()),
            ("q1", "t7")
        );
        let msg = refuse_overlaps(&test, std::slice::from_ref(&train), false)
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("test.jsonl") && msg.contains("train.jsonl") && msg.contains("`q1`"),
            "{msg}"
        );
        refuse_overlaps(&test, &[], false).unwrap();
    }
}
