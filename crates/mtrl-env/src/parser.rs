//! The tool-call parser: finds `<tool_call>…</tool_call>` blocks in an assistant message and reads
//! each as `{"name": "…", "arguments": {…}}` (arguments may also be a JSON string holding an
//! object, as some models write them; missing arguments mean `{}`).
//!
//! With `env.tool_calls = "tolerant"` ([`parse_calls`]), a message without any block has its bare
//! or fenced JSON objects that carry a `"name"` read as calls too.
//!
//! Invariants: never panics on any input (property-tested over ≥ 100k generated strings); returns
//! one entry per opening tag, in order; a malformed block becomes an `Err` with a message meant for
//! the model, never an error of the caller. Text outside blocks is ignored.

use mtrl_core::config::ToolCallSyntax;
use mtrl_core::ToolCall;
use serde_json::Value;

pub const OPEN: &str = "<tool_call>";
pub const CLOSE: &str = "</tool_call>";

/// Why one tool-call block could not be read (shown to the model).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallError(pub String);

/// The calls of `text` under `syntax`: the `<tool_call>` blocks; under
/// [`ToolCallSyntax::Tolerant`], when there are none, every JSON object with a `"name"` key in the
/// text (bare, or inside a Markdown code fence), in order. An object that names a tool but does not
/// parse (a dropped brace) is a malformed call there, so the model is told.
pub fn parse_calls(text: &str, syntax: ToolCallSyntax) -> Vec<Result<ToolCall, CallError>> {
    let strict = parse_tool_calls(text);
    if !strict.is_empty() || syntax == ToolCallSyntax::Strict {
        return strict;
    }
    bare_json_calls(text)
}

/// JSON objects carrying a `"name"` key anywhere in `text` (outermost objects only).
fn bare_json_calls(text: &str) -> Vec<Result<ToolCall, CallError>> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(off) = text[at..].find('{') {
        let start = at + off;
        let mut it = serde_json::Deserializer::from_str(&text[start..]).into_iter::<Value>();
        match it.next() {
            Some(Ok(v @ Value::Object(_))) => {
                let end = start + it.byte_offset();
                if v.get("name").is_some() {
                    out.push(parse_value(v));
                }
                at = end;
            }
            _ => {
                // Not JSON from here: a named call cut short is reported once, then scanning
                // goes on after this brace.
                let mut end = text.len().min(start + 200);
                while !text.is_char_boundary(end) {
                    end -= 1;
                }
                let head = &text[start..end];
                if head.contains("\"name\"") && out.is_empty() && !looks_complete(&text[start..]) {
                    out.push(Err(CallError(
                        "a tool call could not be read as JSON (unbalanced braces or quotes?); \
                         write it as <tool_call>{\"name\": …, \"arguments\": {…}}</tool_call>"
                            .into(),
                    )));
                }
                at = start + 1;
            }
        }
    }
    out
}

/// Whether a nested JSON object starts later in `text` that parses (so the failure at the outer
/// brace is prose, not a broken call).
fn looks_complete(text: &str) -> bool {
    text[1..].find('{').is_some_and(|i| {
        serde_json::Deserializer::from_str(&text[1 + i..])
            .into_iter::<Value>()
            .next()
            .is_some_and(|r| matches!(r, Ok(Value::Object(ref o)) if o.contains_key("name")))
    })
}

/// Every tool-call block of `text`, in order.
pub fn parse_tool_calls(text: &str) -> Vec<Result<ToolCall, CallError>> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(OPEN) {
        let body_start = &rest[start + OPEN.len()..];
        match body_start.find(CLOSE) {
            Some(end) => {
                out.push(parse_body(&body_start[..end]));
                rest = &body_start[end + CLOSE.len()..];
            }
            None => {
                out.push(Err(CallError(format!(
                    "unterminated {OPEN}: every call must end with {CLOSE}"
                ))));
                break;
            }
        }
    }
    out
}

fn parse_body(body: &str) -> Result<ToolCall, CallError> {
    let body = body.trim();
    if body.is_empty() {
        return Err(CallError("empty tool call".into()));
    }
    let v: Value = serde_json::from_str(body).map_err(|e| {
        CallError(format!(
            "tool call is not valid JSON ({e}); expected {{\"name\": …, \"arguments\": {{…}}}}"
        ))
    })?;
    parse_value(v)
}

fn parse_value(v: Value) -> Result<ToolCall, CallError> {
    let Value::Object(mut obj) = v else {
        return Err(CallError(
            "tool call must be a JSON object {\"name\": …, \"arguments\": {…}}".into(),
        ));
    };
    let name = match obj.remove("name") {
        Some(Value::String(s)) if !s.trim().is_empty() => s.trim().to_string(),
        Some(_) => return Err(CallError("`name` must be a non-empty string".into())),
        None => return Err(CallError("tool call has no `name`".into())),
    };
    let arguments = match obj.remove("arguments") {
        None | Some(Value::Null) => Value::Object(Default::default()),
        Some(a @ Value::Object(_)) => a,
        Some(Value::String(s)) => match serde_json::from_str::<Value>(&s) {
            Ok(a @ Value::Object(_)) => a,
            _ => return Err(CallError("`arguments` must be a JSON object".into())),
        },
        Some(_) => return Err(CallError("`arguments` must be a JSON object".into())),
    };
    if let Some(k) = obj.keys().next() {
        return Err(CallError(format!(
            "unexpected key `{k}` in tool call (only `name` and `arguments`)"
        )));
    }
    Ok(ToolCall { name, arguments })
}

/// The text a tool call is written as (what the scripted policies emit).
pub fn format_tool_call(call: &ToolCall) -> String {
    let body = serde_json::json!({"name": call.name, "arguments": call.arguments});
    format!("{OPEN}\n{body}\n{CLOSE}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_several_calls_and_errors_in_order() {
        let text = "think first\n<tool_call>\n{\"name\": \"bm25_search\", \"arguments\": {\"query\": \"wing\", \"k\": 5}}\n</tool_call>\n<tool_call>{bad}</tool_call><tool_call>{\"name\":\"submit\",\"arguments\":\"{\\\"doc_ids\\\":[\\\"1\\\"]}\"}</tool_call>";
        let calls = parse_tool_calls(text);
        assert_eq!(calls.len(), 3);
        assert_eq!(calls[0].as_ref().unwrap().name, "bm25_search");
        assert_eq!(calls[0].as_ref().unwrap().arguments["k"], 5);
        assert!(calls[1].is_err());
        assert_eq!(
            calls[2].as_ref().unwrap().arguments,
            json!({"doc_ids": ["1"]})
        );
    }

    #[test]
    fn malformed_blocks_are_errors() {
        for t in [
            "<tool_call>",
            "<tool_call>{\"name\":\"x\"",
            "<tool_call></tool_call>",
            "<tool_call>[1]</tool_call>",
            "<tool_call>{\"arguments\":{}}</tool_call>",
            "<tool_call>{\"name\":3}</tool_call>",
            "<tool_call>{\"name\":\"x\",\"arguments\":[1]}</tool_call>",
            "<tool_call>{\"name\":\"x\",\"args\":{}}</tool_call>",
        ] {
            let calls = parse_tool_calls(t);
            assert_eq!(calls.len(), 1, "{t}");
            assert!(calls[0].is_err(), "{t}");
        }
        assert!(parse_tool_calls("no calls </tool_call> here").is_empty());
        let ok = &parse_tool_calls("<tool_call>{\"name\":\"x\"}</tool_call>")[0];
        assert_eq!(ok.as_ref().unwrap().arguments, json!({}));
    }

    #[test]
    fn tolerant_reads_fenced_and_bare_json_and_strict_does_not() {
        let fenced = "I will search.\n```json\n{\"name\": \"bm25_search\", \"arguments\": {\"query\": \"wing flutter\"}}\n```";
        let bare = "{\"name\": \"submit\", \"arguments\": {\"doc_ids\": [\"12\", \"7\"]}} and {\"note\": 1}";
        for (text, name) in [(fenced, "bm25_search"), (bare, "submit")] {
            assert!(parse_calls(text, ToolCallSyntax::Strict).is_empty());
            let calls = parse_calls(text, ToolCallSyntax::Tolerant);
            assert_eq!(calls.len(), 1, "{text}");
            assert_eq!(calls[0].as_ref().unwrap().name, name);
        }
        // A block wins: the bare object beside it is not a second call.
        let both = "<tool_call>{\"name\": \"a\"}</tool_call> {\"name\": \"b\"}";
        let calls = parse_calls(both, ToolCallSyntax::Tolerant);
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].as_ref().unwrap().name, "a");
        // A named call with a dropped brace is a malformed call the model is told about.
        let cut = "{\"name\": \"submit\", \"arguments\": {\"doc_ids\": [\"1\"]}";
        let calls = parse_calls(cut, ToolCallSyntax::Tolerant);
        assert_eq!(calls.len(), 1);
        assert!(calls[0].is_err());
        // Multi-byte text after a stray brace (the cut at 200 bytes falls inside a character).
        for n in [66, 67, 100, 300] {
            let t = format!("{{{}", "漢".repeat(n));
            assert!(parse_calls(&t, ToolCallSyntax::Tolerant).is_empty());
            let t = format!("{{\"name\": \"submit\" {}", "é✈".repeat(n));
            assert_eq!(parse_calls(&t, ToolCallSyntax::Tolerant).len(), 1);
        }
        // Prose braces and objects without a name are not calls.
        assert!(parse_calls("use {x} and {\"k\": 1}", ToolCallSyntax::Tolerant).is_empty());
    }

    #[test]
    fn format_round_trips() {
        let call = ToolCall {
            name: "submit".into(),
            arguments: json!({"doc_ids": ["a", "b"]}),
        };
        assert_eq!(parse_tool_calls(&format_tool_call(&call)), vec![Ok(call)]);
    }
}
