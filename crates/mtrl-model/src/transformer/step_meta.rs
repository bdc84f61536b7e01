//! The integer metadata of one engine forward, built on the host and uploaded in **one** copy:
//! token ids, positions, the slot mapping of the key/value write, the rows to return, and the
//! attention's tables ([`Tables`]): for the in-place paged attention the segments' slot tables and
//! each query's segment and length; for the gather spelling the decode rows' gather index and
//! lengths (candle backend only), the prefill segments' query rows, key gather index, causal
//! limits and output rows, and an `0..S` ramp. Every tensor the forward needs
//! is a view of that one buffer; the additive masks are formed on the device from the lengths and
//! limits (`ramp ≥ limit`), not uploaded as f32. On a GPU this turns ~10 small host→device copies
//! and two mask uploads of `n · s` and `m · t · s` floats per step into one copy (diagnosis C2).

use candle_core::{DType, Device, Result, Tensor};

use super::mask_value;
use super::paged::{DecodeTable, Segment};
use crate::flash_prefill::PrefixRows;
use crate::kv_pool::gather_rows;
use crate::paged_attention::PagedRows;

/// The attention metadata a step uploads.
#[derive(Clone, Copy)]
pub(super) enum Tables<'a> {
    /// The CPU kernels: the decode rows follow their slot tables on the host; the prefill
    /// segments are padded and their keys gathered.
    Host,
    /// The candle spelling: as `Host`, plus the decode rows' gather index and lengths of this
    /// table.
    Gather(&'a DecodeTable),
    /// [`crate::paged_attention`]: one slot table per segment, and each query's segment and
    /// length; nothing padded. With `fused_prefill`, the prefill segments go to
    /// [`crate::flash_prefill`] instead: their sequences' key rows (token-major) and the query
    /// and key offsets.
    InPlace { fused_prefill: bool },
}

/// The prefill segments' operands of [`crate::flash_prefill`].
pub(super) struct PrefixMeta {
    /// `[keys · kv]`: the pool row of every position and KV head of the segments' sequences.
    pub key_rows: Tensor,
    /// Σ (start + len) over the segments.
    pub keys: usize,
    pub rows: PrefixRows,
}

/// Views of the step's one upload.
pub(super) struct StepMeta {
    /// `[1, t]`.
    pub ids: Tensor,
    /// `[1, t]`.
    pub positions: Tensor,
    /// `[t]`: the slot each row's keys/values go to.
    pub write_slots: Tensor,
    /// `[outputs]`, `None` when the step samples nothing.
    pub outputs: Option<Tensor>,
    /// The decode rows' gather index `[n · kv · max_len]` and lengths `[n]`, when packed.
    pub decode: Option<(Tensor, Tensor)>,
    pub prefill: Option<PrefillMeta>,
    /// With [`Tables::InPlace`]: the tables of every row, or of the decode rows only when the
    /// prefill is fused (`None` when there are none).
    pub paged: Option<PagedRows>,
    /// With [`Tables::InPlace`] `{ fused_prefill: true }` and prefill segments.
    pub prefix: Option<PrefixMeta>,
    /// `[S]`: `0, 1, …` for the masks.
    ramp: Tensor,
}

/// The prefill segments' padding (see `paged`).
pub(super) struct PrefillMeta {
    pub m: usize,
    pub t_max: usize,
    pub s_max: usize,
    /// `[m · t_max]`: row (within the prefill rows) of each padded query; padding repeats 0.
    pub q_rows: Tensor,
    /// `[m · kv · s_max]`: buffer row of each padded key.
    pub kv_slots: Tensor,
    /// `[m, t_max]`: keys `< limit` are visible to the padded query (0 for padding).
    limits: Tensor,
    /// `[prefill rows]`: index of each real row in the padded `[m · t_max]` output.
    pub out_rows: Tensor,
}

/// Appends `v` to `buf`, returning its range.
fn section(buf: &mut Vec<u32>, v: impl IntoIterator<Item = u32>) -> (usize, usize) {
    let start = buf.len();
    buf.extend(v);
    (start, buf.len() - start)
}

impl StepMeta {
    /// The metadata of rows `ids` (decode segments, then prefill segments) returning `outputs`,
    /// with the attention tables `tables` asks for.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        ids: &[u32],
        decode: &[Segment],
        prefill: &[Segment],
        outputs: &[u32],
        kv: usize,
        tables: Tables<'_>,
        dev: &Device,
    ) -> Result<(StepMeta, Vec<u32>)> {
        let t = ids.len();
        let mut buf: Vec<u32> = Vec::with_capacity(4 * t);
        let r_ids = section(&mut buf, ids.iter().copied());
        let (mut positions, mut slots) = (Vec::with_capacity(t), Vec::with_capacity(t));
        for s in decode.iter().chain(prefill) {
            for p in s.start..s.start + s.len {
                positions.push(p as u32);
                slots.push(s.slots[p]);
            }
        }
        if positions.len() != t {
            candle_core::bail!(
                "paged batch: {} ids for {} segment rows",
                t,
                positions.len()
            )
        }
        let r_pos = section(&mut buf, positions);
        let r_slots = section(&mut buf, slots.iter().copied());
        let r_out = section(&mut buf, outputs.iter().copied());
        let mut ramp_len = 1;
        let r_dec = match tables {
            Tables::Gather(table) if !table.lens.is_empty() => {
                ramp_len = ramp_len.max(table.max_len);
                let start = buf.len();
                gather_rows(&table.slots, table.lens.len(), kv, &mut buf);
                let idx = (start, buf.len() - start);
                let lens = section(&mut buf, table.lens.iter().map(|&l| l as u32));
                Some((idx, lens))
            }
            _ => None,
        };
        let fused = matches!(
            tables,
            Tables::InPlace {
                fused_prefill: true
            }
        ) && !prefill.is_empty();
        let r_paged = match tables {
            Tables::InPlace { .. } => {
                let segs: Vec<&Segment> = match fused {
                    true => decode.iter().collect(),
                    false => decode.iter().chain(prefill).collect(),
                };
                if segs.is_empty() {
                    None
                } else {
                    let (table, qrow, qlen, s_max) = crate::paged_attention::layout(&segs);
                    let table = section(&mut buf, table);
                    let (qrow, qlen) = (section(&mut buf, qrow), section(&mut buf, qlen));
                    Some((table, qrow, qlen, s_max))
                }
            }
            _ => None,
        };
        let r_prefix = if fused {
            let segs: Vec<&Segment> = prefill.iter().collect();
            let start = buf.len();
            crate::flash_prefill::key_rows(&segs, kv, &mut buf);
            let key_rows = (start, buf.len() - start);
            let lens: Vec<(usize, usize)> =
                prefill.iter().map(|s| (s.len, s.start + s.len)).collect();
            let (qo, ko) = crate::flash_prefill::offsets(&lens);
            let cu_q = section(&mut buf, qo.iter().map(|&x| x as u32));
            let cu_k = section(&mut buf, ko.iter().map(|&x| x as u32));
            Some((key_rows, cu_q, cu_k, qo, ko))
        } else {
            None
        };
        let r_pre = if prefill.is_empty() || matches!(tables, Tables::InPlace { .. }) {
            None
        } else {
            let m = prefill.len();
            let t_max = prefill.iter().map(|s| s.len).max().unwrap_or(0);
            let s_max = prefill.iter().map(|s| s.start + s.len).max().unwrap_or(0);
            ramp_len = ramp_len.max(s_max);
            let (mut q_rows, mut table) = (vec![0u32; m * t_max], vec![0u32; m * s_max]);
            let mut limits = vec![0u32; m * t_max];
            let mut out_rows = Vec::new();
            let mut row = 0u32;
            for (j, s) in prefill.iter().enumerate() {
                table[j * s_max..][..s.slots.len()].copy_from_slice(&s.slots);
                for i in 0..s.len {
                    q_rows[j * t_max + i] = row;
                    limits[j * t_max + i] = (s.start + i + 1) as u32;
                    row += 1;
                    out_rows.push((j * t_max + i) as u32);
                }
            }
            let q = section(&mut buf, q_rows);
            let start = buf.len();
            gather_rows(&table, m, kv, &mut buf);
            let kvs = (start, buf.len() - start);
            let lim = section(&mut buf, limits);
            let out = section(&mut buf, out_rows);
            Some((m, t_max, s_max, q, kvs, lim, out))
        };
        let r_ramp = section(&mut buf, 0..ramp_len as u32);
        let n = buf.len();
        let all = Tensor::from_vec(buf, n, dev)?;
        let view = |(o, l): (usize, usize)| all.narrow(0, o, l);
        let meta = StepMeta {
            ids: view(r_ids)?.reshape((1, t))?,
            positions: view(r_pos)?.reshape((1, t))?,
            write_slots: view(r_slots)?,
            outputs: if outputs.is_empty() {
                None
            } else {
                Some(view(r_out)?)
            },
            decode: r_dec
                .map(|(i, l)| Ok::<_, candle_core::Error>((view(i)?, view(l)?)))
                .transpose()?,
            prefill: r_pre
                .map(|(m, t_max, s_max, q, kvs, lim, out)| {
                    Ok::<_, candle_core::Error>(PrefillMeta {
                        m,
                        t_max,
                        s_max,
                        q_rows: view(q)?,
                        kv_slots: view(kvs)?,
                        limits: view(lim)?.reshape((m, t_max))?,
                        out_rows: view(out)?,
                    })
                })
                .transpose()?,
            paged: r_paged
                .map(|(table, qrow, qlen, s_max)| {
                    Ok::<_, candle_core::Error>(PagedRows {
                        table: view(table)?,
                        qrow: view(qrow)?,
                        qlen: view(qlen)?,
                        s_max,
                    })
                })
                .transpose()?,
            prefix: r_prefix
                .map(|(key_rows, cu_q, cu_k, qo, ko)| {
                    let keys = ko.last().copied().unwrap_or(0);
                    Ok::<_, candle_core::Error>(PrefixMeta {
                        key_rows: view(key_rows)?,
                        keys,
                        rows: PrefixRows::with_device(qo, ko, view(cu_q)?, view(cu_k)?),
                    })
                })
                .transpose()?,
            ramp: view(r_ramp)?,
        };
        Ok((meta, slots))
    }

    /// The additive mask `[n, 1, 1, s]` of decode rows of `lens` (`[n]` u32): 0 for a key
    /// position below the row's length, the dtype's mask value from it on.
    pub fn length_mask(ramp: &Tensor, lens: &Tensor, s: usize, dtype: DType) -> Result<Tensor> {
        let n = lens.dim(0)?;
        let off = ramp
            .narrow(0, 0, s)?
            .unsqueeze(0)?
            .broadcast_ge(&lens.unsqueeze(1)?)?;
        additive(&off, dtype)?.reshape((n, 1, 1, s))
    }

    /// `[S]` ramp of this step (for [`Self::length_mask`]).
    pub fn ramp(&self) -> &Tensor {
        &self.ramp
    }
}

impl PrefillMeta {
    /// The additive mask `[m, 1, t_max, s_max]`: key `j` is visible to padded query `q` when
    /// `j < limits[q]` (causal from the segment's start; padding queries see nothing).
    pub fn mask(&self, ramp: &Tensor, dtype: DType) -> Result<Tensor> {
        let off = ramp
            .narrow(0, 0, self.s_max)?
            .reshape((1, 1, self.s_max))?
            .broadcast_ge(&self.limits.unsqueeze(2)?)?;
        additive(&off, dtype)?.reshape((self.m, 1, self.t_max, self.s_max))
    }
}

/// `mask_value(dtype)` where `off` is 1, 0 elsewhere, in `dtype`: one selection pass over
/// broadcast scalars (the value rounded to `dtype` as the host masks' conversion did).
pub(super) fn additive(off: &Tensor, dtype: DType) -> Result<Tensor> {
    let dev = off.device();
    let neg = Tensor::new(mask_value(dtype), dev)?.to_dtype(dtype)?;
    let zero = Tensor::zeros((), dtype, dev)?;
    off.where_cond(
        &neg.broadcast_as(off.shape())?,
        &zero.broadcast_as(off.shape())?,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv_pool::gather_index;

    fn seg(start: usize, len: usize, first_slot: u32) -> Segment {
        Segment {
            start,
            len,
            slots: (0..(start + len) as u32)
                .map(|i| first_slot + 3 * i)
                .collect(),
        }
    }

    /// The masks formed on the device equal the host-built ones they replace (every value, in
    /// f32, bf16 and f16), and the packed gather index equals `gather_index`.
    #[test]
    fn device_masks_and_packed_index_equal_the_host_spelling() {
        let dev = Device::Cpu;
        let decode = [seg(4, 1, 0), seg(9, 1, 200), seg(0, 1, 500)];
        let prefill = [seg(0, 5, 700), seg(6, 3, 900), seg(2, 1, 1100)];
        let t = decode.len() + prefill.iter().map(|s| s.len).sum::<usize>();
        let ids: Vec<u32> = (0..t as u32).collect();
        let kv = 2;
        let table = DecodeTable::new(&decode, &dev);
        let (meta, slots) = StepMeta::new(
            &ids,
            &decode,
            &prefill,
            &[0, 2, 7],
            kv,
            Tables::Gather(&table),
            &dev,
        )
        .unwrap();
        assert_eq!(slots.len(), t);
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            let neg = mask_value(dtype);
            // decode: the old host mask
            let (idx, lens) = meta.decode.as_ref().unwrap();
            let s = decode.iter().map(|x| x.slots.len()).max().unwrap();
            let mut want = vec![0f32; decode.len() * s];
            for (i, x) in decode.iter().enumerate() {
                want[i * s + x.slots.len()..(i + 1) * s].fill(neg);
            }
            let want = Tensor::from_vec(want, (3, 1, 1, s), &dev)
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            let got = StepMeta::length_mask(meta.ramp(), lens, s, dtype).unwrap();
            let bits = |t: &Tensor| -> Vec<f32> {
                t.to_dtype(DType::F32)
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1()
                    .unwrap()
            };
            assert_eq!(bits(&got), bits(&want), "{dtype:?} decode mask");
            let mut table = vec![0u32; decode.len() * s];
            for (i, x) in decode.iter().enumerate() {
                table[i * s..][..x.slots.len()].copy_from_slice(&x.slots);
            }
            let want_idx = gather_index(&table, decode.len(), kv, &dev).unwrap();
            assert_eq!(
                idx.to_vec1::<u32>().unwrap(),
                want_idx.to_vec1::<u32>().unwrap()
            );
            // prefill: the old host mask
            let pt = meta.prefill.as_ref().unwrap();
            let (m, tm, sm) = (pt.m, pt.t_max, pt.s_max);
            let mut want = vec![neg; m * tm * sm];
            for (j, x) in prefill.iter().enumerate() {
                for i in 0..x.len {
                    want[(j * tm + i) * sm..][..x.start + i + 1].fill(0.0);
                }
            }
            let want = Tensor::from_vec(want, (m, 1, tm, sm), &dev)
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            let got = pt.mask(meta.ramp(), dtype).unwrap();
            assert_eq!(bits(&got), bits(&want), "{dtype:?} prefill mask");
        }
        assert_eq!(meta.ids.dims(), [1, t]);
        assert_eq!(
            meta.outputs.unwrap().to_vec1::<u32>().unwrap(),
            vec![0, 2, 7]
        );
    }
}
