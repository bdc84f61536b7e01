//! Shared file plumbing for corpus, query and qrels readers: transparent `.gz`, format detection
//! by extension, and a line reader that reports bad UTF-8 with its line number instead of failing
//! the whole file.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::Path;

use crate::error::{Result, SearchError};

/// Table formats recognised by extension (after stripping `.gz`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    JsonLines,
    Tsv,
    Csv,
    /// Whitespace-separated TREC qrels (`.trec`, `.qrels`).
    Trec,
}

/// Detects the format from a path such as `docs.jsonl.gz`.
pub(crate) fn detect(path: &Path) -> Option<Format> {
    let name = path.file_name()?.to_string_lossy().to_ascii_lowercase();
    let name = name.strip_suffix(".gz").unwrap_or(&name);
    let ext = name.rsplit_once('.').map(|(_, e)| e).unwrap_or("");
    match ext {
        "jsonl" | "ndjson" => Some(Format::JsonLines),
        "tsv" | "tab" => Some(Format::Tsv),
        "csv" => Some(Format::Csv),
        "trec" | "qrels" | "qrel" => Some(Format::Trec),
        _ if name == "qrels" || name == "cranqrel" => Some(Format::Trec),
        _ => None,
    }
}

/// Opens a file for reading, decompressing `.gz` on the fly.
pub(crate) fn open(path: &Path) -> Result<Box<dyn BufRead + Send>> {
    let file = File::open(path).map_err(SearchError::io("open", path))?;
    let is_gz = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gz"));
    if is_gz {
        Ok(Box::new(BufReader::new(flate2::read::MultiGzDecoder::new(
            file,
        ))))
    } else {
        Ok(Box::new(BufReader::new(file)))
    }
}

/// One physical line: its 1-based number and its text, or the UTF-8 error on that line.
pub(crate) type Line = (u64, std::result::Result<String, String>);

/// Iterates over the lines of a file; IO errors end the iteration with an error.
pub(crate) fn lines(path: &Path) -> Result<impl Iterator<Item = Result<Line>>> {
    let mut reader = open(path)?;
    let path = path.to_path_buf();
    let mut n = 0u64;
    let mut buf = Vec::new();
    Ok(std::iter::from_fn(move || {
        buf.clear();
        match reader.read_until(b'\n', &mut buf) {
            Ok(0) => None,
            Ok(_) => {
                n += 1;
                while buf.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
                    buf.pop();
                }
                let text = String::from_utf8(std::mem::take(&mut buf))
                    .map_err(|e| format!("invalid UTF-8 at byte {}", e.utf8_error().valid_up_to()));
                Some(Ok((n, text)))
            }
            Err(source) => Some(Err(SearchError::Io {
                action: "read",
                path: path.clone(),
                source,
            })),
        }
    }))
}

/// A delimited-text table (CSV or TSV) with a header row, read field by field with line numbers.
pub(crate) struct Table {
    pub header: Vec<String>,
    pub rows: Vec<(u64, std::result::Result<Vec<String>, String>)>,
}

/// Reads a CSV/TSV file. TSV is read without quote handling (a `"` is an ordinary character), CSV
/// with RFC 4180 quoting. A row whose field count differs from the header is a row error.
pub(crate) fn read_table(path: &Path, format: Format) -> Result<Table> {
    let reader = open(path)?;
    let mut builder = csv::ReaderBuilder::new();
    builder.has_headers(false).flexible(true);
    if format == Format::Tsv {
        builder.delimiter(b'\t').quoting(false);
    }
    let mut rdr = builder.from_reader(reader);
    let mut header: Option<Vec<String>> = None;
    let mut rows = Vec::new();
    for rec in rdr.byte_records() {
        let rec = match rec {
            Ok(r) => r,
            Err(e) => {
                let line = e.position().map(|p| p.line()).unwrap_or(0);
                if let csv::ErrorKind::Io(_) = e.kind() {
                    return Err(SearchError::BadRow {
                        path: path.to_path_buf(),
                        line,
                        message: e.to_string(),
                    });
                }
                rows.push((line, Err(e.to_string())));
                continue;
            }
        };
        let line = rec.position().map(|p| p.line()).unwrap_or(0);
        let fields: std::result::Result<Vec<String>, String> = rec
            .iter()
            .enumerate()
            .map(|(i, f)| {
                String::from_utf8(f.to_vec())
                    .map_err(|_| format!("invalid UTF-8 in field {}", i + 1))
            })
            .collect();
        match (&header, fields) {
            (None, Ok(f)) => header = Some(f.into_iter().map(|h| h.trim().to_string()).collect()),
            (None, Err(e)) => {
                return Err(SearchError::BadRow {
                    path: path.to_path_buf(),
                    line,
                    message: format!("header: {e}"),
                })
            }
            (Some(h), Ok(f)) if f.len() == 1 && f[0].trim().is_empty() && h.len() > 1 => {}
            (Some(h), Ok(f)) if f.len() != h.len() => rows.push((
                line,
                Err(format!(
                    "expected {} fields like the header, found {}",
                    h.len(),
                    f.len()
                )),
            )),
            (Some(_), r) => rows.push((line, r)),
        }
    }
    let header = header.ok_or_else(|| SearchError::Empty {
        path: path.to_path_buf(),
    })?;
    Ok(Table { header, rows })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_formats() {
        assert_eq!(
            detect(Path::new("a/docs.jsonl.gz")),
            Some(Format::JsonLines)
        );
        assert_eq!(detect(Path::new("docs.TSV")), Some(Format::Tsv));
        assert_eq!(detect(Path::new("x.csv.gz")), Some(Format::Csv));
        assert_eq!(detect(Path::new("qrels.trec")), Some(Format::Trec));
        assert_eq!(detect(Path::new("data/qrels")), Some(Format::Trec));
        assert_eq!(detect(Path::new("docs.parquet")), None);
    }

    #[test]
    fn lines_report_bad_utf8_with_line_number() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f.txt");
        std::fs::write(&p, b"ok\r\nbad \xff here\nlast").unwrap();
        let got: Vec<_> = lines(&p).unwrap().map(|l| l.unwrap()).collect();
        assert_eq!(got[0], (1, Ok("ok".to_string())));
        assert_eq!(got[1].0, 2);
        assert!(got[1].1.is_err());
        assert_eq!(got[2], (3, Ok("last".to_string())));
    }

    #[test]
    fn gz_is_transparent() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f.tsv.gz");
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        enc.write_all(b"id\ttext\n1\thello \"world\n2\tbye\n")
            .unwrap();
        std::fs::write(&p, enc.finish().unwrap()).unwrap();
        let t = read_table(&p, Format::Tsv).unwrap();
        assert_eq!(t.header, vec!["id", "text"]);
        assert_eq!(t.rows.len(), 2);
        assert_eq!(t.rows[0].1.as_ref().unwrap()[1], "hello \"world");
    }
}
