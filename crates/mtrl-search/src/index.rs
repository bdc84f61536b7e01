//! The on-disk search index of one corpus: BM25 + embeddings + HNSW graph, each reused when its
//! inputs are unchanged and rebuilt when they changed.
//!
//! `index_dir/` holds `manifest.json` and one folder per part (`bm25/`, `embeddings/`, `graph/`).
//! A part's *key* is a string of everything its content depends on (corpus sha256, column mapping,
//! analyzer settings, embedder id, HNSW parameters, format versions); the manifest records each
//! part's key and the sha256 of its files. On open, a part is reused only if its key matches and
//! its files verify; otherwise it is rebuilt into `.NAME.tmp/` and renamed into place, and the
//! manifest (written via temp file + rename) is updated after each part, so an interrupted build
//! keeps the parts it finished and never leaves a part that looks valid but is not.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use mtrl_core::config::SearchConfig;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::bm25::Bm25Index;
use crate::corpus::{Corpus, IngestReport};
use crate::embed::{self, hex, Embedder};
use crate::error::{Result, SearchError};
use crate::vector::{self, Embeddings, QueryBatching, VectorIndex, EMBEDDINGS_FILE, GRAPH_FILE};
use crate::Retriever;

/// Version of the index folder layout and manifest.
pub const FORMAT_VERSION: u32 = 1;
const MANIFEST: &str = "manifest.json";

/// Receives build progress (a progress bar in the CLI, nothing in tests).
pub trait Progress {
    fn start(&mut self, stage: &str, total: u64);
    fn set(&mut self, done: u64);
    fn finish(&mut self);
}

/// Progress sink that ignores everything.
pub struct NoProgress;

impl Progress for NoProgress {
    fn start(&mut self, _: &str, _: u64) {}
    fn set(&mut self, _: u64) {}
    fn finish(&mut self) {}
}

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
struct PartRecord {
    key: String,
    files: BTreeMap<String, String>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Manifest {
    format_version: u32,
    corpus: String,
    docs: usize,
    parts: BTreeMap<String, PartRecord>,
}

/// What happened to one part during `open_or_build`.
#[derive(Debug, Clone, Serialize)]
pub struct PartReport {
    pub part: String,
    /// `reused` or `built`.
    pub action: String,
    /// Why it was (re)built, if it was.
    pub reason: Option<String>,
    pub seconds: f64,
}

/// Summary of `open_or_build`.
#[derive(Debug, Clone, Serialize)]
pub struct BuildReport {
    pub corpus: PathBuf,
    pub docs: usize,
    pub ingest: IngestReport,
    pub parts: Vec<PartReport>,
    pub embedder: String,
}

impl std::fmt::Display for BuildReport {
    /// What was ingested (and skipped) and which parts were reused or rebuilt, as lines.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "corpus {}: {} documents, embedder {}",
            self.corpus.display(),
            self.docs,
            self.embedder
        )?;
        if self.ingest.skipped > 0 {
            write!(
                f,
                "\n  skipped {} bad rows (skip_bad_rows = true):",
                self.ingest.skipped
            )?;
            for (line, why) in &self.ingest.examples {
                write!(f, "\n    line {line}: {why}")?;
            }
        }
        for p in &self.parts {
            match &p.reason {
                None => write!(f, "\n  {:<10} reused", p.part)?,
                Some(why) => write!(f, "\n  {:<10} built in {:.2}s ({why})", p.part, p.seconds)?,
            }
        }
        Ok(())
    }
}

/// Both retrieval tools over one corpus.
pub struct SearchIndex {
    corpus: Arc<Corpus>,
    bm25: Bm25Index,
    vector: VectorIndex,
}

impl SearchIndex {
    pub fn corpus(&self) -> &Arc<Corpus> {
        &self.corpus
    }

    pub fn bm25(&self) -> &Bm25Index {
        &self.bm25
    }

    pub fn vector(&self) -> &VectorIndex {
        &self.vector
    }

    pub fn vector_mut(&mut self) -> &mut VectorIndex {
        &mut self.vector
    }

    /// A tool by name: `bm25` or `vector`.
    pub fn retriever(&self, name: &str) -> Option<&dyn Retriever> {
        match name {
            "bm25" => Some(&self.bm25),
            "vector" => Some(&self.vector),
            _ => None,
        }
    }

    /// Opens the index of `cfg.corpus` in `cfg.index_dir`, building or rebuilding what is missing
    /// or stale.
    pub fn open_or_build(
        cfg: &SearchConfig,
        progress: &mut dyn Progress,
    ) -> Result<(SearchIndex, BuildReport)> {
        let dir = &cfg.index_dir;
        std::fs::create_dir_all(dir).map_err(SearchError::io("create", dir))?;
        let corpus_sha = sha256_file(&cfg.corpus)?;
        let (corpus, ingest) = Corpus::load(&cfg.corpus, &cfg.columns, cfg.skip_bad_rows)?;
        let corpus = Arc::new(corpus);
        let corpus_key = format!(
            "corpus={corpus_sha};columns={:?};skip={}",
            cfg.columns, cfg.skip_bad_rows
        );
        let mut manifest = read_manifest(dir);
        let mut reports = Vec::new();
        if manifest.corpus != corpus_key {
            manifest = Manifest::default();
        }
        manifest.format_version = FORMAT_VERSION;
        manifest.corpus = corpus_key.clone();
        manifest.docs = corpus.len();

        // BM25.
        // k1 and b apply when the index is opened, so they are not part of the key.
        let bm25_key = format!(
            "{corpus_key};bm25=stopwords:{:?},stemming:{},min_len=2;tantivy=0.27",
            cfg.bm25.stopwords, cfg.bm25.stemming
        );
        let bm25_dir = dir.join("bm25");
        let t = Instant::now();
        let reuse = check_part(&manifest, "bm25", &bm25_key, &bm25_dir);
        let bm25 = match reuse.and_then(|()| {
            Bm25Index::open(&bm25_dir, corpus.clone(), &cfg.bm25, cfg.snippet_chars)
                .map_err(|e| e.to_string())
        }) {
            Ok(idx) => {
                reports.push(part_report("bm25", None, t));
                idx
            }
            Err(reason) => {
                progress.start("bm25 index", corpus.len() as u64);
                let files = build_part(dir, "bm25", |tmp| {
                    Bm25Index::build(tmp, &corpus, &cfg.bm25, &mut |n| progress.set(n))
                })?;
                progress.finish();
                record(dir, &mut manifest, "bm25", bm25_key, files)?;
                reports.push(part_report("bm25", Some(reason), t));
                Bm25Index::open(&bm25_dir, corpus.clone(), &cfg.bm25, cfg.snippet_chars)?
            }
        };

        // Embeddings.
        let embedder: Arc<dyn Embedder> =
            Arc::from(embed::from_config(&cfg.embedder, &cfg.vector)?);
        let emb_key = format!("{corpus_key};embedder={}", embedder.id());
        let emb_dir = dir.join("embeddings");
        let t = Instant::now();
        let embeddings =
            match check_part(&manifest, "embeddings", &emb_key, &emb_dir).and_then(|()| {
                Embeddings::load(&emb_dir.join(EMBEDDINGS_FILE)).map_err(|e| e.to_string())
            }) {
                Ok(e) if e.len() == corpus.len() && e.dim == embedder.dim() => {
                    reports.push(part_report("embeddings", None, t));
                    e
                }
                other => {
                    let reason = other
                        .err()
                        .unwrap_or_else(|| "shape does not match corpus".into());
                    progress.start("embeddings", corpus.len() as u64);
                    let e = Embeddings::compute(
                        &corpus,
                        embedder.as_ref(),
                        cfg.vector.batch_size,
                        &mut |n| progress.set(n),
                    )?;
                    progress.finish();
                    let files =
                        build_part(dir, "embeddings", |tmp| e.save(&tmp.join(EMBEDDINGS_FILE)))?;
                    record(dir, &mut manifest, "embeddings", emb_key.clone(), files)?;
                    reports.push(part_report("embeddings", Some(reason), t));
                    e
                }
            };

        // HNSW graph.
        let mut graph_key = format!(
            "{emb_key};m={};ef_construction={};hnsw=mtrl1",
            cfg.vector.m, cfg.vector.ef_construction
        );
        if !cfg.vector.parallel_build {
            graph_key.push_str(";build=sequential");
        }
        let graph_dir = dir.join("graph");
        let t = Instant::now();
        // Shared, not copied: the reuse attempt and a rebuild after it see the same matrix.
        let embeddings = Arc::new(embeddings);
        let open_graph = |embeddings: Arc<Embeddings>| {
            VectorIndex::open(
                &graph_dir,
                corpus.clone(),
                embedder.clone(),
                embeddings,
                cfg.vector.ef_search,
                cfg.snippet_chars,
            )
        };
        let reuse = check_part(&manifest, "graph", &graph_key, &graph_dir)
            .and_then(|()| open_graph(embeddings.clone()).map_err(|e| e.to_string()));
        let mut vector = match reuse {
            Ok(v) => {
                reports.push(part_report("graph", None, t));
                v
            }
            Err(reason) => {
                progress.start("hnsw graph", 1);
                let files = build_part(dir, "graph", |tmp| {
                    vector::build_graph(
                        tmp,
                        &embeddings,
                        cfg.vector.m,
                        cfg.vector.ef_construction,
                        cfg.vector.parallel_build,
                    )
                })?;
                progress.finish();
                record(dir, &mut manifest, "graph", graph_key, files)?;
                reports.push(part_report("graph", Some(reason), t));
                open_graph(embeddings)?
            }
        };
        vector.set_query_batching(QueryBatching {
            max_batch: cfg.vector.query_batch,
            max_wait: std::time::Duration::from_micros(cfg.vector.query_batch_wait_us),
        });
        let report = BuildReport {
            corpus: cfg.corpus.clone(),
            docs: corpus.len(),
            ingest,
            parts: reports,
            embedder: embedder.id(),
        };
        Ok((
            SearchIndex {
                corpus,
                bm25,
                vector,
            },
            report,
        ))
    }
}

fn part_report(part: &str, reason: Option<String>, t: Instant) -> PartReport {
    PartReport {
        part: part.into(),
        action: if reason.is_some() { "built" } else { "reused" }.into(),
        reason,
        seconds: t.elapsed().as_secs_f64(),
    }
}

fn read_manifest(dir: &Path) -> Manifest {
    std::fs::read_to_string(dir.join(MANIFEST))
        .ok()
        .and_then(|t| serde_json::from_str::<Manifest>(&t).ok())
        .filter(|m| m.format_version == FORMAT_VERSION)
        .unwrap_or_default()
}

/// Ok when the manifest's record of `part` has `key` and its files still hash as recorded.
fn check_part(m: &Manifest, part: &str, key: &str, dir: &Path) -> std::result::Result<(), String> {
    let rec = m
        .parts
        .get(part)
        .ok_or_else(|| "not built yet".to_string())?;
    if rec.key != key {
        return Err("inputs or settings changed".into());
    }
    for (name, sha) in &rec.files {
        match sha256_file(&dir.join(name)) {
            Ok(s) if &s == sha => {}
            Ok(_) => return Err(format!("{name} changed on disk (checksum mismatch)")),
            Err(_) => return Err(format!("{name} is missing")),
        }
    }
    Ok(())
}

/// Builds a part into a temporary folder, checksums its files and renames it into place.
fn build_part(
    dir: &Path,
    part: &str,
    build: impl FnOnce(&Path) -> Result<()>,
) -> Result<BTreeMap<String, String>> {
    let tmp = dir.join(format!(".{part}.tmp"));
    let dest = dir.join(part);
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(SearchError::io("remove", &tmp))?;
    }
    std::fs::create_dir_all(&tmp).map_err(SearchError::io("create", &tmp))?;
    build(&tmp)?;
    let mut files = BTreeMap::new();
    let entries = std::fs::read_dir(&tmp).map_err(SearchError::io("list", &tmp))?;
    for entry in entries {
        let entry = entry.map_err(SearchError::io("list", &tmp))?;
        let path = entry.path();
        if path.is_file() {
            let name = entry.file_name().to_string_lossy().into_owned();
            // tantivy's lock files come and go; they are not part of the index content.
            if name.starts_with('.') {
                continue;
            }
            files.insert(name, sha256_file(&path)?);
        }
    }
    if part == "graph" && !files.contains_key(GRAPH_FILE) {
        return Err(SearchError::VectorIndex {
            path: tmp.clone(),
            message: format!("the graph build did not write {GRAPH_FILE}"),
        });
    }
    if dest.exists() {
        std::fs::remove_dir_all(&dest).map_err(SearchError::io("remove", &dest))?;
    }
    std::fs::rename(&tmp, &dest).map_err(SearchError::io("rename", &tmp))?;
    Ok(files)
}

fn record(
    dir: &Path,
    m: &mut Manifest,
    part: &str,
    key: String,
    files: BTreeMap<String, String>,
) -> Result<()> {
    m.parts.insert(part.to_string(), PartRecord { key, files });
    let path = dir.join(MANIFEST);
    let tmp = dir.join(".manifest.json.tmp");
    let text =
        serde_json::to_string_pretty(m).map_err(|e| SearchError::InvalidArgument(e.to_string()))?;
    std::fs::write(&tmp, text).map_err(SearchError::io("write", &tmp))?;
    std::fs::rename(&tmp, &path).map_err(SearchError::io("rename", &tmp))
}

/// sha256 of a file's bytes, hex.
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut f = std::fs::File::open(path).map_err(SearchError::io("open", path))?;
    let mut h = Sha256::new();
    std::io::copy(&mut f, &mut h).map_err(SearchError::io("read", path))?;
    Ok(hex(&h.finalize()))
}
