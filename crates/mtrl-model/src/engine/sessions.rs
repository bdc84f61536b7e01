//! Parked sessions: the keys/values of conversations between their model calls, least recently
//! used first out.

use std::collections::HashMap;

use super::Seq;
use crate::kv_pool::{KvPool, SeqBlocks};

/// A finished sequence's stored positions and the token ids they hold.
struct Parked {
    kv: SeqBlocks,
    /// The version that computed the oldest of them (later ones may be newer).
    version: u64,
    tokens: Vec<u32>,
    last_used: u64,
}

/// The parked sessions of an engine.
#[derive(Default)]
pub(super) struct Sessions {
    parked: HashMap<u64, Parked>,
    tick: u64,
}

impl Sessions {
    pub fn len(&self) -> usize {
        self.parked.len()
    }

    /// Blocks held by parked sessions (what eviction could free).
    pub fn blocks(&self) -> usize {
        self.parked.values().map(|p| p.kv.num_blocks()).sum()
    }

    /// Parks `seq`'s stored positions under its session, or frees them when it has none.
    pub fn park(&mut self, seq: &mut Seq, pool: &mut KvPool) {
        let mut kv = std::mem::take(&mut seq.kv);
        let Some(session) = seq.req.session else {
            pool.release(&mut kv);
            return;
        };
        let tokens = (0..kv.len()).map(|p| seq.token_at(p)).collect();
        self.tick += 1;
        let new = Parked {
            kv,
            version: seq.kv_version,
            tokens,
            last_used: self.tick,
        };
        if let Some(mut old) = self.parked.insert(session, new) {
            pool.release(&mut old.kv);
        }
    }

    /// Gives `seq` the parked positions of its session that match the start of its context, at
    /// most all but the last prompt token (whose logits must be computed), and only when every
    /// one of them was computed by `version` (a session parked with older positions is dropped).
    /// Returns the number of positions reused.
    pub fn attach(&mut self, seq: &mut Seq, pool: &mut KvPool, version: u64) -> usize {
        let Some(mut p) = seq.req.session.and_then(|s| self.parked.remove(&s)) else {
            return 0;
        };
        if p.version != version {
            pool.release(&mut p.kv);
            return 0;
        }
        let prompt = &seq.req.prompt;
        let common = p
            .tokens
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count()
            .min(prompt.len() - 1);
        pool.truncate(&mut p.kv, common);
        seq.kv = p.kv;
        common
    }

    /// Frees the least recently used session; `false` when none is parked.
    pub fn evict_one(&mut self, pool: &mut KvPool) -> bool {
        let Some(&oldest) = self
            .parked
            .iter()
            .min_by_key(|(_, p)| p.last_used)
            .map(|(s, _)| s)
        else {
            return false;
        };
        self.release(oldest, pool);
        true
    }

    pub fn release(&mut self, session: u64, pool: &mut KvPool) {
        if let Some(mut p) = self.parked.remove(&session) {
            pool.release(&mut p.kv);
        }
    }

    pub fn clear(&mut self, pool: &mut KvPool) {
        for (_, mut p) in self.parked.drain() {
            pool.release(&mut p.kv);
        }
    }
}
