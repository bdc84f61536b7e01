//! One key/value store per layer for every resident sequence of the engine: paged blocks.
//!
//! Layout: per layer, keys and values are each one tensor `[blocks · kv_heads · BLOCK, head_dim]`:
//! block-major, then KV head, then position in the block, so one head's `BLOCK` positions of a
//! block are one contiguous run (a reader streams `BLOCK · head_dim` floats before it jumps; with
//! position-major rows it jumped every position, and the CPU decode attention ran about 3× slower).
//! A sequence owns a list of blocks ([`SeqBlocks`]); position `p` of the sequence lives in slot
//! `blocks[p / BLOCK] · BLOCK + p % BLOCK`, and head `g` of slot `s` is row [`row_of`]`(s, g, kv)`.
//! So sequences of any lengths share one buffer without padding, a sequence grows by one block at
//! a time, and freeing it returns its blocks to a free list — no copying, no fragmentation beyond
//! the last block.
//!
//! Why paged blocks and not a slab with per-row lengths: resident sequences live across turns
//! (an episode's conversation stays between its model calls) and grow by hundreds of tokens per
//! turn; a slab row would have to be sized for the longest possible conversation up front.
//!
//! Writes are one `scatter_set` per layer for all new rows of a step (keys and values); reads are
//! either a hand-written kernel that follows the slot table (the CPU f32 decode attention) or one
//! `index_select` gather per layer (every other path). Both are candle ops or have a candle twin.
//!
//! Memory: the store grows by doubling, up to `max_blocks`; [`KvPool::reserve`] reports when the
//! bound is reached, and the engine then evicts or preempts (see `engine`).
//!
//! Invariant: every layer holds the same slots; a block is owned by at most one sequence.

use candle_core::{DType, Device, Result, Tensor};

/// Positions per block.
pub const BLOCK: usize = 64;

/// The buffer row of KV head `g` of slot `slot`, in a store of `kv` heads.
#[inline(always)]
pub fn row_of(slot: u32, g: usize, kv: usize) -> usize {
    let s = slot as usize;
    ((s / BLOCK) * kv + g) * BLOCK + s % BLOCK
}

/// The blocks one sequence owns and how many positions are written.
#[derive(Debug, Clone, Default)]
pub struct SeqBlocks {
    blocks: Vec<u32>,
    len: usize,
}

impl SeqBlocks {
    /// Number of positions whose keys and values are stored.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Positions the owned blocks can hold.
    pub fn capacity(&self) -> usize {
        self.blocks.len() * BLOCK
    }

    /// Blocks owned.
    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Slot of position `p` (which must be below `capacity()`).
    pub fn slot(&self, p: usize) -> u32 {
        self.blocks[p / BLOCK] * BLOCK as u32 + (p % BLOCK) as u32
    }

    /// Slots of positions `0..n`.
    pub fn slots(&self, n: usize) -> impl Iterator<Item = u32> + '_ {
        (0..n).map(|p| self.slot(p))
    }

    /// Marks `n` positions as written (after the step that wrote them).
    pub fn set_len(&mut self, n: usize) {
        debug_assert!(n <= self.capacity());
        self.len = n;
    }
}

/// The paged key/value store of all layers.
#[derive(Debug)]
pub struct KvPool {
    layers: Vec<(Tensor, Tensor)>,
    kv: usize,
    d: usize,
    dtype: DType,
    device: Device,
    free: Vec<u32>,
    blocks: usize,
    max_blocks: usize,
}

impl KvPool {
    /// An empty store for `layers` layers of `kv` heads of `d` values per position, bounded to
    /// `max_tokens` positions (rounded up to whole blocks).
    pub fn new(
        layers: usize,
        kv: usize,
        d: usize,
        max_tokens: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let max_blocks = max_tokens.div_ceil(BLOCK).max(1);
        let mut pool = KvPool {
            layers: Vec::with_capacity(layers),
            kv,
            d,
            dtype,
            device: device.clone(),
            free: Vec::new(),
            blocks: 0,
            max_blocks,
        };
        let first = max_blocks.min(16);
        for _ in 0..layers {
            let z = Tensor::zeros((first * kv * BLOCK, d), dtype, device)?;
            pool.layers.push((z.clone(), z.copy()?));
        }
        pool.free = (0..first as u32).rev().collect();
        pool.blocks = first;
        Ok(pool)
    }

    /// Bytes one position takes in the store of a model with `layers` layers of `kv` heads of
    /// `d` values (keys and values).
    pub fn bytes_per_token(layers: usize, kv: usize, d: usize, dtype: DType) -> usize {
        layers * 2 * kv * d * dtype.size_in_bytes()
    }

    /// Positions the store may hold at most.
    pub fn max_tokens(&self) -> usize {
        self.max_blocks * BLOCK
    }

    /// Blocks not owned by any sequence (including ones not yet allocated).
    pub fn free_blocks(&self) -> usize {
        self.free.len() + (self.max_blocks - self.blocks)
    }

    /// Bytes of the allocated buffers.
    pub fn allocated_bytes(&self) -> usize {
        let per_block = BLOCK * self.kv * self.d * self.dtype.size_in_bytes();
        2 * self.layers.len() * self.blocks * per_block
    }

    /// Blocks a sequence needs to hold `tokens` positions.
    pub fn blocks_for(tokens: usize) -> usize {
        tokens.div_ceil(BLOCK)
    }

    /// Gives `seq` enough blocks for `tokens` positions. Returns `false`, changing nothing, when
    /// the bound leaves too few free blocks.
    pub fn reserve(&mut self, seq: &mut SeqBlocks, tokens: usize) -> Result<bool> {
        let need = Self::blocks_for(tokens).saturating_sub(seq.blocks.len());
        if need == 0 {
            return Ok(true);
        }
        if need > self.free_blocks() {
            return Ok(false);
        }
        while self.free.len() < need {
            self.grow()?;
        }
        for _ in 0..need {
            if let Some(b) = self.free.pop() {
                seq.blocks.push(b);
            }
        }
        Ok(true)
    }

    /// Keeps the first `tokens` positions of `seq`, returning blocks past them.
    pub fn truncate(&mut self, seq: &mut SeqBlocks, tokens: usize) {
        let keep = Self::blocks_for(tokens);
        while seq.blocks.len() > keep {
            if let Some(b) = seq.blocks.pop() {
                self.free.push(b);
            }
        }
        seq.len = seq.len.min(tokens);
    }

    /// Returns every block of `seq`.
    pub fn release(&mut self, seq: &mut SeqBlocks) {
        self.truncate(seq, 0);
    }

    /// Doubles the allocated slots (up to the bound), keeping the contents.
    fn grow(&mut self) -> Result<()> {
        let new = (self.blocks * 2).clamp(self.blocks + 1, self.max_blocks);
        let extra = (new - self.blocks) * BLOCK * self.kv;
        for (k, v) in self.layers.iter_mut() {
            let z = Tensor::zeros((extra, self.d), self.dtype, &self.device)?;
            *k = Tensor::cat(&[&*k, &z], 0)?;
            *v = Tensor::cat(&[&*v, &z], 0)?;
        }
        self.free.extend((self.blocks as u32..new as u32).rev());
        self.blocks = new;
        Ok(())
    }

    /// The slot mapping of a write (`[tokens]` u32 on the store's device), once per step for
    /// every layer; errors on a slot outside the allocated blocks (checked here, on the host,
    /// because the CUDA kernel does not).
    pub fn slot_mapping(&self, slots: &[u32]) -> Result<Tensor> {
        self.check_slots(slots)?;
        Tensor::from_slice(slots, slots.len(), &self.device)
    }

    /// Errors on a slot outside the allocated blocks (the check of [`Self::slot_mapping`], for a
    /// caller that uploads the slots itself).
    pub fn check_slots(&self, slots: &[u32]) -> Result<()> {
        let rows = self.blocks * BLOCK;
        if let Some(&s) = slots.iter().find(|&&s| s as usize >= rows) {
            candle_core::bail!("slot {s} is outside the store's {rows} allocated positions")
        }
        Ok(())
    }

    /// Writes `k`, `v` (`[tokens · kv, d]`: token-major, then head) of layer `layer` at the slots
    /// of `slots` ([`Self::slot_mapping`]): one kernel per buffer on CUDA (`crate::kv_write`).
    pub fn write(&self, layer: usize, slots: &Tensor, k: &Tensor, v: &Tensor) -> Result<()> {
        crate::host::nonempty(k, "key/value write");
        let (kp, vp) = &self.layers[layer];
        kp.inplace_op3(&k.contiguous()?, slots, &crate::kv_write::KvWrite)?;
        vp.inplace_op3(&v.contiguous()?, slots, &crate::kv_write::KvWrite)
    }

    /// [`Self::write`] spelled with candle's `scatter_set` and a [`write_index`]: the reference
    /// the kernel is checked against (`mtrl selftest` on a GPU, the tests here).
    pub fn write_scatter(
        &self,
        layer: usize,
        index: &Tensor,
        k: &Tensor,
        v: &Tensor,
    ) -> Result<()> {
        let (kp, vp) = &self.layers[layer];
        kp.scatter_set(index, &k.contiguous()?, 0)?;
        vp.scatter_set(index, &v.contiguous()?, 0)
    }

    /// The key and value buffers of `layer`, `[blocks · kv · BLOCK, d]` each.
    pub fn layer(&self, layer: usize) -> (&Tensor, &Tensor) {
        let (k, v) = &self.layers[layer];
        (k, v)
    }
}

/// The scatter index of a write of `slots` (one per token): `[slots.len() · kv, d]` u32, the row
/// of (token, head) filled with its buffer row.
pub fn write_index(slots: &[u32], kv: usize, d: usize, device: &Device) -> Result<Tensor> {
    let rows: Vec<u32> = slots
        .iter()
        .flat_map(|&s| (0..kv).map(move |g| row_of(s, g, kv) as u32))
        .collect();
    let n = rows.len();
    Tensor::from_vec(rows, (n, 1), device)?
        .broadcast_as((n, d))?
        .contiguous()
}

/// The gather index of `rows` sequences' slots, `[rows · kv · s]` u32 in (sequence, head,
/// position) order, for `slots` laid out `[rows, s]`: gathered rows reshape to `[rows, kv, s, d]`.
pub fn gather_index(slots: &[u32], rows: usize, kv: usize, device: &Device) -> Result<Tensor> {
    let mut idx = Vec::new();
    gather_rows(slots, rows, kv, &mut idx);
    let n = idx.len();
    Tensor::from_vec(idx, n, device)
}

/// [`gather_index`] on the host, appended to `out`.
pub fn gather_rows(slots: &[u32], rows: usize, kv: usize, out: &mut Vec<u32>) {
    let s = slots.len() / rows.max(1);
    out.reserve(rows * kv * s);
    for r in 0..rows {
        for g in 0..kv {
            out.extend(
                slots[r * s..(r + 1) * s]
                    .iter()
                    .map(|&x| row_of(x, g, kv) as u32),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The write (`crate::kv_write`, the CUDA kernel's CPU twin) and candle's `scatter_set` with a
    /// `write_index` leave the same store, bit for bit, in every dtype; a slot outside the
    /// allocated blocks is refused before anything is written.
    #[test]
    fn the_write_equals_scatter_set_and_refuses_a_slot_outside() {
        let dev = Device::Cpu;
        for dtype in [DType::F32, DType::F64, DType::BF16, DType::F16] {
            let (kv, d) = (3usize, 5usize);
            let stores = [(); 2].map(|_| KvPool::new(2, kv, d, 8 * BLOCK, dtype, &dev).unwrap());
            let mut pools = stores;
            let mut owned = Vec::new();
            for p in pools.iter_mut() {
                let mut a = SeqBlocks::default();
                let mut b = SeqBlocks::default();
                assert!(p.reserve(&mut a, BLOCK + 9).unwrap());
                assert!(p.reserve(&mut b, 2 * BLOCK).unwrap());
                owned.push((a, b));
            }
            let (a, b) = &owned[0];
            // Interleaved owners, across block boundaries, out of order.
            let mut slots: Vec<u32> = a.slots(BLOCK + 9).step_by(3).collect();
            slots.reverse();
            slots.extend(b.slots(70));
            let t = slots.len();
            let k = Tensor::randn(0f32, 1.0, (t * kv, d), &dev)
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            let v = (&k * -0.5).unwrap();
            pools[0]
                .write(1, &pools[0].slot_mapping(&slots).unwrap(), &k, &v)
                .unwrap();
            let idx = write_index(&slots, kv, d, &dev).unwrap();
            pools[1].write_scatter(1, &idx, &k, &v).unwrap();
            for i in 0..2 {
                let bits = |p: &KvPool| {
                    let t = if i == 0 { p.layer(1).0 } else { p.layer(1).1 };
                    t.to_dtype(DType::F64)
                        .unwrap()
                        .flatten_all()
                        .unwrap()
                        .to_vec1::<f64>()
                        .unwrap()
                };
                assert_eq!(bits(&pools[0]), bits(&pools[1]), "{dtype:?} buffer {i}");
            }
            let rows = pools[0].blocks * BLOCK;
            let err = pools[0]
                .slot_mapping(&[0, rows as u32])
                .unwrap_err()
                .to_string();
            assert!(err.contains("outside"), "{err}");
        }
    }

    #[test]
    fn blocks_are_reused_and_the_bound_holds() {
        let dev = Device::Cpu;
        let mut pool = KvPool::new(1, 1, 2, 3 * BLOCK, DType::F32, &dev).unwrap();
        let (mut a, mut b) = (SeqBlocks::default(), SeqBlocks::default());
        assert!(pool.reserve(&mut a, BLOCK + 1).unwrap());
        assert_eq!(a.num_blocks(), 2);
        assert!(!pool.reserve(&mut b, 2 * BLOCK).unwrap());
        assert_eq!(b.num_blocks(), 0);
        assert!(pool.reserve(&mut b, BLOCK).unwrap());
        pool.truncate(&mut a, 3);
        assert_eq!(a.num_blocks(), 1);
        assert!(pool.reserve(&mut b, 2 * BLOCK).unwrap());
        let slots: Vec<u32> = a.slots(3).chain(b.slots(2 * BLOCK)).collect();
        let mut sorted = slots.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), slots.len(), "a slot is owned twice");
    }

    #[test]
    fn writes_land_in_their_slots_and_survive_growth() {
        let dev = Device::Cpu;
        let mut pool = KvPool::new(2, 2, 3, 200 * BLOCK, DType::F32, &dev).unwrap();
        let mut gap = SeqBlocks::default();
        assert!(pool.reserve(&mut gap, 1).unwrap());
        let mut s = SeqBlocks::default();
        assert!(pool.reserve(&mut s, BLOCK + 5).unwrap());
        // Seven positions across a block boundary.
        let slots: Vec<u32> = s.slots(BLOCK + 5).skip(BLOCK - 2).collect();
        // k[token, head, i] = 100·token + 10·head + i
        let k: Vec<f32> = (0..7)
            .flat_map(|t| {
                (0..2).flat_map(move |g| (0..3).map(move |i| (100 * t + 10 * g + i) as f32))
            })
            .collect();
        let k = Tensor::from_vec(k, (14, 3), &dev).unwrap();
        let map = pool.slot_mapping(&slots).unwrap();
        pool.write(1, &map, &k, &(&k * 2.0).unwrap()).unwrap();
        let mut other = SeqBlocks::default();
        assert!(pool.reserve(&mut other, 100 * BLOCK).unwrap());
        let (kb, vb) = pool.layer(1);
        let gather = gather_index(&slots, 1, 2, &dev).unwrap();
        let got = kb
            .index_select(&gather, 0)
            .unwrap()
            .reshape((1, 2, 7, 3))
            .unwrap();
        let want = k
            .reshape((7, 2, 3))
            .unwrap()
            .transpose(0, 1)
            .unwrap()
            .unsqueeze(0)
            .unwrap();
        let diff = (got - want).unwrap().abs().unwrap().sum_all().unwrap();
        assert_eq!(diff.to_scalar::<f32>().unwrap(), 0.0);
        let gv = vb.index_select(&gather, 0).unwrap().sum_all().unwrap();
        let sk = k.sum_all().unwrap().to_scalar::<f32>().unwrap();
        assert_eq!(gv.to_scalar::<f32>().unwrap(), 2.0 * sk);
    }
}
