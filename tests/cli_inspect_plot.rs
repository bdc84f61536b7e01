//! What a run leaves to read: a short `mtrl train` with `[logging] trajectories = true` on the
//! one-token pick task, then `mtrl inspect` (summary, --step, --worst, --failed, --task,
//! --compare) and `mtrl plot` on its folder, and the errors for a missing folder and for a log
//! of another format version.

mod train_common;

use std::path::Path;

use train_common::*;

fn run_ok(args: &[&str]) -> String {
    let out = mtrl(args);
    assert!(
        out.status.success(),
        "mtrl {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn run_err(args: &[&str]) -> String {
    let out = mtrl(args);
    assert!(!out.status.success(), "mtrl {args:?} should fail");
    String::from_utf8(out.stderr).unwrap()
}

/// The trajectory headers of `inspect` output: `(step, task)`.
fn headers(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|l| l.strip_prefix("━━ train step "))
        .map(|l| {
            let mut parts = l.split(" · ");
            let step = parts.next().unwrap().to_string();
            let task = parts
                .next()
                .unwrap()
                .trim_start_matches("task ")
                .to_string();
            (step, task)
        })
        .collect()
}

#[test]
fn train_then_inspect_and_plot() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(
        dir.path(),
        "group_size = 4\nrollout_max_concurrency = 8",
        "global_batch_size = 4\nmax_steps = 6",
        "every_steps = 6\nkeep_last = 1",
    );
    let mut text = std::fs::read_to_string(&cfg).unwrap();
    text.push_str("[logging]\ntrajectories = true\ntrajectory_rotate_mb = 1\n");
    std::fs::write(&cfg, text).unwrap();
    train(&cfg, &[]);
    let run = dir.path().join("run");
    let r = run.to_str().unwrap();

    // The log: one line per trajectory, versioned, with counts instead of token vectors.
    let log = run.join("trajectories/trajectories-00001.jsonl");
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 6 * 4 * 4);
    let first = &lines[0];
    assert_eq!(first["format_version"], 1);
    assert_eq!(
        (&first["kind"], &first["step"]),
        (&"train".into(), &1.into())
    );
    assert_eq!(first["tokens"]["sampled"], 1);
    assert_eq!(first["versions"], serde_json::json!({"min": 0, "max": 0}));
    assert!(first.get("loss_mask").is_none() && first["messages"].is_array());
    assert_eq!(lines.last().unwrap()["step"], 6);

    let summary = run_ok(&["inspect", r]);
    assert!(
        summary.contains("96 trajectories in 1 file (train 1–6)"),
        "{summary}"
    );
    assert!(summary.contains("train step 6"), "{summary}");

    let step = run_ok(&["inspect", r, "--step", "3", "--color", "never"]);
    let h = headers(&step);
    assert_eq!(h.len(), 16, "{step}");
    assert!(h.iter().all(|(s, _)| s == "3"));
    assert!(
        step.contains("[user]") && step.contains("[assistant 1]") && step.contains("answer: d")
    );

    let worst = run_ok(&["inspect", r, "--worst", "3"]);
    assert_eq!(headers(&worst).len(), 3, "{worst}");
    let rewards: Vec<f64> = worst
        .lines()
        .filter_map(|l| l.strip_prefix("reward "))
        .map(|l| l.split(' ').next().unwrap().parse().unwrap())
        .collect();
    assert!(rewards.windows(2).all(|w| w[0] <= w[1]), "{rewards:?}");

    // Pick episodes always answer: nothing failed.
    let failed = run_ok(&["inspect", r, "--failed"]);
    assert!(
        failed.contains("no trajectory matches (logged: train 1–6)"),
        "{failed}"
    );

    let task = run_ok(&["inspect", r, "--task", "q0", "--limit", "100"]);
    let h = headers(&task);
    assert!(!h.is_empty() && h.iter().all(|(_, t)| t == "q0"), "{task}");

    let cmp = run_ok(&["inspect", r, "--compare", "1", "6", "--limit", "2"]);
    assert!(cmp.contains("logged at both step 1 and step 6"), "{cmp}");
    assert!(cmp.contains(": step 1 → step 6, mean reward"), "{cmp}");
    assert!(cmp.contains("train step 1 · task") && cmp.contains("train step 6 · task"));

    let out = run_ok(&["plot", r]);
    let png = Path::new(out.trim());
    assert_eq!(png, run.join("plots/training.png"));
    let bytes = std::fs::read(png).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    assert!(bytes.len() > 20_000, "{} bytes", bytes.len());

    // Bad input names the path.
    let missing = dir.path().join("no-such-run");
    let m = missing.to_str().unwrap();
    for cmd in ["inspect", "plot"] {
        let err = run_err(&[cmd, m]);
        assert!(
            err.contains("no-such-run") && err.contains("no such run folder"),
            "{err}"
        );
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let future = text.replacen("\"format_version\":1", "\"format_version\":7", 1);
    std::fs::write(&log, future).unwrap();
    let err = run_err(&["inspect", r]);
    assert!(
        err.contains("trajectories-00001.jsonl:1") && err.contains("format_version 7"),
        "{err}"
    );
}
