//! Query sets: TSV/CSV (`id<TAB>text`, with or without a header) or JSON Lines.
//!
//! Header names recognised (first match wins): id — `query_id`, `qid`, `id`, `_id`; text — `text`,
//! `query`, `question`, `title`. A headerless table uses the first column as id and the last as text.

use std::path::Path;

use serde::Serialize;

use crate::error::{Result, SearchError};
use crate::readers::{self, Format};

const ID_NAMES: &[&str] = &["query_id", "qid", "id", "_id"];
const TEXT_NAMES: &[&str] = &["text", "query", "question", "title"];

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Query {
    pub id: String,
    pub text: String,
}

/// Reads a query file; every malformed row is an error naming the file and line.
pub fn load(path: &Path) -> Result<Vec<Query>> {
    let bad = |line: u64, message: String| SearchError::BadRow {
        path: path.to_path_buf(),
        line,
        message,
    };
    let format = readers::detect(path).ok_or_else(|| SearchError::UnsupportedFormat {
        path: path.to_path_buf(),
        expected: ".tsv, .csv or .jsonl",
    })?;
    let mut out = Vec::new();
    match format {
        Format::JsonLines => {
            for line in readers::lines(path)? {
                let (n, text) = line?;
                let text = text.map_err(|e| bad(n, e))?;
                if text.trim().is_empty() {
                    continue;
                }
                let v: serde_json::Value = serde_json::from_str(&text)
                    .map_err(|e| bad(n, format!("malformed JSON: {e}")))?;
                let pick = |names: &[&str]| {
                    names.iter().find_map(|k| match v.get(*k) {
                        Some(serde_json::Value::String(s)) => Some(s.clone()),
                        Some(x @ serde_json::Value::Number(_)) => Some(x.to_string()),
                        _ => None,
                    })
                };
                let id = pick(ID_NAMES).ok_or_else(|| {
                    bad(
                        n,
                        format!("no query id field (one of {})", ID_NAMES.join(", ")),
                    )
                })?;
                let qtext = pick(TEXT_NAMES).ok_or_else(|| {
                    bad(
                        n,
                        format!("no query text field (one of {})", TEXT_NAMES.join(", ")),
                    )
                })?;
                out.push(Query { id, text: qtext });
            }
        }
        Format::Tsv | Format::Csv => {
            let table = readers::read_table(path, format)?;
            let find = |names: &[&str]| {
                names
                    .iter()
                    .find_map(|n| table.header.iter().position(|h| h.eq_ignore_ascii_case(n)))
            };
            let (id_col, text_col, has_header) = match (find(ID_NAMES), find(TEXT_NAMES)) {
                (Some(i), Some(t)) => (i, t, true),
                _ if table.header.len() >= 2 => (0, table.header.len() - 1, false),
                _ => return Err(bad(1, "expected at least two columns: id and text".into())),
            };
            let mut rows = Vec::with_capacity(table.rows.len() + 1);
            if !has_header {
                rows.push((1, Ok(table.header.clone())));
            }
            rows.extend(table.rows);
            for (n, row) in rows {
                let f = row.map_err(|e| bad(n, e))?;
                let id = f[id_col].trim().to_string();
                if id.is_empty() {
                    return Err(bad(n, "empty query id".into()));
                }
                out.push(Query {
                    id,
                    text: f[text_col].trim().to_string(),
                });
            }
        }
        Format::Trec => {
            return Err(SearchError::UnsupportedFormat {
                path: path.to_path_buf(),
                expected: ".tsv, .csv or .jsonl",
            })
        }
    }
    if out.is_empty() {
        return Err(SearchError::Empty {
            path: path.to_path_buf(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(name: &str, content: &str) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(name);
        std::fs::write(&p, content).unwrap();
        (dir, p)
    }

    #[test]
    fn tsv_with_and_without_header() {
        let (_d, p) = write("q.tsv", "query_id\toriginal\ttext\n1\t001\twing flutter\n");
        assert_eq!(
            load(&p).unwrap(),
            vec![Query {
                id: "1".into(),
                text: "wing flutter".into()
            }]
        );
        let (_d, p) = write("q.tsv", "7\tfirst\n8\tsecond\n");
        let q = load(&p).unwrap();
        assert_eq!(q.len(), 2);
        assert_eq!(
            q[1],
            Query {
                id: "8".into(),
                text: "second".into()
            }
        );
    }

    #[test]
    fn jsonl_field_names() {
        let (_d, p) = write(
            "q.jsonl",
            "{\"query_id\": \"a\", \"question\": \"who?\"}\n{\"qid\": 3, \"text\": \"t\"}\n",
        );
        let q = load(&p).unwrap();
        assert_eq!(q[0].text, "who?");
        assert_eq!(q[1].id, "3");
        let (_d, p) = write("q.jsonl", "{\"query_id\": \"a\"}\n");
        let msg = load(&p).unwrap_err().to_string();
        assert!(
            msg.contains("q.jsonl line 1") && msg.contains("no query text"),
            "{msg}"
        );
    }
}
