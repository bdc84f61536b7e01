//! The episode record that rollout produces and the learner consumes.
//!
//! Invariants (checked by [`Trajectory::check`]):
//! - in token mode `tokens`, `loss_mask`, `logprobs` and `versions` have one entry per token;
//! - `loss_mask[i] == 1` exactly on ids the policy sampled; every other token (prompt, tool output,
//!   template glue) has `loss_mask 0`, `logprob 0.0` and `version 0`. Zeros rather than NaN so that
//!   sums over masked vectors stay finite; consumers must use the mask, never the values, to tell
//!   sampled tokens apart (a staleness check takes the oldest version *under the mask*);
//! - a failed episode (`failure` set) carries the configured failure reward.
//!
//! In text mode (scripted policies, no tokenizer) the four token vectors are empty.
//! Serialised trajectories carry [`TRAJECTORY_FORMAT_VERSION`] (2 added `tool_calls`; a version-1
//! record reads with an empty list).

use serde::{Deserialize, Serialize};

use crate::chat::Message;

/// Version of the serialised [`Trajectory`] layout.
pub const TRAJECTORY_FORMAT_VERSION: u32 = 2;

/// Why an episode failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureReason {
    /// `max_turns` assistant messages without a final answer.
    TurnLimit,
    /// A generation reached `max_tokens_per_turn` before ending its message.
    TokenLimit,
    /// The conversation outgrew `max_context_tokens`.
    ContextOverflow,
    /// The assistant ended its turn without calling any tool and without an answer.
    NoAnswer,
    /// The last attempt at a final answer was malformed and no turn was left to fix it.
    InvalidAnswer,
}

impl FailureReason {
    pub const ALL: [FailureReason; 5] = [
        FailureReason::TurnLimit,
        FailureReason::TokenLimit,
        FailureReason::ContextOverflow,
        FailureReason::NoAnswer,
        FailureReason::InvalidAnswer,
    ];

    /// The serialised name (`turn_limit`, …).
    pub fn as_str(&self) -> &'static str {
        match self {
            FailureReason::TurnLimit => "turn_limit",
            FailureReason::TokenLimit => "token_limit",
            FailureReason::ContextOverflow => "context_overflow",
            FailureReason::NoAnswer => "no_answer",
            FailureReason::InvalidAnswer => "invalid_answer",
        }
    }
}

/// What kind of tool call the environment answered with an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallErrorKind {
    /// The call could not be read: bad JSON, no `name`, unterminated block, … .
    MalformedCall,
    /// A well-formed call to a tool the environment does not have.
    UnknownTool,
    /// A known tool refused its arguments (missing query, unknown document id, …).
    InvalidArguments,
    /// More calls in one message than `env.max_calls_per_turn`.
    TooManyCalls,
}

impl CallErrorKind {
    pub const ALL: [CallErrorKind; 4] = [
        CallErrorKind::MalformedCall,
        CallErrorKind::UnknownTool,
        CallErrorKind::InvalidArguments,
        CallErrorKind::TooManyCalls,
    ];

    /// The serialised name (`malformed_call`, …).
    pub fn as_str(&self) -> &'static str {
        match self {
            CallErrorKind::MalformedCall => "malformed_call",
            CallErrorKind::UnknownTool => "unknown_tool",
            CallErrorKind::InvalidArguments => "invalid_arguments",
            CallErrorKind::TooManyCalls => "too_many_calls",
        }
    }
}

/// Tool-call bookkeeping of one episode.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ToolStats {
    /// Well-formed calls per tool name, in first-use order.
    pub calls: Vec<(String, u32)>,
    /// Calls answered with an error tool response (bad JSON, unknown tool, bad arguments, …).
    pub errors: u32,
    /// The error messages, in order (what the model was told).
    pub error_messages: Vec<String>,
    /// Errors per kind, in first-seen order (absent in records written before kinds were kept).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub error_kinds: Vec<(CallErrorKind, u32)>,
}

impl ToolStats {
    pub fn count_call(&mut self, name: &str) {
        match self.calls.iter_mut().find(|(n, _)| n == name) {
            Some((_, c)) => *c += 1,
            None => self.calls.push((name.to_string(), 1)),
        }
    }

    pub fn count_error(&mut self, kind: CallErrorKind, message: &str) {
        self.errors += 1;
        self.error_messages.push(message.to_string());
        match self.error_kinds.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, c)) => *c += 1,
            None => self.error_kinds.push((kind, 1)),
        }
    }

    /// Errors of `kind` in this episode.
    pub fn errors_of(&self, kind: CallErrorKind) -> u32 {
        self.error_kinds
            .iter()
            .find(|(k, _)| *k == kind)
            .map_or(0, |(_, c)| *c)
    }

    pub fn total_calls(&self) -> u32 {
        self.calls.iter().map(|(_, c)| c).sum()
    }
}

/// One executed tool call, in the order the environment ran them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ToolCallRecord {
    /// The assistant turn (1-based) whose message made the call.
    pub turn: u32,
    /// The tool called (`error` when the call could not be parsed).
    pub name: String,
    /// The parsed JSON arguments (`null` when the call could not be parsed).
    pub arguments: serde_json::Value,
    /// Document ids the tool returned (search hits best first; the submitted list for `submit`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub result_ids: Vec<String>,
    /// Wall time of the call in milliseconds.
    pub latency_ms: f64,
    /// The error the model was shown, when the call failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One finished episode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Trajectory {
    pub format_version: u32,
    pub task_id: String,
    /// Every token of the episode, prompt included (empty in text mode).
    pub tokens: Vec<u32>,
    /// 1 on policy-sampled tokens, 0 elsewhere.
    pub loss_mask: Vec<u8>,
    /// Behaviour log-prob of each sampled token; 0.0 where `loss_mask` is 0.
    pub logprobs: Vec<f32>,
    /// Policy version that sampled each token; 0 where `loss_mask` is 0.
    pub versions: Vec<u64>,
    /// Number of prompt tokens at the start of `tokens`.
    pub prompt_len: usize,
    /// Where a new sequence starts in `tokens`, after the first (empty: one sequence). An external
    /// agent that rewrites its history continues in a new *segment*: its ids are not a
    /// continuation of the previous call's, so the learner trains each segment as its own row
    /// (with the trajectory's advantages) instead of re-tokenizing anything. Every segment starts
    /// with context (`loss_mask` 0), so sampled runs never cross a boundary.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub segment_starts: Vec<usize>,
    /// Final reward (the failure reward when `failure` is set).
    pub reward: f64,
    /// A reward per model call (turn), when the environment or an external agent gives them;
    /// empty = the whole `reward` at the last turn. When set, its sum is `reward`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub turn_rewards: Vec<f64>,
    /// Named reward components (e.g. `ndcg@10`) of the submitted answer, when there was one.
    pub scores: Vec<(String, f64)>,
    pub failure: Option<FailureReason>,
    /// Assistant messages written.
    pub turns: u32,
    pub tools: ToolStats,
    /// Every tool call with its arguments, result ids and latency.
    #[serde(default)]
    pub tool_calls: Vec<ToolCallRecord>,
    /// The final answer (ranked document ids), when one was submitted.
    pub answer: Option<Vec<String>>,
    /// The conversation, assistant messages holding the raw text the model wrote.
    pub messages: Vec<Message>,
}

impl Trajectory {
    /// An empty record for `task_id`.
    pub fn new(task_id: impl Into<String>) -> Trajectory {
        Trajectory {
            format_version: TRAJECTORY_FORMAT_VERSION,
            task_id: task_id.into(),
            tokens: Vec::new(),
            loss_mask: Vec::new(),
            logprobs: Vec::new(),
            versions: Vec::new(),
            prompt_len: 0,
            segment_starts: Vec::new(),
            reward: 0.0,
            turn_rewards: Vec::new(),
            scores: Vec::new(),
            failure: None,
            turns: 0,
            tools: ToolStats::default(),
            tool_calls: Vec::new(),
            answer: None,
            messages: Vec::new(),
        }
    }

    /// Appends ids the policy did not sample (prompt, tool output, glue).
    pub fn push_context(&mut self, ids: &[u32]) {
        self.tokens.extend_from_slice(ids);
        self.loss_mask.extend(std::iter::repeat_n(0, ids.len()));
        self.logprobs.extend(std::iter::repeat_n(0.0, ids.len()));
        self.versions.extend(std::iter::repeat_n(0, ids.len()));
    }

    /// Appends sampled ids with their behaviour log-probs and versions (equal lengths required).
    pub fn push_sampled(&mut self, ids: &[u32], logprobs: &[f32], versions: &[u64]) -> bool {
        if ids.len() != logprobs.len() || ids.len() != versions.len() {
            return false;
        }
        self.tokens.extend_from_slice(ids);
        self.loss_mask.extend(std::iter::repeat_n(1, ids.len()));
        self.logprobs.extend_from_slice(logprobs);
        self.versions.extend_from_slice(versions);
        true
    }

    /// Lengths of the runs of sampled tokens: one per model call (turn) that produced tokens.
    pub fn sampled_runs(&self) -> Vec<usize> {
        let mut runs = Vec::new();
        let mut prev = 0u8;
        for &m in &self.loss_mask {
            if m == 1 {
                if prev == 1 {
                    *runs.last_mut().expect("a run is open") += 1;
                } else {
                    runs.push(1);
                }
            }
            prev = m;
        }
        runs
    }

    /// The token ranges of the trajectory's sequences, in order (one unless the history was
    /// rewritten; see `segment_starts`).
    pub fn segments(&self) -> Vec<std::ops::Range<usize>> {
        let mut bounds = vec![0];
        bounds.extend(self.segment_starts.iter().copied());
        bounds.push(self.tokens.len());
        bounds.windows(2).map(|w| w[0]..w[1]).collect()
    }

    /// Number of policy-sampled tokens.
    pub fn sampled_tokens(&self) -> usize {
        self.loss_mask.iter().filter(|m| **m == 1).count()
    }

    /// Checks the per-token invariants; returns what is wrong.
    pub fn check(&self) -> std::result::Result<(), String> {
        let n = self.tokens.len();
        if self.loss_mask.len() != n || self.logprobs.len() != n || self.versions.len() != n {
            return Err(format!(
                "token vectors differ in length: tokens {n}, loss_mask {}, logprobs {}, versions {}",
                self.loss_mask.len(),
                self.logprobs.len(),
                self.versions.len()
            ));
        }
        for i in 0..n {
            match self.loss_mask[i] {
                0 if self.logprobs[i] != 0.0 || self.versions[i] != 0 => {
                    return Err(format!(
                        "token {i} is not sampled but has a logprob or version"
                    ))
                }
                0 | 1 => {}
                m => return Err(format!("token {i} has loss_mask {m}")),
            }
        }
        if self.prompt_len > n || self.loss_mask[..self.prompt_len].contains(&1) {
            return Err("prompt tokens must not be sampled".into());
        }
        let mut prev = 0;
        for &s in &self.segment_starts {
            if s <= prev || s >= n {
                return Err(format!(
                    "segment start {s} is not after {prev} and inside the {n} tokens"
                ));
            }
            if self.loss_mask[s] == 1 {
                return Err(format!("segment start {s} is a sampled token"));
            }
            prev = s;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_vectors_stay_aligned() {
        let mut t = Trajectory::new("q1");
        t.push_context(&[1, 2, 3]);
        t.prompt_len = 3;
        assert!(t.push_sampled(&[4, 5], &[-0.5, -1.0], &[7, 7]));
        assert!(!t.push_sampled(&[6], &[], &[]));
        t.push_context(&[9]);
        assert_eq!(t.loss_mask, vec![0, 0, 0, 1, 1, 0]);
        assert_eq!(t.sampled_tokens(), 2);
        t.check().unwrap();
        t.versions[0] = 3;
        assert!(t.check().is_err());
        t.versions[0] = 0;
        assert_eq!(t.segments(), vec![0..6]);
        t.segment_starts = vec![5];
        t.check().unwrap();
        assert_eq!(t.segments(), vec![0..5, 5..6]);
        t.segment_starts = vec![4];
        assert!(t.check().unwrap_err().contains("sampled"));
        t.segment_starts = vec![6];
        assert!(t.check().is_err());
    }

    #[test]
    fn serialises_with_version_and_snake_case_failure() {
        let mut t = Trajectory::new("q");
        t.failure = Some(FailureReason::TurnLimit);
        t.tools.count_call("bm25_search");
        t.tools.count_call("bm25_search");
        t.tools
            .count_error(CallErrorKind::MalformedCall, "bad json");
        t.tool_calls.push(ToolCallRecord {
            turn: 1,
            name: "bm25_search".into(),
            arguments: serde_json::json!({"query": "q"}),
            result_ids: vec!["d1".into()],
            latency_ms: 1.5,
            error: None,
        });
        let v = serde_json::to_value(&t).unwrap();
        assert_eq!(v["format_version"], TRAJECTORY_FORMAT_VERSION);
        assert_eq!(v["failure"], "turn_limit");
        assert_eq!(t.tools.total_calls(), 2);
        let back: Trajectory = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(back, t);
        // Version 1 had no `tool_calls`: it still reads, with none.
        let mut v1 = v;
        v1.as_object_mut().unwrap().remove("tool_calls");
        let old: Trajectory = serde_json::from_value(v1).unwrap();
        assert!(old.tool_calls.is_empty());
        for f in FailureReason::ALL {
            assert_eq!(serde_json::to_value(f).unwrap(), f.as_str());
        }
    }
}
