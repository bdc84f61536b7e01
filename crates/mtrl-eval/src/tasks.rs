//! Test sets: one per test task file, each a benchmark row group of the report.
//!
//! Every task of a test file must be a search task with at least one relevant judgment (a qrels
//! grade > 0): without one, nDCG@10 is 0 whatever the agent does, and a silently zero score would
//! read as a bad model. Such a file is an error naming the file, the task and its 1-based row.

use std::path::{Path, PathBuf};

use mtrl_env::{load_tasks, SearchTask, Task};

use crate::error::{EvalError, Result};

/// The tasks of one test file.
#[derive(Debug, Clone)]
pub struct TestSet {
    /// Benchmark name for reports (see [`benchmark_name`]).
    pub name: String,
    pub path: PathBuf,
    pub tasks: Vec<Task>,
}

/// `<parent folder>/<file stem>` (`runs/data/cranfield/test.jsonl` → `cranfield/test`), or the
/// stem alone for a file without a named parent.
pub fn benchmark_name(path: &Path) -> String {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string());
    match path
        .parent()
        .and_then(Path::file_name)
        .map(|p| p.to_string_lossy().into_owned())
    {
        Some(parent) if !parent.is_empty() => format!("{parent}/{stem}"),
        _ => stem,
    }
}

/// Loads each test file (the first `limit` tasks of each when given) and checks that every task
/// has judgments. Names are made unique by appending `#2`, `#3`, … when two files share one.
pub fn load_test_sets(
    paths: &[PathBuf],
    skip_bad_rows: bool,
    limit: Option<usize>,
) -> Result<Vec<TestSet>> {
    if paths.is_empty() {
        return Err(EvalError::Invalid(
            "no test task files: set `[data] test = [\"…\"]` in the config".into(),
        ));
    }
    let mut sets: Vec<TestSet> = Vec::with_capacity(paths.len());
    for path in paths {
        let bad = |message: String| EvalError::TestFile {
            path: path.clone(),
            message,
        };
        // Load errors name the file and row already.
        let (mut tasks, report) = load_tasks(path, skip_bad_rows)?;
        // Row numbers are the file's only when no row was skipped before.
        let row_of = |i: usize| match report.skipped {
            0 => format!(" (row {})", i + 1),
            _ => String::new(),
        };
        if let Some(n) = limit {
            tasks.truncate(n);
        }
        if tasks.is_empty() {
            return Err(bad("has no tasks".into()));
        }
        for (row, task) in tasks.iter().enumerate() {
            let st = SearchTask::parse(task).map_err(|e| bad(format!("{e}{}", row_of(row))))?;
            if !st.qrels.values().any(|g| *g > 0) {
                return Err(bad(format!(
                    "task {}{} has no relevance judgments (qrels with a grade > 0); \
                     evaluation needs judged tasks",
                    task.id,
                    row_of(row)
                )));
            }
        }
        let mut name = benchmark_name(path);
        let base = name.clone();
        let mut n = 1;
        while sets.iter().any(|s| s.name == name) {
            n += 1;
            name = format!("{base}#{n}");
        }
        sets.push(TestSet {
            name,
            path: path.clone(),
            tasks,
        });
    }
    Ok(sets)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, rows: &[&str]) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, rows.join("\n")).unwrap();
        p
    }

    #[test]
    fn names_limits_and_missing_qrels() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("cran");
        std::fs::create_dir(&sub).unwrap();
        let good = write(
            &sub,
            "test.jsonl",
            &[
                r#"{"id": "q1", "prompt": {"query": "wings", "qrels": {"d1": 1}}}"#,
                r#"{"id": "q2", "prompt": {"query": "flow", "qrels": {"d2": 2}}}"#,
            ],
        );
        let sets = load_test_sets(&[good.clone(), good.clone()], false, Some(1)).unwrap();
        assert_eq!(sets[0].name, "cran/test");
        assert_eq!(sets[1].name, "cran/test#2");
        assert_eq!(sets[0].tasks.len(), 1);

        let bad = write(
            &sub,
            "noqrels.jsonl",
            &[
                r#"{"id": "q1", "prompt": {"query": "wings", "qrels": {"d1": 1}}}"#,
                r#"{"id": "q9", "prompt": {"query": "flow"}}"#,
            ],
        );
        let msg = load_test_sets(std::slice::from_ref(&bad), false, None)
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains(&bad.display().to_string()) && msg.contains("q9") && msg.contains("row 2"),
            "{msg}"
        );
        let missing = sub.join("nope.jsonl");
        let msg = load_test_sets(std::slice::from_ref(&missing), false, None)
            .unwrap_err()
            .to_string();
        assert!(msg.contains(&missing.display().to_string()), "{msg}");
        assert!(load_test_sets(&[], false, None).is_err());
    }
}
