//! Episode state machine of `SearchEnv` with in-memory tools: success, recovery from malformed
//! calls, every failure reason, token-mode bookkeeping, and misuse errors.

use std::sync::Arc;

use mtrl_core::{ChatCodec, CodecError, EnvConfig, FailureReason, Message, Role};
use mtrl_env::reward::NdcgAt;
use mtrl_env::tools::{SearchTool, SubmitTool};
use mtrl_env::{Action, Environment, SearchEnv, Step, Task, Tool};
use mtrl_search::{Hit, Retriever};
use serde_json::Value;

/// Always returns documents d0, d1, … in order.
struct Ladder;

impl Retriever for Ladder {
    fn name(&self) -> &'static str {
        "ladder"
    }
    fn search(&self, _q: &str, k: usize) -> mtrl_search::Result<Vec<Hit>> {
        Ok((0..k)
            .map(|i| Hit {
                doc_id: format!("d{i}"),
                score: 1.0,
                title: format!("title {i}"),
                snippet: "some words here".into(),
            })
            .collect())
    }
}

fn env(cfg: EnvConfig) -> SearchEnv {
    let tools: Vec<Arc<dyn Tool>> = vec![
        Arc::new(SearchTool::new(
            "bm25_search",
            "d",
            Arc::new(Ladder),
            5,
            20,
            10,
        )),
        Arc::new(SubmitTool::new(cfg.final_k, None)),
    ];
    SearchEnv::new(cfg, tools, Arc::new(NdcgAt(10))).unwrap()
}

fn task() -> Task {
    Task {
        id: "t1".into(),
        prompt: r#"{"query":"wings","qrels":{"d0":1,"d1":2}}"#.into(),
    }
}

const SEARCH: &str =
    r#"<tool_call>{"name":"bm25_search","arguments":{"query":"wings","k":3}}</tool_call>"#;
const SUBMIT: &str =
    r#"<tool_call>{"name":"submit","arguments":{"doc_ids":["d1","d0","d1"]}}</tool_call>"#;

fn cont(s: Step) -> mtrl_env::Observation {
    match s {
        Step::Continue(o) => o,
        Step::Done => panic!("episode ended early"),
    }
}

#[test]
fn search_then_submit_scores_the_answer() {
    let mut e = env(EnvConfig::default());
    let obs = cont(e.reset(&task()).unwrap());
    assert_eq!(obs.query.as_deref(), Some("wings"));
    assert_eq!(obs.messages[0].role, Role::System);
    let obs = cont(e.step(Action::text(SEARCH)).unwrap());
    let last = obs.messages.last().unwrap();
    assert_eq!(last.role, Role::Tool);
    let hits: Value = serde_json::from_str(&last.content).unwrap();
    assert_eq!(hits.as_array().unwrap().len(), 3);
    assert_eq!(e.step(Action::text(SUBMIT)).unwrap(), Step::Done);
    let t = e.finish().unwrap();
    assert_eq!(t.failure, None);
    assert_eq!(t.reward, 1.0, "[d1, d0] is the ideal ranking");
    assert_eq!(t.answer, Some(vec!["d1".to_string(), "d0".to_string()]));
    assert_eq!(t.turns, 2);
    assert_eq!(t.tools.total_calls(), 2);
    let calls: Vec<(&str, u32)> = t.tool_calls.iter().map(|c| (&*c.name, c.turn)).collect();
    assert_eq!(calls, vec![("bm25_search", 1), ("submit", 2)]);
    assert_eq!(t.tool_calls[0].result_ids.len(), 3, "hit ids are recorded");
    assert_eq!(t.tool_calls[1].result_ids, vec!["d1", "d0"]);
    assert!(t
        .tool_calls
        .iter()
        .all(|c| c.error.is_none() && c.latency_ms >= 0.0));
    assert!(t.tokens.is_empty(), "text mode keeps no tokens");
    assert!(e.finish().is_err(), "finish twice");
    assert!(e.step(Action::text(SUBMIT)).is_err(), "step after done");
}

#[test]
fn malformed_calls_get_error_responses_and_are_counted() {
    let mut e = env(EnvConfig::default());
    cont(e.reset(&task()).unwrap());
    let text = format!(
        "{}<tool_call>{{oops</tool_call><tool_call>{{\"name\":\"nope\",\"arguments\":{{}}}}</tool_call>\
         <tool_call>{{\"name\":\"bm25_search\",\"arguments\":{{\"query\":\"x\",\"k\":99}}}}</tool_call>\
         <tool_call>{{\"name\":\"submit\",\"arguments\":{{\"ids\":[]}}}}</tool_call>",
        SEARCH
    );
    let obs = cont(e.step(Action::text(text)).unwrap());
    let tools: Vec<&Message> = obs
        .messages
        .iter()
        .filter(|m| m.role == Role::Tool)
        .collect();
    assert_eq!(tools.len(), 5);
    assert!(!tools[0].content.starts_with("error"));
    for m in &tools[1..] {
        assert!(m.content.starts_with("error: "), "{}", m.content);
    }
    assert!(tools[2].content.contains("unknown tool `nope`"));
    assert!(tools[3].content.contains("out of range"));
    e.step(Action::text(SUBMIT)).unwrap();
    let t = e.finish().unwrap();
    assert_eq!(t.failure, None);
    assert_eq!(t.tools.errors, 4);
    assert_eq!(t.tools.error_messages.len(), 4);
    // Counted by kind: the bad JSON, the unknown tool, the two refused argument lists.
    use mtrl_core::CallErrorKind as K;
    assert_eq!(
        t.tools.error_kinds,
        vec![
            (K::MalformedCall, 1),
            (K::UnknownTool, 1),
            (K::InvalidArguments, 2)
        ]
    );
    let errors = t.tool_calls.iter().filter(|c| c.error.is_some()).count();
    assert_eq!(
        (t.tool_calls.len(), errors),
        (6, 4),
        "every call is recorded"
    );
    assert_eq!(t.tool_calls[1].name, "error");
    assert_eq!(t.tool_calls[3].arguments["k"], 99);
}

#[test]
fn failure_reasons_get_the_failure_reward() {
    let cases: Vec<(EnvConfig, Vec<Action>, FailureReason)> = vec![
        (
            EnvConfig {
                max_turns: 2,
                ..EnvConfig::default()
            },
            vec![Action::text(SEARCH), Action::text(SEARCH)],
            FailureReason::TurnLimit,
        ),
        (
            EnvConfig::default(),
            vec![Action::text("I think d1.")],
            FailureReason::NoAnswer,
        ),
        (
            EnvConfig {
                max_turns: 1,
                ..EnvConfig::default()
            },
            vec![Action::text(
                r#"<tool_call>{"name":"submit","arguments":{}}</tool_call>"#,
            )],
            FailureReason::InvalidAnswer,
        ),
        (
            EnvConfig::default(),
            vec![Action::Text {
                text: SEARCH.into(),
                truncated: true,
            }],
            FailureReason::TokenLimit,
        ),
    ];
    for (cfg, actions, why) in cases {
        let mut e = env(EnvConfig {
            failure_reward: -0.5,
            ..cfg
        });
        let mut step = e.reset(&task()).unwrap();
        for a in actions {
            assert!(matches!(step, Step::Continue(_)), "{why:?}");
            step = e.step(a).unwrap();
        }
        assert_eq!(step, Step::Done, "{why:?}");
        let t = e.finish().unwrap();
        assert_eq!(t.failure, Some(why));
        assert_eq!(t.reward, -0.5);
    }
}

#[test]
fn too_many_calls_in_one_message_are_refused() {
    let mut e = env(EnvConfig {
        max_calls_per_turn: 2,
        ..EnvConfig::default()
    });
    cont(e.reset(&task()).unwrap());
    let obs = cont(e.step(Action::text(SEARCH.repeat(3))).unwrap());
    let last = obs.messages.last().unwrap();
    assert!(
        last.content.contains("too many tool calls"),
        "{}",
        last.content
    );
}

/// Bytes as ids; 1000 ends a turn. Prompt = `[role]content` per message, tool turn likewise.
struct ByteCodec;

const EOT: u32 = 1000;

fn bytes(s: &str) -> Vec<u32> {
    s.bytes().map(u32::from).collect()
}

impl ChatCodec for ByteCodec {
    fn encode_prompt(&self, m: &[Message], t: &[Value]) -> Result<Vec<u32>, CodecError> {
        Ok(bytes(&self.render(m, t, true)?))
    }
    fn encode_tool_turn(
        &self,
        _h: &[Message],
        new: &[Message],
        t: &[Value],
    ) -> Result<Vec<u32>, CodecError> {
        Ok(bytes(&self.render(new, t, true)?))
    }
    fn decode(&self, ids: &[u32]) -> Result<String, CodecError> {
        let b: Vec<u8> = ids.iter().filter(|i| **i < 256).map(|i| *i as u8).collect();
        Ok(String::from_utf8_lossy(&b).into_owned())
    }
    fn stop_token_ids(&self) -> Vec<u32> {
        vec![EOT]
    }
    fn render(&self, m: &[Message], _t: &[Value], gen: bool) -> Result<String, CodecError> {
        let mut s: String = m
            .iter()
            .map(|m| format!("[{:?}]{}", m.role, m.content))
            .collect();
        if gen {
            s.push_str("[Assistant]");
        }
        Ok(s)
    }
    fn encode_text(&self, text: &str) -> Result<Vec<u32>, CodecError> {
        Ok(bytes(text))
    }
}

fn sampled(text: &str, stop: bool) -> Action {
    let mut ids = bytes(text);
    if stop {
        ids.push(EOT);
    }
    let n = ids.len();
    Action::Tokens {
        ids,
        logprobs: vec![-0.25; n],
        versions: vec![3; n],
    }
}

#[test]
fn token_mode_masks_only_sampled_tokens() {
    let mut e = env(EnvConfig::default()).with_codec(Arc::new(ByteCodec));
    let obs = cont(e.reset(&task()).unwrap());
    let prompt_len = obs.new_tokens.len();
    assert_eq!(obs.context_len, prompt_len);
    assert!(
        e.step(Action::text(SEARCH)).is_err(),
        "text action in token mode"
    );
    let obs = cont(e.step(sampled(SEARCH, true)).unwrap());
    assert!(!obs.new_tokens.is_empty());
    assert_eq!(e.step(sampled(SUBMIT, true)).unwrap(), Step::Done);
    let t = e.finish().unwrap();
    t.check().unwrap();
    assert_eq!(t.prompt_len, prompt_len);
    assert_eq!(t.sampled_tokens(), SEARCH.len() + SUBMIT.len() + 2);
    assert_eq!(
        *t.tokens.last().unwrap(),
        EOT,
        "the transcript ends with the policy's tokens"
    );
    for i in 0..t.tokens.len() {
        if t.loss_mask[i] == 1 {
            assert_eq!((t.logprobs[i], t.versions[i]), (-0.25, 3));
        }
    }
    assert_eq!(t.reward, 1.0);
}

#[test]
fn token_mode_budgets() {
    // A message that does not end with a stop token hit its cap: token_limit.
    let mut e = env(EnvConfig::default()).with_codec(Arc::new(ByteCodec));
    cont(e.reset(&task()).unwrap());
    assert_eq!(e.step(sampled(SEARCH, false)).unwrap(), Step::Done);
    assert_eq!(e.finish().unwrap().failure, Some(FailureReason::TokenLimit));
    // Longer than max_tokens_per_turn: token_limit even with a stop token.
    let mut e = env(EnvConfig {
        max_tokens_per_turn: 10,
        ..EnvConfig::default()
    })
    .with_codec(Arc::new(ByteCodec));
    cont(e.reset(&task()).unwrap());
    e.step(sampled(SEARCH, true)).unwrap();
    assert_eq!(e.finish().unwrap().failure, Some(FailureReason::TokenLimit));
    // The tool results outgrow the context: context_overflow.
    let prompt = {
        let mut e = env(EnvConfig::default()).with_codec(Arc::new(ByteCodec));
        cont(e.reset(&task()).unwrap()).context_len
    };
    let cfg = EnvConfig {
        max_context_tokens: prompt + SEARCH.len() + 30,
        max_tokens_per_turn: 200,
        ..EnvConfig::default()
    };
    let mut e = env(cfg.clone()).with_codec(Arc::new(ByteCodec));
    let obs = cont(e.reset(&task()).unwrap());
    assert!(
        obs.max_new_tokens < 200,
        "the context cap shrinks the turn cap"
    );
    assert_eq!(e.step(sampled(SEARCH, true)).unwrap(), Step::Done);
    assert_eq!(
        e.finish().unwrap().failure,
        Some(FailureReason::ContextOverflow)
    );
    // A prompt that alone fills the context ends the episode at reset.
    let mut e = env(EnvConfig {
        max_context_tokens: 201,
        ..cfg
    })
    .with_codec(Arc::new(ByteCodec));
    assert_eq!(e.reset(&task()).unwrap(), Step::Done);
    let t = e.finish().unwrap();
    assert_eq!(t.failure, Some(FailureReason::ContextOverflow));
}

#[test]
fn bad_task_and_misuse_are_errors() {
    let mut e = env(EnvConfig::default());
    assert!(e.step(Action::text("x")).is_err(), "step before reset");
    let bad = Task {
        id: "b".into(),
        prompt: "not json".into(),
    };
    let msg = e.reset(&bad).unwrap_err().to_string();
    assert!(msg.contains("task b"), "{msg}");
    cont(e.reset(&task()).unwrap());
    assert!(e.finish().is_err(), "finish before done");
}

/// Hits only for the task's own query ("wings"): shows which query a call searched.
struct OnlyWings;

impl Retriever for OnlyWings {
    fn name(&self) -> &'static str {
        "only-wings"
    }
    fn search(&self, q: &str, k: usize) -> mtrl_search::Result<Vec<Hit>> {
        if q == "wings" {
            Ladder.search(q, k)
        } else {
            Ok(Vec::new())
        }
    }
}

#[test]
fn argument_shortcuts_search_the_question_and_submit_by_rank() {
    let cfg = EnvConfig {
        default_query: true,
        submit_hits: true,
        ..EnvConfig::default()
    };
    let tools: Vec<Arc<dyn Tool>> = vec![
        Arc::new(
            SearchTool::new("bm25_search", "d", Arc::new(OnlyWings), 5, 20, 0)
                .with_optional_query(true),
        ),
        Arc::new(SubmitTool::new(cfg.final_k, None).with_hits(true)),
    ];
    assert_eq!(
        tools[0].schema()["function"]["parameters"]["required"],
        serde_json::json!([])
    );
    assert!(tools[1].schema()["function"]["parameters"]["properties"]["hits"].is_object());
    let mut e = SearchEnv::new(cfg, tools, Arc::new(NdcgAt(10))).unwrap();
    cont(e.reset(&task()).unwrap());
    let search = r#"<tool_call>{"name":"bm25_search","arguments":{"k":3}}</tool_call>"#;
    let obs = cont(e.step(Action::text(search)).unwrap());
    let hits: Value = serde_json::from_str(&obs.messages.last().unwrap().content).unwrap();
    assert_eq!(
        hits.as_array().unwrap().len(),
        3,
        "the question was searched"
    );
    // A rank past the results is an error the model sees; the episode goes on.
    let bad = r#"<tool_call>{"name":"submit","arguments":{"hits":[4]}}</tool_call>"#;
    let obs = cont(e.step(Action::text(bad)).unwrap());
    let reply = &obs.messages.last().unwrap().content;
    assert!(reply.contains("hit 4 is out of range"), "{reply}");
    let submit = r#"<tool_call>{"name":"submit","arguments":{"hits":[2,1]}}</tool_call>"#;
    assert_eq!(e.step(Action::text(submit)).unwrap(), Step::Done);
    let t = e.finish().unwrap();
    assert_eq!(t.failure, None);
    assert_eq!(t.answer, Some(vec!["d1".to_string(), "d0".to_string()]));
    assert_eq!(t.reward, 1.0);
    let last = t.tool_calls.last().unwrap();
    assert_eq!(
        last.arguments["hits"],
        serde_json::json!([2, 1]),
        "what the model wrote"
    );
    assert_eq!(last.result_ids, vec!["d1", "d0"]);
}

#[test]
fn a_submit_longer_than_final_k_is_cut_or_refused_as_configured() {
    use mtrl_core::config::SubmitExcess;
    let run = |excess: SubmitExcess| {
        let cfg = EnvConfig {
            final_k: 2,
            submit_excess: excess,
            ..EnvConfig::default()
        };
        let tools: Vec<Arc<dyn Tool>> = vec![
            Arc::new(SearchTool::new(
                "bm25_search",
                "d",
                Arc::new(Ladder),
                5,
                20,
                10,
            )),
            Arc::new(SubmitTool::new(cfg.final_k, None).with_excess(cfg.submit_excess)),
        ];
        let mut e = SearchEnv::new(cfg, tools, Arc::new(NdcgAt(10))).unwrap();
        cont(e.reset(&task()).unwrap());
        let long =
            r#"<tool_call>{"name":"submit","arguments":{"doc_ids":["d1","d0","d2"]}}</tool_call>"#;
        let step = e.step(Action::text(long)).unwrap();
        (e, step)
    };
    // Cut: the first final_k ids are scored and the episode ends.
    let (mut e, step) = run(SubmitExcess::Cut);
    assert_eq!(step, Step::Done);
    let t = e.finish().unwrap();
    assert_eq!(t.answer, Some(vec!["d1".to_string(), "d0".to_string()]));
    // Refuse: an error the model is shown; a list of final_k ids then ends the episode.
    let (mut e, step) = run(SubmitExcess::Refuse);
    let obs = cont(step);
    let reply = &obs.messages.last().unwrap().content;
    assert!(
        reply.contains("at most 2 documents; 3 were listed"),
        "{reply}"
    );
    let ok = r#"<tool_call>{"name":"submit","arguments":{"doc_ids":["d1","d0"]}}</tool_call>"#;
    assert_eq!(e.step(Action::text(ok)).unwrap(), Step::Done);
    let t = e.finish().unwrap();
    assert_eq!(t.tools.errors, 1);
    assert_eq!(t.answer, Some(vec!["d1".to_string(), "d0".to_string()]));
}

#[test]
fn submit_top_takes_the_first_distinct_hits_of_the_episode() {
    use mtrl_core::config::SubmitExcess;
    let cfg = EnvConfig {
        default_query: true,
        submit_hits: true,
        final_k: 3,
        submit_excess: SubmitExcess::Refuse,
        ..EnvConfig::default()
    };
    let tools: Vec<Arc<dyn Tool>> = vec![
        Arc::new(
            SearchTool::new("bm25_search", "d", Arc::new(OnlyWings), 5, 20, 0)
                .with_optional_query(true),
        ),
        Arc::new(
            SubmitTool::new(cfg.final_k, None)
                .with_hits(true)
                .with_excess(cfg.submit_excess),
        ),
    ];
    let mut e = SearchEnv::new(cfg, tools, Arc::new(NdcgAt(10))).unwrap();
    cont(e.reset(&task()).unwrap());
    // The same search twice: d0 d1, then d0 d1 d2 — `top` skips the repeats.
    let twice = r#"<tool_call>{"name":"bm25_search","arguments":{"k":2}}</tool_call>
<tool_call>{"name":"bm25_search","arguments":{"k":3}}</tool_call>"#;
    cont(e.step(Action::text(twice)).unwrap());
    let over = r#"<tool_call>{"name":"submit","arguments":{"top":4}}</tool_call>"#;
    let obs = cont(e.step(Action::text(over)).unwrap());
    let reply = &obs.messages.last().unwrap().content;
    assert!(reply.contains("at most 3"), "{reply}");
    let top = r#"<tool_call>{"name":"submit","arguments":{"top":3,"interleave":true}}</tool_call>"#;
    assert_eq!(e.step(Action::text(top)).unwrap(), Step::Done);
    let t = e.finish().unwrap();
    assert_eq!(
        t.answer,
        Some(vec!["d0".to_string(), "d1".to_string(), "d2".to_string()])
    );
    let last = t.tool_calls.last().unwrap();
    assert_eq!(
        last.arguments,
        serde_json::json!({"top": 3, "interleave": true})
    );
}

#[test]
fn tolerant_tool_calls_read_fenced_json_and_strict_ones_do_not() {
    let fenced = "```json\n{\"name\": \"bm25_search\", \"arguments\": {\"query\": \"wing\"}}\n```";
    // Strict (the default): no <tool_call> block, so the message has no call and the episode ends.
    let mut e = env(EnvConfig::default());
    cont(e.reset(&task()).unwrap());
    assert!(matches!(e.step(Action::text(fenced)).unwrap(), Step::Done));
    assert_eq!(e.finish().unwrap().failure, Some(FailureReason::NoAnswer));
    // Tolerant: the fenced object is the search call; the episode goes on.
    let mut e = env(EnvConfig {
        tool_calls: mtrl_core::config::ToolCallSyntax::Tolerant,
        ..EnvConfig::default()
    });
    cont(e.reset(&task()).unwrap());
    let obs = cont(e.step(Action::text(fenced)).unwrap());
    assert!(obs
        .messages
        .iter()
        .any(|m| m.role == Role::Tool && !m.content.starts_with("error")));
    e.step(Action::text(SUBMIT)).unwrap();
    let t = e.finish().unwrap();
    assert_eq!(t.failure, None);
    assert_eq!(t.tools.calls[0], ("bm25_search".to_string(), 1));
}
