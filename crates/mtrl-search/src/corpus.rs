//! Corpus ingest: JSON Lines or CSV/TSV (each optionally `.gz`) into an in-memory document store.
//!
//! Every problem with a row — malformed JSON, a missing id or text column, an empty document, bad
//! UTF-8, a duplicate id, a wrong field count — is an error naming the file and line. With
//! `skip_bad_rows` the row is skipped instead and counted in the [`IngestReport`], which keeps the
//! first few reasons so the user can see what was dropped.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use mtrl_core::config::Columns;
use serde::Serialize;

use crate::error::{Result, SearchError};
use crate::readers::{self, Format};
use crate::{snippet, Hit};

/// One retrievable document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Document {
    pub id: String,
    pub title: String,
    pub text: String,
}

impl Document {
    /// The text that is indexed and embedded: title and body, without repeating a title that the
    /// body already starts with (Cranfield abstracts do).
    pub fn indexed_text(&self) -> String {
        let title = self.title.trim();
        if title.is_empty() || self.text.trim_start().starts_with(title) {
            self.text.clone()
        } else if self.text.trim().is_empty() {
            title.to_string()
        } else {
            format!("{title}\n{}", self.text)
        }
    }
}

/// What ingest skipped (only non-empty with `skip_bad_rows = true`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct IngestReport {
    pub rows_read: u64,
    pub skipped: u64,
    /// The first skipped rows as `(line, reason)`, at most [`IngestReport::MAX_EXAMPLES`].
    pub examples: Vec<(u64, String)>,
}

impl IngestReport {
    pub const MAX_EXAMPLES: usize = 20;

    fn skip(&mut self, line: u64, reason: String) {
        self.skipped += 1;
        if self.examples.len() < Self::MAX_EXAMPLES {
            self.examples.push((line, reason));
        }
    }
}

/// Documents in file order, addressable by position (`ord`) and by id.
#[derive(Debug, Clone, Default)]
pub struct Corpus {
    docs: Vec<Document>,
    by_id: HashMap<String, usize>,
}

impl Corpus {
    /// Builds a corpus from documents; duplicate ids are an error naming the id.
    pub fn from_documents(docs: Vec<Document>) -> Result<Corpus> {
        let mut by_id = HashMap::with_capacity(docs.len());
        for (i, d) in docs.iter().enumerate() {
            if by_id.insert(d.id.clone(), i).is_some() {
                return Err(SearchError::InvalidArgument(format!(
                    "duplicate document id `{}`",
                    d.id
                )));
            }
        }
        Ok(Corpus { docs, by_id })
    }

    /// Reads a corpus file. `columns` names the id/title/text fields; a missing title column means
    /// documents without titles, a missing id or text column is an error.
    pub fn load(
        path: &Path,
        columns: &Columns,
        skip_bad_rows: bool,
    ) -> Result<(Corpus, IngestReport)> {
        let format = readers::detect(path).ok_or_else(|| SearchError::UnsupportedFormat {
            path: path.to_path_buf(),
            expected: ".jsonl, .tsv or .csv, optionally .gz",
        })?;
        let mut b = Builder {
            path: path.to_path_buf(),
            skip_bad_rows,
            corpus: Corpus::default(),
            first_line: Vec::new(),
            report: IngestReport::default(),
        };
        match format {
            Format::JsonLines => {
                for line in readers::lines(path)? {
                    let (n, text) = line?;
                    let row = text.and_then(|t| {
                        if t.trim().is_empty() {
                            Ok(None)
                        } else {
                            parse_json_row(&t, columns).map(Some)
                        }
                    });
                    match row {
                        Ok(None) => {}
                        Ok(Some(doc)) => b.add(n, Ok(doc))?,
                        Err(e) => b.add(n, Err(e))?,
                    }
                }
            }
            Format::Tsv | Format::Csv => {
                let table = readers::read_table(path, format)?;
                let col = |name: &str| table.header.iter().position(|h| h == name);
                let missing = |name: &str| SearchError::BadRow {
                    path: path.to_path_buf(),
                    line: 1,
                    message: format!(
                        "header has no `{name}` column (columns: {})",
                        table.header.join(", ")
                    ),
                };
                let id_col = col(&columns.id).ok_or_else(|| missing(&columns.id))?;
                let text_col = col(&columns.text).ok_or_else(|| missing(&columns.text))?;
                let title_col = col(&columns.title);
                for (n, row) in table.rows {
                    let doc = row.map(|f| Document {
                        id: f[id_col].trim().to_string(),
                        title: title_col
                            .map(|c| f[c].trim().to_string())
                            .unwrap_or_default(),
                        text: f[text_col].trim().to_string(),
                    });
                    b.add(n, doc)?;
                }
            }
            Format::Trec => {
                return Err(SearchError::UnsupportedFormat {
                    path: path.to_path_buf(),
                    expected: ".jsonl, .tsv or .csv, optionally .gz",
                })
            }
        }
        if b.corpus.docs.is_empty() {
            return Err(SearchError::Empty {
                path: path.to_path_buf(),
            });
        }
        Ok((b.corpus, b.report))
    }

    pub fn len(&self) -> usize {
        self.docs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.docs.is_empty()
    }

    pub fn get(&self, ord: usize) -> Option<&Document> {
        self.docs.get(ord)
    }

    pub fn ord_of(&self, id: &str) -> Option<usize> {
        self.by_id.get(id).copied()
    }

    pub fn by_id(&self, id: &str) -> Option<&Document> {
        self.ord_of(id).map(|i| &self.docs[i])
    }

    pub fn documents(&self) -> &[Document] {
        &self.docs
    }

    /// Turns `(ord, score)` pairs into hits with titles and snippets of `snippet_chars`
    /// characters (ords outside the corpus are dropped).
    pub fn hits(
        &self,
        scored: impl IntoIterator<Item = (usize, f32)>,
        snippet_chars: usize,
    ) -> Vec<Hit> {
        scored
            .into_iter()
            .filter_map(|(ord, score)| {
                let d = self.get(ord)?;
                Some(Hit {
                    doc_id: d.id.clone(),
                    score,
                    title: d.title.clone(),
                    snippet: snippet(&d.text, snippet_chars),
                })
            })
            .collect()
    }
}

struct Builder {
    path: PathBuf,
    skip_bad_rows: bool,
    corpus: Corpus,
    first_line: Vec<u64>,
    report: IngestReport,
}

impl Builder {
    fn add(&mut self, line: u64, doc: std::result::Result<Document, String>) -> Result<()> {
        self.report.rows_read += 1;
        let doc = doc.and_then(|d| {
            if d.id.is_empty() {
                Err("empty document id".to_string())
            } else if d.title.trim().is_empty() && d.text.trim().is_empty() {
                Err(format!(
                    "document `{}` is empty (no title and no text)",
                    d.id
                ))
            } else {
                Ok(d)
            }
        });
        let doc = match doc {
            Ok(d) => d,
            Err(message) if self.skip_bad_rows => {
                self.report.skip(line, message);
                return Ok(());
            }
            Err(message) => {
                return Err(SearchError::BadRow {
                    path: self.path.clone(),
                    line,
                    message,
                })
            }
        };
        if let Some(&first) = self.corpus.by_id.get(&doc.id) {
            let first_line = self.first_line[first];
            if self.skip_bad_rows {
                self.report.skip(
                    line,
                    format!(
                        "duplicate document id `{}` (first on line {first_line})",
                        doc.id
                    ),
                );
                return Ok(());
            }
            return Err(SearchError::DuplicateId {
                path: self.path.clone(),
                line,
                id: doc.id,
                first_line,
            });
        }
        self.corpus
            .by_id
            .insert(doc.id.clone(), self.corpus.docs.len());
        self.corpus.docs.push(doc);
        self.first_line.push(line);
        Ok(())
    }
}

fn parse_json_row(line: &str, columns: &Columns) -> std::result::Result<Document, String> {
    let value: serde_json::Value =
        serde_json::from_str(line).map_err(|e| format!("malformed JSON: {e}"))?;
    let obj = value
        .as_object()
        .ok_or_else(|| "expected a JSON object".to_string())?;
    let field = |name: &str, required: bool| -> std::result::Result<String, String> {
        match obj.get(name) {
            None | Some(serde_json::Value::Null) if required => {
                Err(format!("missing field `{name}`"))
            }
            None | Some(serde_json::Value::Null) => Ok(String::new()),
            Some(serde_json::Value::String(s)) => Ok(s.trim().to_string()),
            Some(v @ serde_json::Value::Number(_)) => Ok(v.to_string()),
            Some(_) => Err(format!("field `{name}` must be a string")),
        }
    };
    Ok(Document {
        id: field(&columns.id, true)?,
        title: field(&columns.title, false)?,
        text: field(&columns.text, true)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cols() -> Columns {
        Columns::default()
    }

    fn write(name: &str, content: &[u8]) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(name);
        std::fs::write(&p, content).unwrap();
        (dir, p)
    }

    #[test]
    fn jsonl_with_numeric_ids_and_blank_lines() {
        let (_d, p) = write("c.jsonl", b"{\"id\": 1, \"title\": \"T\", \"text\": \"body\"}\n\n{\"id\": \"b\", \"text\": \"x\"}\n");
        let (c, r) = Corpus::load(&p, &cols(), false).unwrap();
        assert_eq!(c.len(), 2);
        assert_eq!(c.get(0).unwrap().id, "1");
        assert_eq!(c.by_id("b").unwrap().title, "");
        assert_eq!(r.skipped, 0);
    }

    #[test]
    fn errors_name_file_and_line() {
        let cases: &[(&[u8], &str)] = &[
            (
                b"{\"id\":\"a\",\"text\":\"x\"}\n{\"id\":\"a\",\"text\":\"y\"}\n",
                "line 2: duplicate document id `a` (first seen on line 1)",
            ),
            (
                b"{\"id\":\"a\",\"text\":\"x\"}\n{oops\n",
                "line 2: malformed JSON",
            ),
            (b"{\"id\":\"a\"}\n", "line 1: missing field `text`"),
            (
                b"{\"id\":\"a\",\"text\":\"  \"}\n",
                "line 1: document `a` is empty",
            ),
            (
                b"{\"id\":\"a\",\"text\":\"x\"}\n{\"id\":\"b\",\"text\":\"\xff\"}\n",
                "line 2: invalid UTF-8",
            ),
            (b"[1,2]\n", "line 1: expected a JSON object"),
        ];
        for (content, want) in cases {
            let (_d, p) = write("c.jsonl", content);
            let msg = Corpus::load(&p, &cols(), false).unwrap_err().to_string();
            assert!(
                msg.contains("c.jsonl") && msg.contains(want),
                "{msg} !~ {want}"
            );
        }
    }

    #[test]
    fn skip_bad_rows_counts_and_keeps_reasons() {
        let (_d, p) = write(
            "c.jsonl",
            b"{\"id\":\"a\",\"text\":\"x\"}\n{bad\n{\"id\":\"a\",\"text\":\"y\"}\n{\"id\":\"c\",\"text\":\"\"}\n{\"id\":\"d\",\"text\":\"z\"}\n",
        );
        let (c, r) = Corpus::load(&p, &cols(), true).unwrap();
        assert_eq!(c.len(), 2);
        assert_eq!(r.rows_read, 5);
        assert_eq!(r.skipped, 3);
        assert_eq!(
            r.examples.iter().map(|e| e.0).collect::<Vec<_>>(),
            vec![2, 3, 4]
        );
    }

    #[test]
    fn tsv_with_column_mapping_and_missing_column() {
        let (_d, p) = write("c.tsv", b"doc_id\ttext\n1\thello\n2\tworld\n");
        let c = Columns {
            id: "doc_id".into(),
            ..cols()
        };
        let (corpus, _) = Corpus::load(&p, &c, false).unwrap();
        assert_eq!(corpus.by_id("2").unwrap().text, "world");
        let msg = Corpus::load(&p, &cols(), false).unwrap_err().to_string();
        assert!(
            msg.contains("line 1") && msg.contains("no `id` column"),
            "{msg}"
        );
        let (_d2, p2) = write("c.tsv", b"doc_id\ttext\n1\thello\textra\n");
        let msg = Corpus::load(&p2, &c, false).unwrap_err().to_string();
        assert!(
            msg.contains("line 2") && msg.contains("expected 2 fields"),
            "{msg}"
        );
    }

    #[test]
    fn csv_quoting() {
        let (_d, p) = write("c.csv", b"id,title,text\n1,\"A, b\",\"multi\nline\"\n");
        let (corpus, _) = Corpus::load(&p, &cols(), false).unwrap();
        assert_eq!(corpus.get(0).unwrap().title, "A, b");
        assert_eq!(corpus.get(0).unwrap().text, "multi\nline");
    }

    #[test]
    fn unsupported_and_empty() {
        let (_d, p) = write("c.parquet", b"x");
        assert!(Corpus::load(&p, &cols(), false)
            .unwrap_err()
            .to_string()
            .contains("unsupported"));
        let (_d, p) = write("c.jsonl", b"\n");
        assert!(Corpus::load(&p, &cols(), false)
            .unwrap_err()
            .to_string()
            .contains("no usable rows"));
    }

    #[test]
    fn indexed_text_does_not_repeat_title() {
        let d = Document {
            id: "1".into(),
            title: "wing".into(),
            text: "wing flutter".into(),
        };
        assert_eq!(d.indexed_text(), "wing flutter");
        let d = Document {
            id: "1".into(),
            title: "Paris".into(),
            text: "capital".into(),
        };
        assert_eq!(d.indexed_text(), "Paris\ncapital");
    }
}
