//! Token capture on the real fixture tokenizer and chat template: a continuation is built
//! exactly as the in-process environment builds a tool turn (prompt ids, then the sampled ids,
//! then `encode_tool_turn` of the new messages only); a rewritten history becomes a new segment;
//! budgets fail the trajectory as in-process. Completions are given (a policy that writes tool
//! calls on demand), so each case is known exactly.

use std::path::PathBuf;
use std::sync::Arc;

use candle_core::{DType, Device};
use mtrl_core::{ChatCodec, FailureReason, Message};
use mtrl_model::{Completion, Engine, FinishReason, Policy, TemplateCodec, Tokenizer};
use mtrl_rollout::engine_thread::EngineThread;
use mtrl_serve::capture::{Budgets, Capture, Spec};
use mtrl_serve::request::{self, ApiMessage, Reward};
use serde_json::{json, Value};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

fn codec() -> Arc<dyn ChatCodec> {
    let tok = Tokenizer::from_dir(&fixtures().join("tiny-qwen3")).unwrap();
    Arc::new(TemplateCodec::qwen(Arc::new(tok)).unwrap())
}

fn capture(budgets: Budgets) -> (Capture, EngineThread) {
    let policy = Policy::load(&fixtures().join("tiny-qwen3"), DType::F32, &Device::Cpu).unwrap();
    let engine = EngineThread::spawn(Engine::new(policy, None, 0, 4).unwrap()).unwrap();
    let spec = Spec {
        task_id: "t1".into(),
        gen: engine.client.clone(),
        codec: codec(),
        model: "tiny".into(),
        budgets,
        sampling: None,
        seeds: (0, 0, 0),
        session: 1,
        sampled_logprobs: true,
    };
    (Capture::new(spec), engine)
}

const BUDGETS: Budgets = Budgets {
    max_turns: 3,
    max_tokens_per_turn: 64,
    max_context_tokens: 4096,
};

fn tools() -> Vec<Value> {
    vec![
        json!({"type": "function", "function": {"name": "bm25_search", "description": "search",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}}),
    ]
}

/// A completion that writes `text` and ends its message.
fn said(codec: &dyn ChatCodec, text: &str, version: u64) -> Completion {
    let mut tokens = codec.encode_text(text).unwrap();
    tokens.push(codec.stop_token_ids()[0]);
    let n = tokens.len();
    Completion {
        seq: 0,
        prompt: Vec::new(),
        tokens,
        logprobs: (0..n).map(|i| -0.1 * (i + 1) as f32).collect(),
        versions: vec![version; n],
        truncated_logprobs: Vec::new(),
        finish: FinishReason::Eos,
    }
}

fn api(v: Value) -> Vec<ApiMessage> {
    request::chat(json!({"messages": v}).to_string().as_bytes())
        .unwrap()
        .messages
}

const CALL: &str = "<tool_call>\n{\"name\": \"bm25_search\", \"arguments\": {\"query\": \"wing flutter\"}}\n</tool_call>";

#[test]
fn a_continuation_is_the_in_process_tool_turn_and_one_sequence() {
    let (mut cap, _engine) = capture(BUDGETS);
    let c = codec();
    let first = json!([{"role": "system", "content": "Find documents."}, {"role": "user", "content": "Query: wings"}]);
    let p = cap.prepare(&api(first.clone()), &tools(), None).unwrap();
    let msgs = vec![
        Message::system("Find documents."),
        Message::user("Query: wings"),
    ];
    let prompt = c.encode_prompt(&msgs, &tools()).unwrap();
    assert_eq!(p.prompt, prompt);
    let done = said(c.as_ref(), CALL, 3);
    let (reply, ended) = cap.record(p, &done, true, true, "0").unwrap();
    assert!(ended);
    assert_eq!(reply.tool_calls.len(), 1);
    assert_eq!(reply.tool_calls[0].2, json!({"query": "wing flutter"}));

    // The agent sends back what it got, as OpenAI messages, plus the tool result.
    let mut second = first.as_array().unwrap().clone();
    let mut m = reply.message();
    m["tool_calls"][0]["id"] = json!("the-agent-renamed-it");
    let call_id = m["tool_calls"][0]["id"].clone();
    second.push(m);
    second.push(json!({"role": "tool", "tool_call_id": call_id, "content": "1. doc 7"}));
    let p2 = cap
        .prepare(&api(Value::Array(second)), &tools(), None)
        .unwrap();
    let mut history = msgs.clone();
    history.push(Message::assistant(CALL));
    let glue = c
        .encode_tool_turn(
            &history,
            &[Message::tool("bm25_search", "1. doc 7")],
            &tools(),
        )
        .unwrap();
    let mut expect = prompt.clone();
    expect.extend_from_slice(&done.tokens);
    expect.extend_from_slice(&glue);
    assert_eq!(
        p2.prompt, expect,
        "prompt + sampled ids + the new tool turn only"
    );
    let done2 = said(c.as_ref(), "no more", 4);
    cap.record(p2, &done2, true, true, "1").unwrap();

    let t = cap.trajectory();
    t.check().unwrap();
    assert!(t.segment_starts.is_empty());
    assert_eq!(t.prompt_len, prompt.len());
    assert_eq!(t.turns, 2);
    assert_eq!(
        t.sampled_runs(),
        vec![done.tokens.len(), done2.tokens.len()]
    );
    let n = expect.len() + done2.tokens.len();
    assert_eq!(t.tokens.len(), n);
    // Sampled ids carry exactly the engine's log-probs and versions; the rest is masked.
    let sampled: Vec<(f32, u64)> = (0..n)
        .filter(|&i| t.loss_mask[i] == 1)
        .map(|i| (t.logprobs[i], t.versions[i]))
        .collect();
    let engine: Vec<(f32, u64)> = [&done, &done2]
        .iter()
        .flat_map(|c| c.logprobs.iter().copied().zip(c.versions.iter().copied()))
        .collect();
    assert_eq!(sampled, engine);
    assert_eq!(t.tools.calls, vec![("bm25_search".to_string(), 1)]);

    // Per-turn rewards: one per model call.
    cap.report.reward = Some(Reward::PerTurn(vec![0.25, 0.5]));
    let f = cap.finish(-1.0).unwrap();
    assert_eq!((f.reward, f.turn_rewards.clone()), (0.75, vec![0.25, 0.5]));
    cap.report.reward = Some(Reward::PerTurn(vec![1.0]));
    assert!(cap
        .finish(-1.0)
        .unwrap_err()
        .contains("1 per-turn rewards for 2"));
    cap.report.reward = None;
    assert!(cap.finish(-1.0).unwrap_err().contains("no reward"));
}

#[test]
fn a_rewritten_history_is_a_new_segment_not_a_retokenization() {
    let (mut cap, _engine) = capture(BUDGETS);
    let c = codec();
    let first = json!([{"role": "user", "content": "Query: wings"}]);
    let p = cap.prepare(&api(first), &[], None).unwrap();
    let done = said(c.as_ref(), "thinking", 1);
    cap.record(p, &done, true, true, "0").unwrap();
    let before = cap.trajectory().tokens.len();
    // The agent summarised its history: the new prompt does not extend the old sequence.
    let rewritten = json!([{"role": "user", "content": "Query: wings (summary: nothing found)"}]);
    let p2 = cap.prepare(&api(rewritten.clone()), &[], None).unwrap();
    let fresh = c
        .encode_prompt(
            &[Message::user("Query: wings (summary: nothing found)")],
            &[],
        )
        .unwrap();
    assert_eq!(p2.prompt, fresh);
    let done2 = said(c.as_ref(), "ok", 2);
    cap.record(p2, &done2, true, true, "1").unwrap();
    let t = cap.trajectory();
    t.check().unwrap();
    assert_eq!(t.segment_starts, vec![before]);
    assert_eq!(t.segments().len(), 2);
    assert_eq!(&t.tokens[before..before + fresh.len()], &fresh[..]);
    assert_eq!(
        t.loss_mask[before..].iter().filter(|m| **m == 1).count(),
        done2.tokens.len()
    );
}

#[test]
fn budgets_fail_the_trajectory_as_in_process() {
    let c = codec();
    let msgs = json!([{"role": "user", "content": "Query: wings"}]);
    // Turns: the call after max_turns is refused and the trajectory fails with turn_limit.
    let (mut cap, _e) = capture(Budgets {
        max_turns: 1,
        ..BUDGETS
    });
    let p = cap.prepare(&api(msgs.clone()), &[], None).unwrap();
    cap.record(p, &said(c.as_ref(), "a", 1), true, true, "0")
        .unwrap();
    let e = cap.prepare(&api(msgs.clone()), &[], None).err().unwrap();
    assert_eq!(e.code, Some("turn_budget_exceeded"));
    assert_eq!(cap.failure(), Some(FailureReason::TurnLimit));
    assert_eq!(cap.finish(-1.0).unwrap().reward, -1.0);
    // Tokens: a message not ended within the per-turn budget.
    let (mut cap, _e) = capture(Budgets {
        max_tokens_per_turn: 4,
        ..BUDGETS
    });
    let p = cap.prepare(&api(msgs.clone()), &[], Some(100)).unwrap();
    assert_eq!(p.max_new_tokens, 4, "the client cannot raise the budget");
    let mut cut = said(c.as_ref(), "a b c d e", 1);
    cut.tokens.truncate(4);
    cut.logprobs.truncate(4);
    cut.versions.truncate(4);
    let (_, ended) = cap.record(p, &cut, true, true, "0").unwrap();
    assert!(!ended);
    assert_eq!(cap.failure(), Some(FailureReason::TokenLimit));
    let e = cap.prepare(&api(msgs.clone()), &[], None).err().unwrap();
    assert_eq!(e.code, Some("trajectory_ended"));
    // Context: a prompt that fills the context budget.
    let (mut cap, _e) = capture(Budgets {
        max_context_tokens: 5,
        ..BUDGETS
    });
    let e = cap.prepare(&api(msgs), &[], None).err().unwrap();
    assert_eq!(e.code, Some("context_length_exceeded"));
    assert_eq!(cap.failure(), Some(FailureReason::ContextOverflow));
}

#[test]
fn two_sample_calls_with_no_context_between_stay_two_turns() {
    let (mut cap, _engine) = capture(BUDGETS);
    let c = codec();
    let prompt = c.encode_text("Query: wings").unwrap();
    let p = cap.prepare_ids(&prompt, None).unwrap();
    let done = said(c.as_ref(), "first", 1);
    cap.record(p, &done, false, false, "").unwrap();
    // The next call sends back exactly the segment so far: no context for a second turn.
    let mut again = prompt.clone();
    again.extend_from_slice(&done.tokens);
    match cap.prepare_ids(&again, None) {
        Err(e) => {
            assert_eq!(
                (e.status, e.param.as_deref()),
                (400, Some("input_ids")),
                "{}",
                e.message
            );
            assert_eq!(cap.trajectory().turns, 1, "a refused call records nothing");
        }
        Ok(p2) => {
            cap.record(p2, &said(c.as_ref(), "second", 2), false, false, "")
                .unwrap();
            let t = cap.trajectory();
            assert_eq!(
                t.sampled_runs().len(),
                t.turns as usize,
                "two model calls merged into one turn"
            );
        }
    }
    // One new context token is enough for a second turn.
    again.push(prompt[0]);
    let p2 = cap.prepare_ids(&again, None).unwrap();
    cap.record(p2, &said(c.as_ref(), "second", 2), false, false, "")
        .unwrap();
    let t = cap.trajectory();
    t.check().unwrap();
    assert_eq!((t.turns, t.sampled_runs().len()), (2, 2));
}

#[test]
fn status_failed_is_an_infrastructure_error_and_a_named_failure_a_policy_one() {
    let (mut cap, _engine) = capture(BUDGETS);
    // The managed service's CompleteRollout status FAILED: do not use the trajectory.
    cap.report
        .merge(request::reward_report(br#"{"status": "failed"}"#).unwrap());
    let e = cap
        .finish(-1.0)
        .expect_err("status failed is not a trajectory to train on");
    assert!(e.contains("failed"), "{e}");
    // mtrl's `failure` names what the policy did wrong: trained with the failure reward.
    let (mut cap, _engine) = capture(BUDGETS);
    cap.report.merge(
        request::reward_report(br#"{"status": "failed", "failure": "turn_limit"}"#).unwrap(),
    );
    let t = cap.finish(-1.0).unwrap();
    assert_eq!(
        (t.failure, t.reward),
        (Some(FailureReason::TurnLimit), -1.0)
    );
    // A budget this endpoint saw the policy spend comes first: an agent that gave up on the
    // refused call and reports "failed" would only repeat it on a retry.
    let (mut cap, _engine) = capture(Budgets {
        max_turns: 1,
        ..BUDGETS
    });
    let c = codec();
    let msgs = json!([{"role": "user", "content": "Query: wings"}]);
    let p = cap.prepare(&api(msgs.clone()), &[], None).unwrap();
    cap.record(p, &said(c.as_ref(), "a", 1), true, true, "0")
        .unwrap();
    assert!(cap.prepare(&api(msgs), &[], None).is_err());
    cap.report
        .merge(request::reward_report(br#"{"status": "failed"}"#).unwrap());
    let t = cap.finish(-1.0).unwrap();
    assert_eq!(
        (t.failure, t.reward),
        (Some(FailureReason::TurnLimit), -1.0)
    );
    // A reason mtrl does not know is refused by name, not trained as some other failure.
    let e = request::reward_report(br#"{"failure": "tool_crashed"}"#).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("failure"), "{}", e.message);
}
