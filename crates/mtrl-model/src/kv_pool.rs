//! One key/value store per layer for every resident sequence of the engine: paged blocks.
//!
//! Layout: per layer, keys and values are each one tensor `[slots, kv_heads · head_dim]`, where
//! `slots = blocks · BLOCK`. A sequence owns a list of blocks ([`SeqBlocks`]); position `p` of the
//! sequence lives in slot `blocks[p / BLOCK] · BLOCK + p % BLOCK`. So sequences of any lengths
//! share one buffer without padding, a sequence grows by one block at a time, and freeing it
//! returns its blocks to a free list — no copying, no fragmentation beyond the last block.
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
pub const BLOCK: usize = 16;

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
    width: usize,
    dtype: DType,
    device: Device,
    free: Vec<u32>,
    blocks: usize,
    max_blocks: usize,
}

impl KvPool {
    /// An empty store for `layers` layers of `width = kv_heads · head_dim` per position, bounded
    /// to `max_tokens` positions (rounded up to whole blocks).
    pub fn new(
        layers: usize,
        width: usize,
        max_tokens: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let max_blocks = max_tokens.div_ceil(BLOCK).max(1);
        let mut pool = KvPool {
            layers: Vec::with_capacity(layers),
            width,
            dtype,
            device: device.clone(),
            free: Vec::new(),
            blocks: 0,
            max_blocks,
        };
        let first = max_blocks.min(64);
        for _ in 0..layers {
            let z = Tensor::zeros((first * BLOCK, width), dtype, device)?;
            pool.layers.push((z.clone(), z.copy()?));
        }
        pool.free = (0..first as u32).rev().collect();
        pool.blocks = first;
        Ok(pool)
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
        2 * self.layers.len() * self.blocks * BLOCK * self.width * self.dtype.size_in_bytes()
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
        let extra = (new - self.blocks) * BLOCK;
        for (k, v) in self.layers.iter_mut() {
            let z = Tensor::zeros((extra, self.width), self.dtype, &self.device)?;
            *k = Tensor::cat(&[&*k, &z], 0)?;
            *v = Tensor::cat(&[&*v, &z], 0)?;
        }
        self.free.extend((self.blocks as u32..new as u32).rev());
        self.blocks = new;
        Ok(())
    }

    /// Writes `k`, `v` (`[rows, width]`) of layer `layer` at the slots in `index`
    /// (`[rows, width]` u32, each row filled with its slot: see [`write_index`]).
    pub fn write(&self, layer: usize, index: &Tensor, k: &Tensor, v: &Tensor) -> Result<()> {
        let (kp, vp) = &self.layers[layer];
        kp.scatter_set(index, &k.contiguous()?, 0)?;
        vp.scatter_set(index, &v.contiguous()?, 0)
    }

    /// The key and value buffers of `layer`, `[slots, width]` each.
    pub fn layer(&self, layer: usize) -> (&Tensor, &Tensor) {
        let (k, v) = &self.layers[layer];
        (k, v)
    }
}

/// The scatter index of a write: `[slots.len(), width]` u32, row `i` filled with `slots[i]`.
pub fn write_index(slots: &[u32], width: usize, device: &Device) -> Result<Tensor> {
    Tensor::from_slice(slots, (slots.len(), 1), device)?
        .broadcast_as((slots.len(), width))?
        .contiguous()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_reused_and_the_bound_holds() {
        let dev = Device::Cpu;
        let mut pool = KvPool::new(1, 2, 3 * BLOCK, DType::F32, &dev).unwrap();
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
        let mut pool = KvPool::new(2, 3, 200 * BLOCK, DType::F32, &dev).unwrap();
        let mut s = SeqBlocks::default();
        assert!(pool.reserve(&mut s, 5).unwrap());
        let slots: Vec<u32> = s.slots(5).collect();
        let k = Tensor::arange(0f32, 15.0, &dev)
            .unwrap()
            .reshape((5, 3))
            .unwrap();
        let idx = write_index(&slots, 3, &dev).unwrap();
        pool.write(1, &idx, &k, &(&k * 2.0).unwrap()).unwrap();
        let mut other = SeqBlocks::default();
        assert!(pool.reserve(&mut other, 100 * BLOCK).unwrap());
        let (kb, vb) = pool.layer(1);
        let ids = Tensor::from_slice(&slots, 5, &dev).unwrap();
        let got = kb.index_select(&ids, 0).unwrap();
        assert_eq!(got.to_vec2::<f32>().unwrap(), k.to_vec2::<f32>().unwrap());
        let gv = vb.index_select(&ids, 0).unwrap().sum_all().unwrap();
        assert_eq!(gv.to_scalar::<f32>().unwrap(), 2.0 * 105.0);
    }
}
