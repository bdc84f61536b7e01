//! The engine's forward: one pass over the ragged rows of many sequences that share the paged
//! key/value store ([`KvPool`]).
//!
//! A step's rows are segments of sequences: single-token **decode** segments first, then
//! **prefill** segments (a joiner's prompt, a returning conversation's new turn, or a chunk of
//! either). Every projection and the MLP run once over all rows (one product per weight); each
//! layer writes all new keys/values with one write, then attends:
//! - where the backend reads the store in place ([`Backend::paged_in_place`]: the CUDA kernel
//!   [`crate::paged_attention`]), every row in **one call**, each query over its sequence's slot
//!   table up to its own position — no gather, no padding, no mask;
//! - otherwise in two batched operations: the decode rows by
//!   [`Backend::paged_decode_attention`] (the CPU kernel follows the slot table; the candle
//!   spelling gathers `[n, kv, max_len, d]` and masks by length), the prefill segments with their
//!   queries padded to `[m, heads, t_max, d]`, their keys gathered to `[m, kv, s_max, d]`, and one
//!   masked attention (causal from each segment's start, padding off).
//!
//! So the number of operations per layer does not grow with the number of sequences.

use std::sync::OnceLock;

use candle_core::{Device, Result, Tensor};

use super::step_meta::{StepMeta, Tables};
use super::Transformer;
use crate::host;
use crate::kv_pool::{gather_index, KvPool};
use crate::EngineAttention;

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
    /// The gather index and lengths already on the device (a view of the step's one upload,
    /// [`super::step_meta`]), with the step's ramp.
    packed: Option<(Tensor, Tensor, Tensor)>,
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
            packed: None,
            gathered: OnceLock::new(),
        }
    }

    /// The table with its gather index `[n · kv · max_len]` and lengths `[n]` on the device, and
    /// the step's `0..S` ramp (S ≥ `max_len`).
    pub(crate) fn with_device_index(mut self, idx: Tensor, lens: Tensor, ramp: Tensor) -> Self {
        self.packed = Some((idx, lens, ramp));
        self
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
        let (idx, lens, ramp) = match &self.packed {
            Some((i, l, r)) => (i.clone(), l.clone(), r.clone()),
            None => {
                let lens: Vec<u32> = self.lens.iter().map(|&l| l as u32).collect();
                (
                    gather_index(&self.slots, n, kv, &self.device)?,
                    Tensor::from_vec(lens, n, &self.device)?,
                    Tensor::arange(0u32, s as u32, &self.device)?,
                )
            }
        };
        let mask = StepMeta::length_mask(&ramp, &lens, s, dtype)?;
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
        self.forward_paged_with(batch, pool, EngineAttention::Auto)
    }

    /// [`Self::forward_paged`] attending as `attention` says (`[rollout] engine_attention`).
    pub fn forward_paged_with(
        &self,
        batch: &PagedBatch,
        pool: &KvPool,
        attention: EngineAttention,
    ) -> Result<Option<Tensor>> {
        let b = Rows {
            ids: &batch.ids,
            decode: &batch.decode,
            prefill: &batch.prefill,
            outputs: &batch.outputs,
        };
        if self.be.ragged_in_one_pass() || b.decode.len() + b.prefill.len() <= 1 {
            return self.forward_rows(b, pool, attention);
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
            hidden.extend(self.forward_rows(sub, pool, attention)?);
        }
        Ok(match hidden.len() {
            0 => None,
            1 => hidden.pop(),
            _ => Some(Tensor::cat(&hidden, 0)?),
        })
    }

    /// [`Self::forward_paged`] in one pass.
    fn forward_rows(
        &self,
        batch: Rows<'_>,
        pool: &KvPool,
        attention: EngineAttention,
    ) -> Result<Option<Tensor>> {
        let dev = self.embed.device();
        let t = batch.ids.len();
        let n_dec = batch.decode.len();
        if t == 0 {
            candle_core::bail!("paged batch: no rows")
        }
        let Some(l0) = self.layers.first() else {
            candle_core::bail!("a model without layers")
        };
        let (heads, kv, d) = (l0.attn.heads, l0.attn.kv_heads, l0.attn.head_dim);
        // In place (`paged_attention`), with prompt chunks on tensor cores (`flash_prefill`)?
        let (in_place, fused_prefill) =
            attention.resolve(&*self.be, dev, pool.layer(0).0.dtype(), d)?;
        let mut decode = match in_place {
            true => DecodeTable::new(&[], dev),
            false => DecodeTable::new(batch.decode, dev),
        };
        let tables = match (in_place, self.be.ragged_in_one_pass()) {
            (true, _) => Tables::InPlace { fused_prefill },
            (false, true) => Tables::Gather(&decode),
            (false, false) => Tables::Host,
        };
        // One upload for the step's ids, positions, slots and tables (`step_meta`).
        let (meta, write_slots) = StepMeta::new(
            batch.ids,
            batch.decode,
            batch.prefill,
            batch.outputs,
            kv,
            tables,
            dev,
        )?;
        pool.check_slots(&write_slots)?;
        let mut x = self.embed_ids(&meta.ids)?;
        let rope = self.rope.gather(&meta.positions)?;
        if let Some((idx, lens)) = &meta.decode {
            decode = decode.with_device_index(idx.clone(), lens.clone(), meta.ramp().clone());
        }
        let prefill = match &meta.prefill {
            Some(pt) => Some((pt, pt.mask(meta.ramp(), x.dtype())?)),
            None => None,
        };
        for (li, l) in self.layers.iter().enumerate() {
            let h = self.be.rms_norm(&x, &l.input_ln, self.eps)?;
            let (q, k, v) = l.attn.qkv(&*self.be, &h, &rope)?;
            let rows = |a: &Tensor| -> Result<Tensor> { a.squeeze(0)?.transpose(0, 1) };
            pool.write(
                li,
                &meta.write_slots,
                &rows(&k)?.reshape((t * kv, d))?,
                &rows(&v)?.reshape((t * kv, d))?,
            )?;
            let q = rows(&q)?.contiguous()?; // [t, heads, d]
            let (kp, vp) = pool.layer(li);
            if in_place {
                let a = self.attend_in_place(&meta, &q, (kp, vp), (n_dec, kv))?;
                x = (x + self.be.linear(&a.unsqueeze(0)?, &l.attn.o)?)?;
                x = self.mlp_block(l, x)?;
                continue;
            }
            let mut parts = Vec::with_capacity(2);
            if n_dec > 0 {
                let qd = q.narrow(0, 0, n_dec)?.unsqueeze(2)?.contiguous()?;
                let a = self.be.paged_decode_attention(&qd, kp, vp, kv, &decode)?;
                parts.push(a.reshape((n_dec, heads * d))?);
            }
            if let Some((pt, mask)) = &prefill {
                let qp = q
                    .narrow(0, n_dec, t - n_dec)?
                    .index_select(&pt.q_rows, 0)?
                    .reshape((pt.m, pt.t_max, heads, d))?
                    .transpose(1, 2)?
                    .contiguous()?;
                let kg = gather_heads(kp, &pt.kv_slots, pt.m, kv)?;
                let vg = gather_heads(vp, &pt.kv_slots, pt.m, kv)?;
                let a = self.be.attention(&qp, &kg, &vg, Some(mask))?;
                let a = a
                    .reshape((pt.m * pt.t_max, heads * d))?
                    .index_select(&pt.out_rows, 0)?;
                parts.push(a);
            }
            let a = Tensor::cat(&parts, 0)?.unsqueeze(0)?;
            x = (x + self.be.linear(&a, &l.attn.o)?)?;
            x = self.mlp_block(l, x)?;
        }
        let Some(out) = &meta.outputs else {
            return Ok(None);
        };
        let x = x.squeeze(0)?.index_select(out, 0)?;
        host::nonempty(&x, "final norm");
        Ok(Some(self.be.rms_norm(&x, &self.norm, self.eps)?))
    }
}

impl Transformer {
    /// The attention of every row of `q` `[t, heads, d]` reading the store in place: the rows
    /// [`StepMeta::paged`] covers through [`crate::paged_attention`] (all, or the `n_dec` decode
    /// rows when the prefill is fused), the prefill rows through [`crate::flash_prefill`] over
    /// their sequences' keys and values gathered once. Returns `[t, heads · d]`.
    fn attend_in_place(
        &self,
        meta: &StepMeta,
        q: &Tensor,
        (kp, vp): (&Tensor, &Tensor),
        (n_dec, kv): (usize, usize),
    ) -> Result<Tensor> {
        let t = q.dim(0)?;
        let mut parts = Vec::with_capacity(2);
        if let Some(paged) = &meta.paged {
            let n = if meta.prefix.is_some() { n_dec } else { t };
            parts.push(crate::paged_attention::attend(
                &q.narrow(0, 0, n)?,
                kp,
                vp,
                kv,
                paged,
            )?);
        }
        if let Some(pf) = &meta.prefix {
            let d = kp.dim(1)?;
            let gather = |pool: &Tensor| -> Result<Tensor> {
                host::nonempty(&pf.key_rows, "prefill key gather");
                pool.index_select(&pf.key_rows, 0)?
                    .reshape((pf.keys, kv, d))
            };
            parts.push(crate::flash_prefill::attend(
                &q.narrow(0, n_dec, t - n_dec)?,
                &gather(kp)?,
                &gather(vp)?,
                &pf.rows,
            )?);
        }
        match parts.len() {
            1 => Ok(parts.remove(0)),
            _ => Tensor::cat(&parts, 0),
        }
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

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device, Tensor};

    use super::{PagedBatch, Segment};
    use crate::config::Config;
    use crate::kv_pool::{KvPool, SeqBlocks};
    use crate::policy::Policy;
    use crate::EngineAttention;

    /// Two steps of the engine's forward: prompts of 70 and 5 tokens, then a mixed step (a
    /// decode row, a second chunk of the 5-token prompt, a new 3-token prompt). Returns every
    /// row's final hidden state of both steps.
    fn two_steps(p: &Policy, dtype: DType, attention: EngineAttention) -> Tensor {
        let dev = Device::Cpu;
        let mut pool = KvPool::new(2, 2, 32, 1024, dtype, &dev).unwrap();
        let mut seqs = [
            SeqBlocks::default(),
            SeqBlocks::default(),
            SeqBlocks::default(),
        ];
        // A gap owner, so sequences' blocks interleave.
        pool.reserve(&mut SeqBlocks::default(), 3).unwrap();
        let ids = |n: usize, salt: u32| -> Vec<u32> {
            (0..n as u32).map(|i| (i * 7 + salt) % 96).collect()
        };
        let seg = |pool: &mut KvPool, s: &mut SeqBlocks, len: usize| -> Segment {
            let start = s.len();
            assert!(pool.reserve(s, start + len).unwrap());
            s.set_len(start + len);
            Segment {
                start,
                len,
                slots: s.slots(start + len).collect(),
            }
        };
        let mut out = Vec::new();
        let first = PagedBatch {
            ids: [ids(70, 1), ids(5, 2)].concat(),
            decode: vec![],
            prefill: vec![
                seg(&mut pool, &mut seqs[0], 70),
                seg(&mut pool, &mut seqs[1], 5),
            ],
            outputs: (0..75).collect(),
        };
        let run = |b: &PagedBatch, pool: &KvPool| {
            p.inference()
                .forward_paged_with(b, pool, attention)
                .unwrap()
                .unwrap()
        };
        out.push(run(&first, &pool));
        let decode = vec![seg(&mut pool, &mut seqs[0], 1)];
        let prefill = vec![
            seg(&mut pool, &mut seqs[1], 4),
            seg(&mut pool, &mut seqs[2], 3),
        ];
        let mixed = PagedBatch {
            ids: [ids(1, 3), ids(4, 4), ids(3, 5)].concat(),
            decode,
            prefill,
            outputs: (0..8).collect(),
        };
        out.push(run(&mixed, &pool));
        Tensor::cat(&out, 0).unwrap().to_dtype(DType::F64).unwrap()
    }

    /// `engine_attention` = "paged" (one call per layer through `crate::paged_attention`, its twin
    /// on the CPU), "flash-prefill" (prompt chunks through `crate::flash_prefill`'s twin) and
    /// "gathered" give the same hidden states for every row of a prefill step and a mixed step,
    /// in f64 (the twins compute in f32) and bf16 (all round every op's output).
    #[test]
    fn in_place_attention_equals_the_gather_spelling() {
        let cfg = Config::from_value(
            serde_json::json!({"model_type": "qwen3", "vocab_size": 96, "hidden_size": 64,
                "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "head_dim": 32, "max_position_embeddings": 256,
                "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": true}),
            std::path::Path::new("config.json"),
        )
        .unwrap();
        for (dtype, tol) in [(DType::F64, 1e-4), (DType::BF16, 0.15)] {
            let p = Policy::random(cfg.clone(), dtype, &Device::Cpu).unwrap();
            let gathered = two_steps(&p, dtype, EngineAttention::Gathered);
            // On the CPU `auto` is the gather spelling.
            let auto = two_steps(&p, dtype, EngineAttention::Auto);
            assert_eq!(
                (&gathered - &auto)
                    .unwrap()
                    .abs()
                    .unwrap()
                    .max_all()
                    .unwrap()
                    .to_scalar::<f64>()
                    .unwrap(),
                0.0
            );
            let in_place = two_steps(&p, dtype, EngineAttention::Paged);
            let fused_prefill = two_steps(&p, dtype, EngineAttention::FlashPrefill);
            assert_eq!(gathered.dims(), [83, 64]);
            for (what, got) in [("in place", in_place), ("fused prefill", fused_prefill)] {
                let diff = (&gathered - got)
                    .unwrap()
                    .abs()
                    .unwrap()
                    .max_all()
                    .unwrap()
                    .to_scalar::<f64>()
                    .unwrap();
                assert!(diff < tol, "{dtype:?}: {what} vs gathered {diff}");
            }
        }
    }
}
