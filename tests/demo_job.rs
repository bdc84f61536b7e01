//! End-to-end test of the default job (`mtrl demo`, what `mtrl` and `mtrl train` run without a
//! config), shortened: the embedded demo config with every path moved into a temporary folder,
//! fewer teacher episodes, one SFT epoch, two RL steps and a greedy-only evaluation on a few test
//! queries. It checks that every stage runs and leaves its outputs: task files, teacher
//! trajectories, tokenizer, SFT checkpoint, RL checkpoints, the evaluation table (Markdown, JSON,
//! CSV) and the training curves.

mod common;
use common::mtrl;

#[test]
fn default_job_runs_every_stage_and_writes_its_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cfg = common::demo_config(
        d,
        &[
            ("teacher_samples = 4", "teacher_samples = 2"),
            ("epochs = 3", "epochs = 1"),
            ("group_size = 8", "group_size = 4"),
            ("global_batch_size = 8", "global_batch_size = 2"),
        ],
    );
    let (ok, out, err) = mtrl(&[
        "demo",
        "--config",
        cfg.to_str().unwrap(),
        "--max-steps",
        "2",
        "--eval-k",
        "0",
        "--eval-limit",
        "6",
        "--quiet",
    ]);
    assert!(ok, "stdout:\n{out}\nstderr:\n{err}");
    for stage in ["1/7", "3/7", "5/7", "6/7", "7/7"] {
        assert!(err.contains(stage), "stage {stage} missing:\n{err}");
    }
    // The table: base, tuned, both scripted baselines and the paired difference.
    for row in [
        "| base |",
        "| tuned |",
        "| bm25-once |",
        "| vector-once |",
        "Δ tuned − base",
    ] {
        assert!(out.contains(row), "no `{row}` row:\n{out}");
    }
    for f in [
        "data/train.jsonl",
        "data/test.jsonl",
        "teacher.jsonl",
        "tokenizer/tokenizer.json",
        "sft/model.safetensors",
        "sft/tokenizer.json",
        "rl/metrics.jsonl",
        "rl/eval/eval.md",
        "rl/eval/eval.json",
        "rl/eval/eval.csv",
    ] {
        assert!(d.join("demo").join(f).is_file(), "{f} was not written");
    }
    let ckpts = std::fs::read_dir(d.join("demo/rl"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("step-"))
        .count();
    assert!(ckpts >= 1, "no RL checkpoint");
    // Both training stages leave typed records of every step (SFT through the same sinks as RL).
    let sft: Vec<mtrl_core::SftRecord> =
        mtrl_core::read_jsonl(&d.join("demo/sft/sft-metrics.jsonl")).unwrap();
    assert!(!sft.is_empty() && sft.iter().all(|r| r.loss.is_finite() && r.tokens > 0));
    let rl: Vec<mtrl_core::StepRecord> =
        mtrl_core::read_jsonl(&d.join("demo/rl/metrics.jsonl")).unwrap();
    assert_eq!(rl.iter().map(|r| r.step).collect::<Vec<_>>(), vec![1, 2]);
    let png = std::fs::read(d.join("demo/rl/plots/training.png")).unwrap();
    assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000);
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("demo/rl/eval/eval.json")).unwrap())
            .unwrap();
    let runs = report["datasets"][0]["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 4);
    // The teacher fails on purpose sometimes (it keeps searching past the turn budget), and uses
    // the demo environment's argument shortcuts (no query, submit by rank).
    let teacher = std::fs::read_to_string(d.join("demo/teacher.jsonl")).unwrap();
    assert!(teacher.contains("\"failure\":\"turn_limit\""));
    assert!(
        teacher.contains(r#"{\"hits\":[1,2,3,4,5]}"#),
        "no submit by rank"
    );
    assert!(
        !teacher.contains(r#"\"query\":"#),
        "the teacher wrote a query"
    );
    kill_nine_and_faults(d);
}

/// The demo's RL stage from its SFT checkpoint in `d`, synchronous (η = 0), one episode at a time,
/// four steps of two groups, a checkpoint every step, into `d/<name>`.
fn rl_config(d: &std::path::Path, name: &str) -> std::path::PathBuf {
    let text = std::fs::read_to_string(d.join("demo.toml")).unwrap();
    let mut text = text.replace(
        &format!("dir = \"{}/demo/rl\"", d.display()),
        &format!("dir = \"{}/{name}\"", d.display()),
    );
    for (from, to) in [
        ("max_staleness = 1", "max_staleness = 0"),
        (
            "rollout_max_concurrency = 64",
            "rollout_max_concurrency = 1",
        ),
        ("max_steps = 30", "max_steps = 4"),
        ("every_steps = 10", "every_steps = 1"),
    ] {
        assert!(text.contains(from), "demo.toml has no `{from}`");
        text = text.replace(from, to);
    }
    let p = d.join(format!("{name}.toml"));
    std::fs::write(&p, text).unwrap();
    p
}

fn train_cmd(cfg: &std::path::Path) -> std::process::Command {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_mtrl"));
    c.args(["train", "--quiet", "--config", cfg.to_str().unwrap()]);
    c.stdout(std::process::Stdio::null());
    c.stderr(std::process::Stdio::piped());
    c
}

fn run_to_end(cfg: &std::path::Path, faults: Option<&str>, extra: &[&str]) {
    let mut c = train_cmd(cfg);
    c.args(extra);
    if let Some(f) = faults {
        c.env("MTRL_FAULTS", f);
    }
    let out = c.output().unwrap();
    assert!(
        out.status.success(),
        "mtrl train failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// What must be identical between two runs: every record field but wall times, rates and the
/// engine-wide counters of a step's window (prompt tokens, faults: episodes of the next step may
/// start inside it); every trajectory line but its timestamp and tool latencies.
fn deterministic(mut v: serde_json::Value) -> serde_json::Value {
    if let Some(o) = v.as_object_mut() {
        o.retain(|k, _| {
            !(k.starts_with("time_")
                || k.ends_with("_per_s")
                || k.ends_with("_wait_s")
                || k.starts_with("prompt_tokens_")
                || matches!(k.as_str(), "step_wall_s" | "elapsed_s" | "unix_ms"))
        });
        if let Some(calls) = o.get_mut("tool_calls").and_then(|c| c.as_array_mut()) {
            for c in calls {
                c.as_object_mut().unwrap().remove("latency_ms");
            }
        }
    }
    v
}

fn lines(paths: &[std::path::PathBuf]) -> Vec<serde_json::Value> {
    paths
        .iter()
        .flat_map(|p| {
            std::fs::read_to_string(p)
                .unwrap()
                .lines()
                .map(|l| deterministic(serde_json::from_str(l).unwrap()))
                .collect::<Vec<_>>()
        })
        .collect()
}

fn run_files(
    run: &std::path::Path,
) -> (
    Vec<u8>,
    Vec<u8>,
    Vec<serde_json::Value>,
    Vec<serde_json::Value>,
) {
    let last = run.join("step-00000004");
    let mut logs: Vec<_> = std::fs::read_dir(run.join("trajectories"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    logs.sort();
    (
        std::fs::read(last.join("policy/model.safetensors")).unwrap(),
        std::fs::read(last.join("optimizer.safetensors")).unwrap(),
        lines(&[run.join("metrics.jsonl")]),
        lines(&logs),
    )
}

/// kill -9 at many points of a multi-turn search run: every restart resumes from the newest valid
/// checkpoint and the run ends bit for bit where the uninterrupted one ends — weights, optimizer
/// state, step records and trajectory log (wall times aside). Then the same run with injected
/// faults (5 % of environment steps fail, 2 % stall, 1 % of generations fail): retries hide
/// them, every fault is counted in the records, a stop and resume in the middle changes nothing,
/// and the result is again the fault-free run's.
fn kill_nine_and_faults(d: &std::path::Path) {
    let plain = rl_config(d, "rl-plain");
    run_to_end(&plain, None, &[]);
    let want = run_files(&d.join("rl-plain"));
    assert_eq!(want.2.len(), 4);
    assert!(want.3.len() == 4 * 8, "{} trajectory lines", want.3.len());
    let turns: u64 = want.3.iter().map(|t| t["turns"].as_u64().unwrap()).sum();
    assert!(
        turns > 32,
        "the episodes are multi-turn: {turns} turns in 32 episodes"
    );

    let killed = rl_config(d, "rl-killed");
    // Kill points from a fixed pseudo-random sequence, 0.1 – 3.3 s after each start: during
    // start-up, rollouts, learner steps and checkpoint writes.
    let mut z = 0x9E37_79B9_7F4A_7C15u64;
    let mut kills = 0;
    let mut tries = 0;
    while kills < 12 {
        tries += 1;
        assert!(tries < 60, "the run kept finishing before its kill point");
        z = mtrl_core::rng::splitmix(z);
        let delay = std::time::Duration::from_millis(100 + z % 3200);
        let mut child = train_cmd(&killed).spawn().unwrap();
        std::thread::sleep(delay);
        if child.try_wait().unwrap().is_some() {
            // It finished first: start over from scratch so later kills still land mid-run.
            std::fs::remove_dir_all(d.join("rl-killed")).unwrap();
            continue;
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        kills += 1;
    }
    run_to_end(&killed, None, &[]);
    let got = run_files(&d.join("rl-killed"));
    assert!(got.0 == want.0, "weights differ after {kills} kills");
    assert!(got.1 == want.1, "optimizer state differs");
    assert_eq!(got.2, want.2, "step records differ");
    assert_eq!(got.3, want.3, "trajectory logs differ");

    let faulty = rl_config(d, "rl-faults");
    let spec = "tool_error:0.05,slow_tool:0.02:0.05,engine_error:0.01";
    run_to_end(&faulty, Some(spec), &["--max-steps", "2"]);
    run_to_end(&faulty, Some(spec), &[]);
    let recs: Vec<mtrl_core::StepRecord> =
        mtrl_core::read_jsonl(&d.join("rl-faults/metrics.jsonl")).unwrap();
    let injected: u64 = recs.iter().flat_map(|r| r.faults_injected.values()).sum();
    let retries: u64 = recs.iter().map(|r| r.episode_retries).sum();
    let hard: u64 = ["tool_error", "engine_error"]
        .iter()
        .map(|k| {
            recs.iter()
                .filter_map(|r| r.faults_injected.get(*k))
                .sum::<u64>()
        })
        .sum();
    assert!(injected > 0 && hard > 0, "no fault was injected: {recs:?}");
    assert_eq!(
        retries, hard,
        "every failing fault is retried once it strikes"
    );
    assert!(recs
        .iter()
        .all(|r| r.episodes_errored == 0 && r.groups_replaced == 0));
    let got = run_files(&d.join("rl-faults"));
    assert!(got.0 == want.0, "the faulty run trained other weights");
}
