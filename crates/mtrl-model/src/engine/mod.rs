//! Batched generation engine for rollouts.
//!
//! One loop serves many concurrent sequences over one paged key/value store ([`KvPool`]). A call
//! to [`Engine::step`]:
//! 1. admits waiting requests (up to `max_batch` active), attaching the resident keys/values of
//!    the request's **session** when it has one (see below);
//! 2. plans the step's rows: one row for every sequence that is decoding, and up to
//!    `prefill_chunk_tokens` rows of prompt for the sequences still prefilling (several joiners
//!    share the budget; a long prompt is spread over several steps, so decoding never stalls);
//!    finds room for them in the store, evicting parked sessions and then preempting the
//!    youngest sequences when the bound is reached;
//! 3. runs one forward over all those rows ([`crate::transformer::paged`]);
//! 4. samples, on the device, one token for every sequence whose context is now fully processed
//!    ([`crate::batch_sampler`]); only ids and log-probs come back to the host;
//! 5. retires sequences that hit an EOS id, a stop string, `max_new_tokens` or the context end.
//!
//! **Sessions: sequences live across turns.** A request may name a session (an episode). When its
//! sequence finishes, its keys/values stay in the store (the session is *parked*); the session's
//! next request — the same conversation plus a tool response and the next assistant header — then
//! prefills only the tokens after the longest common prefix. Tokens in, tokens out: the prompt is
//! always the whole context, and the engine checks what it holds against it, so a client that
//! edits history only loses the reuse. Parked sessions are dropped when their owner calls
//! [`Engine::release`], least recently used first when the store is full, and all of them at a
//! weight update. Invariant: a turn's prompt is always prefilled by the weights that sample that
//! turn. A session is tagged with the version that computed its oldest stored position, and
//! positions are reused only under that same version: a sequence *in flight* during an update
//! keeps its entries to finish its turn, but parks them under the old version, so its next turn
//! prefills afresh.
//!
//! **Log-probs.** Every sampled token comes with `log_softmax(logits / T)[token]` over the full
//! vocabulary (`T = 1` for greedy), the quantity `logprobs::token_logprobs` evaluates for the
//! learner, and with its log-prob under the truncated (top-k/top-p) distribution it was drawn from.
//!
//! **Weights.** [`Engine::update_weights`] takes `&mut self`, so it runs only between steps; it
//! writes the new tensors in place, synchronises the device (so the caller may drop the tensors it
//! passed: every copy from them has finished), bumps the version. Each token is tagged with the
//! version of the weights that produced the logits it was sampled from.
//!
//! Determinism: a sequence's tokens depend on its prompt, its seed and the weights, not on its
//! batch-mates, on eviction or on preemption — up to the last bits of f32 arithmetic in kernels
//! whose reduction order depends on the batch shape (checked in `tests/engine.rs`).

mod legacy;
mod plan;
mod sessions;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use candle_core::Tensor;
use rand_chacha::ChaCha8Rng;

use crate::error::{ModelError, Result};
use crate::kv_pool::{KvPool, SeqBlocks};
use crate::policy::Policy;
use crate::sampler::SamplingParams;
use crate::tokenizer::Tokenizer;

pub use legacy::LegacyEngine;
use sessions::Sessions;

/// Identifier of a submitted sequence.
pub type SeqId = u64;

/// What to generate.
#[derive(Debug, Clone, Default)]
pub struct GenerationRequest {
    pub prompt: Vec<u32>,
    pub sampling: SamplingParams,
    pub max_new_tokens: usize,
    /// Generation stops after emitting any of these ids (the id is kept).
    pub stop_token_ids: Vec<u32>,
    /// Generation stops once the decoded new text contains any of these (tokens are kept).
    pub stop_strings: Vec<String>,
    /// The conversation this request continues: its keys/values stay resident after it finishes
    /// and the next request of the same session reuses the common prefix.
    pub session: Option<u64>,
}

/// Why a sequence stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// Emitted a stop token id.
    Eos,
    /// The new text contains this stop string.
    StopString(String),
    /// Reached `max_new_tokens`.
    Length,
    /// Reached the model's context window (or the key/value store's bound).
    ContextFull,
}

impl FinishReason {
    /// A short name: `eos`, `stop`, `length`, `context`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Eos => "eos",
            Self::StopString(_) => "stop",
            Self::Length => "length",
            Self::ContextFull => "context",
        }
    }
}

/// One sampled token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SampledToken {
    pub seq: SeqId,
    pub token: u32,
    /// `log_softmax(logits / T)[token]`, full vocabulary, before truncation.
    pub logprob: f32,
    /// Log-prob under the truncated, renormalised distribution the token was drawn from (equal to
    /// `logprob` without top-k/top-p; NaN from the legacy engine).
    pub truncated_logprob: f32,
    /// Policy version whose weights produced the logits.
    pub version: u64,
}

/// A finished sequence.
#[derive(Debug, Clone)]
pub struct Completion {
    pub seq: SeqId,
    pub prompt: Vec<u32>,
    pub tokens: Vec<u32>,
    pub logprobs: Vec<f32>,
    pub versions: Vec<u64>,
    /// Per token, the log-prob under the truncated distribution (empty from the legacy engine).
    pub truncated_logprobs: Vec<f32>,
    pub finish: FinishReason,
}

/// What one step produced.
#[derive(Debug, Default)]
pub struct StepOutput {
    pub tokens: Vec<SampledToken>,
    pub finished: Vec<Completion>,
}

impl Completion {
    /// The behaviour log-probs to record: under the (top-k/top-p truncated) distribution each
    /// token was drawn from when `sampled` (the full-vocabulary ones where the engine reported no
    /// truncated ones: the legacy engine), else under the full vocabulary.
    pub fn behaviour_logprobs(&self, sampled: bool) -> &[f32] {
        if sampled && self.truncated_logprobs.len() == self.logprobs.len() {
            &self.truncated_logprobs
        } else {
            &self.logprobs
        }
    }

    /// A sequence that produced nothing (its request asked for no token, or it never finished).
    pub fn empty(seq: SeqId, prompt: Vec<u32>) -> Completion {
        Completion {
            seq,
            prompt,
            tokens: Vec::new(),
            logprobs: Vec::new(),
            versions: Vec::new(),
            truncated_logprobs: Vec::new(),
            finish: FinishReason::Length,
        }
    }
}

/// What every engine does: queue requests, step. [`Stepper::generate`] is written once on top.
pub trait Stepper {
    /// Queues a request; it joins the batch at a later step.
    fn submit(&mut self, req: GenerationRequest) -> Result<SeqId>;
    /// Runs one step.
    fn step(&mut self) -> Result<StepOutput>;
    /// Sequences active or waiting.
    fn num_unfinished(&self) -> usize;

    /// Submits `requests`, steps until all finish and returns their completions in request order.
    fn generate(&mut self, requests: Vec<GenerationRequest>) -> Result<Vec<Completion>> {
        let ids = requests
            .into_iter()
            .map(|r| self.submit(r))
            .collect::<Result<Vec<_>>>()?;
        let mut done: HashMap<SeqId, Completion> = HashMap::new();
        while ids.iter().any(|id| !done.contains_key(id)) && self.num_unfinished() > 0 {
            for c in self.step()?.finished {
                done.insert(c.seq, c);
            }
        }
        Ok(ids
            .iter()
            .map(|id| {
                done.remove(id)
                    .unwrap_or_else(|| Completion::empty(*id, Vec::new()))
            })
            .collect())
    }
}

/// The checks of `submit`, shared by both engines: valid sampling parameters, a non-empty prompt
/// that leaves room below `max` positions, ids inside the vocabulary, a tokenizer for stop strings.
pub(crate) fn check_request(
    req: &GenerationRequest,
    max: usize,
    vocab: usize,
    has_tokenizer: bool,
) -> Result<()> {
    req.sampling.validate()?;
    if req.prompt.is_empty() {
        return Err(ModelError::InvalidArgument("empty prompt".into()));
    }
    if req.prompt.len() >= max {
        return Err(ModelError::ContextOverflow {
            len: req.prompt.len(),
            max,
        });
    }
    if let Some(&bad) = req.prompt.iter().find(|&&t| t as usize >= vocab) {
        return Err(ModelError::InvalidArgument(format!(
            "prompt token id {bad} is outside the vocabulary of {vocab} ids"
        )));
    }
    if !req.stop_strings.is_empty() && !has_tokenizer {
        return Err(ModelError::InvalidArgument(
            "stop strings need an engine with a tokenizer".into(),
        ));
    }
    Ok(())
}

/// How the engine batches and how much it keeps resident.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineOptions {
    /// Sequences per step at most.
    pub max_batch: usize,
    /// Positions the key/value store holds at most, all sequences and parked sessions together;
    /// `None`: `max_batch` × the context window (the store grows only as used).
    pub kv_cache_tokens: Option<usize>,
    /// Prompt rows per step at most, across sequences (decode rows come on top).
    pub prefill_chunk_tokens: usize,
    /// How the forward attends (`[rollout] engine_attention`).
    pub attention: crate::EngineAttention,
}

impl EngineOptions {
    /// `max_batch` sequences, the default bound and a 512-token prefill chunk.
    pub fn new(max_batch: usize) -> Self {
        EngineOptions {
            max_batch,
            kv_cache_tokens: None,
            prefill_chunk_tokens: 512,
            attention: crate::EngineAttention::Auto,
        }
    }
}

/// Monotonic counters of the engine's work (the trainer and the bench take differences).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineCounters {
    /// Rows run through the model to process prompts (decode rows not included).
    pub prefill_tokens: u64,
    /// Prompt positions taken from a parked session instead of being prefilled.
    pub reused_tokens: u64,
    /// Decode rows run.
    pub decode_tokens: u64,
    /// Parked sessions evicted to make room.
    pub evicted_sessions: u64,
    /// Sequences preempted (their keys/values dropped, recomputed later).
    pub preempted: u64,
    /// Forward passes run.
    pub forwards: u64,
    /// Nanoseconds in forward passes that had prompt rows, and in those with decode rows only.
    pub prefill_forward_ns: u64,
    pub decode_forward_ns: u64,
    /// Nanoseconds in the output head and sampling (logits, device sampler, ids to the host).
    pub sample_ns: u64,
}

/// A sequence in the engine. Its context is `req.prompt ++ tokens`; `kv` stores the first
/// `kv.len()` positions of it; while active, the rest (at least one token) is still to be fed.
pub(crate) struct Seq {
    pub id: SeqId,
    pub req: GenerationRequest,
    pub rng: ChaCha8Rng,
    pub tokens: Vec<u32>,
    pub logprobs: Vec<f32>,
    pub truncated: Vec<f32>,
    pub versions: Vec<u64>,
    pub kv: SeqBlocks,
    /// The policy version that computed the oldest position in `kv` (set at admission: a waiting
    /// sequence holds no positions, and a session's are attached only at the current version).
    /// Positions of later versions may follow; parking tags the session with this one.
    pub kv_version: u64,
    /// Admission order (the youngest is preempted first).
    pub admitted: u64,
}

impl Seq {
    pub fn context_len(&self) -> usize {
        self.req.prompt.len() + self.tokens.len()
    }

    pub fn token_at(&self, p: usize) -> u32 {
        let n = self.req.prompt.len();
        if p < n {
            self.req.prompt[p]
        } else {
            self.tokens[p - n]
        }
    }
}

/// The generation engine. Owns its policy copy and its key/value store.
pub struct Engine {
    policy: Policy,
    tokenizer: Option<Arc<Tokenizer>>,
    version: u64,
    opts: EngineOptions,
    pool: KvPool,
    next_id: SeqId,
    admissions: u64,
    waiting: VecDeque<Seq>,
    active: Vec<Seq>,
    sessions: Sessions,
    counters: EngineCounters,
}

impl Engine {
    /// An engine serving at most `max_batch` (at least 1) sequences per step, other options at
    /// their defaults. The tokenizer is needed only for stop strings.
    pub fn new(
        policy: Policy,
        tokenizer: Option<Arc<Tokenizer>>,
        version: u64,
        max_batch: usize,
    ) -> Result<Self> {
        let opts = EngineOptions::new(max_batch.max(1));
        Self::with_options(policy, tokenizer, version, opts)
    }

    /// An engine with explicit options; errors on a zero batch, chunk or store bound.
    pub fn with_options(
        policy: Policy,
        tokenizer: Option<Arc<Tokenizer>>,
        version: u64,
        opts: EngineOptions,
    ) -> Result<Self> {
        let cfg = policy.config();
        let bad = |what: &str| Err(ModelError::InvalidArgument(format!("engine: {what}")));
        if opts.max_batch == 0 {
            return bad("max_batch must be at least 1");
        }
        if opts.prefill_chunk_tokens == 0 {
            return bad("prefill_chunk_tokens must be at least 1");
        }
        let bound = opts
            .kv_cache_tokens
            .unwrap_or(opts.max_batch * cfg.max_position_embeddings);
        if bound < 2 {
            return bad("kv_cache_tokens must be at least 2");
        }
        let pool = KvPool::new(
            cfg.num_hidden_layers,
            cfg.num_key_value_heads,
            cfg.head_dim,
            bound,
            policy.dtype(),
            policy.device(),
        )?;
        // Stream safety: the store's zero fill (queued on this thread's stream) has finished
        // before the engine may move to a thread of its own (`mtrl_rollout::EngineThread`).
        policy.device().synchronize()?;
        mtrl_core::trace!(
            "engine built: batch {}, store bound {} positions, {} MB allocated",
            opts.max_batch,
            pool.max_tokens(),
            pool.allocated_bytes() >> 20
        );
        Ok(Self {
            policy,
            tokenizer,
            version,
            opts,
            pool,
            next_id: 0,
            admissions: 0,
            waiting: VecDeque::new(),
            active: Vec::new(),
            sessions: Sessions::default(),
            counters: EngineCounters::default(),
        })
    }

    /// The served policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The current policy version.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The options in force.
    pub fn options(&self) -> &EngineOptions {
        &self.opts
    }

    /// Work counters since the engine started.
    pub fn counters(&self) -> EngineCounters {
        self.counters
    }

    /// Positions stored now (active sequences and parked sessions) and the bound.
    pub fn resident_tokens(&self) -> (usize, usize) {
        let free = self.pool.free_blocks() * crate::kv_pool::BLOCK;
        (self.pool.max_tokens() - free, self.pool.max_tokens())
    }

    /// Sequences active or waiting.
    pub fn num_unfinished(&self) -> usize {
        self.active.len() + self.waiting.len()
    }

    /// Parked sessions.
    pub fn num_parked(&self) -> usize {
        self.sessions.len()
    }

    /// Queues a request; it joins the batch at a later step. Errors at once on an empty prompt,
    /// a prompt that leaves no room in the context window or the store, an out-of-vocabulary id,
    /// bad sampling parameters, or stop strings without a tokenizer.
    pub fn submit(&mut self, req: GenerationRequest) -> Result<SeqId> {
        check_request(
            &req,
            self.context_limit(),
            self.policy.config().vocab_size,
            self.tokenizer.is_some(),
        )?;
        let id = self.next_id;
        self.next_id += 1;
        self.waiting.push_back(Seq {
            id,
            rng: req.sampling.rng(),
            req,
            tokens: Vec::new(),
            logprobs: Vec::new(),
            truncated: Vec::new(),
            versions: Vec::new(),
            kv: SeqBlocks::default(),
            kv_version: self.version,
            admitted: 0,
        });
        Ok(id)
    }

    /// Drops the parked keys/values of `session` (its episode is over). Unknown sessions are
    /// ignored.
    pub fn release(&mut self, session: u64) {
        self.sessions.release(session, &mut self.pool);
    }

    /// Replaces weights (HF names) and sets the version; takes effect for the next logits
    /// computed. Parked sessions are dropped (see the module header).
    pub fn update_weights(
        &mut self,
        version: u64,
        tensors: &HashMap<String, Tensor>,
    ) -> Result<()> {
        self.policy.set_weights(tensors)?;
        // Stream safety: every copy out of `tensors` has finished before they can be dropped.
        self.policy.device().synchronize()?;
        self.version = version;
        self.sessions.clear(&mut self.pool);
        Ok(())
    }

    /// Submits `requests`, steps until all finish and returns their completions in request order
    /// ([`Stepper::generate`], callable without the trait in scope).
    pub fn generate(&mut self, requests: Vec<GenerationRequest>) -> Result<Vec<Completion>> {
        Stepper::generate(self, requests)
    }

    /// Positions a sequence may reach: the context window, or the store's bound if smaller.
    fn context_limit(&self) -> usize {
        self.policy
            .config()
            .max_position_embeddings
            .min(self.pool.max_tokens())
    }
}

impl Stepper for Engine {
    fn submit(&mut self, req: GenerationRequest) -> Result<SeqId> {
        Engine::submit(self, req)
    }
    fn step(&mut self) -> Result<StepOutput> {
        Engine::step(self)
    }
    fn num_unfinished(&self) -> usize {
        Engine::num_unfinished(self)
    }
}
