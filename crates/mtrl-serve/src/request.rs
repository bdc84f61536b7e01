//! Parsing request bodies into typed requests. Every failure is an [`ApiError`] 400 naming the
//! field (`messages[1].content`, `temperature`, …); no input panics (fuzzed in
//! `tests/request_fuzz.rs`). Unknown top-level fields are refused by name, except those listed
//! as accepted-and-ignored in [`IGNORED`], so a client's setting is never silently dropped.

use mtrl_core::FailureReason;
use serde_json::{Map, Value};

use crate::error::ApiError;

mod chat;
mod fields;

pub use chat::chat;
use fields::{as_object, keys, kind, sampling, Fields};

/// OpenAI fields that do not change what this server does and are accepted as such
/// (`user`, `metadata`, `store`: bookkeeping; `service_tier`: one tier).
pub const IGNORED: &[&str] = &["user", "metadata", "store", "service_tier"];

/// A chat message as the client sent it (OpenAI shape).
#[derive(Debug, Clone, PartialEq)]
pub struct ApiMessage {
    pub role: String,
    pub content: String,
    /// Assistant tool calls: (id, name, arguments JSON object).
    pub tool_calls: Vec<ApiToolCall>,
    pub tool_call_id: Option<String>,
    pub name: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ApiToolCall {
    pub id: String,
    pub name: String,
    pub arguments: Value,
}

/// Sampling settings common to the generation routes.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Sampling {
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<usize>,
    pub max_tokens: Option<usize>,
    pub seed: Option<u64>,
    pub stop: Vec<String>,
    pub n: usize,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatRequest {
    pub model: Option<String>,
    pub messages: Vec<ApiMessage>,
    /// OpenAI function schemas, passed to the chat template as given.
    pub tools: Vec<Value>,
    /// `tool_choice = "none"`: tool calls the model writes stay in the text.
    pub parse_tools: bool,
    /// `parallel_tool_calls = false`: only the first call is returned.
    pub parallel_tool_calls: bool,
    pub sampling: Sampling,
    pub logprobs: bool,
    pub stream: bool,
    pub include_usage: bool,
    /// vLLM's `return_token_ids`: the choice carries `token_ids` and `prompt_token_ids`.
    pub return_token_ids: bool,
}

/// `POST /v1/completions`.
#[derive(Debug, Clone, PartialEq)]
pub struct CompletionRequest {
    pub model: Option<String>,
    pub prompt: Prompt,
    pub sampling: Sampling,
    pub logprobs: bool,
    pub echo: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    Text(String),
    Ids(Vec<u32>),
}

/// `POST /sample`: token ids in, ids and log-probs out.
#[derive(Debug, Clone, PartialEq)]
pub struct SampleRequest {
    pub input_ids: Vec<u32>,
    pub sampling: Sampling,
    pub stop_token_ids: Vec<u32>,
}

/// `POST /update-reward` and `POST /complete-rollout`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RewardReport {
    pub trajectory: Option<String>,
    /// One scalar, or one per model call.
    pub reward: Option<Reward>,
    /// A policy failure: mtrl's `failure` field, a [`FailureReason`] name (trained with the
    /// failure reward).
    pub failure: Option<FailureReason>,
    /// An infrastructure failure: `status: "failed"` without a `failure` reason (the managed
    /// service's "do not use this trajectory"; the attempt is retried).
    pub error: Option<String>,
    /// Named figures (e.g. `ndcg@10`), kept as the trajectory's scores.
    pub metrics: Vec<(String, f64)>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Reward {
    Total(f64),
    PerTurn(Vec<f64>),
}

/// Parses a body as a JSON object.
pub fn object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}")))?;
    match v {
        Value::Object(m) => Ok(m),
        other => Err(ApiError::bad_request(format!(
            "the body must be a JSON object, not {}",
            kind(&other)
        ))),
    }
}

/// Parses `POST /v1/completions`.
pub fn completion(body: &[u8]) -> Result<CompletionRequest, ApiError> {
    let map = object(body)?;
    let f = Fields::new(&map, "");
    f.only(&keys(&["model", "prompt", "logprobs", "echo", "stream"]))?;
    if f.bool("stream")?.unwrap_or(false) {
        return Err(ApiError::field(
            "stream",
            "streaming is supported on /v1/chat/completions only",
        ));
    }
    let prompt = match f.get("prompt") {
        Some(Value::String(s)) => Prompt::Text(s.clone()),
        Some(Value::Array(_)) => Prompt::Ids(f.ids("prompt")?.unwrap_or_default()),
        Some(_) => {
            return Err(ApiError::field(
                "prompt",
                "must be a string or an array of token ids",
            ))
        }
        None => return Err(ApiError::field("prompt", "is required")),
    };
    if matches!(&prompt, Prompt::Ids(v) if v.is_empty()) {
        return Err(ApiError::field("prompt", "must not be empty"));
    }
    let logprobs = match f.get("logprobs") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(Value::Number(n)) if n.as_u64() == Some(0) || n.as_u64() == Some(1) => true,
        Some(_) => {
            return Err(ApiError::field(
                "logprobs",
                "only 0 or 1 (the sampled token's own log-prob) is supported",
            ))
        }
    };
    Ok(CompletionRequest {
        model: f.str("model")?.map(str::to_string),
        prompt,
        sampling: sampling(&f)?,
        logprobs,
        echo: f.bool("echo")?.unwrap_or(false),
    })
}

/// Parses `POST /sample`.
pub fn sample(body: &[u8]) -> Result<SampleRequest, ApiError> {
    let map = object(body)?;
    let f = Fields::new(&map, "");
    f.only(&keys(&["input_ids", "stop_token_ids", "model"]))?;
    let input_ids = f
        .ids("input_ids")?
        .ok_or_else(|| ApiError::field("input_ids", "is required"))?;
    if input_ids.is_empty() {
        return Err(ApiError::field("input_ids", "must not be empty"));
    }
    let s = sampling(&f)?;
    if s.n != 1 {
        return Err(ApiError::field("n", "/sample draws one sequence"));
    }
    Ok(SampleRequest {
        input_ids,
        sampling: s,
        stop_token_ids: f.ids("stop_token_ids")?.unwrap_or_default(),
    })
}

/// Parses `POST /update-reward` and `POST /complete-rollout` (service names `trajectoryId`,
/// `reward`, `status`; mtrl's `failure` and `metrics`). `status: "failed"` alone is the agent's
/// failure (an error, retried); `failure: "<reason>"` the policy's (trained).
pub fn reward_report(body: &[u8]) -> Result<RewardReport, ApiError> {
    let map = object(body)?;
    let mut keys = vec!["trajectoryId", "trajectory_id"];
    keys.extend_from_slice(RESULT_KEYS);
    Fields::new(&map, "").only(&keys)?;
    reward_fields(&map)
}

/// The reward fields of an agent's result object.
pub const RESULT_KEYS: &[&str] = &["reward", "rewards", "status", "failure", "metrics"];

/// Reads the reward fields of `map` ([`RESULT_KEYS`] and the trajectory id); other fields are
/// left alone (an agent's answer carries its own).
pub fn reward_fields(map: &Map<String, Value>) -> Result<RewardReport, ApiError> {
    let f = Fields::new(map, "");
    let trajectory = match f.str("trajectoryId")? {
        Some(t) => Some(t.to_string()),
        None => f.str("trajectory_id")?.map(str::to_string),
    };
    let key = if f.get("reward").is_some() {
        "reward"
    } else {
        "rewards"
    };
    let reward = match f.get(key) {
        None => None,
        Some(Value::Number(n)) => Some(Reward::Total(finite(n.as_f64(), key)?)),
        Some(Value::Array(a)) => Some(Reward::PerTurn(
            a.iter()
                .enumerate()
                .map(|(i, v)| finite(v.as_f64(), &format!("{key}[{i}]")))
                .collect::<Result<_, _>>()?,
        )),
        Some(_) => {
            return Err(ApiError::field(
                key,
                "must be a number or an array of numbers (one per model call)",
            ))
        }
    };
    let failure = match f.str("failure")? {
        None => None,
        Some(name) => Some(
            FailureReason::ALL
                .into_iter()
                .find(|r| r.as_str() == name)
                .ok_or_else(|| {
                    let names: Vec<&str> = FailureReason::ALL.iter().map(|r| r.as_str()).collect();
                    ApiError::field(
                        "failure",
                        format!("unknown failure `{name}` (one of {})", names.join(", ")),
                    )
                })?,
        ),
    };
    let status = f.str("status")?;
    let failed = match status.map(str::to_ascii_lowercase).as_deref() {
        Some("failed" | "failure" | "error") => true,
        // `processing` / `in_progress`: the agent runs on and reports through the routes.
        Some(
            "ready" | "success" | "succeeded" | "completed" | "ok" | "processing" | "in_progress",
        )
        | None => false,
        Some(_) => {
            return Err(ApiError::field(
                "status",
                format!(
                    "unknown status `{}` (ready or failed)",
                    status.unwrap_or_default()
                ),
            ))
        }
    };
    // A named failure is the policy's, whatever the status; a bare "failed" is the agent's.
    let error = (failed && failure.is_none())
        .then(|| "the agent reported status \"failed\" (the rollout hit an error)".to_string());
    let metrics = match f.get("metrics") {
        None => Vec::new(),
        Some(v) => as_object(v, "metrics")?
            .iter()
            .map(|(k, v)| Ok((k.clone(), finite(v.as_f64(), &format!("metrics.{k}"))?)))
            .collect::<Result<_, ApiError>>()?,
    };
    Ok(RewardReport {
        trajectory,
        reward,
        failure,
        error,
        metrics,
    })
}

fn finite(x: Option<f64>, path: &str) -> Result<f64, ApiError> {
    x.filter(|x| x.is_finite())
        .ok_or_else(|| ApiError::field(path, "must be a finite number"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(r: Result<impl std::fmt::Debug, ApiError>) -> ApiError {
        r.unwrap_err()
    }

    #[test]
    fn chat_errors_name_the_field() {
        let e = err(chat(br#"{"messages": [{"role": "user", "content": 3}]}"#));
        assert_eq!(e.param.as_deref(), Some("messages[0].content"));
        let e = err(chat(
            br#"{"messages": [{"role": "user", "content": "hi"}], "temperature": 7}"#,
        ));
        assert_eq!(e.param.as_deref(), Some("temperature"));
        let e = err(chat(
            br#"{"messages": [{"role": "user", "content": "hi"}], "temprature": 1}"#,
        ));
        assert_eq!(e.param.as_deref(), Some("temprature"));
        assert!(e.message.contains("unknown field"), "{}", e.message);
        let bad_args = br#"{"messages": [{"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]}"#;
        let e = err(chat(bad_args));
        assert_eq!(
            e.param.as_deref(),
            Some("messages[0].tool_calls[0].function.arguments")
        );
        let e = err(chat(b"{\"messages\": [] "));
        assert!(e.message.contains("not valid JSON"), "{}", e.message);
        assert_eq!(e.status, 400);
    }

    #[test]
    fn chat_reads_openai_shapes() {
        let r = chat(br#"{"model": "m", "messages": [
            {"role": "developer", "content": [{"type": "text", "text": "be "}, {"type": "text", "text": "brief"}]},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"q\": 1}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "r"}],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
            "max_completion_tokens": 7, "stop": "x", "stream": true, "stream_options": {"include_usage": true},
            "seed": -1, "top_k": -1, "user": "u"}"#)
        .unwrap();
        assert_eq!(r.messages[0].role, "system");
        assert_eq!(r.messages[0].content, "be brief");
        assert_eq!(r.messages[1].tool_calls[0].arguments["q"], 1);
        assert_eq!(r.sampling.max_tokens, Some(7));
        assert_eq!(r.sampling.stop, vec!["x"]);
        assert_eq!(r.sampling.top_k, Some(0));
        assert_eq!(r.sampling.seed, Some(u64::MAX));
        assert!(r.stream && r.include_usage && r.parse_tools);
    }

    #[test]
    fn rewards_scalar_or_per_turn() {
        let r = reward_report(br#"{"trajectoryId": "t", "reward": [0.5, 1]}"#).unwrap();
        assert_eq!(r.reward, Some(Reward::PerTurn(vec![0.5, 1.0])));
        let r = reward_report(br#"{"status": "failed"}"#).unwrap();
        assert_eq!(r.failure, None);
        assert!(r.error.unwrap().contains("failed"));
        let r = reward_report(br#"{"status": "FAILED", "failure": "no_answer"}"#).unwrap();
        assert_eq!((r.failure, r.error), (Some(FailureReason::NoAnswer), None));
        let r = reward_report(br#"{"status": "READY", "reward": 1}"#).unwrap();
        assert_eq!((r.failure, r.error), (None, None));
        let e = err(reward_report(br#"{"failure": "agent_failed"}"#));
        assert_eq!(e.param.as_deref(), Some("failure"));
        let e = err(reward_report(br#"{"reward": "high"}"#));
        assert_eq!(e.param.as_deref(), Some("reward"));
        let e = err(sample(br#"{"input_ids": [1, -2]}"#));
        assert_eq!(e.param.as_deref(), Some("input_ids[1]"));
    }
}
