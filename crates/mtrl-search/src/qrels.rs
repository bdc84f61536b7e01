//! Relevance judgments: TREC (`qid 0 docid grade`, whitespace-separated) or TSV/CSV
//! (`qid docid grade`, with or without a header; a 4-column headerless table is read as TREC).
//!
//! Grades are integers (negative grades, such as Cranfield's -1, are kept and count as
//! non-relevant with gain 0). When a pair is judged twice the last judgment wins.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use crate::error::{Result, SearchError};
use crate::readers::{self, Format};

const QID_NAMES: &[&str] = &["query_id", "qid", "query-id", "topic"];
const DOC_NAMES: &[&str] = &["doc_id", "docid", "docno", "corpus-id", "doc"];
const GRADE_NAMES: &[&str] = &["gain", "relevance", "grade", "label", "rel", "score"];

/// Judgments per query: query id → (document id → grade).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Qrels {
    by_query: BTreeMap<String, HashMap<String, i32>>,
}

impl Qrels {
    pub fn new() -> Qrels {
        Qrels::default()
    }

    pub fn insert(&mut self, qid: &str, doc_id: &str, grade: i32) {
        self.by_query
            .entry(qid.to_string())
            .or_default()
            .insert(doc_id.to_string(), grade);
    }

    /// The judgments of one query (empty map when the query has none).
    pub fn for_query(&self, qid: &str) -> Option<&HashMap<String, i32>> {
        self.by_query.get(qid)
    }

    /// Judged query ids, sorted.
    pub fn query_ids(&self) -> impl Iterator<Item = &str> {
        self.by_query.keys().map(String::as_str)
    }

    pub fn num_queries(&self) -> usize {
        self.by_query.len()
    }

    pub fn num_judgments(&self) -> usize {
        self.by_query.values().map(HashMap::len).sum()
    }

    /// Reads a qrels file; a malformed line is an error naming the file and line.
    pub fn load(path: &Path) -> Result<Qrels> {
        let bad = |line: u64, message: String| SearchError::BadRow {
            path: path.to_path_buf(),
            line,
            message,
        };
        let format = readers::detect(path).unwrap_or(Format::Trec);
        let mut q = Qrels::new();
        let grade = |n: u64, s: &str| -> Result<i32> {
            let s = s.trim();
            s.parse::<i32>()
                .or_else(|_| s.parse::<f64>().map(|f| f.round() as i32).map_err(|_| ()))
                .map_err(|_| bad(n, format!("grade `{s}` is not a number")))
        };
        match format {
            Format::Trec => {
                for line in readers::lines(path)? {
                    let (n, text) = line?;
                    let text = text.map_err(|e| bad(n, e))?;
                    let f: Vec<&str> = text.split_whitespace().collect();
                    match f.len() {
                        0 => continue,
                        4 => q.insert(f[0], f[2], grade(n, f[3])?),
                        k => {
                            return Err(bad(
                                n,
                                format!("expected 4 fields `qid iter docid grade`, found {k}"),
                            ))
                        }
                    }
                }
            }
            Format::Tsv | Format::Csv => {
                let table = readers::read_table(path, format)?;
                let find = |names: &[&str]| {
                    names
                        .iter()
                        .find_map(|n| table.header.iter().position(|h| h.eq_ignore_ascii_case(n)))
                };
                let header_grade_numeric = table
                    .header
                    .last()
                    .is_some_and(|g| g.trim().parse::<f64>().is_ok());
                let (qc, dc, gc, rows) = if header_grade_numeric {
                    let w = table.header.len();
                    let (qc, dc, gc) = match w {
                        3 => (0, 1, 2),
                        4 => (0, 2, 3),
                        _ => return Err(bad(1, format!("expected 3 or 4 columns, found {w}"))),
                    };
                    let mut rows = vec![(1, Ok(table.header.clone()))];
                    rows.extend(table.rows);
                    (qc, dc, gc, rows)
                } else {
                    let missing = |what: &str, names: &[&str]| {
                        bad(
                            1,
                            format!("header has no {what} column (one of {})", names.join(", ")),
                        )
                    };
                    (
                        find(QID_NAMES).ok_or_else(|| missing("query id", QID_NAMES))?,
                        find(DOC_NAMES).ok_or_else(|| missing("document id", DOC_NAMES))?,
                        find(GRADE_NAMES).ok_or_else(|| missing("grade", GRADE_NAMES))?,
                        table.rows,
                    )
                };
                for (n, row) in rows {
                    let f = row.map_err(|e| bad(n, e))?;
                    q.insert(f[qc].trim(), f[dc].trim(), grade(n, &f[gc])?);
                }
            }
            Format::JsonLines => {
                return Err(SearchError::UnsupportedFormat {
                    path: path.to_path_buf(),
                    expected: "TREC qrels or .tsv/.csv",
                })
            }
        }
        if q.by_query.is_empty() {
            return Err(SearchError::Empty {
                path: path.to_path_buf(),
            });
        }
        Ok(q)
    }
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
    fn trec_and_tsv_forms_agree() {
        let (_a, trec) = write("q.trec", "1 0 d1 3\n1 0 d2 -1\n2 0 d9 1\n");
        let (_b, tsv) = write(
            "q.tsv",
            "query_id\tdoc_id\tcode\tgain\n1\td1\t2\t3\n1\td2\t-1\t-1\n2\td9\t4\t1\n",
        );
        let (_c, bare) = write("q.tsv", "1\td1\t3\n1\td2\t-1\n2\td9\t1\n");
        let a = Qrels::load(&trec).unwrap();
        assert_eq!(a, Qrels::load(&tsv).unwrap());
        assert_eq!(a, Qrels::load(&bare).unwrap());
        assert_eq!(a.num_queries(), 2);
        assert_eq!(a.for_query("1").unwrap()["d1"], 3);
    }

    #[test]
    fn bad_lines_are_named() {
        let (_a, p) = write("q.trec", "1 0 d1 3\n1 0 d2\n");
        let msg = Qrels::load(&p).unwrap_err().to_string();
        assert!(
            msg.contains("q.trec line 2") && msg.contains("expected 4 fields"),
            "{msg}"
        );
        let (_a, p) = write("q.trec", "1 0 d1 high\n");
        assert!(Qrels::load(&p)
            .unwrap_err()
            .to_string()
            .contains("not a number"));
    }
}
