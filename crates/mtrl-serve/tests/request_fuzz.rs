//! The request parsers never panic: 160,000 generated bodies (random JSON built from the
//! routes' own field names and values of every type, mutations of valid requests — byte flips,
//! truncations, insertions — and raw bytes) through every parser. Each failure is a 4xx whose
//! message names the field when it blames one.

use std::panic::{catch_unwind, AssertUnwindSafe};

use mtrl_core::rng::SplitMix64;
use mtrl_serve::request;
use serde_json::{json, Map, Value};

const KEYS: &[&str] = &[
    "model",
    "messages",
    "role",
    "content",
    "tool_calls",
    "tool_call_id",
    "name",
    "function",
    "arguments",
    "type",
    "id",
    "tools",
    "tool_choice",
    "temperature",
    "top_p",
    "top_k",
    "max_tokens",
    "max_completion_tokens",
    "seed",
    "stop",
    "n",
    "logprobs",
    "top_logprobs",
    "stream",
    "stream_options",
    "include_usage",
    "prompt",
    "echo",
    "input_ids",
    "stop_token_ids",
    "trajectoryId",
    "reward",
    "rewards",
    "status",
    "failure",
    "metrics",
    "text",
    "parameters",
    "user",
    "presence_penalty",
    "parallel_tool_calls",
];
const WORDS: &[&str] = &[
    "user",
    "assistant",
    "system",
    "tool",
    "developer",
    "function",
    "text",
    "auto",
    "none",
    "failed",
    "success",
    "{\"q\": 1}",
    "{oops",
    "",
    "mtrl-1",
    "é\u{0}\u{ffff}",
    "[1,2]",
];

fn value(r: &mut SplitMix64, depth: usize) -> Value {
    match r.below(if depth > 3 { 6 } else { 9 }) {
        0 => Value::Null,
        1 => Value::Bool(r.below(2) == 1),
        2 => json!(r.next_u64() as i64 >> r.below(64)),
        3 => json!((r.next_f64() - 0.5) * 10f64.powi(r.below(40) as i32 - 20)),
        4 | 5 => json!(WORDS[r.below(WORDS.len())]),
        6 | 7 => {
            let mut m = Map::new();
            for _ in 0..r.below(5) {
                m.insert(KEYS[r.below(KEYS.len())].to_string(), value(r, depth + 1));
            }
            Value::Object(m)
        }
        _ => Value::Array((0..r.below(4)).map(|_| value(r, depth + 1)).collect()),
    }
}

fn valid(r: &mut SplitMix64) -> Value {
    match r.below(4) {
        0 => json!({"messages": [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function",
             "function": {"name": "f", "arguments": "{\"q\": 1}"}}]},
            {"role": "tool", "tool_call_id": "c", "content": "r"}],
            "tools": [{"type": "function", "function": {"name": "f"}}], "temperature": 0.5,
            "stream": true, "stream_options": {"include_usage": true}, "stop": ["x"], "n": 2}),
        1 => json!({"prompt": "hello", "max_tokens": 4, "logprobs": 1, "echo": true}),
        2 => json!({"input_ids": [1, 2, 3], "max_tokens": 4, "stop_token_ids": [2]}),
        _ => json!({"trajectoryId": "mtrl-1", "reward": [0.5, 1], "metrics": {"ndcg@10": 0.5}}),
    }
}

fn body(r: &mut SplitMix64) -> Vec<u8> {
    match r.below(4) {
        0 => value(r, 0).to_string().into_bytes(),
        1 => {
            let mut v = valid(r);
            if let Some(m) = v.as_object_mut() {
                let k = KEYS[r.below(KEYS.len())].to_string();
                m.insert(k, value(r, 1));
            }
            v.to_string().into_bytes()
        }
        2 => {
            let mut b = valid(r).to_string().into_bytes();
            for _ in 0..1 + r.below(4) {
                let i = r.below(b.len().max(1));
                match r.below(3) {
                    0 if !b.is_empty() => b[i] = r.next_u64() as u8,
                    1 => b.truncate(i),
                    _ => b.insert(i.min(b.len()), b"{}[]\",:\\0e-"[r.below(11)]),
                }
            }
            b
        }
        _ => (0..r.below(64)).map(|_| r.next_u64() as u8).collect(),
    }
}

#[test]
fn no_body_panics_any_parser() {
    let mut r = SplitMix64(20261201);
    let mut accepted = 0;
    let mut named = 0;
    for i in 0..160_000 {
        let b = body(&mut r);
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            [
                request::chat(&b).err(),
                request::completion(&b).err(),
                request::sample(&b).err(),
                request::reward_report(&b).err(),
            ]
        }));
        let errors = outcome
            .unwrap_or_else(|_| panic!("input {i} panicked: {:?}", String::from_utf8_lossy(&b)));
        for e in errors.iter() {
            match e {
                None => accepted += 1,
                Some(e) => {
                    assert_eq!(e.status, 400, "input {i}: {e}");
                    if let Some(p) = &e.param {
                        assert!(e.message.contains(p.as_str()), "input {i}: {e}");
                        named += 1;
                    }
                }
            }
        }
    }
    // The generator reaches both sides: accepted requests and field-named refusals.
    assert!(accepted > 1_000, "{accepted}");
    assert!(named > 10_000, "{named}");
}
