//! The engine before paged KV and turn reuse, kept runnable only for the side-by-side comparison of
//! `mtrl bench engine` (remove it once those numbers are in the notes).
//!
//! One decode loop serves many concurrent sequences. Each sequence owns its KV cache, RNG, length
//! and stop conditions. A call to [`Engine::step`]:
//! 1. admits waiting requests (up to `max_batch` active) and prefills each one alone;
//! 2. samples one token for every active sequence from the logits it holds;
//! 3. retires sequences that hit an EOS id, a stop string, `max_new_tokens` or the context end;
//! 4. runs one batched decode step for the rest, which leaves each holding its next logits.
//!
//! So sequences join and leave between steps and a long sequence never holds a short one back.
//!
//! **Log-probs.** Every sampled token comes with `log_softmax(logits / T)[token]` over the full
//! vocabulary, before top-k/top-p truncation (`T = 1` for greedy): the distribution
//! `logprobs::token_logprobs(.., temperature = T, ..)` evaluates for the learner.
//!
//! **Weights.** [`Engine::update_weights`] takes `&mut self`, so it can only run between steps; it
//! writes the new tensors in place and bumps the version. Each token is tagged with the version of
//! the weights that produced the logits it was sampled from. KV entries computed before an update
//! are kept (as in PipelineRL-style in-flight updates); the version tag makes that staleness visible.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use candle_core::{DType, Tensor};
use rand_chacha::ChaCha8Rng;

use super::{
    check_request, Completion, FinishReason, GenerationRequest, SampledToken, SeqId, StepOutput,
    Stepper,
};
use crate::error::Result;
use crate::kv_cache::KvCache;
use crate::policy::Policy;
use crate::sampler::sample;
use crate::tokenizer::Tokenizer;

struct Active {
    id: SeqId,
    req: GenerationRequest,
    cache: KvCache,
    logits: Vec<f32>,
    logits_version: u64,
    rng: ChaCha8Rng,
    tokens: Vec<u32>,
    logprobs: Vec<f32>,
    versions: Vec<u64>,
}

/// The generation engine. Owns its policy copy.
pub struct LegacyEngine {
    policy: Policy,
    tokenizer: Option<Arc<Tokenizer>>,
    version: u64,
    max_batch: usize,
    next_id: SeqId,
    waiting: VecDeque<(SeqId, GenerationRequest)>,
    active: Vec<Active>,
}

fn last_row_logits(policy: &Policy, hidden: &Tensor) -> Result<Tensor> {
    Ok(policy.inference().logits(hidden)?.to_dtype(DType::F32)?)
}

impl LegacyEngine {
    /// An engine serving at most `max_batch` sequences per decode step. The tokenizer is needed
    /// only for stop strings.
    pub fn new(
        policy: Policy,
        tokenizer: Option<Arc<Tokenizer>>,
        version: u64,
        max_batch: usize,
    ) -> Self {
        Self {
            policy,
            tokenizer,
            version,
            max_batch: max_batch.max(1),
            next_id: 0,
            waiting: VecDeque::new(),
            active: Vec::new(),
        }
    }

    /// The served policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The current policy version.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Sequences active or waiting.
    pub fn num_unfinished(&self) -> usize {
        self.active.len() + self.waiting.len()
    }

    /// Queues a request; it joins the batch at the next step. Errors at once on an empty prompt,
    /// a prompt that leaves no room in the context window, an out-of-vocabulary id, bad sampling
    /// parameters, or stop strings without a tokenizer.
    pub fn submit(&mut self, req: GenerationRequest) -> Result<SeqId> {
        let cfg = self.policy.config();
        let max = cfg.max_position_embeddings;
        check_request(&req, max, cfg.vocab_size, self.tokenizer.is_some())?;
        let id = self.next_id;
        self.next_id += 1;
        self.waiting.push_back((id, req));
        Ok(id)
    }

    /// Replaces weights (HF names) and sets the version; takes effect for the next logits computed.
    pub fn update_weights(
        &mut self,
        version: u64,
        tensors: &HashMap<String, Tensor>,
    ) -> Result<()> {
        self.policy.set_weights(tensors)?;
        self.version = version;
        Ok(())
    }

    fn prefill(&self, id: SeqId, req: GenerationRequest) -> Result<Active> {
        let dev = self.policy.device();
        let mut cache = KvCache::new(self.policy.config().num_hidden_layers);
        let ids = Tensor::from_slice(&req.prompt, (1, req.prompt.len()), dev)?;
        let hidden = self.policy.inference().forward_cached(&ids, &mut cache)?;
        let last = hidden.narrow(1, req.prompt.len() - 1, 1)?.squeeze(1)?;
        let logits = last_row_logits(&self.policy, &last)?
            .squeeze(0)?
            .to_vec1::<f32>()?;
        Ok(Active {
            id,
            rng: req.sampling.rng(),
            req,
            cache,
            logits,
            logits_version: self.version,
            tokens: Vec::new(),
            logprobs: Vec::new(),
            versions: Vec::new(),
        })
    }

    fn finish_reason(&self, a: &Active) -> Result<Option<FinishReason>> {
        let Some(&last) = a.tokens.last() else {
            return Ok(None);
        };
        if a.req.stop_token_ids.contains(&last) {
            return Ok(Some(FinishReason::Eos));
        }
        if let (Some(tok), false) = (&self.tokenizer, a.req.stop_strings.is_empty()) {
            let text = tok.decode(&a.tokens, false)?;
            if let Some(s) = a
                .req
                .stop_strings
                .iter()
                .find(|s| text.contains(s.as_str()))
            {
                return Ok(Some(FinishReason::StopString(s.clone())));
            }
        }
        if a.tokens.len() >= a.req.max_new_tokens {
            return Ok(Some(FinishReason::Length));
        }
        if a.req.prompt.len() + a.tokens.len() >= self.policy.config().max_position_embeddings {
            return Ok(Some(FinishReason::ContextFull));
        }
        Ok(None)
    }

    /// Admits, samples, retires and decodes once (see the module header).
    pub fn step(&mut self) -> Result<StepOutput> {
        while self.active.len() < self.max_batch {
            let Some((id, req)) = self.waiting.pop_front() else {
                break;
            };
            if req.max_new_tokens == 0 {
                continue;
            }
            let a = self.prefill(id, req)?;
            self.active.push(a);
        }
        let mut out = StepOutput::default();
        let mut keep = Vec::with_capacity(self.active.len());
        for mut a in std::mem::take(&mut self.active) {
            let s = sample(&a.logits, &a.req.sampling, &mut a.rng);
            a.tokens.push(s.token);
            a.logprobs.push(s.logprob);
            a.versions.push(a.logits_version);
            out.tokens.push(SampledToken {
                seq: a.id,
                token: s.token,
                logprob: s.logprob,
                truncated_logprob: f32::NAN,
                version: a.logits_version,
            });
            match self.finish_reason(&a)? {
                Some(finish) => out.finished.push(Completion {
                    seq: a.id,
                    prompt: a.req.prompt,
                    tokens: a.tokens,
                    logprobs: a.logprobs,
                    versions: a.versions,
                    truncated_logprobs: Vec::new(),
                    finish,
                }),
                None => keep.push(a),
            }
        }
        if !keep.is_empty() {
            let toks: Vec<u32> = keep
                .iter()
                .map(|a| a.tokens.last().copied().unwrap_or(0))
                .collect();
            let mut caches: Vec<&mut KvCache> = keep.iter_mut().map(|a| &mut a.cache).collect();
            let hidden = self.policy.inference().decode_step(&toks, &mut caches)?;
            let logits = last_row_logits(&self.policy, &hidden)?.to_vec2::<f32>()?;
            for (a, l) in keep.iter_mut().zip(logits) {
                a.logits = l;
                a.logits_version = self.version;
            }
        }
        self.active = keep;
        Ok(out)
    }
}

impl Stepper for LegacyEngine {
    fn submit(&mut self, req: GenerationRequest) -> Result<SeqId> {
        LegacyEngine::submit(self, req)
    }
    fn step(&mut self) -> Result<StepOutput> {
        LegacyEngine::step(self)
    }
    fn num_unfinished(&self) -> usize {
        LegacyEngine::num_unfinished(self)
    }
}
