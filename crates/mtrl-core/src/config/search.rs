//! `[search]`: the corpus, where its indexes live, and how BM25 and vector search are configured.
//!
//! ```toml
//! [search]
//! corpus = "../data/cranfield/docs.jsonl"   # .jsonl / .tsv / .csv, optionally .gz
//! index_dir = "../runs/index/cranfield"
//! embedder = "hash"                          # or a sentence-transformers folder
//! skip_bad_rows = false
//! snippet_chars = 240
//! [search.columns]  id = "doc_id"  title = "title"  text = "text"
//! [search.bm25]     stopwords = "english"    # "none" or a list of words
//! [search.vector]   m = 16  ef_construction = 200  ef_search = 128  hash_dim = 384
//!                   parallel_build = true   # false: one thread, the same graph on every build
//! [search.eval]     queries = "../data/cranfield/queries.tsv"  qrels = "../data/cranfield/qrels.trec"
//! ```

use std::path::PathBuf;

use serde::Deserialize;

use super::Ctx;
use crate::error::Result;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SearchSpec {
    pub corpus: String,
    pub index_dir: String,
    pub embedder: Option<String>,
    pub skip_bad_rows: Option<bool>,
    pub snippet_chars: Option<usize>,
    pub columns: Option<ColumnsSpec>,
    pub bm25: Option<Bm25Spec>,
    pub vector: Option<VectorSpec>,
    pub eval: Option<RetrievalEvalSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ColumnsSpec {
    pub id: Option<String>,
    pub title: Option<String>,
    pub text: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum StopWordsSpec {
    Named(String),
    List(Vec<String>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bm25Spec {
    pub stopwords: Option<StopWordsSpec>,
    pub stemming: Option<bool>,
    pub k1: Option<f64>,
    pub b: Option<f64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VectorSpec {
    pub m: Option<usize>,
    pub ef_construction: Option<usize>,
    pub ef_search: Option<usize>,
    pub parallel_build: Option<bool>,
    pub hash_dim: Option<usize>,
    pub max_seq_len: Option<usize>,
    pub batch_size: Option<usize>,
    pub query_batch: Option<usize>,
    pub query_batch_wait_us: Option<usize>,
    pub device: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetrievalEvalSpec {
    pub queries: String,
    pub qrels: String,
}

/// Which corpus fields hold the id, title and text (title optional: a missing column means none).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Columns {
    pub id: String,
    pub title: String,
    pub text: String,
}

impl Default for Columns {
    fn default() -> Self {
        Columns {
            id: "id".into(),
            title: "title".into(),
            text: "text".into(),
        }
    }
}

/// Stop words removed by the BM25 analyzer (at index and query time alike).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum StopWords {
    None,
    English,
    Custom(Vec<String>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Bm25Config {
    pub stopwords: StopWords,
    pub stemming: bool,
    /// Term-frequency saturation (applied when the index is opened: no rebuild).
    pub k1: f32,
    /// Document-length normalisation, 0..=1 (applied when the index is opened).
    pub b: f32,
}

/// The embedder behind vector search.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum EmbedderChoice {
    /// Deterministic feature hashing into `dim` dimensions (fixtures, CI).
    Hash { dim: usize },
    /// A local sentence-transformers BERT folder (config.json, tokenizer.json, model.safetensors).
    Bert { dir: PathBuf },
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct VectorConfig {
    /// HNSW max connections per node.
    pub m: usize,
    pub ef_construction: usize,
    pub ef_search: usize,
    /// Insert into the HNSW graph from many threads (fast; the graph, and so vector results,
    /// can differ between builds). `false`: one thread, the same graph every time.
    pub parallel_build: bool,
    /// Longest embedder input in tokens (longer text is truncated).
    pub max_seq_len: usize,
    /// Texts per embedder forward pass while indexing.
    pub batch_size: usize,
    /// Most queries of concurrent `vector_search` calls embedded in one pass (1: each on its own).
    pub query_batch: usize,
    /// Longest a query batch is held open for searches in progress to join it, in microseconds.
    pub query_batch_wait_us: u64,
    /// Device string for the neural embedder: "cpu", "cuda", "cuda:N".
    pub device: String,
}

/// Query set + judgments for `mtrl search-eval`.
#[derive(Debug, Clone)]
pub struct RetrievalEvalConfig {
    pub queries: PathBuf,
    pub qrels: PathBuf,
}

#[derive(Debug, Clone)]
pub struct SearchConfig {
    pub corpus: PathBuf,
    pub index_dir: PathBuf,
    pub embedder: EmbedderChoice,
    pub skip_bad_rows: bool,
    /// Longest snippet shown per hit, in characters.
    pub snippet_chars: usize,
    pub columns: Columns,
    pub bm25: Bm25Config,
    pub vector: VectorConfig,
    pub eval: Option<RetrievalEvalConfig>,
}

/// A float setting inside `lo..=hi`.
fn unit_range(ctx: &Ctx<'_>, key: &str, v: f64, lo: f64, hi: f64) -> Result<f32> {
    if !(lo..=hi).contains(&v) {
        return Err(ctx.invalid(key, format!("{v} is outside {lo}..={hi}")));
    }
    Ok(v as f32)
}

impl SearchSpec {
    pub(crate) fn validate(self, ctx: &Ctx<'_>) -> Result<SearchConfig> {
        ctx.non_empty("search.corpus", &self.corpus)?;
        ctx.non_empty("search.index_dir", &self.index_dir)?;
        let v = self.vector.unwrap_or_default();
        let hash_dim = ctx.range("search.vector.hash_dim", v.hash_dim.unwrap_or(384), 8, 8192)?;
        let embedder = match self.embedder.as_deref().unwrap_or("hash") {
            "" => return Err(ctx.invalid("search.embedder", "must not be empty")),
            "hash" => EmbedderChoice::Hash { dim: hash_dim },
            dir => EmbedderChoice::Bert {
                dir: ctx.resolve(dir),
            },
        };
        let device = v.device.unwrap_or_else(|| "cpu".into());
        if !(device == "cpu" || device == "cuda" || parse_cuda_index(&device).is_some()) {
            return Err(ctx.invalid(
                "search.vector.device",
                format!("`{device}` is not one of \"cpu\", \"cuda\", \"cuda:N\""),
            ));
        }
        let vector = VectorConfig {
            m: ctx.range("search.vector.m", v.m.unwrap_or(16), 2, 256)?,
            ef_construction: ctx.range(
                "search.vector.ef_construction",
                v.ef_construction.unwrap_or(200),
                1,
                10_000,
            )?,
            ef_search: ctx.range(
                "search.vector.ef_search",
                v.ef_search.unwrap_or(128),
                1,
                10_000,
            )?,
            parallel_build: v.parallel_build.unwrap_or(true),
            max_seq_len: ctx.range(
                "search.vector.max_seq_len",
                v.max_seq_len.unwrap_or(256),
                8,
                512,
            )?,
            batch_size: ctx.range(
                "search.vector.batch_size",
                v.batch_size.unwrap_or(32),
                1,
                4096,
            )?,
            query_batch: ctx.range(
                "search.vector.query_batch",
                v.query_batch.unwrap_or(64),
                1,
                4096,
            )?,
            query_batch_wait_us: ctx.range(
                "search.vector.query_batch_wait_us",
                v.query_batch_wait_us.unwrap_or(2000),
                0,
                1_000_000,
            )? as u64,
            device,
        };
        let columns = match self.columns {
            None => Columns::default(),
            Some(c) => {
                let d = Columns::default();
                let cols = Columns {
                    id: c.id.unwrap_or(d.id),
                    title: c.title.unwrap_or(d.title),
                    text: c.text.unwrap_or(d.text),
                };
                ctx.non_empty("search.columns.id", &cols.id)?;
                ctx.non_empty("search.columns.text", &cols.text)?;
                cols
            }
        };
        let bm25 = match self.bm25 {
            None => Bm25Config {
                stopwords: StopWords::English,
                stemming: true,
                k1: 1.2,
                b: 0.75,
            },
            Some(b) => Bm25Config {
                k1: unit_range(ctx, "search.bm25.k1", b.k1.unwrap_or(1.2), 0.0, 10.0)?,
                b: unit_range(ctx, "search.bm25.b", b.b.unwrap_or(0.75), 0.0, 1.0)?,
                stopwords: match b.stopwords {
                    None => StopWords::English,
                    Some(StopWordsSpec::Named(n)) => match n.as_str() {
                        "english" => StopWords::English,
                        "none" => StopWords::None,
                        other => {
                            return Err(ctx.invalid(
                                "search.bm25.stopwords",
                                format!(
                                    "`{other}` is not \"english\", \"none\" or a list of words"
                                ),
                            ))
                        }
                    },
                    Some(StopWordsSpec::List(words)) => {
                        StopWords::Custom(words.into_iter().map(|w| w.to_lowercase()).collect())
                    }
                },
                stemming: b.stemming.unwrap_or(true),
            },
        };
        let snippet_chars = ctx.range(
            "search.snippet_chars",
            self.snippet_chars.unwrap_or(240),
            16,
            100_000,
        )?;
        let eval = self
            .eval
            .map(|e| -> Result<RetrievalEvalConfig> {
                ctx.non_empty("search.eval.queries", &e.queries)?;
                ctx.non_empty("search.eval.qrels", &e.qrels)?;
                Ok(RetrievalEvalConfig {
                    queries: ctx.resolve(&e.queries),
                    qrels: ctx.resolve(&e.qrels),
                })
            })
            .transpose()?;
        Ok(SearchConfig {
            corpus: ctx.resolve(&self.corpus),
            index_dir: ctx.resolve(&self.index_dir),
            embedder,
            skip_bad_rows: self.skip_bad_rows.unwrap_or(false),
            snippet_chars,
            columns,
            bm25,
            vector,
            eval,
        })
    }
}

/// `"cuda:3"` → `Some(3)`.
pub fn parse_cuda_index(device: &str) -> Option<usize> {
    device.strip_prefix("cuda:")?.parse().ok()
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::{EmbedderChoice, StopWords};
    use crate::Config;

    fn load(text: &str) -> crate::Result<Config> {
        Config::from_toml_str(text, Path::new("configs/t.toml"))
    }

    #[test]
    fn defaults_and_relative_paths() {
        let cfg = load("[search]\ncorpus = '../data/c.jsonl'\nindex_dir = '/abs/idx'\n").unwrap();
        let s = cfg.search().unwrap();
        assert_eq!(s.corpus, Path::new("configs/../data/c.jsonl"));
        assert_eq!(s.index_dir, Path::new("/abs/idx"));
        assert_eq!(s.embedder, EmbedderChoice::Hash { dim: 384 });
        assert_eq!(s.bm25.stopwords, StopWords::English);
        assert_eq!(s.vector.m, 16);
        assert_eq!(s.columns.id, "id");
        assert!(s.eval.is_none());
    }

    #[test]
    fn bm25_weights_and_query_batching_are_read_and_checked() {
        let base = "[search]\ncorpus='c'\nindex_dir='i'\n";
        let s = load(base).unwrap().search().unwrap().clone();
        assert_eq!((s.bm25.k1, s.bm25.b), (1.2, 0.75));
        assert_eq!(
            (s.vector.query_batch, s.vector.query_batch_wait_us),
            (64, 2000)
        );
        let cfg = load(&format!(
            "{base}[search.bm25]\nk1 = 2.0\nb = 0.3\n[search.vector]\nquery_batch = 1\nquery_batch_wait_us = 0\n"
        ))
        .unwrap();
        let s = cfg.search().unwrap();
        assert_eq!((s.bm25.k1, s.bm25.b), (2.0, 0.3));
        assert_eq!((s.vector.query_batch, s.vector.query_batch_wait_us), (1, 0));
        for (section, bad, key) in [
            ("bm25", "b = 1.5", "search.bm25.b"),
            ("bm25", "k1 = -1", "search.bm25.k1"),
            ("vector", "query_batch = 0", "search.vector.query_batch"),
            (
                "vector",
                "query_batch_wait_us = 5000000",
                "search.vector.query_batch_wait_us",
            ),
        ] {
            let err = load(&format!("{base}[search.{section}]\n{bad}\n")).unwrap_err();
            assert!(err.to_string().contains(key), "{bad}: {err}");
        }
    }

    #[test]
    fn mistyped_nested_key_is_named() {
        let err = load("[search]\ncorpus='c'\nindex_dir='i'\n[search.vector]\nef_serch = 3\n")
            .unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("ef_serch") && msg.contains("configs/t.toml"),
            "{msg}"
        );
    }

    #[test]
    fn out_of_range_value_names_key() {
        let err =
            load("[search]\ncorpus='c'\nindex_dir='i'\n[search.vector]\nm = 1\n").unwrap_err();
        assert!(err.to_string().contains("search.vector.m"), "{err}");
    }

    #[test]
    fn bad_stopwords_and_device_are_rejected() {
        let err = load("[search]\ncorpus='c'\nindex_dir='i'\n[search.bm25]\nstopwords='klingon'\n")
            .unwrap_err();
        assert!(err.to_string().contains("search.bm25.stopwords"), "{err}");
        let err = load("[search]\ncorpus='c'\nindex_dir='i'\n[search.vector]\ndevice='tpu'\n")
            .unwrap_err();
        assert!(err.to_string().contains("search.vector.device"), "{err}");
        let ok =
            load("[search]\ncorpus='c'\nindex_dir='i'\n[search.bm25]\nstopwords=['The','of']\n")
                .unwrap();
        assert_eq!(
            ok.search().unwrap().bm25.stopwords,
            StopWords::Custom(vec!["the".into(), "of".into()])
        );
    }

    #[test]
    fn wrong_type_is_reported() {
        let err = load("[search]\ncorpus=3\nindex_dir='i'\n").unwrap_err();
        assert!(err.to_string().contains("corpus"), "{err}");
    }

    #[test]
    fn embedder_dir_is_resolved() {
        let cfg =
            load("[search]\ncorpus='c'\nindex_dir='i'\nembedder='../models/minilm'\n").unwrap();
        assert_eq!(
            cfg.search().unwrap().embedder,
            EmbedderChoice::Bert {
                dir: "configs/../models/minilm".into()
            }
        );
    }
}
