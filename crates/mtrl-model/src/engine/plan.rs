//! One engine step: admit, plan rows and room, forward, sample, retire (see the module header of
//! `engine`).

use std::time::Instant;

use candle_core::{DType, Tensor};

use super::{Completion, Engine, FinishReason, SampledToken, Seq, StepOutput};
use crate::error::{ModelError, Result};
use crate::kv_pool::KvPool;
use crate::sampler::{draw, SamplingParams};
use crate::transformer::paged::{PagedBatch, Segment};

/// Rows of one active sequence in this step: positions `start .. start + len`.
struct Planned {
    idx: usize,
    start: usize,
    len: usize,
}

impl Engine {
    /// Admits, plans, runs one forward, samples and retires (see the module header).
    pub fn step(&mut self) -> Result<StepOutput> {
        self.admit();
        let plan = self.plan()?;
        let mut out = StepOutput::default();
        if plan.is_empty() {
            return Ok(out);
        }
        let (batch, owners) = self.batch(&plan);
        // `MTRL_TRACE`: the phases of the first forwards, each one synchronised with the device,
        // so that a hang is placed in the phase that hangs rather than at the next copy to host.
        let n = self.counters.forwards + 1;
        let traced = mtrl_core::trace::enabled() && (n <= 3 || mtrl_core::trace::all());
        if traced {
            mtrl_core::trace!(
                "forward {n}: {} rows ({} decode, {} prefill segments), {} sampled, store {} MB",
                batch.ids.len(),
                batch.decode.len(),
                batch.prefill.len(),
                batch.outputs.len(),
                self.pool.allocated_bytes() >> 20
            );
        }
        let t0 = Instant::now();
        let hidden =
            self.policy
                .inference()
                .forward_paged_with(&batch, &self.pool, self.opts.attention)?;
        if traced {
            self.policy.device().synchronize()?;
            mtrl_core::trace!("forward {n}: model forward done");
        }
        let ns = t0.elapsed().as_nanos() as u64;
        if batch.prefill.is_empty() {
            self.counters.decode_forward_ns += ns;
        } else {
            self.counters.prefill_forward_ns += ns;
        }
        self.counters.forwards += 1;
        for p in &plan {
            let s = &mut self.active[p.idx];
            let decode = p.len == 1 && !s.tokens.is_empty() && p.start + 1 == s.context_len();
            if decode {
                self.counters.decode_tokens += 1;
            } else {
                self.counters.prefill_tokens += p.len as u64;
            }
            s.kv.set_len(p.start + p.len);
        }
        let Some(hidden) = hidden else {
            return Ok(out);
        };
        let t0 = Instant::now();
        let logits = self
            .policy
            .inference()
            .logits(&hidden)?
            .to_dtype(DType::F32)?;
        if traced {
            self.policy.device().synchronize()?;
            mtrl_core::trace!("forward {n}: logits done");
        }
        self.sample(&logits, &owners, &mut out)?;
        self.counters.sample_ns += t0.elapsed().as_nanos() as u64;
        if traced {
            mtrl_core::trace!("forward {n}: sampled {} tokens", out.tokens.len());
        }
        self.retire(&mut out)?;
        Ok(out)
    }

    /// Moves waiting sequences into the batch while there is a place and room for their whole
    /// context (after evicting parked sessions); the first one is always admitted.
    fn admit(&mut self) {
        while self.active.len() < self.opts.max_batch {
            let Some(mut seq) = self.waiting.pop_front() else {
                break;
            };
            if seq.req.max_new_tokens == 0 {
                continue;
            }
            if seq.tokens.is_empty() && seq.kv.is_empty() {
                let reused = self.sessions.attach(&mut seq, &mut self.pool, self.version);
                self.counters.reused_tokens += reused as u64;
            }
            // What `kv` holds now was computed by this version (see `Seq::kv_version`).
            seq.kv_version = self.version;
            let need =
                KvPool::blocks_for(seq.context_len() + 1).saturating_sub(seq.kv.num_blocks());
            if !self.active.is_empty() && need > self.pool.free_blocks() + self.sessions.blocks() {
                // Hold no blocks while waiting: waiting sequences must never pin the store.
                self.counters.reused_tokens -= seq.kv.len() as u64;
                self.pool.release(&mut seq.kv);
                self.waiting.push_front(seq);
                break;
            }
            self.admissions += 1;
            seq.admitted = self.admissions;
            self.active.push(seq);
        }
    }

    /// This step's rows, oldest sequence first: one for each decoding sequence, and prompt chunks
    /// for the others while the prefill budget lasts; each with room in the store (evicting
    /// parked sessions, then preempting the youngest sequences).
    ///
    /// A prompt is cut at multiples of `prefill_chunk_tokens` of its own positions, never by
    /// what else is in the step (a chunk waits for a step with budget for all of it; the first
    /// chunk of a step always runs), so a sequence's rows are the same in every run.
    fn plan(&mut self) -> Result<Vec<Planned>> {
        let chunk = self.opts.prefill_chunk_tokens;
        let mut budget = chunk;
        let mut first = true;
        let mut plan = Vec::with_capacity(self.active.len());
        let mut i = 0;
        while i < self.active.len() {
            let s = &self.active[i];
            let (start, tail) = (s.kv.len(), s.context_len() - s.kv.len());
            let len = if tail == 1 {
                1
            } else {
                let len = tail.min(chunk - start % chunk);
                if len > budget && !first {
                    i += 1;
                    continue;
                }
                first = false;
                budget = budget.saturating_sub(len);
                len
            };
            if self.make_room(i, start + len)? {
                plan.push(Planned { idx: i, start, len });
                i += 1;
            } else {
                // Only older sequences hold the store: this one waits for them.
                let mut s = self.active.remove(i);
                self.pool.release(&mut s.kv);
                self.counters.preempted += 1;
                self.waiting.push_front(s);
            }
        }
        Ok(plan)
    }

    /// Gives active sequence `i` room for `tokens` positions: evicts parked sessions, then
    /// preempts the youngest sequences after `i`. `false` when only older sequences are left.
    fn make_room(&mut self, i: usize, tokens: usize) -> Result<bool> {
        loop {
            if self.pool.reserve(&mut self.active[i].kv, tokens)? {
                return Ok(true);
            }
            if self.sessions.evict_one(&mut self.pool) {
                self.counters.evicted_sessions += 1;
                continue;
            }
            if self.active.len() > i + 1 {
                if let Some(mut s) = self.active.pop() {
                    self.pool.release(&mut s.kv);
                    self.counters.preempted += 1;
                    self.waiting.push_front(s);
                }
                continue;
            }
            if i == 0 {
                return Err(ModelError::InvalidArgument(format!(
                    "the key/value store ({} positions) cannot hold one sequence of {tokens}",
                    self.pool.max_tokens()
                )));
            }
            return Ok(false);
        }
    }

    /// The rows of `plan` as one paged batch (decode rows first) and, per output row, the index
    /// of the active sequence it samples for.
    fn batch(&self, plan: &[Planned]) -> (PagedBatch, Vec<usize>) {
        let mut b = PagedBatch::default();
        let (dec, pre): (Vec<&Planned>, Vec<&Planned>) = plan.iter().partition(|p| p.len == 1);
        let mut owners = Vec::new();
        let mut row = 0u32;
        for p in dec.iter().chain(&pre) {
            let s = &self.active[p.idx];
            b.ids
                .extend((p.start..p.start + p.len).map(|q| s.token_at(q)));
            let seg = Segment {
                start: p.start,
                len: p.len,
                slots: s.kv.slots(p.start + p.len).collect(),
            };
            row += p.len as u32;
            if p.start + p.len == s.context_len() {
                b.outputs.push(row - 1);
                owners.push(p.idx);
            }
            if p.len == 1 {
                b.decode.push(seg);
            } else {
                b.prefill.push(seg);
            }
        }
        (b, owners)
    }

    /// Samples the next token of each sequence in `owners` from its row of `logits`.
    fn sample(&mut self, logits: &Tensor, owners: &[usize], out: &mut StepOutput) -> Result<()> {
        let mut params: Vec<SamplingParams> = Vec::with_capacity(owners.len());
        let mut us = Vec::with_capacity(owners.len());
        for &i in owners {
            let s = &mut self.active[i];
            us.push(draw(&s.req.sampling, &mut s.rng));
            params.push(s.req.sampling.clone());
        }
        let refs: Vec<&SamplingParams> = params.iter().collect();
        let drawn = crate::batch_sampler::sample_rows(logits, &refs, &us)?;
        for (&i, d) in owners.iter().zip(drawn) {
            let s = &mut self.active[i];
            s.tokens.push(d.token);
            s.logprobs.push(d.logprob);
            s.truncated.push(d.logprob_truncated);
            s.versions.push(self.version);
            out.tokens.push(SampledToken {
                seq: s.id,
                token: d.token,
                logprob: d.logprob,
                truncated_logprob: d.logprob_truncated,
                version: self.version,
            });
        }
        Ok(())
    }

    /// Retires the sequences that just sampled their last token: their completions go to `out`,
    /// their keys/values to their session (or back to the store).
    fn retire(&mut self, out: &mut StepOutput) -> Result<()> {
        let mut keep = Vec::with_capacity(self.active.len());
        for mut s in std::mem::take(&mut self.active) {
            match self.finish_reason(&s)? {
                None => keep.push(s),
                Some(finish) => {
                    self.sessions.park(&mut s, &mut self.pool);
                    out.finished.push(Completion {
                        seq: s.id,
                        prompt: s.req.prompt,
                        tokens: s.tokens,
                        logprobs: s.logprobs,
                        versions: s.versions,
                        truncated_logprobs: s.truncated,
                        finish,
                    });
                }
            }
        }
        self.active = keep;
        Ok(())
    }

    /// Why `s` stops after its last sampled token, if it does (`None` while still prefilling).
    fn finish_reason(&self, s: &Seq) -> Result<Option<FinishReason>> {
        let Some(&last) = s.tokens.last() else {
            return Ok(None);
        };
        if s.kv.len() + 1 != s.context_len() {
            return Ok(None);
        }
        if s.req.stop_token_ids.contains(&last) {
            return Ok(Some(FinishReason::Eos));
        }
        if let (Some(tok), false) = (&self.tokenizer, s.req.stop_strings.is_empty()) {
            let text = tok.decode(&s.tokens, false)?;
            if let Some(x) = s
                .req
                .stop_strings
                .iter()
                .find(|x| text.contains(x.as_str()))
            {
                return Ok(Some(FinishReason::StopString(x.clone())));
            }
        }
        if s.tokens.len() >= s.req.max_new_tokens {
            return Ok(Some(FinishReason::Length));
        }
        if s.context_len() >= self.context_limit() {
            return Ok(Some(FinishReason::ContextFull));
        }
        Ok(None)
    }
}
