//! Tokenizer and chat template against tokenizer-cases.json, and the real Qwen3 tokenizer.

mod common;

use std::io::Read;

use common::fixtures;
use mtrl_model::{ChatOptions, Tokenizer};
use serde_json::Value;

#[test]
fn encode_and_chat_template_cases() {
    let dir = fixtures().join("tokenizer");
    let tok = Tokenizer::from_dir(&dir).unwrap();
    let cases: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("tokenizer-cases.json")).unwrap())
            .unwrap();
    for c in cases["encode_cases"].as_array().unwrap() {
        let text = c["text"].as_str().unwrap();
        let want: Vec<u32> = serde_json::from_value(c["ids"].clone()).unwrap();
        let ids = tok.encode(text).unwrap();
        assert_eq!(ids, want, "encode {text:?}");
        let toks: Vec<String> = serde_json::from_value(c["tokens"].clone()).unwrap();
        assert_eq!(tok.tokens(text).unwrap(), toks, "tokens {text:?}");
        assert_eq!(
            tok.decode(&ids, false).unwrap(),
            c["decoded"].as_str().unwrap(),
            "decode {text:?}"
        );
        assert_eq!(
            tok.decode(&ids, true).unwrap(),
            c["decoded_skip_special"].as_str().unwrap(),
            "decode skip {text:?}"
        );
    }
    let chat = cases["chat_template_cases"].as_array().unwrap();
    assert!(chat.len() >= 5);
    for c in chat {
        let opts = ChatOptions {
            add_generation_prompt: c["add_generation_prompt"].as_bool().unwrap_or(false),
            enable_thinking: c.get("enable_thinking").and_then(Value::as_bool),
        };
        let tools = c.get("tools");
        let text = tok
            .apply_chat_template(&c["messages"], tools, opts)
            .unwrap();
        assert_eq!(text, c["rendered"].as_str().unwrap(), "case {}", c["name"]);
        let want: Vec<u32> = serde_json::from_value(c["ids"].clone()).unwrap();
        assert_eq!(
            tok.encode_chat(&c["messages"], tools, opts).unwrap(),
            want,
            "ids of case {}",
            c["name"]
        );
    }
    assert_eq!(tok.eos_token_id(), Some(1993));
    assert_eq!(tok.pad_token_id(), Some(1991));
}

#[test]
fn real_qwen3_tokenizer_and_template() {
    let src = fixtures().join("qwen3-tokenizer");
    let mut gz =
        flate2::read::GzDecoder::new(std::fs::File::open(src.join("tokenizer.json.gz")).unwrap());
    let mut json = Vec::new();
    gz.read_to_end(&mut json).unwrap();
    let inner = tokenizers::Tokenizer::from_bytes(&json).unwrap();
    let cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("tokenizer_config.json")).unwrap())
            .unwrap();
    let tok = Tokenizer::from_parts(inner, &cfg).unwrap();
    assert_eq!(
        tok.encode("<|im_start|>user\nhi<|im_end|>").unwrap(),
        vec![151644, 872, 198, 6023, 151645]
    );
    assert_eq!(tok.eos_token_id(), Some(151645));
    let msgs = serde_json::json!([
        {"role": "system", "content": "You search."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "<think>\nplan\n</think>\n\nok", "tool_calls": [
            {"type": "function", "function": {"name": "bm25", "arguments": {"query": "x", "k": 5}}}]},
        {"role": "tool", "content": "doc1"},
    ]);
    let tools = serde_json::json!([{"type": "function", "function": {"name": "bm25", "parameters": {"type": "object"}}}]);
    let text = tok
        .apply_chat_template(
            &msgs,
            Some(&tools),
            ChatOptions {
                add_generation_prompt: true,
                enable_thinking: Some(false),
            },
        )
        .unwrap();
    let want = "<|im_start|>system\nYou search.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"bm25\", \"parameters\": {\"type\": \"object\"}}}\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\nplan\n</think>\n\nok\n<tool_call>\n{\"name\": \"bm25\", \"arguments\": {\"query\": \"x\", \"k\": 5}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\ndoc1\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
    assert_eq!(text, want);
    let ids = tok.encode(&text).unwrap();
    assert_eq!(ids[0], 151644);
    assert!(
        ids.contains(&151657) && ids.contains(&151667),
        "tool_call and think ids present"
    );
}
