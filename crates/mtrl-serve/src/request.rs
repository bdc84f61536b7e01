//! Parsing request bodies into typed requests. Every failure is an [`ApiError`] 400 naming the
//! field (`messages[1].content`, `temperature`, …); no input panics (fuzzed in
//! `tests/request_fuzz.rs`). Unknown top-level fields are refused by name, except those listed
//! as accepted-and-ignored in [`IGNORED`], so a client's setting is never silently dropped.

use serde_json::{Map, Value};

use crate::error::ApiError;

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
    /// `status: "failed"` on complete-rollout, or an mtrl `failure` reason name.
    pub failure: Option<String>,
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

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Typed reads of an object's fields, each error naming `prefix.key`.
struct Fields<'a> {
    map: &'a Map<String, Value>,
    prefix: String,
}

impl<'a> Fields<'a> {
    fn new(map: &'a Map<String, Value>, prefix: &str) -> Self {
        Fields {
            map,
            prefix: prefix.to_string(),
        }
    }

    fn path(&self, key: &str) -> String {
        if self.prefix.is_empty() {
            key.to_string()
        } else {
            format!("{}.{key}", self.prefix)
        }
    }

    fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    fn only(&self, allowed: &[&str]) -> Result<(), ApiError> {
        for k in self.map.keys() {
            let ignored = self.prefix.is_empty() && IGNORED.contains(&k.as_str());
            if !(allowed.contains(&k.as_str()) || ignored) {
                return Err(ApiError::field(
                    self.path(k),
                    format!("unknown field (accepted: {})", allowed.join(", ")),
                ));
            }
        }
        Ok(())
    }

    fn str(&self, key: &str) -> Result<Option<&'a str>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(ApiError::field(
                self.path(key),
                format!("must be a string, not {}", kind(v)),
            )),
        }
    }

    fn bool(&self, key: &str) -> Result<Option<bool>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(ApiError::field(
                self.path(key),
                format!("must be true or false, not {}", kind(v)),
            )),
        }
    }

    fn f64_in(&self, key: &str, lo: f64, hi: f64) -> Result<Option<f64>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Number(n)) => match n.as_f64() {
                Some(x) if x >= lo && x <= hi => Ok(Some(x)),
                _ => Err(ApiError::field(
                    self.path(key),
                    format!("must be a number in [{lo}, {hi}], not {n}"),
                )),
            },
            Some(v) => Err(ApiError::field(
                self.path(key),
                format!("must be a number, not {}", kind(v)),
            )),
        }
    }

    fn uint_in(&self, key: &str, lo: u64, hi: u64) -> Result<Option<u64>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Number(n)) => match n.as_u64() {
                Some(x) if x >= lo && x <= hi => Ok(Some(x)),
                _ => Err(ApiError::field(
                    self.path(key),
                    format!("must be an integer in [{lo}, {hi}], not {n}"),
                )),
            },
            Some(v) => Err(ApiError::field(
                self.path(key),
                format!("must be an integer, not {}", kind(v)),
            )),
        }
    }

    fn array(&self, key: &str) -> Result<Option<&'a Vec<Value>>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(a)) => Ok(Some(a)),
            Some(v) => Err(ApiError::field(
                self.path(key),
                format!("must be an array, not {}", kind(v)),
            )),
        }
    }

    fn ids(&self, key: &str) -> Result<Option<Vec<u32>>, ApiError> {
        let Some(a) = self.array(key)? else {
            return Ok(None);
        };
        a.iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_u64()
                    .filter(|&x| x <= u64::from(u32::MAX))
                    .map(|x| x as u32)
                    .ok_or_else(|| {
                        ApiError::field(
                            format!("{}[{i}]", self.path(key)),
                            "must be a token id (an integer ≥ 0)",
                        )
                    })
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }
}

fn as_object<'a>(v: &'a Value, path: &str) -> Result<&'a Map<String, Value>, ApiError> {
    v.as_object()
        .ok_or_else(|| ApiError::field(path, format!("must be an object, not {}", kind(v))))
}

/// The sampling fields of a request (`max_tokens` capped at `max_tokens_cap` by the caller).
fn sampling(f: &Fields<'_>) -> Result<Sampling, ApiError> {
    for key in ["presence_penalty", "frequency_penalty"] {
        if let Some(x) = f.f64_in(key, -2.0, 2.0)? {
            if x != 0.0 {
                return Err(ApiError::field(key, "penalties are not supported (only 0)"));
            }
        }
    }
    let max_tokens = match f.uint_in("max_completion_tokens", 1, 1 << 20)? {
        Some(m) => Some(m),
        None => f.uint_in("max_tokens", 1, 1 << 20)?,
    };
    let stop = match f.get("stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) if a.len() <= 16 => a
            .iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_str()
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .ok_or_else(|| {
                        ApiError::field(format!("stop[{i}]"), "must be a non-empty string")
                    })
            })
            .collect::<Result<_, _>>()?,
        Some(_) => {
            return Err(ApiError::field(
                "stop",
                "must be a string or an array of at most 16 strings",
            ))
        }
    };
    Ok(Sampling {
        temperature: f.f64_in("temperature", 0.0, 2.0)?,
        top_p: match f.f64_in("top_p", 0.0, 1.0)? {
            Some(0.0) => return Err(ApiError::field("top_p", "must be in (0, 1]")),
            p => p,
        },
        top_k: match f.get("top_k").and_then(Value::as_i64) {
            Some(-1) => Some(0),
            _ => f.uint_in("top_k", 0, 1 << 20)?.map(|k| k as usize),
        },
        max_tokens: max_tokens.map(|m| m as usize),
        seed: match f.get("seed").and_then(Value::as_i64) {
            Some(s) if s < 0 => Some(s as u64),
            _ => f.uint_in("seed", 0, u64::MAX)?,
        },
        stop,
        n: f.uint_in("n", 1, 16)?.unwrap_or(1) as usize,
    })
}

const SAMPLING_KEYS: &[&str] = &[
    "temperature",
    "top_p",
    "top_k",
    "max_tokens",
    "max_completion_tokens",
    "seed",
    "stop",
    "n",
    "presence_penalty",
    "frequency_penalty",
];

fn keys(extra: &[&'static str]) -> Vec<&'static str> {
    let mut k: Vec<&str> = SAMPLING_KEYS.to_vec();
    k.extend_from_slice(extra);
    k
}

/// Parses `POST /v1/chat/completions`.
pub fn chat(body: &[u8]) -> Result<ChatRequest, ApiError> {
    let map = object(body)?;
    let f = Fields::new(&map, "");
    f.only(&keys(&[
        "model",
        "messages",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "logprobs",
        "top_logprobs",
        "stream",
        "stream_options",
        "return_token_ids",
    ]))?;
    let messages = f
        .array("messages")?
        .ok_or_else(|| ApiError::field("messages", "is required"))?;
    if messages.is_empty() {
        return Err(ApiError::field("messages", "must not be empty"));
    }
    let messages = messages
        .iter()
        .enumerate()
        .map(|(i, m)| message(m, &format!("messages[{i}]")))
        .collect::<Result<Vec<_>, _>>()?;
    let tools = match f.array("tools")? {
        None => Vec::new(),
        Some(a) => a
            .iter()
            .enumerate()
            .map(|(i, t)| tool_schema(t, &format!("tools[{i}]")))
            .collect::<Result<_, _>>()?,
    };
    let parse_tools = match f.get("tool_choice") {
        None => true,
        Some(Value::String(s)) if s == "auto" => true,
        Some(Value::String(s)) if s == "none" => false,
        Some(_) => {
            return Err(ApiError::field(
                "tool_choice",
                "only \"auto\" and \"none\" are supported (a Qwen policy cannot be forced to call a tool)",
            ))
        }
    };
    if f.uint_in("top_logprobs", 0, 20)?.unwrap_or(0) > 0 {
        return Err(ApiError::field(
            "top_logprobs",
            "only 0 is supported: each sampled token's own log-prob is returned",
        ));
    }
    let include_usage = match f.get("stream_options") {
        None => false,
        Some(v) => {
            let o = Fields::new(as_object(v, "stream_options")?, "stream_options");
            o.only(&["include_usage"])?;
            o.bool("include_usage")?.unwrap_or(false)
        }
    };
    Ok(ChatRequest {
        model: f.str("model")?.map(str::to_string),
        messages,
        tools,
        parse_tools,
        parallel_tool_calls: f.bool("parallel_tool_calls")?.unwrap_or(true),
        sampling: sampling(&f)?,
        logprobs: f.bool("logprobs")?.unwrap_or(false),
        stream: f.bool("stream")?.unwrap_or(false),
        include_usage,
        return_token_ids: f.bool("return_token_ids")?.unwrap_or(false),
    })
}

fn tool_schema(t: &Value, path: &str) -> Result<Value, ApiError> {
    let o = Fields::new(as_object(t, path)?, path);
    match o.str("type")? {
        Some("function") => {}
        _ => {
            return Err(ApiError::field(
                format!("{path}.type"),
                "must be \"function\"",
            ))
        }
    }
    let func = o
        .get("function")
        .ok_or_else(|| ApiError::field(format!("{path}.function"), "is required"))?;
    let fo = Fields::new(
        as_object(func, &format!("{path}.function"))?,
        &format!("{path}.function"),
    );
    match fo.str("name")? {
        Some(n) if !n.trim().is_empty() => {}
        _ => {
            return Err(ApiError::field(
                format!("{path}.function.name"),
                "is required",
            ))
        }
    }
    Ok(t.clone())
}

fn content(v: Option<&Value>, path: &str) -> Result<String, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut out = String::new();
            for (i, p) in parts.iter().enumerate() {
                let pp = format!("{path}[{i}]");
                let o = Fields::new(as_object(p, &pp)?, &pp);
                match (o.str("type")?, o.str("text")?) {
                    (Some("text"), Some(t)) => out.push_str(t),
                    (Some("text"), None) => {
                        return Err(ApiError::field(format!("{pp}.text"), "is required"))
                    }
                    _ => {
                        return Err(ApiError::field(
                            format!("{pp}.type"),
                            "only text parts are supported",
                        ))
                    }
                }
            }
            Ok(out)
        }
        Some(v) => Err(ApiError::field(
            path,
            format!(
                "must be a string or an array of text parts, not {}",
                kind(v)
            ),
        )),
    }
}

fn message(v: &Value, path: &str) -> Result<ApiMessage, ApiError> {
    let o = Fields::new(as_object(v, path)?, path);
    let role = match o.str("role")? {
        Some(r @ ("system" | "user" | "assistant" | "tool")) => r.to_string(),
        Some("developer") => "system".to_string(),
        Some(r) => {
            return Err(ApiError::field(
                format!("{path}.role"),
                format!("unknown role `{r}`"),
            ))
        }
        None => return Err(ApiError::field(format!("{path}.role"), "is required")),
    };
    // `invalid_tool_calls` is this server's own reply field, accepted when a reply is echoed.
    o.only(&[
        "role",
        "content",
        "tool_calls",
        "tool_call_id",
        "name",
        "refusal",
        "reasoning_content",
        "invalid_tool_calls",
    ])?;
    let content = content(o.get("content"), &format!("{path}.content"))?;
    let mut tool_calls = Vec::new();
    if let Some(calls) = o.array("tool_calls")? {
        if role != "assistant" {
            return Err(ApiError::field(
                format!("{path}.tool_calls"),
                "only assistant messages have tool calls",
            ));
        }
        for (j, c) in calls.iter().enumerate() {
            tool_calls.push(tool_call(c, &format!("{path}.tool_calls[{j}]"))?);
        }
    }
    let tool_call_id = o.str("tool_call_id")?.map(str::to_string);
    if role == "tool" && tool_call_id.is_none() && o.str("name")?.is_none() {
        return Err(ApiError::field(
            format!("{path}.tool_call_id"),
            "is required on tool messages",
        ));
    }
    Ok(ApiMessage {
        role,
        content,
        tool_calls,
        tool_call_id,
        name: o.str("name")?.map(str::to_string),
    })
}

fn tool_call(v: &Value, path: &str) -> Result<ApiToolCall, ApiError> {
    let o = Fields::new(as_object(v, path)?, path);
    let id = o.str("id")?.unwrap_or_default().to_string();
    let func = o
        .get("function")
        .ok_or_else(|| ApiError::field(format!("{path}.function"), "is required"))?;
    let fp = format!("{path}.function");
    let fo = Fields::new(as_object(func, &fp)?, &fp);
    let name = match fo.str("name")? {
        Some(n) if !n.is_empty() => n.to_string(),
        _ => return Err(ApiError::field(format!("{fp}.name"), "is required")),
    };
    let arguments = match fo.get("arguments") {
        None => Value::Object(Map::new()),
        Some(Value::String(s)) if s.trim().is_empty() => Value::Object(Map::new()),
        Some(Value::String(s)) => serde_json::from_str::<Value>(s)
            .map_err(|e| ApiError::field(format!("{fp}.arguments"), format!("is not JSON: {e}")))?,
        Some(a @ Value::Object(_)) => a.clone(),
        Some(v) => {
            return Err(ApiError::field(
                format!("{fp}.arguments"),
                format!("must be a JSON string, not {}", kind(v)),
            ))
        }
    };
    Ok(ApiToolCall {
        id,
        name,
        arguments,
    })
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
/// `reward`, `status`; mtrl's `failure` and `metrics`).
pub fn reward_report(body: &[u8]) -> Result<RewardReport, ApiError> {
    let map = object(body)?;
    let f = Fields::new(&map, "");
    f.only(&[
        "trajectoryId",
        "trajectory_id",
        "reward",
        "rewards",
        "status",
        "failure",
        "metrics",
    ])?;
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
    let failure = match (f.str("status")?, f.str("failure")?) {
        (_, Some(r)) => Some(r.to_string()),
        (Some("failed" | "failure" | "error"), None) => Some("agent_failed".to_string()),
        // `processing` / `in_progress`: the agent runs on and reports through the routes.
        (
            Some("success" | "succeeded" | "completed" | "ok" | "processing" | "in_progress"),
            None,
        )
        | (None, None) => None,
        (Some(s), None) => {
            return Err(ApiError::field(
                "status",
                format!("unknown status `{s}` (success or failed)"),
            ))
        }
    };
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
        assert_eq!(r.failure.as_deref(), Some("agent_failed"));
        let e = err(reward_report(br#"{"reward": "high"}"#));
        assert_eq!(e.param.as_deref(), Some("reward"));
        let e = err(sample(br#"{"input_ids": [1, -2]}"#));
        assert_eq!(e.param.as_deref(), Some("input_ids[1]"));
    }
}
