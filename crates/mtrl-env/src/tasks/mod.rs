//! Task files in the managed service's asset format: Parquet, JSON Lines, JSON (an array of
//! objects) or CSV. Each row becomes a [`Task`]: the `prompt` column (else the first column) is the
//! prompt, passed on as-is (a JSON object or array in a JSON row is serialised to text); the id is
//! the `id` / `task_id` / `query_id` / `qid` column when present, else `<file stem>:<row>`.
//!
//! Invariants: a malformed row is an error naming the file and the 1-based row (header excluded),
//! or, with `skip_bad_rows`, is skipped and counted in [`LoadReport`]; rows keep file order;
//! "first column" means the first key as written in the file, whatever serde_json's map type.

mod ordered;
mod parquet;

pub use parquet::write_tasks as write_parquet_tasks;

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::{EnvError, Result};
use crate::task::Task;
use ordered::{JsonRow, OrderedObject};

const ID_NAMES: &[&str] = &["id", "task_id", "query_id", "qid"];

/// Search tasks from a query set and its judgments: one task per query that has judgments, in
/// query-file order, id = query id (what `mtrl data prepare` writes and `mtrl rollout` runs when
/// the config has no `[data]`).
pub fn from_qrels(queries: &[mtrl_search::Query], qrels: &mtrl_search::Qrels) -> Vec<Task> {
    queries
        .iter()
        .filter_map(|q| {
            let judged = qrels.for_query(&q.id)?;
            Some(Task {
                id: q.id.clone(),
                prompt: crate::task::SearchTask::prompt_json(&q.text, judged),
            })
        })
        .collect()
}

/// What loading a task file did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoadReport {
    pub path: PathBuf,
    pub rows: usize,
    pub skipped: usize,
    /// Up to 10 (row, reason) of the skipped rows.
    pub examples: Vec<(usize, String)>,
}

/// Reads a task file; the format follows the extension (`.parquet`, `.jsonl`/`.ndjson`, `.json`,
/// `.csv`).
pub fn load_tasks(path: &Path, skip_bad_rows: bool) -> Result<(Vec<Task>, LoadReport)> {
    let ext = path
        .extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    let mut sink = Sink {
        path: path.to_path_buf(),
        stem: path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "task".into()),
        skip: skip_bad_rows,
        tasks: Vec::new(),
        report: LoadReport {
            path: path.to_path_buf(),
            ..LoadReport::default()
        },
    };
    match ext.as_str() {
        "parquet" | "pq" => parquet::read(path, &mut sink)?,
        "jsonl" | "ndjson" => read_jsonl(path, &mut sink)?,
        "json" => read_json_array(path, &mut sink)?,
        "csv" => read_csv(path, &mut sink)?,
        _ => {
            return Err(EnvError::UnsupportedFormat {
                path: path.to_path_buf(),
            })
        }
    }
    Ok((sink.tasks, sink.report))
}

/// Collects rows, applying the skip policy.
pub(crate) struct Sink {
    path: PathBuf,
    stem: String,
    skip: bool,
    tasks: Vec<Task>,
    report: LoadReport,
}

impl Sink {
    /// Accepts row `row` (1-based): `Ok((id, prompt))` or the reason it is bad.
    pub(crate) fn row(
        &mut self,
        row: usize,
        parsed: std::result::Result<(Option<String>, String), String>,
    ) -> Result<()> {
        self.report.rows += 1;
        match parsed {
            Ok((id, prompt)) => {
                let id = id.unwrap_or_else(|| format!("{}:{row}", self.stem));
                self.tasks.push(Task { id, prompt });
                Ok(())
            }
            Err(message) if self.skip => {
                self.report.skipped += 1;
                if self.report.examples.len() < 10 {
                    self.report.examples.push((row, message));
                }
                Ok(())
            }
            Err(message) => Err(EnvError::BadRow {
                path: self.path.clone(),
                row,
                message,
            }),
        }
    }
}

fn read_err(path: &Path, e: impl std::fmt::Display) -> EnvError {
    EnvError::Read {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

/// The prompt text of a JSON cell: strings as-is, anything else serialised.
fn cell_text(v: &Value) -> std::result::Result<String, String> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Null => Err("prompt is null".into()),
        other => Ok(other.to_string()),
    }
}

fn id_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) if !s.trim().is_empty() => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// `(id, prompt)` of one JSON object row.
fn object_row(obj: &OrderedObject) -> std::result::Result<(Option<String>, String), String> {
    let prompt = match obj.get("prompt").or_else(|| obj.first()) {
        Some(v) => cell_text(v)?,
        None => return Err("empty object: no prompt column".into()),
    };
    let id = ID_NAMES.iter().find_map(|k| obj.get(k)).and_then(id_text);
    Ok((id, prompt))
}

fn read_jsonl(path: &Path, sink: &mut Sink) -> Result<()> {
    let text = std::fs::read(path).map_err(|e| read_err(path, e))?;
    let mut row = 0;
    for line in text.split(|b| *b == b'\n') {
        let line = match std::str::from_utf8(line) {
            Ok(l) => l.trim(),
            Err(e) => {
                row += 1;
                sink.row(row, Err(format!("not UTF-8: {e}")))?;
                continue;
            }
        };
        if line.is_empty() {
            continue;
        }
        row += 1;
        let parsed = match serde_json::from_str::<JsonRow>(line) {
            Ok(JsonRow::Object(obj)) => object_row(&obj),
            Ok(JsonRow::Other(kind)) => Err(format!("expected a JSON object, found {kind}")),
            Err(e) => Err(format!("malformed JSON: {e}")),
        };
        sink.row(row, parsed)?;
    }
    Ok(())
}

fn read_json_array(path: &Path, sink: &mut Sink) -> Result<()> {
    let text = std::fs::read_to_string(path).map_err(|e| read_err(path, e))?;
    let rows: Vec<JsonRow> = serde_json::from_str(&text)
        .map_err(|e| read_err(path, format!("expected a JSON array of objects: {e}")))?;
    for (i, r) in rows.iter().enumerate() {
        let parsed = match r {
            JsonRow::Object(obj) => object_row(obj),
            JsonRow::Other(kind) => Err(format!("expected a JSON object, found {kind}")),
        };
        sink.row(i + 1, parsed)?;
    }
    Ok(())
}

fn read_csv(path: &Path, sink: &mut Sink) -> Result<()> {
    let mut rdr = csv::ReaderBuilder::new()
        .flexible(true)
        .from_path(path)
        .map_err(|e| read_err(path, e))?;
    let header: Vec<String> = rdr
        .headers()
        .map_err(|e| read_err(path, e))?
        .iter()
        .map(|h| h.trim().to_string())
        .collect();
    if header.is_empty() || header.iter().all(String::is_empty) {
        return Err(read_err(path, "no header row"));
    }
    let col = |name: &str| header.iter().position(|h| h.eq_ignore_ascii_case(name));
    let prompt_col = col("prompt").unwrap_or(0);
    let id_col = ID_NAMES.iter().find_map(|n| col(n));
    for (i, rec) in rdr.records().enumerate() {
        let parsed = match rec {
            Err(e) => Err(format!("malformed CSV: {e}")),
            Ok(r) if r.len() != header.len() => Err(format!(
                "{} fields, the header has {}",
                r.len(),
                header.len()
            )),
            Ok(r) => match r.get(prompt_col) {
                Some(p) if !p.trim().is_empty() => Ok((
                    id_col
                        .and_then(|c| r.get(c))
                        .filter(|s| !s.trim().is_empty())
                        .map(str::to_string),
                    p.to_string(),
                )),
                _ => Err(format!("empty `{}` column", header[prompt_col])),
            },
        };
        sink.row(i + 1, parsed)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn jsonl_json_and_csv_rows() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(
            dir.path(),
            "a.jsonl",
            "{\"zz\":\"first\",\"id\":7}\n\n{\"prompt\":{\"query\":\"q\"},\"id\":\"x\"}\n",
        );
        let (tasks, rep) = load_tasks(&p, false).unwrap();
        assert_eq!(rep.rows, 2);
        assert_eq!(tasks[0].id, "7");
        assert_eq!(tasks[0].prompt, "first");
        assert_eq!(tasks[1].prompt, "{\"query\":\"q\"}");
        let p = write(dir.path(), "b.json", "[{\"b\":\"p1\"},{\"prompt\":\"p2\"}]");
        let (tasks, _) = load_tasks(&p, false).unwrap();
        assert_eq!(tasks[0].id, "b:1");
        assert_eq!(tasks[0].prompt, "p1");
        assert_eq!(tasks[1].prompt, "p2");
        let p = write(
            dir.path(),
            "c.csv",
            "qid,prompt\nq1,\"{\"\"query\"\":\"\"a,b\"\"}\"\n",
        );
        let (tasks, _) = load_tasks(&p, false).unwrap();
        assert_eq!(tasks[0].id, "q1");
        assert_eq!(tasks[0].prompt, "{\"query\":\"a,b\"}");
    }

    #[test]
    fn bad_rows_name_file_and_row_or_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(dir.path(), "t.jsonl", "{\"prompt\":\"ok\"}\n{broken\n[1]\n");
        let msg = load_tasks(&p, false).unwrap_err().to_string();
        assert!(msg.contains("t.jsonl") && msg.contains("row 2"), "{msg}");
        let (tasks, rep) = load_tasks(&p, true).unwrap();
        assert_eq!((tasks.len(), rep.rows, rep.skipped), (1, 3, 2));
        assert_eq!(rep.examples[1].0, 3);
        let p = write(dir.path(), "t.csv", "prompt,id\nok,1\n,2\na,b,c\n");
        let msg = load_tasks(&p, false).unwrap_err().to_string();
        assert!(msg.contains("t.csv") && msg.contains("row 2"), "{msg}");
        let (_, rep) = load_tasks(&p, true).unwrap();
        assert_eq!(rep.skipped, 2);
        let p = write(dir.path(), "t.json", "[{\"prompt\":null}]");
        assert!(load_tasks(&p, false)
            .unwrap_err()
            .to_string()
            .contains("row 1"));
        let p = write(dir.path(), "t.txt", "");
        assert!(matches!(
            load_tasks(&p, false),
            Err(EnvError::UnsupportedFormat { .. })
        ));
    }
}
