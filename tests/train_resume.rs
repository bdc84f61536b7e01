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
    let d = tempfile::tempdir().unwrap();
    let cfg = write_config(
        d.path(),
        "group_size = 4\nrollout_max_concurrency = 4",
        "global_batch_size = 4\nmax_steps = 100000",
        "every_steps = 0",
    );
    let (child, run) = train_until_two_steps(&cfg, Stdio::piped());
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

/// Spawns `mtrl train --quiet` on `cfg` (stderr piped) and waits until two steps are recorded;
/// returns the child and its run folder.
fn train_until_two_steps(
    cfg: &Path,
    stdout: std::process::Stdio,
) -> (std::process::Child, std::path::PathBuf) {
    use std::time::{Duration, Instant};
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_mtrl"))
        .args(["train", "--quiet", "--config", cfg.to_str().unwrap()])
        .stdout(stdout)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let run = cfg.parent().unwrap().join("run");
    let t0 = Instant::now();
    while std::fs::read_to_string(run.join("metrics.jsonl"))
        .map(|s| s.lines().count() < 2)
        .unwrap_or(true)
    {
        assert!(t0.elapsed() < Duration::from_secs(60), "no progress");
        std::thread::sleep(Duration::from_millis(50));
    }
    (child, run)
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

/// Issue 43, item 7: the first SIGTERM stops a run gracefully; a second one (a user pressing
/// Ctrl-C again) ends it at once with status 130, and the checkpoints left behind are whole.
#[test]
fn a_second_signal_ends_the_run_at_once() {
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};
    let d = tempfile::tempdir().unwrap();
    let cfg = write_config(
        d.path(),
        "group_size = 4\nrollout_max_concurrency = 4",
        "global_batch_size = 4\nmax_steps = 100000",
        "every_steps = 1\nkeep_last = 2",
    );
    let (mut child, run) = train_until_two_steps(&cfg, Stdio::null());
    let pid = child.id().to_string();
    // Back to back: the second arrives while the first's graceful stop is under way.
    let both = format!("kill -TERM {pid}; kill -INT {pid}");
    assert!(Command::new("sh")
        .args(["-c", &both])
        .status()
        .unwrap()
        .success());
    let t1 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            t1.elapsed() < Duration::from_secs(10),
            "still running 10 s after two signals"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(130), "{err}");
    assert!(
        err.contains("press Ctrl-C again") && err.contains("interrupted"),
        "{err}"
    );
    // Whatever was written is whole: the run resumes from a verified checkpoint.
    let mgr = mtrl_learner::CheckpointManager::new(&run, 2);
    let (latest, _) = mgr.latest_valid().unwrap();
    assert!(latest.is_some(), "{err}");
    let out = train(&cfg, &["--max-steps", "4"]);
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(s["resumed_from"].as_u64().unwrap_or(0) >= 1, "{s}");
}

/// Issue 43, defect 1, as a user met it: `keep_last = 1`, a copy of the newest checkpoint renamed
/// to a later step and damaged; the resumed run's save used to delete every valid checkpoint, so
/// the next `mtrl train` began again at step 0. Now the damaged folder is set aside and the run
/// goes on from its last valid step.
#[test]
fn a_damaged_later_checkpoint_loses_no_valid_one() {
    let d = tempfile::tempdir().unwrap();
    let cfg = write_config(
        d.path(),
        "group_size = 4\nrollout_max_concurrency = 4",
        "global_batch_size = 4\nmax_steps = 8",
        "every_steps = 2\nkeep_last = 1",
    );
    train(&cfg, &["--max-steps", "4"]);
    let run = d.path().join("run");
    let src = run.join("step-00000004");
    let bad = run.join("step-00000010");
    copy_dir(&src, &bad);
    let w = bad.join("policy/model.safetensors");
    let bytes = std::fs::read(&w).unwrap();
    std::fs::write(&w, &bytes[..bytes.len() / 2]).unwrap();
    let out = train(&cfg, &["--max-steps", "6"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("step-00000010") && err.contains("rejected-"),
        "{err}"
    );
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (s["resumed_from"].as_u64(), s["steps"].as_u64()),
        (Some(4), Some(6)),
        "{s}"
    );
    // The next start resumes from step 6, not from scratch.
    let out = train(&cfg, &["--max-steps", "8"]);
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(s["resumed_from"].as_u64(), Some(6), "{s}");
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dest = to.join(e.file_name());
        if e.path().is_dir() {
            copy_dir(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), dest).unwrap();
        }
    }
}

/// Issue 43, defect 2: an update skipped for a non-finite loss or gradient is reported on stderr
/// and in the step record; `train.max_skipped_updates` steps in a row end the run with an error
/// naming the cause, and 0 never ends it.
#[test]
fn non_finite_updates_are_reported_and_bounded() {
    let d = tempfile::tempdir().unwrap();
    // A learning rate that blows the weights up: the first update lands, later losses are not
    // finite.
    let cfg = write_config(
        d.path(),
        "group_size = 4\nrollout_max_concurrency = 4",
        "global_batch_size = 4\nmax_steps = 8\nmax_skipped_updates = 2",
        "every_steps = 0",
    );
    let text = std::fs::read_to_string(&cfg).unwrap();
    let text = text
        .replace("lr = 0.01", "lr = 1e30")
        .replace("grad_clip = 1.0", "grad_clip = 0.0");
    std::fs::write(&cfg, text).unwrap();
    let out = mtrl(&["train", "--quiet", "--config", cfg.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("max_skipped_updates") && err.contains("non-finite"),
        "{err}"
    );
    assert!(err.contains("optimizer update(s) skipped"), "{err}");
    // 0 = never stop: the same run reaches its last step, every skip still reported.
    std::fs::remove_dir_all(d.path().join("run")).unwrap();
    let text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(
        &cfg,
        text.replace("max_skipped_updates = 2", "max_skipped_updates = 0"),
    )
    .unwrap();
    let out = train(&cfg, &[]);
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(s["steps"], 8, "{s}");
    let skipped = records(&d.path().join("run"))
        .iter()
        .filter(|r| r["skip_reason"].is_string())
        .count();
    assert!(skipped >= 2, "{skipped} records name a skipped update");
}
