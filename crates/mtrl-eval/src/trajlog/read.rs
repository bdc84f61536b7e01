//! Reading a run's trajectory logs back (for `mtrl inspect`).
//!
//! Where logs are looked for, under a run folder `R`: `R/`, `R/trajectories/`, `R/eval/`,
//! `R/eval/trajectories/`, and `R/eval/X/` and `R/eval/X/trajectories/` for every folder `X` of
//! `R/eval/` (evaluation jobs write their own logs). Only files named `trajectories-N.jsonl` are
//! read. Every line must carry [`TRAJLOG_FORMAT_VERSION`]; any other is an error naming the file
//! and line.
//!
//! A resumed training replays the steps after its last checkpoint, so the same (kind, step, task,
//! sample) can be logged twice: the later line wins and the earlier one is counted as a duplicate.

use std::collections::HashMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{At, Kind, TrajectoryRecord, FILE_PREFIX, TRAJLOG_FORMAT_VERSION};
use crate::error::{EvalError, Result};

/// A run's trajectory records, in file then line order.
#[derive(Debug, Clone)]
pub struct RunLog {
    pub dir: PathBuf,
    pub files: Vec<PathBuf>,
    pub records: Vec<TrajectoryRecord>,
    /// Lines replaced by a later line with the same (kind, step, task, sample).
    pub duplicates: usize,
}

/// The number of a `trajectories-N.jsonl` file name.
fn file_number(name: &str) -> Option<u64> {
    name.strip_prefix(FILE_PREFIX)?
        .strip_suffix(".jsonl")?
        .parse()
        .ok()
}

/// The log files directly in `dir`, by number (none when `dir` is not a folder).
pub(crate) fn numbered_files(dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    if !dir.is_dir() {
        return Ok(Vec::new());
    }
    let entries = std::fs::read_dir(dir).map_err(|source| EvalError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut out = Vec::new();
    for e in entries {
        let e = e.map_err(|source| EvalError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let name = e.file_name();
        if let Some(n) = name.to_str().and_then(file_number) {
            out.push((n, e.path()));
        }
    }
    out.sort();
    Ok(out)
}

/// Refuses a log file whose first line has another format version (or is not a record).
pub(crate) fn check_first_line(path: &Path) -> Result<()> {
    let io = |source| EvalError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.map_err(io)?;
        if !line.trim().is_empty() {
            return parse_line(path, i + 1, &line).map(|_| ());
        }
    }
    Ok(())
}

/// The log files of a run folder (see the module docs for where they are looked for).
pub fn trajectory_files(run_dir: &Path) -> Result<Vec<PathBuf>> {
    if !run_dir.is_dir() {
        return Err(EvalError::Invalid(format!(
            "{}: no such run folder",
            run_dir.display()
        )));
    }
    let eval = run_dir.join("eval");
    let mut dirs = vec![run_dir.to_path_buf(), run_dir.join("trajectories")];
    dirs.extend([eval.clone(), eval.join("trajectories")]);
    if eval.is_dir() {
        let mut subs: Vec<PathBuf> = std::fs::read_dir(&eval)
            .map_err(|source| EvalError::Io {
                path: eval.clone(),
                source,
            })?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_dir() && !p.ends_with("trajectories"))
            .collect();
        subs.sort();
        for s in subs {
            dirs.push(s.join("trajectories"));
            dirs.push(s);
        }
    }
    let mut files = Vec::new();
    for d in dirs {
        files.extend(numbered_files(&d)?.into_iter().map(|(_, p)| p));
    }
    Ok(files)
}

/// Every record of one file.
pub fn read_file(path: &Path) -> Result<Vec<TrajectoryRecord>> {
    let mut out = Vec::new();
    for_lines(path, |n, line| {
        out.push(parse_line(path, n, line)?);
        Ok(())
    })?;
    Ok(out)
}

/// Every record of a run; an error when the folder is missing or holds no log.
pub fn read_run(run_dir: &Path) -> Result<RunLog> {
    let files = trajectory_files(run_dir)?;
    if files.is_empty() {
        return Err(EvalError::Invalid(format!(
            "{}: no trajectory log (trajectories/{FILE_PREFIX}N.jsonl); \
             train with `[logging] trajectories = true`",
            run_dir.display()
        )));
    }
    let mut records: Vec<TrajectoryRecord> = Vec::new();
    let mut index: HashMap<(Kind, At, String, u32), usize> = HashMap::new();
    let mut duplicates = 0;
    for f in &files {
        for r in read_file(f)? {
            let key = (r.kind, r.step.clone(), r.task_id.clone(), r.sample);
            match index.get(&key) {
                Some(&i) => {
                    records[i] = r;
                    duplicates += 1;
                }
                None => {
                    index.insert(key, records.len());
                    records.push(r);
                }
            }
        }
    }
    Ok(RunLog {
        dir: run_dir.to_path_buf(),
        files,
        records,
        duplicates,
    })
}

/// Reads the `format_version` of a line without parsing the rest.
#[derive(Deserialize)]
struct VersionProbe {
    format_version: Option<u32>,
}

/// Parses one line; errors name `path:line` and, for another layout, both versions.
pub(crate) fn parse_line(path: &Path, line_no: usize, line: &str) -> Result<TrajectoryRecord> {
    let at = || format!("{}:{line_no}", path.display());
    let version = |v: Option<u32>| {
        match v {
        Some(v) if v != TRAJLOG_FORMAT_VERSION => Err(EvalError::Invalid(format!(
            "{}: trajectory log format_version {v}, this mtrl reads version {TRAJLOG_FORMAT_VERSION} \
             (written by another mtrl version?)",
            at()
        ))),
        _ => Ok(()),
    }
    };
    match serde_json::from_str::<TrajectoryRecord>(line) {
        Ok(r) => version(Some(r.format_version)).map(|()| r),
        Err(e) => {
            let probe = serde_json::from_str::<VersionProbe>(line).ok();
            version(probe.and_then(|p| p.format_version))?;
            Err(EvalError::Invalid(format!(
                "{}: not a trajectory record: {e}",
                at()
            )))
        }
    }
}

/// Iterates the non-empty lines of a file with 1-based numbers.
fn for_lines(path: &Path, mut f: impl FnMut(usize, &str) -> Result<()>) -> Result<()> {
    let io = |source| EvalError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.map_err(io)?;
        if !line.trim().is_empty() {
            f(i + 1, &line)?;
        }
    }
    Ok(())
}
