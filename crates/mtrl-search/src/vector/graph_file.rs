//! The graph file `hnsw.graph`: little-endian u32 words after an 8-byte magic.
//!
//! Layout: `MTRLHNSW`, then `format_version, n, m, entry, max_level`, then the levels (`n` words),
//! then layer 0 (`n × (1 + 2m)` words: a count, then links), then the upper layers (for nodes of
//! level ≥ 1 in node order, per level a count and `m` links). [`load`] checks every count, link
//! and level against the header and the corpus size, so a damaged or foreign file is an error
//! that names it.

use std::io::Write;
use std::path::Path;

use super::hnsw::Graph;
use crate::error::{Result, SearchError};

const MAGIC: &[u8; 8] = b"MTRLHNSW";
const FORMAT_VERSION: u32 = 1;

pub(super) fn save(g: &Graph, path: &Path) -> Result<()> {
    let mut words: Vec<u32> = vec![
        FORMAT_VERSION,
        g.len() as u32,
        g.m as u32,
        g.entry,
        g.max_level as u32,
    ];
    words.extend(g.levels.iter().map(|&l| l as u32));
    words.extend_from_slice(&g.layer0);
    words.extend_from_slice(&g.upper);
    let mut bytes = Vec::with_capacity(8 + words.len() * 4);
    bytes.extend_from_slice(MAGIC);
    for w in words {
        bytes.extend_from_slice(&w.to_le_bytes());
    }
    let mut f = std::fs::File::create(path).map_err(SearchError::io("create", path))?;
    f.write_all(&bytes)
        .map_err(SearchError::io("write", path))?;
    f.sync_all().map_err(SearchError::io("sync", path))
}

/// Reads and checks the graph of a corpus of `docs` documents.
pub(super) fn load(path: &Path, docs: usize) -> Result<Graph> {
    let bytes = std::fs::read(path).map_err(|e| SearchError::VectorIndex {
        path: path.to_path_buf(),
        message: format!("cannot load graph: {e}"),
    })?;
    let bad = |message: String| SearchError::Corrupt {
        path: path.to_path_buf(),
        message,
    };
    if bytes.len() < 8 + 20 || &bytes[..8] != MAGIC || (bytes.len() - 8) % 4 != 0 {
        return Err(bad("not an mtrl HNSW graph file".into()));
    }
    let words: Vec<u32> = bytes[8..]
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let [version, n, m, entry, max_level] = [0, 1, 2, 3, 4].map(|i| words[i] as usize);
    if version != FORMAT_VERSION as usize {
        return Err(bad(format!(
            "format_version {version}, expected {FORMAT_VERSION}"
        )));
    }
    if n != docs {
        return Err(bad(format!(
            "graph holds {n} points but the corpus has {docs}"
        )));
    }
    if !(2..=1 << 16).contains(&m) || (n > 0 && entry >= n) || max_level > 64 {
        return Err(bad(format!(
            "bad header: m {m}, entry {entry}, max_level {max_level}"
        )));
    }
    let w0 = 1 + 2 * m;
    let mut at = 5;
    let take = |at: &mut usize, len: usize| -> Result<&[u32]> {
        let s = words
            .get(*at..*at + len)
            .ok_or_else(|| bad("file ends early".into()))?;
        *at += len;
        Ok(s)
    };
    let levels_w = take(&mut at, n)?;
    if let Some(l) = levels_w.iter().find(|&&l| l as usize > max_level) {
        return Err(bad(format!(
            "a node has level {l} above max_level {max_level}"
        )));
    }
    let levels: Vec<u8> = levels_w.iter().map(|&l| l as u8).collect();
    if n > 0 && levels[entry] as usize != max_level {
        return Err(bad("the entry point is not on the top level".into()));
    }
    let layer0 = take(&mut at, n * w0)?.to_vec();
    let uppers: usize = levels.iter().map(|&l| l as usize).sum();
    let upper = take(&mut at, uppers * (1 + m))?.to_vec();
    if at != words.len() {
        return Err(bad(format!("{} words after the graph", words.len() - at)));
    }
    let check = |list: &[u32], cap: usize| -> Result<()> {
        let len = list[0] as usize;
        if len > cap {
            return Err(bad(format!(
                "a neighbour list holds {len} links, at most {cap}"
            )));
        }
        match list[1..=len].iter().find(|&&e| e as usize >= n) {
            Some(e) => Err(bad(format!("link to node {e} of {n}"))),
            None => Ok(()),
        }
    };
    for list in layer0.chunks_exact(w0) {
        check(list, 2 * m)?;
    }
    let mut upper_at = vec![u32::MAX; n];
    let mut pos = 0usize;
    for (i, &l) in levels.iter().enumerate() {
        if l == 0 {
            continue;
        }
        upper_at[i] = pos as u32;
        for level in 1..=l {
            let list = &upper[pos..pos + 1 + m];
            check(list, m)?;
            // A search on `level` only steps to nodes that have that level.
            if let Some(e) = list[1..=list[0] as usize]
                .iter()
                .find(|&&e| levels[e as usize] < level)
            {
                return Err(bad(format!(
                    "node {i} links to node {e} on level {level}, above that node's level"
                )));
            }
            pos += 1 + m;
        }
    }
    Ok(Graph {
        m,
        entry: entry as u32,
        max_level,
        levels,
        layer0,
        upper,
        upper_at,
    })
}

#[cfg(test)]
mod tests {
    use super::super::hnsw::{Graph, Points};
    use super::*;

    #[test]
    fn roundtrip_and_every_damage_is_an_error() {
        let data: Vec<f32> = (0..200 * 8)
            .map(|i| ((i * 7919) % 97) as f32 / 97.0 - 0.5)
            .collect();
        let g = Graph::build(
            Points {
                data: &data,
                dim: 8,
            },
            4,
            20,
            false,
        );
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("hnsw.graph");
        save(&g, &p).unwrap();
        assert_eq!(load(&p, 200).unwrap(), g);
        assert!(load(&p, 201)
            .unwrap_err()
            .to_string()
            .contains("200 points"));
        let good = std::fs::read(&p).unwrap();
        // Truncation, trailing bytes, and a flipped byte anywhere: an error or (a harmless
        // in-range change) a graph; never a panic.
        for cut in [0, 7, 8, 27, good.len() / 2, good.len() - 1] {
            std::fs::write(&p, &good[..cut]).unwrap();
            assert!(load(&p, 200).is_err(), "cut at {cut}");
        }
        let mut long = good.clone();
        long.extend_from_slice(&[0, 0, 0, 0]);
        std::fs::write(&p, &long).unwrap();
        assert!(load(&p, 200).is_err());
        for i in (8..good.len()).step_by(37) {
            let mut b = good.clone();
            b[i] ^= 0xFF;
            std::fs::write(&p, &b).unwrap();
            let _ = load(&p, 200);
        }
    }
}
