//! Response bodies in the OpenAI shapes: chat completions (whole, or as server-sent-event
//! chunks), text completions, the model list.

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use crate::render::Reply;

/// One generated choice, ready to be shaped.
pub struct Choice {
    pub reply: Reply,
    /// The whole decoded text (text completions).
    pub text: String,
    pub ended: bool,
    /// Sampled ids with their log-probs and decoded pieces (`logprobs = true`).
    pub tokens: Vec<u32>,
    pub logprobs: Vec<f32>,
    pub pieces: Vec<String>,
}

pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
}

impl Usage {
    fn body(&self) -> Value {
        json!({"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
               "total_tokens": self.prompt_tokens + self.completion_tokens})
    }
}

pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn logprob_content(c: &Choice) -> Value {
    Value::Array(
        c.pieces
            .iter()
            .zip(&c.logprobs)
            .map(|(t, lp)| {
                json!({"token": t, "logprob": lp, "bytes": t.as_bytes(), "top_logprobs": []})
            })
            .collect(),
    )
}

/// Options of the chat body.
pub struct ChatShape<'a> {
    pub id: &'a str,
    pub model: &'a str,
    pub logprobs: bool,
    pub token_ids: Option<&'a [u32]>,
}

/// A whole `chat.completion`.
pub fn chat(shape: &ChatShape<'_>, choices: &[Choice], usage: &Usage) -> Value {
    let choices: Vec<Value> = choices
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let mut v = json!({
                "index": i,
                "message": c.reply.message(),
                "logprobs": if shape.logprobs { json!({"content": logprob_content(c)}) } else { Value::Null },
                "finish_reason": c.reply.finish_reason(c.ended),
            });
            if let Some(p) = shape.token_ids {
                v["token_ids"] = json!(c.tokens);
                v["prompt_token_ids"] = json!(p);
            }
            v
        })
        .collect();
    json!({"id": shape.id, "object": "chat.completion", "created": now(), "model": shape.model,
           "choices": choices, "usage": usage.body()})
}

/// The same completion as `chat.completion.chunk` events (`data: …\n\n`, then `data: [DONE]`):
/// a role chunk, the content, each tool call, the finish reason, and usage when asked for. The
/// chunks are written when the completion has finished (not token by token).
pub fn chat_chunks(
    shape: &ChatShape<'_>,
    choices: &[Choice],
    usage: &Usage,
    include_usage: bool,
) -> String {
    let created = now();
    let chunk = |choices: Value, usage: Value| {
        let mut v = json!({"id": shape.id, "object": "chat.completion.chunk", "created": created,
                           "model": shape.model, "choices": choices});
        if include_usage {
            v["usage"] = usage;
        }
        format!("data: {v}\n\n")
    };
    let mut out = String::new();
    for (i, c) in choices.iter().enumerate() {
        out += &chunk(
            json!([{"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}]),
            Value::Null,
        );
        if !c.reply.content.is_empty() {
            let mut ch =
                json!({"index": i, "delta": {"content": c.reply.content}, "finish_reason": null});
            if shape.logprobs {
                ch["logprobs"] = json!({"content": logprob_content(c)});
            }
            out += &chunk(json!([ch]), Value::Null);
        }
        for (k, (id, name, args)) in c.reply.tool_calls.iter().enumerate() {
            let call = json!({"index": k, "id": id, "type": "function",
                              "function": {"name": name, "arguments": args.to_string()}});
            out += &chunk(
                json!([{"index": i, "delta": {"tool_calls": [call]}, "finish_reason": null}]),
                Value::Null,
            );
        }
        out += &chunk(
            json!([{"index": i, "delta": {}, "finish_reason": c.reply.finish_reason(c.ended)}]),
            Value::Null,
        );
    }
    if include_usage {
        out += &chunk(json!([]), usage.body());
    }
    out += "data: [DONE]\n\n";
    out
}

/// A `text_completion`.
pub fn completion(
    id: &str,
    model: &str,
    choices: &[Choice],
    logprobs: bool,
    echo: Option<&str>,
    usage: &Usage,
) -> Value {
    let choices: Vec<Value> = choices
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let lp = logprobs.then(|| {
                json!({"tokens": c.pieces, "token_logprobs": c.logprobs,
                       "top_logprobs": Value::Null, "text_offset": Value::Null})
            });
            json!({"index": i, "text": format!("{}{}", echo.unwrap_or(""), c.text),
                   "logprobs": lp, "finish_reason": if c.ended { "stop" } else { "length" }})
        })
        .collect();
    json!({"id": id, "object": "text_completion", "created": now(), "model": model,
           "choices": choices, "usage": usage.body()})
}

pub fn models(names: &[String]) -> Value {
    let data: Vec<Value> = names
        .iter()
        .map(|n| json!({"id": n, "object": "model", "created": 0, "owned_by": "mtrl"}))
        .collect();
    json!({"object": "list", "data": data})
}
