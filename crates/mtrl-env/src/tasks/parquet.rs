//! Parquet task files through the `parquet` crate's record API (no arrow). The prompt column must
//! hold strings (UTF-8 byte arrays); the id column may be a string or an integer.
//! [`write_tasks`] writes the same layout (snappy-compressed), for `mtrl data prepare` and tests.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use parquet::basic::Compression;
use parquet::data_type::{ByteArray, ByteArrayType};
use parquet::file::properties::WriterProperties;
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::file::writer::SerializedFileWriter;
use parquet::record::Field;
use parquet::schema::parser::parse_message_type;

use super::{read_err, Sink, ID_NAMES};
use crate::error::{EnvError, Result};
use crate::task::Task;

fn field_text(f: &Field) -> Option<String> {
    match f {
        Field::Null => None,
        Field::Str(s) => Some(s.clone()),
        Field::Bytes(b) => std::str::from_utf8(b.data()).ok().map(str::to_string),
        other => Some(other.to_string()),
    }
}

pub(super) fn read(path: &Path, sink: &mut Sink) -> Result<()> {
    let file = File::open(path).map_err(|e| read_err(path, e))?;
    let reader = SerializedFileReader::new(file).map_err(|e| read_err(path, e))?;
    let rows = reader.get_row_iter(None).map_err(|e| read_err(path, e))?;
    for (i, row) in rows.enumerate() {
        let parsed = match row {
            Err(e) => Err(format!("unreadable row: {e}")),
            Ok(row) => {
                let cols: Vec<(&String, &Field)> = row.get_column_iter().collect();
                let prompt = cols
                    .iter()
                    .find(|(n, _)| n.as_str() == "prompt")
                    .or_else(|| cols.first());
                match prompt {
                    None => Err("no columns".to_string()),
                    Some((name, Field::Str(s))) if !s.trim().is_empty() => {
                        let _ = name;
                        let id = ID_NAMES.iter().find_map(|k| {
                            cols.iter()
                                .find(|(n, _)| n.as_str() == *k)
                                .and_then(|(_, f)| field_text(f))
                        });
                        Ok((id, s.clone()))
                    }
                    Some((name, f)) => Err(format!("`{name}` is not a non-empty string: {f}")),
                }
            }
        };
        sink.row(i + 1, parsed)?;
    }
    Ok(())
}

/// Writes tasks as a Parquet file with string columns `id` and `prompt` (snappy).
pub fn write_tasks(path: &Path, tasks: &[Task]) -> Result<()> {
    let io = |e: std::io::Error| EnvError::Io {
        path: path.to_path_buf(),
        source: e,
    };
    let pq = |e: parquet::errors::ParquetError| EnvError::Io {
        path: path.to_path_buf(),
        source: std::io::Error::other(e.to_string()),
    };
    let schema = Arc::new(
        parse_message_type(
            "message tasks { REQUIRED BYTE_ARRAY id (UTF8); REQUIRED BYTE_ARRAY prompt (UTF8); }",
        )
        .map_err(pq)?,
    );
    let props = Arc::new(
        WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .build(),
    );
    let file = File::create(path).map_err(io)?;
    let mut writer = SerializedFileWriter::new(file, schema, props).map_err(pq)?;
    let mut group = writer.next_row_group().map_err(pq)?;
    for column in 0..2 {
        let values: Vec<ByteArray> = tasks
            .iter()
            .map(|t| {
                ByteArray::from(if column == 0 {
                    t.id.as_str()
                } else {
                    t.prompt.as_str()
                })
            })
            .collect();
        let Some(mut col) = group.next_column().map_err(pq)? else {
            break;
        };
        col.typed::<ByteArrayType>()
            .write_batch(&values, None, None)
            .map_err(pq)?;
        col.close().map_err(pq)?;
    }
    group.close().map_err(pq)?;
    writer.close().map_err(pq)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tasks::load_tasks;

    #[test]
    fn parquet_round_trip_and_bad_row() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.parquet");
        let tasks = vec![
            Task {
                id: "q1".into(),
                prompt: "{\"query\":\"é\"}".into(),
            },
            Task {
                id: "q2".into(),
                prompt: "  ".into(),
            },
        ];
        write_tasks(&p, &tasks).unwrap();
        let msg = load_tasks(&p, false).unwrap_err().to_string();
        assert!(msg.contains("t.parquet") && msg.contains("row 2"), "{msg}");
        let (got, rep) = load_tasks(&p, true).unwrap();
        assert_eq!(got, tasks[..1]);
        assert_eq!((rep.rows, rep.skipped), (2, 1));
        std::fs::write(&p, b"not parquet").unwrap();
        assert!(load_tasks(&p, false)
            .unwrap_err()
            .to_string()
            .contains("t.parquet"));
    }
}
