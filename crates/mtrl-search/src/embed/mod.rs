//! Sentence embedders behind one trait: a candle BERT (sentence-transformers folders such as
//! all-MiniLM-L6-v2) and a deterministic hashing embedder for fixtures and CI.
//!
//! Every embedder returns L2-normalised vectors, so cosine similarity is a dot product, and has an
//! [`Embedder::id`] that changes whenever its output could change; the index cache keys on it.

mod batcher;
mod bert;
mod bert_candle;
mod bert_cpu;
mod hash;

pub use batcher::{BatchStats, InSearch, QueryBatcher};
pub use bert::{BertConfig, BertEmbedder};
pub use hash::HashEmbedder;

use mtrl_core::config::{EmbedderChoice, VectorConfig};

use crate::error::{Result, SearchError};

/// Turns texts into unit-length vectors. Safe to call from many threads.
pub trait Embedder: Send + Sync {
    /// Identity of the embedder and its settings (e.g. `bert:<sha256>:256`).
    fn id(&self) -> String;
    /// Vector length.
    fn dim(&self) -> usize;
    /// One unit vector per text, in order.
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>>;
}

/// Builds the embedder a config asks for.
pub fn from_config(choice: &EmbedderChoice, vector: &VectorConfig) -> Result<Box<dyn Embedder>> {
    Ok(match choice {
        EmbedderChoice::Hash { dim } => Box::new(HashEmbedder::new(*dim)),
        EmbedderChoice::Bert { dir } => Box::new(BertEmbedder::load(
            dir,
            &device(&vector.device)?,
            vector.max_seq_len,
            vector.batch_size,
        )?),
    })
}

/// Parses `cpu`, `cuda` or `cuda:N` into a candle device; a cuda device on a build without the
/// `cuda` feature, or on a machine without that GPU, is a clear error.
pub fn device(spec: &str) -> Result<candle_core::Device> {
    let ordinal = match spec {
        "cpu" => return Ok(candle_core::Device::Cpu),
        "cuda" => 0,
        s => s
            .strip_prefix("cuda:")
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| SearchError::InvalidArgument(format!("unknown device `{s}`")))?,
    };
    candle_core::Device::new_cuda(ordinal)
        .map_err(|e| SearchError::InvalidArgument(format!("device `{spec}` is not available: {e}")))
}

/// Lower-case hex of bytes (digests).
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Scales `v` to unit length; an all-zero vector becomes the first basis vector so that cosine
/// distances stay finite.
pub(crate) fn normalize(v: &mut [f32]) {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 && norm.is_finite() {
        v.iter_mut().for_each(|x| *x /= norm);
    } else {
        v.iter_mut().for_each(|x| *x = 0.0);
        if let Some(first) = v.first_mut() {
            *first = 1.0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalize_handles_zero() {
        let mut v = vec![3.0, 4.0];
        normalize(&mut v);
        assert_eq!(v, vec![0.6, 0.8]);
        let mut z = vec![0.0, 0.0];
        normalize(&mut z);
        assert_eq!(z, vec![1.0, 0.0]);
    }

    #[test]
    fn device_strings() {
        assert!(matches!(device("cpu").unwrap(), candle_core::Device::Cpu));
        assert!(device("tpu")
            .unwrap_err()
            .to_string()
            .contains("unknown device"));
        #[cfg(not(feature = "cuda"))]
        assert!(device("cuda:0").unwrap_err().to_string().contains("cuda:0"));
    }
}
