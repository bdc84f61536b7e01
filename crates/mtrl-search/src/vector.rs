//! Vector tool: HNSW (`vector/hnsw.rs`) over unit-length document embeddings, similarity = dot
//! product (cosine on unit vectors).
//!
//! On disk:
//! - `embeddings/embeddings.f32` — header (`MTRLEMB1`, format version, count, dim) then the f32
//!   vectors little-endian, row `ord` = document `ord`. The graph searches these vectors, it can be
//!   rebuilt with other HNSW settings without re-embedding, and exact brute-force search (recall
//!   checks) reads them too;
//! - `graph/hnsw.graph` — the graph (`vector/graph_file.rs`), node `i` = document ord `i`. Every
//!   field is checked on load: a damaged file is an error naming it, never a panic.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::corpus::Corpus;
use crate::embed::{Embedder, QueryBatcher};
use crate::error::{Result, SearchError};
use crate::{Hit, Retriever};

mod graph_file;
mod hnsw;

use hnsw::{Graph, Points};

const MAGIC: &[u8; 8] = b"MTRLEMB1";
const EMB_FORMAT_VERSION: u32 = 1;
pub const EMBEDDINGS_FILE: &str = "embeddings.f32";
/// The graph file inside the graph part's folder.
pub const GRAPH_FILE: &str = "hnsw.graph";

/// Unit-length embeddings of every document, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct Embeddings {
    pub dim: usize,
    pub data: Vec<f32>,
}

impl Embeddings {
    pub fn len(&self) -> usize {
        self.data.len().checked_div(self.dim).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.dim..(i + 1) * self.dim]
    }

    /// Embeds every document of `corpus` in batches; `progress` gets the count done so far.
    pub fn compute(
        corpus: &Corpus,
        embedder: &dyn Embedder,
        batch: usize,
        progress: &mut dyn FnMut(u64),
    ) -> Result<Embeddings> {
        let dim = embedder.dim();
        let mut data = Vec::with_capacity(corpus.len() * dim);
        let texts: Vec<String> = corpus
            .documents()
            .iter()
            .map(|d| d.indexed_text())
            .collect();
        // The embedder forms its batches of `batch` texts from each call's texts sorted by
        // length; calls of 16 batches give it texts of similar length to group.
        let per_call = batch.max(1) * 16;
        let mut done = 0;
        for chunk in texts.chunks(per_call) {
            let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
            for v in embedder.embed(&refs)? {
                data.extend_from_slice(&v);
            }
            done += chunk.len();
            progress(done as u64);
        }
        Ok(Embeddings { dim, data })
    }

    pub fn save(&self, path: &Path) -> Result<()> {
        let mut f = std::io::BufWriter::new(
            std::fs::File::create(path).map_err(SearchError::io("create", path))?,
        );
        let mut head = Vec::with_capacity(24);
        head.extend_from_slice(MAGIC);
        head.extend_from_slice(&EMB_FORMAT_VERSION.to_le_bytes());
        head.extend_from_slice(&(self.len() as u64).to_le_bytes());
        head.extend_from_slice(&(self.dim as u32).to_le_bytes());
        f.write_all(&head).map_err(SearchError::io("write", path))?;
        for x in &self.data {
            f.write_all(&x.to_le_bytes())
                .map_err(SearchError::io("write", path))?;
        }
        f.into_inner()
            .map_err(|e| SearchError::io("write", path)(e.into_error()))?
            .sync_all()
            .map_err(SearchError::io("sync", path))
    }

    pub fn load(path: &Path) -> Result<Embeddings> {
        let mut bytes = Vec::new();
        std::fs::File::open(path)
            .and_then(|mut f| f.read_to_end(&mut bytes))
            .map_err(SearchError::io("read", path))?;
        let corrupt = |message: String| SearchError::Corrupt {
            path: path.to_path_buf(),
            message,
        };
        if bytes.len() < 24 || &bytes[..8] != MAGIC {
            return Err(corrupt("not an mtrl embeddings file".into()));
        }
        let u32_at =
            |o: usize| u32::from_le_bytes([bytes[o], bytes[o + 1], bytes[o + 2], bytes[o + 3]]);
        let version = u32_at(8);
        if version != EMB_FORMAT_VERSION {
            return Err(corrupt(format!(
                "format_version {version}, expected {EMB_FORMAT_VERSION}"
            )));
        }
        let mut n8 = [0u8; 8];
        n8.copy_from_slice(&bytes[12..20]);
        let n = u64::from_le_bytes(n8) as usize;
        let dim = u32_at(20) as usize;
        let body = &bytes[24..];
        if dim == 0 || body.len() != n.saturating_mul(dim).saturating_mul(4) {
            return Err(corrupt(format!(
                "expected {n}×{dim} floats, file holds {} bytes",
                body.len()
            )));
        }
        let data = body
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        Ok(Embeddings { dim, data })
    }

    /// Exact top-k by cosine (dot product of unit vectors): `(ord, similarity)`, best first.
    pub fn exact_search(&self, query: &[f32], k: usize) -> Vec<(usize, f32)> {
        let mut scored: Vec<(usize, f32)> = (0..self.len())
            .map(|i| (i, self.row(i).iter().zip(query).map(|(a, b)| a * b).sum()))
            .collect();
        let k = k.min(scored.len());
        if k == 0 {
            return Vec::new();
        }
        scored.select_nth_unstable_by(k - 1, |a, b| b.1.total_cmp(&a.1));
        scored.truncate(k);
        scored.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        scored
    }
}

/// Builds the HNSW graph for `emb` and writes it into `dir`. `parallel`: insert from many
/// threads (the graph then depends on thread timing); else in row order, the same graph every
/// time.
pub fn build_graph(
    dir: &Path,
    emb: &Embeddings,
    m: usize,
    ef_construction: usize,
    parallel: bool,
) -> Result<()> {
    let pts = Points {
        data: &emb.data,
        dim: emb.dim,
    };
    let graph = Graph::build(pts, m, ef_construction, parallel);
    graph_file::save(&graph, &dir.join(GRAPH_FILE))
}

/// How the vector tool embeds queries: each search on its own, or through a [`QueryBatcher`]
/// shared by every search in flight.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QueryBatching {
    /// Most queries per embedder pass (1: no batching).
    pub max_batch: usize,
    /// Longest time a batch is held open for searches in progress to join it.
    pub max_wait: Duration,
}

/// A loaded vector index with its embedder, searchable from many threads at once.
pub struct VectorIndex {
    path: PathBuf,
    corpus: Arc<Corpus>,
    embedder: Arc<dyn Embedder>,
    batcher: Option<QueryBatcher>,
    embeddings: Arc<Embeddings>,
    graph: Graph,
    ef_search: usize,
    snippet_chars: usize,
}

impl VectorIndex {
    /// Loads the graph written in `dir` over `embeddings` (the corpus' document vectors).
    pub fn open(
        dir: &Path,
        corpus: Arc<Corpus>,
        embedder: Arc<dyn Embedder>,
        embeddings: Arc<Embeddings>,
        ef_search: usize,
        snippet_chars: usize,
    ) -> Result<VectorIndex> {
        let path = dir.join(GRAPH_FILE);
        if embeddings.len() != corpus.len() || embeddings.dim != embedder.dim() {
            return Err(SearchError::Corrupt {
                path,
                message: format!(
                    "{} embeddings of dimension {} for {} documents and a {}-dimensional embedder",
                    embeddings.len(),
                    embeddings.dim,
                    corpus.len(),
                    embedder.dim()
                ),
            });
        }
        let graph = graph_file::load(&path, corpus.len())?;
        Ok(VectorIndex {
            path: dir.to_path_buf(),
            corpus,
            embedder,
            batcher: None,
            embeddings,
            graph,
            ef_search,
            snippet_chars,
        })
    }

    /// Embeds queries through a shared [`QueryBatcher`] (`max_batch` > 1), or one search at a
    /// time (`max_batch` = 1).
    pub fn set_query_batching(&mut self, b: QueryBatching) {
        self.batcher = (b.max_batch > 1)
            .then(|| QueryBatcher::new(self.embedder.clone(), b.max_batch, b.max_wait));
    }

    /// The query batcher's counters, when queries are batched.
    pub fn batch_stats(&self) -> Option<crate::embed::BatchStats> {
        self.batcher.as_ref().map(QueryBatcher::stats)
    }

    /// The document vectors the graph searches.
    pub fn embeddings(&self) -> &Embeddings {
        &self.embeddings
    }

    pub fn embedder(&self) -> &Arc<dyn Embedder> {
        &self.embedder
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Changes the search breadth (no rebuild needed).
    pub fn set_ef_search(&mut self, ef: usize) {
        self.ef_search = ef.max(1);
    }

    /// `(ord, cosine similarity)` of the approximate best `k` for an embedded query.
    pub fn search_vector(&self, query: &[f32], k: usize) -> Vec<(usize, f32)> {
        if k == 0 {
            return Vec::new();
        }
        let k = k.min(self.corpus.len());
        let pts = Points {
            data: &self.embeddings.data,
            dim: self.embeddings.dim,
        };
        let found = self.graph.search(pts, query, k, self.ef_search.max(k));
        if found.len() < k {
            // The graph reached fewer than `k` nodes (a k near the corpus size, or nodes that
            // pruning left without in-links): exact search answers in full.
            return self.embeddings.exact_search(query, k);
        }
        found
    }
}

impl Retriever for VectorIndex {
    fn name(&self) -> &'static str {
        "vector"
    }

    fn search(&self, query: &str, k: usize) -> Result<Vec<Hit>> {
        if k == 0 || query.trim().is_empty() {
            return Ok(Vec::new());
        }
        let q = match &self.batcher {
            Some(b) => {
                let _in_search = b.enter();
                b.embed(query)?
            }
            None => self.embedder.embed(&[query])?.pop().ok_or_else(|| {
                SearchError::InvalidArgument("embedder returned no vector".into())
            })?,
        };
        Ok(self
            .corpus
            .hits(self.search_vector(&q, k), self.snippet_chars))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::corpus::Document;
    use crate::embed::HashEmbedder;

    fn corpus(n: usize) -> Arc<Corpus> {
        let words = [
            "wing", "flutter", "heat", "boundary", "layer", "shock", "wave", "plate", "nozzle",
            "jet",
        ];
        let docs = (0..n)
            .map(|i| Document {
                id: format!("d{i}"),
                title: String::new(),
                text: format!(
                    "{} {} {} n{i}",
                    words[i % 10],
                    words[(i / 10) % 10],
                    words[(i * 7) % 10]
                ),
            })
            .collect();
        Arc::new(Corpus::from_documents(docs).unwrap())
    }

    #[test]
    fn embeddings_roundtrip_and_corruption() {
        let dir = tempfile::tempdir().unwrap();
        let e = Embeddings {
            dim: 2,
            data: vec![1.0, 0.0, 0.6, 0.8],
        };
        let p = dir.path().join(EMBEDDINGS_FILE);
        e.save(&p).unwrap();
        assert_eq!(Embeddings::load(&p).unwrap(), e);
        let mut bytes = std::fs::read(&p).unwrap();
        bytes.truncate(bytes.len() - 3);
        std::fs::write(&p, &bytes).unwrap();
        assert!(Embeddings::load(&p)
            .unwrap_err()
            .to_string()
            .contains("damaged"));
        assert_eq!(e.exact_search(&[0.0, 1.0], 5), vec![(1, 0.8), (0, 0.0)]);
    }

    #[test]
    fn build_dump_reload_and_search() {
        let dir = tempfile::tempdir().unwrap();
        let c = corpus(200);
        let emb: Arc<dyn Embedder> = Arc::new(HashEmbedder::new(64));
        let e = Embeddings::compute(&c, emb.as_ref(), 16, &mut |_| {}).unwrap();
        assert_eq!(e.len(), 200);
        build_graph(dir.path(), &e, 16, 100, true).unwrap();
        let idx = VectorIndex::open(
            dir.path(),
            c.clone(),
            emb.clone(),
            Arc::new(e.clone()),
            64,
            80,
        )
        .unwrap();
        // A document's own text finds itself first.
        let hits = idx.search(&c.get(37).unwrap().text, 5).unwrap();
        assert_eq!(hits[0].doc_id, "d37");
        assert!(hits[0].score > 0.99);
        assert!(idx.search("", 5).unwrap().is_empty());
        assert!(idx.search("🚀 ((AND", 5).is_ok());
        assert_eq!(idx.search("wing", 1000).unwrap().len(), 200);
        // Approximate agrees with exact on this easy set (by similarity: the set has many tied
        // documents, so ids alone would count an equally good neighbour as a miss).
        let q = emb.embed(&["heat boundary layer"]).unwrap().pop().unwrap();
        let exact = e.exact_search(&q, 10);
        let tenth = exact[9].1;
        let approx = idx.search_vector(&q, 10);
        let good = approx.iter().filter(|a| a.1 >= tenth - 1e-6).count();
        assert!(
            good >= 9,
            "{good} of 10 as near as the exact 10th: {approx:?} vs {exact:?}"
        );
    }

    #[test]
    fn a_sequential_build_gives_the_same_graph_every_time() {
        let c = corpus(300);
        let emb = HashEmbedder::new(32);
        let e = Embeddings::compute(&c, &emb, 16, &mut |_| {}).unwrap();
        let dump = || {
            let dir = tempfile::tempdir().unwrap();
            build_graph(dir.path(), &e, 8, 50, false).unwrap();
            let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|f| f.unwrap().path())
                .map(|p| (p.display().to_string(), std::fs::read(&p).unwrap()))
                .map(|(n, b)| (n.rsplit('/').next().unwrap().to_string(), b))
                .collect();
            files.sort();
            files
        };
        let (a, b) = (dump(), dump());
        assert!(!a.is_empty());
        assert_eq!(a, b);
    }

    #[test]
    fn open_rejects_missing_or_mismatched_graph() {
        let dir = tempfile::tempdir().unwrap();
        let emb: Arc<dyn Embedder> = Arc::new(HashEmbedder::new(16));
        let e = Embeddings::compute(&corpus(5), emb.as_ref(), 4, &mut |_| {}).unwrap();
        let err = VectorIndex::open(
            dir.path(),
            corpus(5),
            emb.clone(),
            Arc::new(e.clone()),
            10,
            10,
        )
        .err()
        .unwrap();
        assert!(err.to_string().contains("cannot load graph"), "{err}");
        build_graph(dir.path(), &e, 8, 20, true).unwrap();
        let e6 = Embeddings::compute(&corpus(6), emb.as_ref(), 4, &mut |_| {}).unwrap();
        let err = VectorIndex::open(dir.path(), corpus(6), emb.clone(), Arc::new(e6), 10, 10)
            .err()
            .unwrap();
        assert!(err.to_string().contains("graph holds 5 points"), "{err}");
        let err = VectorIndex::open(dir.path(), corpus(6), emb, Arc::new(e), 10, 10)
            .err()
            .unwrap();
        assert!(err.to_string().contains("5 embeddings"), "{err}");
    }
}
