//! Between the OpenAI chat shapes and the policy's own text: client messages into the
//! Hugging Face messages the chat template renders, and sampled text back into an OpenAI
//! assistant message (`<tool_call>` blocks → `tool_calls`).

use mtrl_core::{Message, Role, ToolCall};
use mtrl_env::parse_tool_calls;
use serde_json::{json, Value};

use crate::request::ApiMessage;

/// What the server answered for one model call, to recognise it when the agent sends it back.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    /// The text without tool-call blocks, trimmed.
    pub content: String,
    /// Well-formed calls: (id, name, arguments).
    pub tool_calls: Vec<(String, String, Value)>,
    /// Blocks that could not be read: (position among all blocks, reason) — mtrl's
    /// `invalid_tool_calls`, so an agent can answer them in order as the in-process environment
    /// does (`error: <reason>`).
    pub invalid: Vec<(usize, String)>,
}

/// The text of a message's sampled ids without its end-of-turn token, and whether it ended with
/// one (an end-of-turn or EOS id of `codec`).
pub fn message_text(
    codec: &dyn mtrl_core::ChatCodec,
    tokens: &[u32],
) -> Result<(String, bool), crate::error::ApiError> {
    let stops = codec.stop_token_ids();
    let ended = tokens.last().is_some_and(|t| stops.contains(t));
    let body = if ended {
        &tokens[..tokens.len() - 1]
    } else {
        tokens
    };
    let text = codec
        .decode(body)
        .map_err(|e| crate::error::ApiError::status(500, e.to_string()))?;
    Ok((text, ended))
}

/// Splits sampled text into content and tool calls. `parse_tools = false` (`tool_choice =
/// "none"`) leaves everything in the content; `parallel = false` keeps the first call only.
pub fn reply(text: &str, parse_tools: bool, parallel: bool, id_prefix: &str) -> Reply {
    if !parse_tools {
        return Reply {
            content: text.trim().to_string(),
            tool_calls: Vec::new(),
            invalid: Vec::new(),
        };
    }
    let mut tool_calls = Vec::new();
    let mut invalid = Vec::new();
    for (i, call) in parse_tool_calls(text).into_iter().enumerate() {
        match call {
            Ok(c) => tool_calls.push((format!("call_{id_prefix}_{i}"), c.name, c.arguments)),
            Err(e) => invalid.push((i, e.0)),
        }
    }
    if !parallel {
        tool_calls.truncate(1);
    }
    Reply {
        content: strip_blocks(text).trim().to_string(),
        tool_calls,
        invalid,
    }
}

/// The text outside `<tool_call>…</tool_call>` blocks (an unterminated block runs to the end).
fn strip_blocks(text: &str) -> String {
    let (open, close) = (mtrl_env::parser::OPEN, mtrl_env::parser::CLOSE);
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find(open) {
        out.push_str(&rest[..i]);
        match rest[i..].find(close) {
            Some(j) => rest = &rest[i + j + close.len()..],
            None => return out,
        }
    }
    out.push_str(rest);
    out
}

impl Reply {
    /// The OpenAI assistant message.
    pub fn message(&self) -> Value {
        let calls: Vec<Value> = self
            .tool_calls
            .iter()
            .map(|(id, name, args)| {
                json!({"id": id, "type": "function",
                       "function": {"name": name, "arguments": args.to_string()}})
            })
            .collect();
        let mut m = json!({
            "role": "assistant",
            "content": if self.content.is_empty() && !calls.is_empty() { Value::Null } else { Value::String(self.content.clone()) },
        });
        if !calls.is_empty() {
            m["tool_calls"] = Value::Array(calls);
        }
        if !self.invalid.is_empty() {
            m["invalid_tool_calls"] = json!(self
                .invalid
                .iter()
                .map(|(i, e)| json!({"index": i, "error": e}))
                .collect::<Vec<_>>());
        }
        m
    }

    /// The OpenAI finish reason for a completion that ended its message or not.
    pub fn finish_reason(&self, ended: bool) -> &'static str {
        match (ended, self.tool_calls.is_empty()) {
            (false, _) => "length",
            (true, false) => "tool_calls",
            (true, true) => "stop",
        }
    }

    /// Whether `m` (sent back by the agent) is this reply: same content and calls, ids aside.
    pub fn is(&self, m: &ApiMessage) -> bool {
        m.role == "assistant"
            && m.content.trim() == self.content
            && m.tool_calls.len() == self.tool_calls.len()
            && m.tool_calls
                .iter()
                .zip(&self.tool_calls)
                .all(|(a, (_, name, args))| &a.name == name && &a.arguments == args)
    }
}

/// The client's messages as the template's messages. A tool message gets the name of the call
/// its `tool_call_id` answers (else its own `name`).
pub fn messages(api: &[ApiMessage]) -> Vec<Message> {
    let mut out = Vec::with_capacity(api.len());
    for (i, m) in api.iter().enumerate() {
        let role = match m.role.as_str() {
            "system" => Role::System,
            "user" => Role::User,
            "assistant" => Role::Assistant,
            _ => Role::Tool,
        };
        let name = match (&m.tool_call_id, role) {
            (Some(id), Role::Tool) => api[..i]
                .iter()
                .rev()
                .flat_map(|p| &p.tool_calls)
                .find(|c| &c.id == id)
                .map(|c| c.name.clone())
                .or_else(|| m.name.clone()),
            _ => m.name.clone(),
        };
        out.push(Message {
            role,
            content: m.content.clone(),
            tool_calls: m
                .tool_calls
                .iter()
                .map(|c| ToolCall {
                    name: c.name.clone(),
                    arguments: c.arguments.clone(),
                })
                .collect(),
            name: if role == Role::Tool { name } else { None },
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::ApiToolCall;

    #[test]
    fn tool_calls_leave_the_content_and_come_back_recognised() {
        let text = "look<tool_call>\n{\"name\": \"bm25_search\", \"arguments\": {\"query\": \"wing\"}}\n</tool_call> <tool_call>{bad}</tool_call>";
        let r = reply(text, true, true, "t1");
        assert_eq!(r.content, "look");
        assert_eq!(r.tool_calls.len(), 1);
        assert_eq!(r.invalid, vec![(1, "tool call is not valid JSON (key must be a string at line 1 column 2); expected {\"name\": …, \"arguments\": {…}}".to_string())]);
        assert_eq!(r.finish_reason(true), "tool_calls");
        let m = r.message();
        assert_eq!(
            m["tool_calls"][0]["function"]["arguments"],
            "{\"query\":\"wing\"}"
        );
        let back = ApiMessage {
            role: "assistant".into(),
            content: "look ".into(),
            tool_calls: vec![ApiToolCall {
                id: "other".into(),
                name: "bm25_search".into(),
                arguments: json!({"query": "wing"}),
            }],
            tool_call_id: None,
            name: None,
        };
        assert!(r.is(&back));
        assert!(!reply(text, false, true, "t").is(&back));
        assert_eq!(reply(text, false, true, "t").content, text.trim());
    }

    #[test]
    fn tool_messages_take_the_name_of_their_call() {
        let api = vec![
            ApiMessage {
                role: "assistant".into(),
                content: String::new(),
                tool_calls: vec![ApiToolCall {
                    id: "c9".into(),
                    name: "vector_search".into(),
                    arguments: json!({}),
                }],
                tool_call_id: None,
                name: None,
            },
            ApiMessage {
                role: "tool".into(),
                content: "hits".into(),
                tool_calls: vec![],
                tool_call_id: Some("c9".into()),
                name: None,
            },
        ];
        let m = messages(&api);
        assert_eq!(m[1], Message::tool("vector_search", "hits"));
    }
}
