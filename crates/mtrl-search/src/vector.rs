//! Vector tool: cosine HNSW (hnsw_rs) over unit-length document embeddings.
//!
//! On disk (inside the index's `vector/` folder):
//! - `embeddings.f32` — header (`MTRLEMB1`, format version, count, dim) then the f32 vectors
//!   little-endian, row `ord` = document `ord`. Kept so the graph can be rebuilt with other
//!   HNSW settings without re-embedding, and for exact brute-force search (recall checks);
//! - `hnsw.hnsw.graph`, `hnsw.hnsw.data` — hnsw_rs's dump; data ids are document ords.
//!
//! hnsw_rs's loader asserts on malformed files, so the index manager verifies checksums of these
//! files before [`VectorIndex::open`] is called; a damaged file is rebuilt, never loaded.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use hnsw_rs::prelude::{AnnT, DistCosine, Hnsw, HnswIo};

use crate::corpus::Corpus;
use crate::embed::Embedder;
use crate::error::{Result, SearchError};
use crate::{Hit, Retriever};

const MAGIC: &[u8; 8] = b"MTRLEMB1";
const EMB_FORMAT_VERSION: u32 = 1;
pub const EMBEDDINGS_FILE: &str = "embeddings.f32";
pub const HNSW_BASENAME: &str = "hnsw";
/// The files hnsw_rs writes for [`HNSW_BASENAME`].
pub const HNSW_FILES: [&str; 2] = ["hnsw.hnsw.graph", "hnsw.hnsw.data"];
const MAX_LAYERS: usize = 16;

type CosineHnsw<'a> = Hnsw<'a, f32, DistCosine>;

self_cell::self_cell!(
    /// hnsw_rs's loaded graph borrows from its loader; this keeps both together.
    struct LoadedGraph {
        owner: HnswIo,
        #[not_covariant]
        dependent: CosineHnsw,
    }
);

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
        for (i, chunk) in texts.chunks(batch.max(1)).enumerate() {
            let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
            for v in embedder.embed(&refs)? {
                data.extend_from_slice(&v);
            }
            progress(((i * batch.max(1)) + chunk.len()) as u64);
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

/// Builds the HNSW graph for `emb` and dumps it into `dir`. `parallel`: insert from many threads
/// (the graph then depends on thread timing); else in row order, the same graph every time
/// (hnsw_rs seeds its level generator).
pub fn build_graph(
    dir: &Path,
    emb: &Embeddings,
    m: usize,
    ef_construction: usize,
    parallel: bool,
) -> Result<()> {
    let hnsw: CosineHnsw = Hnsw::new(
        m,
        emb.len().max(1),
        MAX_LAYERS,
        ef_construction,
        DistCosine {},
    );
    let rows: Vec<Vec<f32>> = (0..emb.len()).map(|i| emb.row(i).to_vec()).collect();
    let with_ids: Vec<(&Vec<f32>, usize)> = rows.iter().zip(0..).collect();
    if parallel {
        hnsw.parallel_insert(&with_ids);
    } else {
        for (row, id) in &with_ids {
            hnsw.insert((row.as_slice(), *id));
        }
    }
    hnsw.file_dump(dir, HNSW_BASENAME)
        .map_err(|e| SearchError::VectorIndex {
            path: dir.to_path_buf(),
            message: format!("cannot write graph: {e}"),
        })?;
    Ok(())
}

/// A loaded vector index with its embedder, searchable from many threads at once.
pub struct VectorIndex {
    path: PathBuf,
    corpus: Arc<Corpus>,
    embedder: Arc<dyn Embedder>,
    graph: LoadedGraph,
    ef_search: usize,
    snippet_chars: usize,
}

impl VectorIndex {
    /// Loads the graph dumped in `dir` (checksums must have been verified by the caller).
    pub fn open(
        dir: &Path,
        corpus: Arc<Corpus>,
        embedder: Arc<dyn Embedder>,
        ef_search: usize,
        snippet_chars: usize,
    ) -> Result<VectorIndex> {
        let io = HnswIo::new(dir, HNSW_BASENAME);
        let graph =
            LoadedGraph::try_new(io, |io| io.load_hnsw_with_dist(DistCosine {})).map_err(|e| {
                SearchError::VectorIndex {
                    path: dir.to_path_buf(),
                    message: format!("cannot load graph: {e}"),
                }
            })?;
        let n = graph.with_dependent(|_, h| h.get_nb_point());
        if n != corpus.len() {
            return Err(SearchError::Corrupt {
                path: dir.to_path_buf(),
                message: format!("graph holds {n} points but the corpus has {}", corpus.len()),
            });
        }
        Ok(VectorIndex {
            path: dir.to_path_buf(),
            corpus,
            embedder,
            graph,
            ef_search,
            snippet_chars,
        })
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
        let ef = self.ef_search.max(k);
        self.graph.with_dependent(|_, h| {
            h.search(query, k, ef)
                .into_iter()
                .filter(|n| n.d_id < self.corpus.len())
                .map(|n| (n.d_id, 1.0 - n.distance))
                .collect()
        })
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
        let q =
            self.embedder.embed(&[query])?.pop().ok_or_else(|| {
                SearchError::InvalidArgument("embedder returned no vector".into())
            })?;
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
        let idx = VectorIndex::open(dir.path(), c.clone(), emb.clone(), 64, 80).unwrap();
        // A document's own text finds itself first.
        let hits = idx.search(&c.get(37).unwrap().text, 5).unwrap();
        assert_eq!(hits[0].doc_id, "d37");
        assert!(hits[0].score > 0.99);
        assert!(idx.search("", 5).unwrap().is_empty());
        assert!(idx.search("🚀 ((AND", 5).is_ok());
        assert_eq!(idx.search("wing", 1000).unwrap().len(), 200);
        // Approximate agrees with exact on this easy set.
        let q = emb.embed(&["heat boundary layer"]).unwrap().pop().unwrap();
        let exact: Vec<usize> = e.exact_search(&q, 10).into_iter().map(|x| x.0).collect();
        let approx: Vec<usize> = idx.search_vector(&q, 10).into_iter().map(|x| x.0).collect();
        let overlap = approx.iter().filter(|a| exact.contains(a)).count();
        assert!(overlap >= 9, "overlap {overlap}");
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
        let err = VectorIndex::open(dir.path(), corpus(5), emb.clone(), 10, 10)
            .err()
            .unwrap();
        assert!(err.to_string().contains("cannot load graph"), "{err}");
        let e = Embeddings::compute(&corpus(5), emb.as_ref(), 4, &mut |_| {}).unwrap();
        build_graph(dir.path(), &e, 8, 20, true).unwrap();
        let err = VectorIndex::open(dir.path(), corpus(6), emb, 10, 10)
            .err()
            .unwrap();
        assert!(err.to_string().contains("graph holds 5 points"), "{err}");
    }
}
