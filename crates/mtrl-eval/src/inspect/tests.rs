//! Selection and rendering over a hand-made log of two tasks at three steps.

use std::path::PathBuf;

use mtrl_core::trajectory::ToolCallRecord;
use mtrl_core::{FailureReason, Message, Trajectory};

use super::*;

fn rec(step: u64, task: &str, sample: u32, reward: f64, fail: bool) -> TrajectoryRecord {
    let mut t = Trajectory::new(task);
    t.messages = vec![
        Message::system("You are a search agent. ".repeat(20)),
        Message::user(format!("find {task}")),
        Message::assistant("<tool_call>{\"name\": \"bm25_search\"}</tool_call>"),
        Message::tool(
            "bm25_search",
            format!("[{}]", "{\"doc_id\": \"d1\"}, ".repeat(40)),
        ),
        Message::assistant("<tool_call>{\"name\": \"submit\"}</tool_call>"),
    ];
    t.turns = 2;
    t.reward = reward;
    t.scores = vec![("ndcg@10".into(), reward.max(0.0))];
    t.tool_calls = vec![
        ToolCallRecord {
            turn: 1,
            name: "bm25_search".into(),
            arguments: serde_json::json!({"query": "wings"}),
            result_ids: vec!["d1".into(), "d7".into()],
            latency_ms: 2.25,
            error: None,
        },
        ToolCallRecord {
            turn: 2,
            name: "submit".into(),
            arguments: serde_json::json!({"ids": []}),
            result_ids: vec![],
            latency_ms: 0.01,
            error: Some("submit: missing argument `doc_ids`".into()),
        },
    ];
    if fail {
        t.failure = Some(FailureReason::InvalidAnswer);
    } else {
        t.answer = Some(vec!["d7".into(), "d1".into()]);
    }
    TrajectoryRecord::new(Kind::Train, At::Step(step), sample, &t)
}

fn log() -> RunLog {
    let mut records = Vec::new();
    for step in [1, 2, 3] {
        for (i, task) in ["q1", "q2"].iter().enumerate() {
            for s in 0..2 {
                let r = step as f64 * (0.25 + i as f64 * 0.1) - s as f64 * 0.05;
                records.push(rec(step, task, s, r, step == 1 && s == 1));
            }
        }
    }
    RunLog {
        dir: PathBuf::from("runs/x"),
        files: vec![PathBuf::from(
            "runs/x/trajectories/trajectories-00001.jsonl",
        )],
        records,
        duplicates: 0,
    }
}

#[test]
fn filters_and_worst() {
    let log = log();
    let q = Query {
        step: Some(At::Step(2)),
        task: Some("q2".into()),
        ..Query::default()
    };
    assert_eq!(select(&log, &q).len(), 2);
    let failed = select(
        &log,
        &Query {
            failed: true,
            ..Query::default()
        },
    );
    assert_eq!(failed.len(), 2);
    assert!(failed.iter().all(|r| r.failure.is_some()));
    let worst = select(
        &log,
        &Query {
            worst: Some(3),
            ..Query::default()
        },
    );
    let rewards: Vec<f64> = worst.iter().map(|r| r.reward).collect();
    assert_eq!(rewards.len(), 3);
    assert!(rewards.windows(2).all(|w| w[0] <= w[1]));
    assert_eq!(
        rewards[0],
        log.records.iter().map(|r| r.reward).fold(1.0, f64::min)
    );
    assert!(Query::default().is_empty() && !q.is_empty());
}

#[test]
fn renders_turn_by_turn() {
    let log = log();
    let text = render(&log.records[1], &Style::default());
    for part in [
        "train step 1 · task q1 · sample 1",
        "[system]",
        "[user]\n    find q1",
        "[assistant 1]",
        "↳ bm25_search {\"query\":\"wings\"} → 2 ids: d1 d7 (2.2 ms)",
        "[tool bm25_search]",
        "chars (--full)",
        "↳ submit {\"ids\":[]} ✗ submit: missing argument",
        "failure: invalid_answer",
        "answer: none",
    ] {
        assert!(text.contains(part), "missing `{part}` in\n{text}");
    }
    assert!(!text.contains('\x1b'));
    let full = render(
        &log.records[0],
        &Style {
            color: true,
            full: true,
        },
    );
    assert!(full.contains("\x1b[1m") && !full.contains("(--full)"));
    assert!(full.contains("answer: d7 d1"));
    let all = render_all(
        &log.records.iter().collect::<Vec<_>>(),
        2,
        &Style::default(),
    );
    assert!(all.contains("… 10 more trajectories match"), "{all}");
}

#[test]
fn summary_and_compare() {
    let log = log();
    let s = summary(&log, &Style::default());
    assert!(s.contains("12 trajectories in 1 file (train 1–3)"), "{s}");
    assert!(s.contains("train step 2"), "{s}");
    let c = compare(&log, &At::Step(1), &At::Step(3), None, 1, &Style::default()).unwrap();
    assert!(
        c.contains("2 tasks logged at both step 1 and step 3"),
        "{c}"
    );
    assert!(
        c.contains("task q2: step 1 → step 3, mean reward +0.700"),
        "{c}"
    );
    assert!(c.contains("… 1 more tasks"), "{c}");
    assert!(c.contains("train step 3 · task q2 · sample 0"), "{c}");
    let msg = compare(&log, &At::Step(1), &At::Step(9), None, 5, &Style::default())
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("nothing logged at step 9") && msg.contains("train 1–3"),
        "{msg}"
    );
}
