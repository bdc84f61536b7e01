//! Token capture: one [`Capture`] per trajectory records every model call's exact prompt ids,
//! sampled ids, log-probs and versions, and enforces the episode's budgets.
//!
//! How a call's prompt is made (token-in/token-out, never a re-tokenized transcript):
//! - **continuation**: the client's messages are the previous call's messages, then the
//!   assistant message this server returned (recognised by content and tool calls, ids aside),
//!   then new non-assistant messages (tool results, a user turn). The prompt is the segment so
//!   far — the previous prompt and the ids the policy actually sampled — plus the codec's
//!   `encode_tool_turn` of the new messages only, exactly as the in-process environment builds
//!   it; the new ids are context (`loss_mask` 0);
//! - otherwise the messages are rendered whole; if the current segment is a prefix of that
//!   rendering, the rest is context and the trajectory stays one sequence;
//! - otherwise the agent rewrote its history: a new **segment** starts
//!   (`Trajectory::segment_starts`), trained as a row of its own by the learner.
//!
//! Every call adds at least one context token: a call whose prompt is exactly the segment so
//! far (a `/sample` sending back the last prompt and output) is refused (400 naming
//! `input_ids` / `messages`), since its sampled ids would run on from the previous call's and
//! the two turns would merge into one (`Trajectory::sampled_runs` tells turns apart by the
//! context between them).
//!
//! Budgets, as in-process: a call beyond `max_turns` fails the trajectory (`turn_limit`); a
//! completion that does not end its message within `max_tokens_per_turn` fails it
//! (`token_limit`, or `context_overflow` when the context bound cut it short); a prompt that
//! fills `max_context_tokens` fails it (`context_overflow`). A failed trajectory refuses further
//! calls and is scored with the failure reward.

use std::sync::Arc;

use mtrl_core::{ChatCodec, FailureReason, Message, Trajectory};
use mtrl_model::{Completion, SamplingParams};
use mtrl_rollout::GenClient;
use serde_json::Value;

use crate::error::ApiError;
use crate::render::{self, Reply};
use crate::request::{ApiMessage, Reward};

/// The budgets of one trajectory.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Budgets {
    pub max_turns: usize,
    pub max_tokens_per_turn: usize,
    pub max_context_tokens: usize,
}

/// How one trajectory's calls are served.
#[derive(Clone)]
pub struct Spec {
    pub task_id: String,
    pub gen: GenClient,
    pub codec: Arc<dyn ChatCodec>,
    pub model: String,
    pub budgets: Budgets,
    /// Training: the run's sampling, seeded per call from `seeds`; the client's temperature,
    /// top-p and seed are not used (the loss is computed under these). `None`: the client's.
    pub sampling: Option<SamplingParams>,
    /// (run seed, group, sample): call t samples with `sample_seed(seed, group, sample, t)`.
    pub seeds: (u64, u64, u64),
    /// Engine session: the conversation's keys/values stay resident between calls.
    pub session: u64,
    /// Record each token's log-prob under the distribution it was drawn from (top-k / top-p
    /// truncated), else under the full vocabulary (`rollout.behaviour_logprobs`).
    pub sampled_logprobs: bool,
}

/// The previous call, to recognise a continuation.
struct Last {
    /// Its messages plus the assistant message as the policy wrote it (raw text).
    history: Vec<Message>,
    reply: Reply,
    /// How many client messages `history` stands for.
    api_len: usize,
    api_prefix: Vec<ApiMessage>,
    tools: Vec<Value>,
}

/// A prepared call: the whole prompt and what of it is new context.
pub struct Prepared {
    pub prompt: Vec<u32>,
    context: Vec<u32>,
    new_segment: bool,
    history: Vec<Message>,
    api: Vec<ApiMessage>,
    tools: Vec<Value>,
    /// The call's token budget (per-turn and context caps applied).
    pub max_new_tokens: usize,
    capped: bool,
}

/// What the agent reported.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub reward: Option<Reward>,
    /// The policy failed this way (trained with the failure reward).
    pub agent_failure: Option<FailureReason>,
    pub metrics: Vec<(String, f64)>,
    pub completed: bool,
    /// The agent itself failed (`status: "failed"`, an exception, a 500 result): the attempt
    /// errors and is retried, it is not scored.
    pub error: Option<String>,
}

impl Report {
    /// Takes what `r` reports; fields it leaves out keep their earlier value.
    pub fn merge(&mut self, r: crate::request::RewardReport) {
        if r.reward.is_some() {
            self.reward = r.reward;
        }
        if r.failure.is_some() {
            self.agent_failure = r.failure;
        }
        if r.error.is_some() {
            self.error = r.error;
        }
        if !r.metrics.is_empty() {
            self.metrics = r.metrics;
        }
    }
}

/// One trajectory's record.
pub struct Capture {
    pub spec: Spec,
    traj: Trajectory,
    /// Where the current segment starts in `traj.tokens`.
    seg_start: usize,
    last: Option<Last>,
    pub report: Report,
}

impl Capture {
    pub fn new(spec: Spec) -> Capture {
        let traj = Trajectory::new(spec.task_id.clone());
        Capture {
            spec,
            traj,
            seg_start: 0,
            last: None,
            report: Report::default(),
        }
    }

    pub fn failure(&self) -> Option<FailureReason> {
        self.traj.failure
    }

    pub fn turns(&self) -> u32 {
        self.traj.turns
    }

    fn fail(&mut self, why: FailureReason, code: &'static str, msg: String) -> ApiError {
        self.traj.failure = Some(why);
        ApiError::bad_request(msg).with_code(code)
    }

    /// Builds the prompt of a call with `api` messages and `tools`, checking the budgets.
    pub fn prepare(
        &mut self,
        api: &[ApiMessage],
        tools: &[Value],
        max_tokens: Option<usize>,
    ) -> Result<Prepared, ApiError> {
        self.check_open()?;
        let codec = self.spec.codec.clone();
        let seg = &self.traj.tokens[self.seg_start..];
        let (context, history, new_segment) = match self.continuation(api, tools) {
            Some((last, new)) => {
                let ids = codec
                    .encode_tool_turn(&last.history, &new, tools)
                    .map_err(|e| ApiError::bad_request(e.to_string()))?;
                let mut history = last.history.clone();
                history.extend(new);
                (ids, history, false)
            }
            None => {
                let msgs = render::messages(api);
                let full = codec
                    .encode_prompt(&msgs, tools)
                    .map_err(|e| ApiError::bad_request(e.to_string()))?;
                if full.starts_with(seg) {
                    (full[seg.len()..].to_vec(), msgs, false)
                } else {
                    (full, msgs, true)
                }
            }
        };
        self.finish_prepare(
            "messages",
            context,
            new_segment,
            history,
            api.to_vec(),
            tools.to_vec(),
            max_tokens,
        )
    }

    /// Refuses calls on an ended trajectory and calls beyond the turn budget.
    fn check_open(&mut self) -> Result<(), ApiError> {
        if let Some(f) = self.traj.failure {
            return Err(ApiError::bad_request(format!(
                "trajectory has ended ({}); no further model calls are served",
                f.as_str()
            ))
            .with_code("trajectory_ended"));
        }
        let max_turns = self.spec.budgets.max_turns;
        if self.traj.turns as usize >= max_turns {
            return Err(self.fail(
                FailureReason::TurnLimit,
                "turn_budget_exceeded",
                format!("the turn budget ({max_turns} model calls) is spent"),
            ));
        }
        Ok(())
    }

    /// The whole prompt and the call's token budget; a full context fails the trajectory.
    /// `param` names the request field the prompt comes from.
    #[allow(clippy::too_many_arguments)]
    fn finish_prepare(
        &mut self,
        param: &'static str,
        context: Vec<u32>,
        new_segment: bool,
        history: Vec<Message>,
        api: Vec<ApiMessage>,
        tools: Vec<Value>,
        max_tokens: Option<usize>,
    ) -> Result<Prepared, ApiError> {
        if context.is_empty() {
            return Err(ApiError::field(
                param,
                "adds no context after the previous call's output: a model call starts with at \
                 least one new token (e.g. the next message's header), else its output would \
                 merge with the previous one into a single turn",
            )
            .with_code("no_new_context"));
        }
        let b = self.spec.budgets;
        let mut prompt = if new_segment {
            Vec::new()
        } else {
            self.traj.tokens[self.seg_start..].to_vec()
        };
        prompt.extend_from_slice(&context);
        let room = b.max_context_tokens.saturating_sub(prompt.len());
        if room == 0 {
            return Err(self.fail(
                FailureReason::ContextOverflow,
                "context_length_exceeded",
                format!(
                    "the prompt has {} tokens; the context budget is {}",
                    prompt.len(),
                    b.max_context_tokens
                ),
            ));
        }
        let cap = b.max_tokens_per_turn.min(room);
        Ok(Prepared {
            prompt,
            context,
            new_segment,
            history,
            api,
            tools,
            max_new_tokens: max_tokens.map_or(cap, |m| m.min(cap)),
            capped: room < b.max_tokens_per_turn,
        })
    }

    /// Builds the prompt of a raw `/sample` call: `ids` is the whole context; it continues the
    /// segment when the segment is a prefix of it, else starts a new one.
    pub fn prepare_ids(
        &mut self,
        ids: &[u32],
        max_tokens: Option<usize>,
    ) -> Result<Prepared, ApiError> {
        self.check_open()?;
        let seg = &self.traj.tokens[self.seg_start..];
        let (context, new_segment) = if ids.starts_with(seg) {
            (ids[seg.len()..].to_vec(), false)
        } else {
            (ids.to_vec(), true)
        };
        let history = self.traj.messages.clone();
        let p = self.finish_prepare(
            "input_ids",
            context,
            new_segment,
            history,
            Vec::new(),
            Vec::new(),
            max_tokens,
        )?;
        self.last = None;
        Ok(p)
    }

    /// The previous call and the new messages when `api` continues it.
    fn continuation(&self, api: &[ApiMessage], tools: &[Value]) -> Option<(&Last, Vec<Message>)> {
        let last = self.last.as_ref()?;
        let n = last.api_len;
        if api.len() <= n + 1 || last.tools != tools || api[..n] != last.api_prefix[..] {
            return None;
        }
        if !last.reply.is(&api[n]) {
            return None;
        }
        let rest = &api[n + 1..];
        if rest.iter().any(|m| m.role == "assistant") {
            return None;
        }
        // Names of tool results come from the calls they answer, in the whole conversation.
        let all = render::messages(api);
        Some((last, all[n + 1..].to_vec()))
    }

    /// The sampling of call `turn`.
    pub fn sampling(&self, client: SamplingParams) -> SamplingParams {
        match &self.spec.sampling {
            None => client,
            Some(s) => {
                let (seed, group, sample) = self.spec.seeds;
                SamplingParams {
                    seed: mtrl_core::rng::sample_seed(
                        seed,
                        group,
                        sample,
                        u64::from(self.traj.turns),
                    ),
                    ..s.clone()
                }
            }
        }
    }

    /// Records a finished call; returns the reply and whether the message ended.
    pub fn record(
        &mut self,
        p: Prepared,
        c: &Completion,
        parse_tools: bool,
        parallel: bool,
        id_prefix: &str,
    ) -> Result<(Reply, bool), ApiError> {
        if p.new_segment && !self.traj.tokens.is_empty() {
            self.seg_start = self.traj.tokens.len();
            self.traj.segment_starts.push(self.seg_start);
        }
        self.traj.push_context(&p.context);
        if self.traj.prompt_len == 0 {
            self.traj.prompt_len = self.traj.tokens.len();
        }
        let logprobs = c.behaviour_logprobs(self.spec.sampled_logprobs);
        self.traj.push_sampled(&c.tokens, logprobs, &c.versions);
        self.traj.turns += 1;
        let (text, ended) = render::message_text(self.spec.codec.as_ref(), &c.tokens)?;
        if !ended {
            self.traj.failure = Some(if p.capped && c.tokens.len() == p.max_new_tokens {
                FailureReason::ContextOverflow
            } else {
                FailureReason::TokenLimit
            });
        }
        let reply = render::reply(&text, parse_tools, parallel, id_prefix);
        for (_, name, _) in &reply.tool_calls {
            self.traj.tools.count_call(name);
        }
        for (_, e) in &reply.invalid {
            self.traj
                .tools
                .count_error(mtrl_core::CallErrorKind::MalformedCall, e);
        }
        let mut history = p.history;
        history.push(Message::assistant(text));
        self.traj.messages = history.clone();
        self.last = Some(Last {
            history,
            reply: reply.clone(),
            api_len: p.api.len(),
            api_prefix: p.api,
            tools: p.tools,
        });
        Ok((reply, ended))
    }

    /// The captured record so far (reward not applied).
    pub fn trajectory(&self) -> &Trajectory {
        &self.traj
    }

    /// The finished trajectory: the agent's reward, or `failure_reward` when a budget ran out or
    /// the agent named a policy failure; per-turn rewards when the agent gave one per call. An
    /// error when the agent itself failed (`status: "failed"` without a reason): the attempt
    /// is retried — unless this endpoint saw the policy spend a budget first, which an agent
    /// that gave up on the refused call would only repeat.
    pub fn finish(&self, failure_reward: f64) -> Result<Trajectory, String> {
        let mut t = self.traj.clone();
        t.scores = self.report.metrics.clone();
        if t.failure.is_none() {
            if let Some(e) = &self.report.error {
                return Err(format!("the agent failed: {e}"));
            }
            t.failure = self.report.agent_failure;
        }
        if t.failure.is_some() {
            t.reward = failure_reward;
            return Ok(t);
        }
        match &self.report.reward {
            None => return Err("the agent reported no reward".into()),
            Some(Reward::Total(r)) => t.reward = *r,
            Some(Reward::PerTurn(r)) => {
                let turns = t.sampled_runs().len();
                if r.len() != turns {
                    return Err(format!(
                        "the agent reported {} per-turn rewards for {turns} model calls",
                        r.len()
                    ));
                }
                t.turn_rewards = r.clone();
                t.reward = r.iter().sum();
            }
        }
        Ok(t)
    }
}
