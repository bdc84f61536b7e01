//! Fixtures of the paged attention and its check against the candle spelling it replaces, which
//! `mtrl selftest` runs on the selftest's device (the kernel on a GPU, the twin on the CPU).

use candle_core::{DType, Device, Result, Tensor};

use super::{attend, PagedRows};
use crate::kv_pool::{KvPool, SeqBlocks};
use crate::transformer::paged::{DecodeTable, Segment};

/// One layer's paged store on `dev` in `dtype` holding the rows of an engine step — decode rows
/// that have `decode` positions (their last one the row), then prefill chunks `(start, len)` —
/// with random keys and values at every position, each sequence's blocks interleaved with
/// another owner's; the step's segments in order, and random queries `[t, heads, d]` (drawn on
/// the CPU, so every device sees the same values).
pub(crate) fn step_fixture(
    dev: &Device,
    dtype: DType,
    (kv, heads, d): (usize, usize, usize),
    decode: &[usize],
    prefill: &[(usize, usize)],
) -> crate::Result<(KvPool, Vec<Segment>, Tensor)> {
    let rand = |shape: &[usize]| -> Result<Tensor> {
        Tensor::randn(0f32, 1.0, shape, &Device::Cpu)?
            .to_dtype(dtype)?
            .to_device(dev)
    };
    let mut pool = KvPool::new(1, kv, d, 4096, dtype, dev)?;
    let rows = decode
        .iter()
        .map(|&n| (n - 1, 1))
        .chain(prefill.iter().copied());
    let mut segs = Vec::new();
    for (i, (start, len)) in rows.enumerate() {
        let n = start + len;
        let mut s = SeqBlocks::default();
        if !pool.reserve(&mut s, n)? {
            return Err(crate::ModelError::InvalidArgument(
                "paged attention fixture: the pool is too small".into(),
            ));
        }
        let slots: Vec<u32> = s.slots(n).collect();
        let (kt, vt) = (rand(&[n * kv, d])?, rand(&[n * kv, d])?);
        pool.write(0, &pool.slot_mapping(&slots)?, &kt, &vt)?;
        segs.push(Segment { start, len, slots });
        // Another owner's blocks between this sequence's and the next's.
        let mut gap = SeqBlocks::default();
        pool.reserve(&mut gap, 3 + i)?;
    }
    let t: usize = segs.iter().map(|s| s.len).sum();
    let q = rand(&[t, heads, d])?;
    Ok((pool, segs, q))
}

/// [`step_fixture`] with decode rows only, as the decode attention takes them: the store, the
/// rows' table and queries `[n, heads, 1, d]`.
#[cfg(test)]
pub(crate) fn decode_fixture(
    dev: &Device,
    dtype: DType,
    dims: (usize, usize, usize),
    lens: &[usize],
) -> crate::Result<(KvPool, DecodeTable, Tensor)> {
    let (pool, segs, q) = step_fixture(dev, dtype, dims, lens, &[])?;
    let (n, heads, d) = q.dims3()?;
    Ok((
        pool,
        DecodeTable::new(&segs, dev),
        q.reshape((n, heads, 1, d))?,
    ))
}

/// Every query of `segs` as a decode row of its own (its sequence's positions up to its own):
/// the table under which the gathered decode spelling computes what [`attend`] does.
pub(crate) fn per_query_table(segs: &[Segment], dev: &Device) -> DecodeTable {
    let rows: Vec<Segment> = segs
        .iter()
        .flat_map(|s| {
            (0..s.len).map(move |i| Segment {
                start: s.start + i,
                len: 1,
                slots: s.slots[..s.start + i + 1].to_vec(),
            })
        })
        .collect();
    DecodeTable::new(&rows, dev)
}

/// The largest difference between [`attend`] (the kernel on a GPU, the twin on the CPU) and the
/// candle spelling it replaces, on `dev` in `dtype`: one step of 4 decode rows (1 to 130
/// positions) and 4 prefill chunks (from a prompt's start, in the middle of a block, across a
/// block boundary, a single token), blocks interleaved with another owner's, GQA (4 query heads
/// per KV head), head dims 64 and 128. `mtrl selftest` reports it.
pub fn check_against_gathered(dev: &Device, dtype: DType) -> crate::Result<f32> {
    use crate::transformer::backend::Candle;
    use crate::transformer::paged::decode_gathered;

    let mut worst = 0f32;
    for d in [64usize, 128] {
        let (kv, heads) = (2, 8);
        let prefill = [(0, 5), (60, 9), (127, 3), (0, 1)];
        let (pool, segs, q) =
            step_fixture(dev, dtype, (kv, heads, d), &[70, 1, 130, 64], &prefill)?;
        let (kp, vp) = pool.layer(0);
        let refs: Vec<&Segment> = segs.iter().collect();
        let got = attend(&q, kp, vp, kv, &PagedRows::new(&refs, dev)?)?;
        let be = Candle {
            differentiable: false,
        };
        let t = q.dim(0)?;
        let table = per_query_table(&segs, dev);
        let want =
            decode_gathered(&be, &q.unsqueeze(2)?, kp, vp, kv, &table)?.reshape((t, heads * d))?;
        let diff = (got.to_dtype(DType::F32)? - want.to_dtype(DType::F32)?)?
            .abs()?
            .max_all()?
            .to_scalar::<f32>()?;
        worst = worst.max(diff);
    }
    Ok(worst)
}
