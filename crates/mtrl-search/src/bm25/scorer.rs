//! BM25 ranking over impact lists read out of the tantivy index once, at open.
//!
//! tantivy builds and stores the index (analysis, postings, segments). Ranking, though, runs
//! here: per term a list of `(document ord, precomputed BM25 weight)`, and a query adds its terms'
//! lists into a per-thread score array and selects the top `k` — the work bm25s does, without
//! tantivy's per-query scorer set-up, block-WAND bookkeeping and doc-address mapping, and with
//! the exact document lengths (tantivy quantises them to one byte, `fieldnorm`), so scores are
//! the textbook formula: `idf · tf·(k1+1) / (tf + k1·(1 − b + b·len/avg_len))` with
//! `idf = ln(1 + (N − df + 0.5)/(df + 0.5))` (the Lucene form tantivy and bm25s use).

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::Path;

use tantivy::postings::Postings;
use tantivy::schema::{Field, IndexRecordOption};
use tantivy::{DocSet, Searcher, TERMINATED};

use crate::error::{Result, SearchError};

/// The impact lists of every term, in CSR form.
pub(super) struct Scorer {
    terms: HashMap<String, u32>,
    /// `starts[t]..starts[t + 1]` indexes term `t`'s postings.
    starts: Vec<usize>,
    docs: Vec<u32>,
    weights: Vec<f32>,
    n: usize,
}

struct Scratch {
    acc: Vec<f32>,
    touched: Vec<u32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = const { RefCell::new(Scratch { acc: Vec::new(), touched: Vec::new() }) };
}

impl Scorer {
    /// Reads every posting of `field` from `searcher`'s segments; `ords[segment][doc]` is the
    /// corpus ord of each segment document.
    pub fn load(
        path: &Path,
        searcher: &Searcher,
        field: Field,
        ords: &[Vec<u32>],
        n: usize,
        k1: f32,
        b: f32,
    ) -> Result<Scorer> {
        let err = |message: String| SearchError::Corrupt {
            path: path.to_path_buf(),
            message,
        };
        let io = |e: std::io::Error| err(format!("cannot read postings: {e}"));
        let mut terms: HashMap<String, u32> = HashMap::new();
        let mut lists: Vec<Vec<(u32, u32)>> = Vec::new();
        let mut len = vec![0u64; n];
        for (seg, reader) in searcher.segment_readers().iter().enumerate() {
            let inv = reader
                .inverted_index(field)
                .map_err(|e| err(format!("cannot open the inverted index: {e}")))?;
            let mut stream = inv.terms().stream().map_err(io)?;
            while stream.advance() {
                let text = std::str::from_utf8(stream.key())
                    .map_err(|_| err("a term is not UTF-8".into()))?;
                let next = terms.len() as u32;
                let t = *terms.entry(text.to_string()).or_insert(next);
                if t == next {
                    lists.push(Vec::new());
                }
                let mut postings = inv
                    .read_postings_from_terminfo(stream.value(), IndexRecordOption::WithFreqs)
                    .map_err(io)?;
                while postings.doc() != TERMINATED {
                    let doc = postings.doc() as usize;
                    let ord = *ords
                        .get(seg)
                        .and_then(|o| o.get(doc))
                        .ok_or_else(|| err(format!("segment {seg} document {doc} has no ord")))?;
                    if ord as usize >= n {
                        return Err(err(format!("document ord {ord} is outside the corpus")));
                    }
                    let tf = postings.term_freq();
                    lists[t as usize].push((ord, tf));
                    len[ord as usize] += tf as u64;
                    postings.advance();
                }
            }
        }
        let avg = (len.iter().sum::<u64>() as f64 / n.max(1) as f64).max(1e-9);
        let (k1, b) = (k1 as f64, b as f64);
        let mut starts = Vec::with_capacity(lists.len() + 1);
        let total: usize = lists.iter().map(Vec::len).sum();
        let mut docs = Vec::with_capacity(total);
        let mut weights = Vec::with_capacity(total);
        starts.push(0);
        for list in &mut lists {
            list.sort_unstable();
            let df = list.len() as f64;
            let idf = (1.0 + (n as f64 - df + 0.5) / (df + 0.5)).ln();
            for &(ord, tf) in list.iter() {
                let tf = tf as f64;
                let norm = k1 * (1.0 - b + b * len[ord as usize] as f64 / avg);
                docs.push(ord);
                weights.push((idf * tf * (k1 + 1.0) / (tf + norm)) as f32);
            }
            starts.push(docs.len());
        }
        Ok(Scorer {
            terms,
            starts,
            docs,
            weights,
            n,
        })
    }

    /// Number of postings held (8 bytes each).
    pub fn postings(&self) -> usize {
        self.docs.len()
    }

    /// `(ord, score)` of the best `k` documents for analysed query `terms` (a repeated term
    /// counts as often as it appears), best first, ties by ord.
    pub fn top_k(&self, terms: &[String], k: usize) -> Vec<(usize, f32)> {
        SCRATCH.with(|s| {
            let mut s = s.borrow_mut();
            let Scratch { acc, touched } = &mut *s;
            if acc.len() != self.n {
                *acc = vec![0.0; self.n];
            }
            touched.clear();
            for t in terms {
                let Some(&id) = self.terms.get(t) else {
                    continue;
                };
                let r = self.starts[id as usize]..self.starts[id as usize + 1];
                for (&d, &w) in self.docs[r.clone()].iter().zip(&self.weights[r]) {
                    let a = &mut acc[d as usize];
                    if *a == 0.0 {
                        touched.push(d);
                    }
                    *a += w;
                }
            }
            // The best `k` in one pass: a small sorted buffer, entered only by a score that beats
            // its worst (ties by ord, so the order is total).
            let better = |a: (u32, f32), b: (u32, f32)| a.1 > b.1 || (a.1 == b.1 && a.0 < b.0);
            let mut best: Vec<(u32, f32)> = Vec::with_capacity(k + 1);
            for &d in touched.iter() {
                let cand = (d, acc[d as usize]);
                acc[d as usize] = 0.0;
                if k == 0 || (best.len() == k && !better(cand, best[k - 1])) {
                    continue;
                }
                let at = best.partition_point(|&x| better(x, cand));
                best.insert(at, cand);
                best.truncate(k);
            }
            let hits: Vec<(usize, f32)> = best.into_iter().map(|(d, s)| (d as usize, s)).collect();
            hits
        })
    }
}
