//! The prefill attention against the candle spelling it replaces, on the selftest's device (the
//! kernel on a GPU, the twin on the CPU).

use candle_core::{DType, Device, Tensor};

use super::{attend, key_rows, PrefixRows};
use crate::paged_attention::{per_query_table, step_fixture};
use crate::transformer::paged::Segment;

/// The queries of `segs` attended by [`attend`] over their sequences' keys and values gathered
/// from `pool` (layer 0), `[Tq, heads · d]`.
pub(crate) fn attend_segments(
    q: &Tensor,
    pool: &crate::kv_pool::KvPool,
    segs: &[Segment],
    kv: usize,
) -> candle_core::Result<Tensor> {
    let dev = q.device();
    let refs: Vec<&Segment> = segs.iter().collect();
    let mut rows = Vec::new();
    key_rows(&refs, kv, &mut rows);
    let n = rows.len();
    let idx = Tensor::from_vec(rows, n, dev)?;
    let (kp, vp) = pool.layer(0);
    let d = kp.dim(1)?;
    let k = kp.index_select(&idx, 0)?.reshape((n / kv, kv, d))?;
    let v = vp.index_select(&idx, 0)?.reshape((n / kv, kv, d))?;
    let lens: Vec<(usize, usize)> = segs.iter().map(|s| (s.len, s.start + s.len)).collect();
    attend(q, &k, &v, &PrefixRows::new(&lens, dev)?)
}

/// The largest difference between [`attend`] (FlashAttention-2 on a GPU, the twin on the CPU)
/// and the candle spelling of the engine's prefill attention, on `dev` in `dtype`: prompt chunks
/// from a prompt's start, in the middle of a block, across a block boundary, a single token and
/// 130 tokens after 5, each sequence's blocks interleaved with another owner's, GQA (4 query
/// heads per KV head), head dims 64 and 128. `mtrl selftest` reports it.
pub fn check_against_gathered(dev: &Device, dtype: DType) -> crate::Result<f32> {
    use crate::transformer::backend::Candle;
    use crate::transformer::paged::decode_gathered;

    let mut worst = 0f32;
    for d in [64usize, 128] {
        let (kv, heads) = (2, 8);
        let prefill = [(0, 5), (60, 9), (127, 3), (0, 1), (5, 130)];
        let (pool, segs, q) = step_fixture(dev, dtype, (kv, heads, d), &[], &prefill)?;
        let got = attend_segments(&q, &pool, &segs, kv)?;
        let be = Candle {
            differentiable: false,
        };
        let (kp, vp) = pool.layer(0);
        let t = q.dim(0)?;
        let want = decode_gathered(
            &be,
            &q.unsqueeze(2)?,
            kp,
            vp,
            kv,
            &per_query_table(&segs, dev),
        )?
        .reshape((t, heads * d))?;
        let diff = (got.to_dtype(DType::F32)? - want.to_dtype(DType::F32)?)?
            .abs()?
            .max_all()?
            .to_scalar::<f32>()?;
        worst = worst.max(diff);
    }
    Ok(worst)
}
