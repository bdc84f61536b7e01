//! `POST /v1/chat/completions` bodies: messages (text parts, tool calls, tool results), tool
//! schemas, tool choice, streaming options.

use serde_json::{Map, Value};

use super::fields::{as_object, keys, kind, sampling, Fields};
use super::{object, ApiMessage, ApiToolCall, ChatRequest};
use crate::error::ApiError;

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
