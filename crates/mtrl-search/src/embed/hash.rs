//! Deterministic hashing embedder: signed feature hashing of words and character trigrams.
//!
//! Not a semantic model — it exists so that tests and CI exercise the whole vector path (HNSW
//! build, persistence, search) without weights. Words count 1 each, trigrams of each word
//! (`#wo`, `wor`, `ord`, `rd#`) count 0.5 each, so morphological variants still overlap. FNV-1a is
//! used instead of std's hasher because its output is fixed forever, and index caches rely on it.

use super::{normalize, Embedder};
use crate::error::Result;

#[derive(Debug, Clone)]
pub struct HashEmbedder {
    dim: usize,
}

impl HashEmbedder {
    pub fn new(dim: usize) -> HashEmbedder {
        HashEmbedder { dim: dim.max(1) }
    }

    fn add(&self, v: &mut [f32], feature: &[u8], weight: f32) {
        let h = fnv1a(feature);
        let idx = (h % self.dim as u64) as usize;
        let sign = if (h >> 63) == 1 { -1.0 } else { 1.0 };
        v[idx] += sign * weight;
    }

    fn embed_one(&self, text: &str) -> Vec<f32> {
        let mut v = vec![0f32; self.dim];
        for word in text
            .split(|c: char| !c.is_alphanumeric())
            .filter(|w| !w.is_empty())
        {
            let w = word.to_lowercase();
            self.add(&mut v, w.as_bytes(), 1.0);
            let padded: Vec<char> = std::iter::once('#')
                .chain(w.chars())
                .chain(std::iter::once('#'))
                .collect();
            for tri in padded.windows(3) {
                let s: String = tri.iter().collect();
                let mut key = b"3:".to_vec();
                key.extend_from_slice(s.as_bytes());
                self.add(&mut v, &key, 0.5);
            }
        }
        normalize(&mut v);
        v
    }
}

/// 64-bit FNV-1a.
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

impl Embedder for HashEmbedder {
    fn id(&self) -> String {
        format!("hash-v1:{}", self.dim)
    }

    fn dim(&self) -> usize {
        self.dim
    }

    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
        Ok(texts.iter().map(|t| self.embed_one(t)).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cos(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }

    #[test]
    fn fnv_reference_values() {
        // Published FNV-1a 64 test vectors.
        assert_eq!(fnv1a(b""), 0xcbf29ce484222325);
        assert_eq!(fnv1a(b"a"), 0xaf63dc4c8601ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x85944171f73967e8);
    }

    #[test]
    fn unit_length_deterministic_and_similarity_ordered() {
        let e = HashEmbedder::new(256);
        let v = e
            .embed(&[
                "supersonic wing flutter",
                "flutter of supersonic wings",
                "heat transfer",
            ])
            .unwrap();
        for x in &v {
            assert!((cos(x, x) - 1.0).abs() < 1e-5);
        }
        assert_eq!(v[0], e.embed(&["supersonic wing flutter"]).unwrap()[0]);
        assert!(cos(&v[0], &v[1]) > cos(&v[0], &v[2]));
        let empty = e.embed(&["!!!"]).unwrap();
        assert!((cos(&empty[0], &empty[0]) - 1.0).abs() < 1e-6);
    }
}
