//! The engine's forward: one pass over the ragged rows of many sequences that share the paged
//! key/value store ([`KvPool`]).
//!
//! A step's rows are segments of sequences: single-token **decode** segments first, then
//! **prefill** segments (a joiner's prompt, a returning conversation's new turn, or a chunk of
//! either). Every projection and the MLP run once over all rows (one product per weight); each
//! layer writes all new keys/values with one scatter, then attends in two batched operations:
//! - decode rows: [`Backend::paged_decode_attention`] over the slot tables (the CPU kernel
//!   follows the table; the candle spelling gathers `[n, kv, max_len, d]` and masks by length);
//! - prefill segments: their queries padded to `[m, heads, t_max, d]`, their keys gathered to
//!   `[m, kv, s_max, d]`, one masked attention (causal from each segment's start, padding off).
//!
//! So the number of operations per layer does not grow with the number of sequences.

use std::sync::OnceLock;

use candle_core::{Device, Result, Tensor};

use super::{mask_value, Transformer};
use crate::host;
use crate::kv_pool::{gather_index, KvPool};

/// One sequence's rows in a step.
#[derive(Debug, Clone)]
pub struct Segment {
    /// First position of the rows (the number of positions already stored).
    pub start: usize,
    /// Number of rows.
    pub len: usize,
    /// Slots of positions `0..start + len`.
    pub slots: Vec<u32>,
}

/// The rows of one engine step: decode segments (one row each) then prefill segments.
#[derive(Debug, Clone, Default)]
pub struct PagedBatch {
    pub ids: Vec<u32>,
    pub decode: Vec<Segment>,
    pub prefill: Vec<Segment>,
    /// Rows whose final hidden state the forward returns, in this order.
    pub outputs: Vec<u32>,
}

/// A borrowed view of a [`PagedBatch`] (or of one part of it), so splitting a step into passes
/// copies no slot table.
#[derive(Clone, Copy)]
struct Rows<'a> {
    ids: &'a [u32],
    decode: &'a [Segment],
    prefill: &'a [Segment],
    outputs: &'a [u32],
}

/// Per-row slot tables of the decode rows, shared by every layer of one forward.
#[derive(Debug)]
pub struct DecodeTable {
    /// Valid positions of row `i` (including the row being decoded).
    pub lens: Vec<usize>,
    /// Row `i`'s slots at `[i · max_len ..][..lens[i]]`; padding repeats slot 0.
    pub slots: Vec<u32>,
    pub max_len: usize,
    device: Device,
    gathered: OnceLock<(Tensor, Tensor)>,
}

impl DecodeTable {
    pub(crate) fn new(segs: &[Segment], device: &Device) -> Self {
        let max_len = segs.iter().map(|s| s.slots.len()).max().unwrap_or(0);
        let mut slots = vec![0u32; segs.len() * max_len];
        for (i, s) in segs.iter().enumerate() {
            slots[i * max_len..][..s.slots.len()].copy_from_slice(&s.slots);
        }
        DecodeTable {
            lens: segs.iter().map(|s| s.slots.len()).collect(),
            slots,
            max_len,
            device: device.clone(),
            gathered: OnceLock::new(),
        }
    }

    /// The gather index `[n · kv · max_len]` and the additive length mask `[n, 1, 1, max_len]`
    /// (built once, on first use).
    pub fn gather_and_mask(
        &self,
        dtype: candle_core::DType,
        kv: usize,
    ) -> Result<&(Tensor, Tensor)> {
        if let Some(g) = self.gathered.get() {
            return Ok(g);
        }
        let (n, s) = (self.lens.len(), self.max_len);
        let idx = gather_index(&self.slots, n, kv, &self.device)?;
        let neg = mask_value(dtype);
        let mut m = vec![0f32; n * s];
        for (i, &len) in self.lens.iter().enumerate() {
            m[i * s + len..(i + 1) * s].fill(neg);
        }
        let mask = Tensor::from_vec(m, (n, 1, 1, s), &self.device)?.to_dtype(dtype)?;
        Ok(self.gathered.get_or_init(|| (idx, mask)))
    }
}

/// Keys or values at a [`gather_index`] (`[m · kv · s]`) from a pool buffer, as `[m, kv, s, d]`.
pub(crate) fn gather_heads(pool: &Tensor, idx: &Tensor, m: usize, kv: usize) -> Result<Tensor> {
    host::nonempty(idx, "key/value gather");
    let d = pool.dim(1)?;
    let s = idx.dim(0)? / (m * kv).max(1);
    pool.index_select(idx, 0)?.reshape((m, kv, s, d))
}

/// The prefill segments' padding: query rows, key slots, mask, and where valid outputs sit.
struct PrefillTable {
    m: usize,
    t_max: usize,
    /// `[m · t_max]`: row (within the prefill rows) of each padded query; padding repeats 0.
    q_rows: Tensor,
    /// `[m · kv · s_max]`: buffer row of each padded key (see [`gather_index`]).
    kv_slots: Tensor,
    /// `[m, 1, t_max, s_max]` additive.
    mask: Tensor,
    /// `[prefill rows]`: index of each real row in the padded `[m · t_max]` output.
    out_rows: Tensor,
}

impl PrefillTable {
    fn new(segs: &[Segment], kv: usize, dtype: candle_core::DType, dev: &Device) -> Result<Self> {
        let m = segs.len();
        let t_max = segs.iter().map(|s| s.len).max().unwrap_or(0);
        let s_max = segs.iter().map(|s| s.start + s.len).max().unwrap_or(0);
        let neg = mask_value(dtype);
        let (mut q_rows, mut kv_slots) = (vec![0u32; m * t_max], vec![0u32; m * s_max]);
        let mut mask = vec![neg; m * t_max * s_max];
        let mut out_rows = Vec::new();
        let mut row = 0u32;
        for (j, s) in segs.iter().enumerate() {
            kv_slots[j * s_max..][..s.slots.len()].copy_from_slice(&s.slots);
            for i in 0..s.len {
                q_rows[j * t_max + i] = row;
                row += 1;
                out_rows.push((j * t_max + i) as u32);
                mask[(j * t_max + i) * s_max..][..s.start + i + 1].fill(0.0);
            }
        }
        Ok(PrefillTable {
            m,
            t_max,
            q_rows: Tensor::from_vec(q_rows, m * t_max, dev)?,
            kv_slots: gather_index(&kv_slots, m, kv, dev)?,
            mask: Tensor::from_vec(mask, (m, 1, t_max, s_max), dev)?.to_dtype(dtype)?,
            out_rows: Tensor::from_vec(out_rows, row as usize, dev)?,
        })
    }
}

impl Transformer {
    /// Runs the rows of `batch` through the model, writing their keys and values into `pool` at
    /// the slots of their positions. Returns the final-normed hidden states of
    /// `batch.outputs` (ascending rows), `[outputs, hidden]`, or `None` when the step has no
    /// output row (a prompt chunk that is not its prompt's last): then no op runs on zero rows.
    ///
    /// One pass for all rows where the backend runs ragged batches in one pass (candle: the
    /// fewest kernels); otherwise (the CPU kernels) the decode rows in one pass and each prefill
    /// segment in its own, so a row's arithmetic never depends on what shares its step — the
    /// product kernels pick their blocking by row count — and runs are reproducible.
    pub fn forward_paged(&self, batch: &PagedBatch, pool: &KvPool) -> Result<Option<Tensor>> {
        let b = Rows {
            ids: &batch.ids,
            decode: &batch.decode,
            prefill: &batch.prefill,
            outputs: &batch.outputs,
        };
        if self.be.ragged_in_one_pass() || b.decode.len() + b.prefill.len() <= 1 {
            return self.forward_rows(b, pool);
        }
        let n_dec = b.decode.len();
        // Outputs are ascending rows: each part's are a contiguous run of them.
        let split = |hi: usize| b.outputs.partition_point(|&r| (r as usize) < hi);
        let mut parts = Vec::with_capacity(1 + b.prefill.len());
        if n_dec > 0 {
            parts.push((0, n_dec, b.decode, &b.prefill[..0]));
        }
        let mut row = n_dec;
        for (j, seg) in b.prefill.iter().enumerate() {
            parts.push((row, row + seg.len, &b.decode[..0], &b.prefill[j..j + 1]));
            row += seg.len;
        }
        let mut hidden = Vec::with_capacity(parts.len());
        for (lo, hi, decode, prefill) in parts {
            let outputs: Vec<u32> = b.outputs[split(lo)..split(hi)]
                .iter()
                .map(|&r| r - lo as u32)
                .collect();
            let sub = Rows {
                ids: &b.ids[lo..hi],
                decode,
                prefill,
                outputs: &outputs,
            };
            hidden.extend(self.forward_rows(sub, pool)?);
        }
        Ok(match hidden.len() {
            0 => None,
            1 => hidden.pop(),
            _ => Some(Tensor::cat(&hidden, 0)?),
        })
    }

    /// [`Self::forward_paged`] in one pass.
    fn forward_rows(&self, batch: Rows<'_>, pool: &KvPool) -> Result<Option<Tensor>> {
        let dev = self.embed.device();
        let t = batch.ids.len();
        let n_dec = batch.decode.len();
        let mut positions = Vec::with_capacity(t);
        let mut write_slots = Vec::with_capacity(t);
        for s in batch.decode.iter().chain(batch.prefill) {
            for p in s.start..s.start + s.len {
                positions.push(p as u32);
                write_slots.push(s.slots[p]);
            }
        }
        if positions.len() != t {
            candle_core::bail!(
                "paged batch: {} ids for {} segment rows",
                t,
                positions.len()
            )
        }
        if t == 0 {
            candle_core::bail!("paged batch: no rows")
        }
        let ids = Tensor::from_slice(batch.ids, (1, t), dev)?;
        let mut x = self.embed_ids(&ids)?;
        let rope = self
            .rope
            .gather(&Tensor::from_vec(positions, (1, t), dev)?)?;
        let Some(l0) = self.layers.first() else {
            candle_core::bail!("a model without layers")
        };
        let (heads, kv, d) = (l0.attn.heads, l0.attn.kv_heads, l0.attn.head_dim);
        let slots = pool.slot_mapping(&write_slots)?;
        let decode = DecodeTable::new(batch.decode, dev);
        let prefill = if batch.prefill.is_empty() {
            None
        } else {
            Some(PrefillTable::new(batch.prefill, kv, x.dtype(), dev)?)
        };
        for (li, l) in self.layers.iter().enumerate() {
            let h = self.be.rms_norm(&x, &l.input_ln, self.eps)?;
            let (q, k, v) = l.attn.qkv(&*self.be, &h, &rope)?;
            let rows = |a: &Tensor| -> Result<Tensor> { a.squeeze(0)?.transpose(0, 1) };
            pool.write(
                li,
                &slots,
                &rows(&k)?.reshape((t * kv, d))?,
                &rows(&v)?.reshape((t * kv, d))?,
            )?;
            let q = rows(&q)?.contiguous()?; // [t, heads, d]
            let (kp, vp) = pool.layer(li);
            let mut parts = Vec::with_capacity(2);
            if n_dec > 0 {
                let qd = q.narrow(0, 0, n_dec)?.unsqueeze(2)?.contiguous()?;
                let a = self.be.paged_decode_attention(&qd, kp, vp, kv, &decode)?;
                parts.push(a.reshape((n_dec, heads * d))?);
            }
            if let Some(pt) = &prefill {
                let qp = q
                    .narrow(0, n_dec, t - n_dec)?
                    .index_select(&pt.q_rows, 0)?
                    .reshape((pt.m, pt.t_max, heads, d))?
                    .transpose(1, 2)?
                    .contiguous()?;
                let kg = gather_heads(kp, &pt.kv_slots, pt.m, kv)?;
                let vg = gather_heads(vp, &pt.kv_slots, pt.m, kv)?;
                let a = self.be.attention(&qp, &kg, &vg, Some(&pt.mask))?;
                let a = a
                    .reshape((pt.m * pt.t_max, heads * d))?
                    .index_select(&pt.out_rows, 0)?;
                parts.push(a);
            }
            let a = Tensor::cat(&parts, 0)?.unsqueeze(0)?;
            x = (x + self.be.linear(&a, &l.attn.o)?)?;
            x = self.mlp_block(l, x)?;
        }
        if batch.outputs.is_empty() {
            return Ok(None);
        }
        let out = Tensor::from_slice(batch.outputs, batch.outputs.len(), dev)?;
        let x = x.squeeze(0)?.index_select(&out, 0)?;
        host::nonempty(&x, "final norm");
        Ok(Some(self.be.rms_norm(&x, &self.norm, self.eps)?))
    }
}

/// Decode attention spelled with candle ops: gather each row's keys/values by its slot table
/// (`[n, kv, max_len, d]`), mask positions past its length, attend. Returns `[n, 1, heads · d]`.
pub(crate) fn decode_gathered(
    be: &dyn super::Backend,
    q: &Tensor,
    k_pool: &Tensor,
    v_pool: &Tensor,
    kv: usize,
    table: &DecodeTable,
) -> Result<Tensor> {
    let n = table.lens.len();
    let (idx, mask) = table.gather_and_mask(q.dtype(), kv)?;
    let k = gather_heads(k_pool, idx, n, kv)?;
    let v = gather_heads(v_pool, idx, n, kv)?;
    be.attention(q, &k, &v, Some(mask))
}
