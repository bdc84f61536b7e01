//! Writer and reader of the trajectory log: round trip, rotation, drops, errors, versions.

use std::path::Path;

use mtrl_core::trajectory::ToolCallRecord;
use mtrl_core::{FailureReason, Message, Trajectory};

use super::*;

fn traj(task: &str, reward: f64, words: usize) -> Trajectory {
    let mut t = Trajectory::new(task);
    t.messages = vec![
        Message::user(format!("question {task}")),
        Message::assistant("word ".repeat(words)),
    ];
    t.push_context(&[1, 2, 3]);
    t.prompt_len = 3;
    t.push_sampled(&[4, 5], &[-0.1, -0.2], &[6, 7]);
    t.push_context(&[8]);
    t.reward = reward;
    t.scores = vec![("ndcg@10".into(), reward)];
    t.turns = 1;
    t.tool_calls.push(ToolCallRecord {
        turn: 1,
        name: "bm25_search".into(),
        arguments: serde_json::json!({"query": "x", "k": 3}),
        result_ids: vec!["d1".into(), "d2".into()],
        latency_ms: 0.25,
        error: None,
    });
    t
}

#[test]
fn records_count_tokens_and_versions() {
    let r = TrajectoryRecord::new(Kind::Train, At::Step(4), 2, &traj("q", 0.5, 1));
    assert_eq!(
        r.tokens,
        TokenCounts {
            prompt: 3,
            sampled: 2,
            total: 6
        }
    );
    assert_eq!(r.versions, Some(VersionRange { min: 6, max: 7 }));
    assert_eq!(r.score("ndcg@10"), Some(0.5));
    let v = serde_json::to_value(&r).unwrap();
    assert_eq!(v["format_version"], TRAJLOG_FORMAT_VERSION);
    assert_eq!(v["kind"], "train");
    assert_eq!(v["step"], 4);
    assert!(v.get("loss_mask").is_none(), "no token vectors on disk");
    let text = TrajectoryRecord::new(Kind::Eval, "base".into(), 0, &Trajectory::new("t"));
    assert_eq!(text.versions, None);
    assert_eq!(serde_json::to_value(&text).unwrap()["step"], "base");
    assert_eq!(At::parse("12"), At::Step(12));
    assert_eq!(At::parse("base"), At::Label("base".into()));
}

#[test]
fn lines_round_trip_and_resumed_logs_continue_numbering() {
    let dir = tempfile::tempdir().unwrap();
    let log = TrajectoryLog::open(dir.path(), LogOptions::default()).unwrap();
    let mut t = traj("q1", 0.25, 3);
    t.failure = Some(FailureReason::TurnLimit);
    assert_eq!(
        log.send_groups(Kind::Train, 1, &[vec![t.clone(), t.clone()]]),
        2
    );
    assert!(log.send(Kind::Eval, "base", &t));
    let stats = log.close().unwrap();
    assert_eq!((stats.written, stats.dropped, stats.files.len()), (3, 0, 1));
    let back = read_file(&stats.files[0]).unwrap();
    assert_eq!(back.len(), 3);
    assert_eq!(back[1].sample, 1);
    assert_eq!(back[0].messages, t.messages);
    assert_eq!(back[0].tool_calls, t.tool_calls);
    assert_eq!(back[0].failure, Some(FailureReason::TurnLimit));
    assert_eq!(back[2].step, At::Label("base".into()));

    // A second log in the same folder (a resumed run) starts file 2; the replayed step replaces
    // the earlier lines when the run is read.
    let log = TrajectoryLog::open(dir.path(), LogOptions::default()).unwrap();
    log.send_groups(Kind::Train, 1, &[vec![traj("q1", 1.0, 1)]]);
    let stats = log.close().unwrap();
    assert!(stats.files[0].ends_with("trajectories-00002.jsonl"));
    let run = read_run(dir.path()).unwrap();
    assert_eq!(
        (run.files.len(), run.records.len(), run.duplicates),
        (2, 3, 1)
    );
    assert_eq!(run.records[0].reward, 1.0);
}

#[test]
fn token_vectors_are_logged_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let t = traj("q", 0.5, 3);
    for tokens in [false, true] {
        let d = dir.path().join(format!("t{tokens}"));
        let opts = LogOptions {
            tokens,
            ..LogOptions::default()
        };
        let log = TrajectoryLog::open(&d, opts).unwrap();
        log.send(Kind::Train, 1u64, &t);
        log.close().unwrap();
        let r = &read_run(&d).unwrap().records[0];
        match tokens {
            false => assert!(r.ids.is_none()),
            true => assert_eq!(r.ids.as_ref().unwrap(), &TokenVectors::of(&t)),
        }
    }
}

#[test]
fn rotates_past_the_size_limit() {
    let dir = tempfile::tempdir().unwrap();
    let opts = LogOptions {
        rotate_bytes: 2_000,
        queue: 64,
        tokens: false,
    };
    let log = TrajectoryLog::open(&dir.path().join("trajectories"), opts).unwrap();
    for i in 0..20 {
        log.send(Kind::Train, i as u64, &traj(&format!("q{i}"), 0.0, 100));
    }
    let stats = log.close().unwrap();
    assert_eq!(stats.written, 20);
    assert!(stats.files.len() >= 5, "{:?}", stats.files);
    for (i, f) in stats.files.iter().enumerate() {
        let name = format!("trajectories-{:05}.jsonl", i + 1);
        assert!(f.ends_with(&name), "{}", f.display());
        let size = std::fs::metadata(f).unwrap().len();
        let lines = read_file(f).unwrap().len();
        assert!(lines >= 1 && (size <= 2_000 || lines == 1), "{size} bytes");
    }
    let run = read_run(dir.path()).unwrap();
    assert_eq!(run.records.len(), 20);
    let steps: Vec<At> = run.records.iter().map(|r| r.step.clone()).collect();
    assert_eq!(
        steps,
        (0..20).map(At::Step).collect::<Vec<_>>(),
        "order kept"
    );
}

#[test]
fn a_full_queue_drops_and_counts_instead_of_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let opts = LogOptions {
        rotate_bytes: 1 << 20,
        queue: 2,
        tokens: false,
    };
    let log = TrajectoryLog::open(dir.path(), opts).unwrap();
    let t = traj("q", 0.0, 1);
    let sent = {
        let _stall = lock(&log.shared.pause);
        (0..10).filter(|_| log.send(Kind::Train, 0, &t)).count()
    };
    // The writer may have taken one record before stalling: at most 3 got through.
    assert!((2..=3).contains(&sent), "{sent}");
    let stats = log.close().unwrap();
    assert_eq!(stats.written, sent as u64);
    assert_eq!(stats.dropped, 10 - sent as u64);
}

#[test]
fn write_errors_are_reported_not_panicked() {
    let dir = tempfile::tempdir().unwrap();
    let log = TrajectoryLog::open(dir.path(), LogOptions::default()).unwrap();
    // Occupy the name of the first file with a folder: creating it fails.
    std::fs::create_dir(dir.path().join("trajectories-00001.jsonl")).unwrap();
    let t = traj("q", 0.0, 1);
    log.send(Kind::Train, 0, &t);
    log.send(Kind::Train, 0, &t);
    let msg = log.close().unwrap_err().to_string();
    assert!(msg.contains("trajectories-00001.jsonl"), "{msg}");
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
}

#[test]
fn other_versions_and_bad_lines_name_the_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("trajectories-00001.jsonl");
    let line = serde_json::to_string(&TrajectoryRecord::new(
        Kind::Train,
        At::Step(1),
        0,
        &traj("q", 0.0, 1),
    ))
    .unwrap();
    let future = line.replacen("\"format_version\":1", "\"format_version\":99", 1);
    write(&f, &format!("{line}\n{future}\n"));
    let msg = read_run(dir.path()).unwrap_err().to_string();
    assert!(
        msg.contains("trajectories-00001.jsonl:2") && msg.contains("99"),
        "{msg}"
    );
    write(
        &f,
        &format!("{line}\n{{\"format_version\": 1, \"kind\": 3}}\n"),
    );
    let msg = read_file(&f).unwrap_err().to_string();
    assert!(
        msg.contains(":2") && msg.contains("not a trajectory record"),
        "{msg}"
    );
    // A folder whose newest log has another version is not appended to.
    write(&f, &format!("{future}\n"));
    let msg = TrajectoryLog::open(dir.path(), LogOptions::default())
        .err()
        .unwrap()
        .to_string();
    assert!(msg.contains("format_version 99"), "{msg}");
    let missing = dir.path().join("nope");
    let msg = read_run(&missing).unwrap_err().to_string();
    assert!(
        msg.contains("nope") && msg.contains("no such run folder"),
        "{msg}"
    );
    let empty = tempfile::tempdir().unwrap();
    let msg = read_run(empty.path()).unwrap_err().to_string();
    assert!(msg.contains("no trajectory log"), "{msg}");
}
