//! Checkpoint and resume of `mtrl train` (CPU, f32, η = 0): a run stopped after step 3 and
//! resumed reproduces the uninterrupted run's losses and weights at step 6 bit for bit; a
//! corrupted newest checkpoint is reported and the previous one used (again bitwise the same
//! result); a config change that makes resuming meaningless is refused naming the keys; SIGTERM
//! writes a checkpoint and exits 0. `MTRL_TRACE` prints each phase of a run.

mod train_common;

use std::path::Path;

use train_common::*;

const FIELDS: &[&str] = &[
    "loss",
    "grad_norm",
    "reward_mean",
    "entropy",
    "tokens",
    "lr",
];

fn setup(dir: &Path, group_size: usize) -> std::path::PathBuf {
    write_config(
        dir,
        &format!("group_size = {group_size}\nrollout_max_concurrency = 4"),
        "global_batch_size = 4\nmax_steps = 6",
        "every_steps = 3\nkeep_last = 2",
    )
}

fn weights(run: &Path, step: u64) -> Vec<u8> {
    std::fs::read(run.join(format!("step-{step:08}/policy/model.safetensors"))).unwrap()
}

fn same_records(a: &[serde_json::Value], b: &[serde_json::Value]) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        for f in FIELDS {
            assert_eq!(x[f], y[f], "step {} field {f}", x["step"]);
        }
    }
}

#[test]
fn resumed_run_matches_uninterrupted_bitwise() {
    let a = tempfile::tempdir().unwrap();
    let cfg_a = setup(a.path(), 4);
    train(&cfg_a, &[]);
    let run_a = a.path().join("run");
    let rec_a = records(&run_a);
    assert_eq!(rec_a.len(), 6);
    // The run moved the weights.
    assert!(rec_a.iter().all(|r| r["grad_norm"].as_f64().unwrap() > 0.0));

    let b = tempfile::tempdir().unwrap();
    let cfg_b = setup(b.path(), 4);
    train(&cfg_b, &["--max-steps", "3"]);
    let run_b = b.path().join("run");
    assert_eq!(records(&run_b).len(), 3);
    let out = train(&cfg_b, &[]);
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["resumed_from"], 3);
    same_records(&rec_a, &records(&run_b));
    assert!(
        weights(&run_a, 6) == weights(&run_b, 6),
        "weights differ at step 6"
    );

    // Corrupt the newest checkpoint: reported, the step-3 one is used, same result again.
    let w = run_b.join("step-00000006/policy/model.safetensors");
    let bytes = std::fs::read(&w).unwrap();
    std::fs::write(&w, &bytes[..bytes.len() / 2]).unwrap();
    let out = train(&cfg_b, &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("step-00000006") && err.contains("model.safetensors"),
        "{err}"
    );
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["resumed_from"], 3);
    assert!(weights(&run_a, 6) == weights(&run_b, 6));

    // A different group size makes the checkpoint meaningless: refused, naming the key.
    let cfg_c = setup(b.path(), 2);
    let out = mtrl(&["train", "--quiet", "--config", cfg_c.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("rollout.group_size"), "{err}");
    // --fresh starts over instead.
    let out = train(&cfg_c, &["--fresh", "--max-steps", "1"]);
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["resumed_from"], serde_json::Value::Null);
}

/// The same config reached from another working directory, by an absolute path through `..`,
/// resumes: resume keys compare what the paths point to, not their spelling.
#[test]
fn resumes_from_another_working_directory() {
    let d = tempfile::tempdir().unwrap();
    let project = d.path().join("project");
    for sub in ["configs", "data"] {
        std::fs::create_dir_all(project.join(sub)).unwrap();
    }
    std::fs::copy(
        fixtures().join("pick/tasks.jsonl"),
        project.join("data/tasks.jsonl"),
    )
    .unwrap();
    let absolute = write_config(
        &project.join("configs"),
        "group_size = 4\nrollout_max_concurrency = 4",
        "global_batch_size = 4\nmax_steps = 3",
        "every_steps = 1",
    );
    // Relative paths, resolved against the config's folder.
    let text = std::fs::read_to_string(&absolute)
        .unwrap()
        .replace(
            &fixtures().join("pick/tasks.jsonl").display().to_string(),
            "../data/tasks.jsonl",
        )
        .replace(&project.join("configs/run").display().to_string(), "../run");
    assert!(text.contains("\"../data/tasks.jsonl\"") && text.contains("\"../run\""));
    std::fs::write(&absolute, text).unwrap();
    let run = |cwd: &Path, config: &str, extra: &[&str]| {
        let mut args = vec!["train", "--quiet", "--config", config];
        args.extend_from_slice(extra);
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_mtrl"))
            .args(&args)
            .current_dir(cwd)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(out.status.success(), "{err}");
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let s = run(&project, "configs/train.toml", &["--max-steps", "2"]);
    assert_eq!(s["steps"], 2);
    let elsewhere = d.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let dotted = project.join("configs/../configs/train.toml");
    let s = run(&elsewhere, dotted.to_str().unwrap(), &[]);
    assert_eq!(s["resumed_from"], 2);
    assert_eq!(s["steps"], 3);
    assert_eq!(records(&project.join("run")).len(), 3);
}

#[cfg(unix)]
#[test]
fn sigterm_writes_a_checkpoint_and_exits_cleanly() {
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};
    let d = tempfile::tempdir().unwrap();
    let cfg = write_config(
        d.path(),
        "group_size = 4\nrollout_max_concurrency = 4",
        "global_batch_size = 4\nmax_steps = 100000",
        "every_steps = 0",
    );
    let child = Command::new(env!("CARGO_BIN_EXE_mtrl"))
        .args(["train", "--quiet", "--config", cfg.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let run = d.path().join("run");
    let t0 = Instant::now();
    while std::fs::read_to_string(run.join("metrics.jsonl"))
        .map(|s| s.lines().count() < 2)
        .unwrap_or(true)
    {
        assert!(t0.elapsed() < Duration::from_secs(60), "no progress");
        std::thread::sleep(Duration::from_millis(50));
    }
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["interrupted"], true);
    let steps = summary["steps"].as_u64().unwrap();
    assert!(steps >= 2);
    assert!(
        run.join(format!("step-{steps:08}/trainer.json")).exists(),
        "{err}"
    );
}

/// `MTRL_TRACE=1` places every phase of a run (engine built, engine thread, the first forwards'
/// phases, each step's wait / update / publish, shutdown) on stderr; without it there is no
/// trace line. What a stall on a new device is diagnosed with.
#[test]
fn trace_lines_place_each_phase() {
    let d = tempfile::tempdir().unwrap();
    let config = write_config(
        d.path(),
        "group_size = 4\nrollout_max_concurrency = 4",
        "global_batch_size = 4\nmax_steps = 2",
        "every_steps = 2",
    );
    let run = |trace: Option<&str>| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_mtrl"));
        cmd.args(["train", "--quiet", "--config", config.to_str().unwrap()]);
        cmd.env_remove("MTRL_TRACE");
        if let Some(v) = trace {
            cmd.env("MTRL_TRACE", v);
        }
        let out = cmd.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(out.status.success(), "{err}");
        std::fs::remove_dir_all(d.path().join("run")).unwrap();
        err
    };
    let err = run(Some("1"));
    let phases = [
        "mtrl train: ",
        "policy loaded on ",
        "engine built: batch ",
        "rollout engine built (version 0)",
        "environments ready",
        "rollouts started from group 0",
        "mtrl-engine] engine thread up, serving version 0",
        "mtrl-engine] request 1: prompt",
        "mtrl-engine] engine step 1: start",
        "forward 1: model forward done",
        "forward 1: logits done",
        "mtrl-engine] engine step 1: done",
        "step 1: waiting for 4 groups",
        "step 1: batch arrived",
        "step 1: update done",
        "step 1: weights published",
        "mtrl-engine] applying weights of version 1",
        "step 2: weights published",
        "stopping the rollouts",
        "rollouts stopped",
    ];
    let mut at = 0;
    for p in phases {
        let i = err
            .find(p)
            .unwrap_or_else(|| panic!("no trace line `{p}` in:\n{err}"));
        if !p.contains("mtrl-engine]") && !p.starts_with("forward") {
            // The learner's own lines come in this order.
            assert!(i >= at, "`{p}` out of order in:\n{err}");
            at = i;
        }
    }
    // Sparse by default: engine steps 9..255 are not traced; `all` traces every one.
    assert!(!err.contains("engine step 9: start"), "{err}");
    assert!(run(Some("all")).contains("engine step 9: start"));
    assert!(!run(None).contains("[trace"));
    assert!(!run(Some("0")).contains("[trace"));
}
