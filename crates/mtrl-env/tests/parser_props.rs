//! Property test of the tool-call parser over 120,000 generated inputs (seeded, deterministic):
//! it never panics, returns one entry per opening tag, every accepted call has a non-empty name
//! and object arguments, and well-formed calls round-trip exactly.

use mtrl_core::config::ToolCallSyntax;
use mtrl_core::rng::SplitMix64;
use mtrl_env::parser::{format_tool_call, parse_calls, parse_tool_calls, CLOSE, OPEN};
use mtrl_env::ToolCall;
use serde_json::{json, Value};

const FRAGMENTS: &[&str] = &[
    "<tool_call>",
    "</tool_call>",
    "<tool_call",
    "tool_call>",
    "{",
    "}",
    "[",
    "]",
    "\"",
    "\\",
    ":",
    ",",
    "\"name\"",
    "\"arguments\"",
    "\"bm25_search\"",
    "\"submit\"",
    "{\"query\": \"x\"}",
    "\"k\"",
    "10",
    "-1",
    "1e999",
    "null",
    "true",
    " ",
    "\n",
    "\t",
    "é",
    "漢字",
    "🦀",
    "\u{0}",
    "\u{200b}",
    "<|im_end|>",
    "<think>",
    "abc",
];

fn random_text(rng: &mut SplitMix64) -> String {
    let n = rng.below(24);
    let mut s = String::new();
    for _ in 0..n {
        if rng.below(10) == 0 {
            // A raw char, occasionally outside the BMP.
            let c = char::from_u32(rng.below(0x2_0000) as u32).unwrap_or('?');
            s.push(c);
        } else {
            s.push_str(FRAGMENTS[rng.below(FRAGMENTS.len())]);
        }
    }
    s
}

fn random_value(rng: &mut SplitMix64, depth: usize) -> Value {
    match rng.below(if depth > 2 { 4 } else { 6 }) {
        0 => Value::Null,
        1 => json!(rng.below(1000) as i64 - 500),
        2 => Value::String(random_text(rng)),
        3 => json!(rng.below(2) == 0),
        4 => Value::Array(
            (0..rng.below(4))
                .map(|_| random_value(rng, depth + 1))
                .collect(),
        ),
        _ => random_object(rng, depth + 1),
    }
}

fn random_object(rng: &mut SplitMix64, depth: usize) -> Value {
    let mut m = serde_json::Map::new();
    for _ in 0..rng.below(4) {
        m.insert(random_text(rng), random_value(rng, depth));
    }
    Value::Object(m)
}

fn count_blocks(text: &str) -> usize {
    let mut n = 0;
    let mut rest = text;
    while let Some(i) = rest.find(OPEN) {
        n += 1;
        match rest[i + OPEN.len()..].find(CLOSE) {
            Some(j) => rest = &rest[i + OPEN.len() + j + CLOSE.len()..],
            None => break,
        }
    }
    n
}

#[test]
fn parser_never_panics_and_round_trips() {
    let mut rng = SplitMix64(0x5eed);
    let mut accepted = 0;
    for i in 0..120_000 {
        if i % 3 == 0 {
            // A well-formed call (name without tags, so it cannot open a block), then noise.
            let name = random_text(&mut rng).replace(OPEN, "").replace(CLOSE, "");
            let name = if name.trim().is_empty() {
                "t".to_string()
            } else {
                name.trim().to_string()
            };
            let mut args = random_object(&mut rng, 0);
            if let Value::Object(m) = &mut args {
                m.retain(|k, v| {
                    !k.contains(OPEN) && !k.contains(CLOSE) && !v.to_string().contains(CLOSE)
                });
            }
            let call = ToolCall {
                name,
                arguments: args,
            };
            let text = format!(
                "{}{}",
                format_tool_call(&call),
                random_text(&mut rng).replace(OPEN, "")
            );
            let parsed = parse_tool_calls(&text);
            assert_eq!(parsed.first(), Some(&Ok(call.clone())), "{text:?}");
            accepted += 1;
        } else {
            let text = random_text(&mut rng);
            let parsed = parse_tool_calls(&text);
            assert_eq!(parsed.len(), count_blocks(&text), "{text:?}");
            // The tolerant reading never panics either, and keeps the blocks when there are any.
            let tolerant = parse_calls(&text, ToolCallSyntax::Tolerant);
            if !parsed.is_empty() {
                assert_eq!(tolerant, parsed, "{text:?}");
            }
            for c in tolerant.into_iter().flatten() {
                assert!(c.arguments.is_object());
            }
            let bare = text.replace(OPEN, "").replace(CLOSE, "");
            for c in parse_calls(&bare, ToolCallSyntax::Tolerant)
                .into_iter()
                .flatten()
            {
                assert!(!c.name.trim().is_empty());
            }
            for c in parsed.into_iter().flatten() {
                assert!(!c.name.trim().is_empty());
                assert!(c.arguments.is_object());
                accepted += 1;
            }
        }
    }
    assert!(accepted >= 40_000, "{accepted}");
}
