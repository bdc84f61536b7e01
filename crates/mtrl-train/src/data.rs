//! `mtrl data prepare`: turns bundled collections (a config's `[search]` corpus and
//! `[search.eval]` queries + qrels) into a corpus file and task files with train / validation /
//! test splits, deterministically.
//!
//! Output per config, in the folder given (`mtrl data prepare`: `--out`/`<name>`): `corpus.jsonl`
//! (`{"id","title","text"}`), `{train,validation,test}.{jsonl|parquet|csv|json}` (columns `id`,
//! `prompt`; prompt = `{"query": …, "qrels": {…}}`) and `manifest.json`.
//! A query goes to test when `hash(seed, id) < test_fraction`, else to validation when it is below
//! `test_fraction + validation_fraction`, else to train; rows keep query-file order.

use std::io::Write;
use std::path::{Path, PathBuf};

use mtrl_core::rng::hash_str;
use mtrl_core::Config;
use mtrl_env::{tasks, Task};
use mtrl_search::{queries, Corpus, Qrels};
use serde_json::json;

use crate::bail;
use crate::error::{Context, Result};

/// How to split and write: fractions, seed and the task file format.
#[derive(Debug, Clone)]
pub struct PrepareOptions {
    pub test_fraction: f64,
    pub validation_fraction: f64,
    pub seed: u64,
    /// Task file format: jsonl, parquet, csv or json.
    pub format: String,
}

impl Default for PrepareOptions {
    fn default() -> PrepareOptions {
        PrepareOptions {
            test_fraction: 0.2,
            validation_fraction: 0.1,
            seed: 0,
            format: "jsonl".into(),
        }
    }
}

impl PrepareOptions {
    /// Refuses fractions outside [0, 1) or summing to 1 or more, and unknown formats.
    pub fn validate(&self) -> Result<()> {
        if !(0.0..1.0).contains(&self.test_fraction)
            || !(0.0..1.0).contains(&self.validation_fraction)
            || self.test_fraction + self.validation_fraction >= 1.0
        {
            bail!("--test-fraction and --validation-fraction must be in [0, 1) and sum below 1");
        }
        if !matches!(self.format.as_str(), "jsonl" | "parquet" | "csv" | "json") {
            bail!(
                "unknown --format `{}` (jsonl, parquet, csv or json)",
                self.format
            );
        }
        Ok(())
    }
}

/// What [`prepare`] wrote for one collection.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub name: String,
    pub dir: PathBuf,
    pub documents: usize,
    /// Tasks of train, validation and test.
    pub tasks: [usize; 3],
}

impl std::fmt::Display for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let [tr, va, te] = self.tasks;
        write!(
            f,
            "{}: {} documents, tasks train {tr} / validation {va} / test {te} → {}",
            self.name,
            self.documents,
            self.dir.display()
        )
    }
}

fn unit(seed: u64, id: &str) -> f64 {
    (hash_str(seed, id) >> 11) as f64 / (1u64 << 53) as f64
}

fn write_tasks(path: &Path, tasks: &[Task], format: &str) -> Result<()> {
    let ctx = || format!("cannot write {}", path.display());
    match format {
        "parquet" => mtrl_env::tasks::write_parquet_tasks(path, tasks).with_context(ctx)?,
        "jsonl" => {
            let mut w = std::io::BufWriter::new(std::fs::File::create(path).with_context(ctx)?);
            for t in tasks {
                writeln!(w, "{}", json!({"id": t.id, "prompt": t.prompt})).with_context(ctx)?;
            }
            w.flush().with_context(ctx)?;
        }
        "json" => {
            let rows: Vec<_> = tasks
                .iter()
                .map(|t| json!({"id": t.id, "prompt": t.prompt}))
                .collect();
            std::fs::write(path, serde_json::to_string(&rows)?).with_context(ctx)?;
        }
        "csv" => {
            let mut w = std::fs::File::create(path).with_context(ctx)?;
            writeln!(w, "id,prompt").with_context(ctx)?;
            for t in tasks {
                let q = |s: &str| format!("\"{}\"", s.replace('"', "\"\""));
                writeln!(w, "{},{}", q(&t.id), q(&t.prompt)).with_context(ctx)?;
            }
        }
        other => bail!("unknown --format `{other}` (jsonl, parquet, csv or json)"),
    }
    Ok(())
}

/// The judged queries of `[search.eval]` as tasks, split into train, validation and test.
fn split_tasks(cfg: &Config, a: &PrepareOptions) -> Result<[Vec<Task>; 3]> {
    let eval = cfg.search()?.eval.as_ref().with_context(|| {
        format!(
            "{} has no [search.eval] queries/qrels",
            cfg.source.display()
        )
    })?;
    let qs = queries::load(&eval.queries)?;
    let qrels = Qrels::load(&eval.qrels)?;
    let (mut train, mut validation, mut test) = (Vec::new(), Vec::new(), Vec::new());
    for t in tasks::from_qrels(&qs, &qrels) {
        let u = unit(a.seed, &t.id);
        if u < a.test_fraction {
            test.push(t);
        } else if u < a.test_fraction + a.validation_fraction {
            validation.push(t);
        } else {
            train.push(t);
        }
    }
    Ok([train, validation, test])
}

/// Writes `corpus` as `{"id","title","text"}` lines to `path`.
fn write_corpus(path: &Path, corpus: &Corpus) -> Result<()> {
    let ctx = || format!("cannot write {}", path.display());
    let mut w = std::io::BufWriter::new(std::fs::File::create(path).with_context(ctx)?);
    for d in corpus.documents() {
        let row = json!({"id": d.id, "title": d.title, "text": d.text});
        writeln!(w, "{row}").with_context(ctx)?;
    }
    w.flush().with_context(ctx)
}

/// Writes the corpus and the train/validation/test task files of one collection config into `dir`.
pub fn prepare(cfg: &Config, dir: &Path, a: &PrepareOptions) -> Result<Prepared> {
    a.validate()?;
    let search = cfg.search()?;
    let splits = split_tasks(cfg, a)?;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let (corpus, report) = Corpus::load(&search.corpus, &search.columns, search.skip_bad_rows)?;
    write_corpus(&dir.join("corpus.jsonl"), &corpus)?;
    let ext = a.format.as_str();
    for (split, ts) in ["train", "validation", "test"].iter().zip(&splits) {
        write_tasks(&dir.join(format!("{split}.{ext}")), ts, ext)?;
    }
    let [tr, va, te] = [&splits[0], &splits[1], &splits[2]].map(Vec::len);
    let manifest = json!({
        "format_version": 1,
        "name": cfg.name,
        "config": cfg.source,
        "seed": a.seed,
        "test_fraction": a.test_fraction,
        "validation_fraction": a.validation_fraction,
        "documents": corpus.len(),
        "skipped_documents": report.skipped,
        "tasks": {"train": tr, "validation": va, "test": te},
    });
    std::fs::write(
        dir.join("manifest.json"),
        serde_json::to_string_pretty(&manifest)?,
    )?;
    Ok(Prepared {
        name: cfg.name.clone(),
        dir: dir.to_path_buf(),
        documents: corpus.len(),
        tasks: [tr, va, te],
    })
}
