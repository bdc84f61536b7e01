//! End-to-end test of the default job (`mtrl demo`, what `mtrl` and `mtrl train` run without a
//! config), shortened: the embedded demo config with every path moved into a temporary folder,
//! fewer teacher episodes, two RL steps and a greedy-only evaluation on a few test
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
            ("teacher_samples = 8", "teacher_samples = 2"),
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
    for stage in ["1/8", "3/8", "5/8", "6/8", "7/8", "8/8"] {
        assert!(err.contains(stage), "stage {stage} missing:\n{err}");
    }
    // The table: base, the RFT control, tuned, every scripted baseline and the paired
    // differences; then the strategy table.
    for row in [
        "| base |",
        "| rft |",
        "| tuned |",
        "| bm25-once |",
        "| vector-once |",
        "| hybrid-rrf |",
        "| teacher-best |",
        "Δ tuned − base",
        "Δ tuned − rft",
        "Δ tuned − teacher-best",
        "| data/test | tuned | greedy |",
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
        "rl/eval/strategy.md",
        "rl/eval/demo.json",
        "rft/model.safetensors",
        "rft/tokenizer.json",
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
    assert_eq!(runs.len(), 7);
    // Validation (train.val_every) chose the checkpoints of RL and of the RFT control: with two
    // steps, both validated at their last step and evaluated it.
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("demo/rl/eval/demo.json")).unwrap())
            .unwrap();
    assert_eq!(record["tuned_step"], 2, "{record}");
    assert_eq!(record["rft_step"], 2, "{record}");
    assert!(err.contains("step-00000002/policy (best)"), "{err}");
    // `mtrl demo-table` over that one run: the seed table, the intervals, the bar read off them,
    // the strategy table and the seconds of every stage.
    let (ok, table, terr) = mtrl(&["demo-table", d.join("demo").to_str().unwrap()]);
    assert!(ok, "{terr}");
    for needle in [
        "| demo | 6 | 1 | tuned |",
        "| tuned − rft | demo | 6 |",
        "The bar, read off",
        "| demo | tuned | ",
        "| run | seed | total | task files | search indexes |",
        "| demo | 0 | ",
    ] {
        assert!(table.contains(needle), "no `{needle}` in:\n{table}");
    }
    let bar = table
        .lines()
        .find(|l| {
            l.starts_with("| demo | ")
                && (l.contains("above 0") || l.contains("spans 0") || l.contains("below 0"))
        })
        .unwrap_or_else(|| panic!("no verdict row:\n{table}"));
    assert_eq!(bar.matches(" / ").count(), 2, "{bar}");
    // The teacher explores (both tools, one or two searches) and uses the demo environment's
    // argument shortcuts (no query, submit by rank).
    let teacher = std::fs::read_to_string(d.join("demo/teacher.jsonl")).unwrap();
    for needle in [r#"{\"hits\":["#, "bm25_search", "vector_search"] {
        assert!(teacher.contains(needle), "the teacher never wrote {needle}");
    }
    assert!(
        !teacher.contains(r#"\"query\":"#),
        "the teacher wrote a query"
    );
    kill_nine_and_faults(d);
    pinned_runs_ignore_timing(d);
    agents(d);
}

/// The demo's pinned rollouts (`weight_sync = "pinned"`) with its staleness of 1: the run does not
/// depend on timing — 64 episodes in flight or one at a time, the same weights, step records and
/// trajectories bit for bit (with `"latest"`, later turns would take up whichever version the
/// learner had published by then).
fn pinned_runs_ignore_timing(d: &std::path::Path) {
    let config = |name: &str, concurrency: &str| {
        let p = rl_config(d, name);
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(
            text.contains("weight_sync = \"pinned\""),
            "the demo is not pinned"
        );
        let text = text
            .replace("max_staleness = 0", "max_staleness = 1")
            .replace(
                "rollout_max_concurrency = 1\n",
                &format!("rollout_max_concurrency = {concurrency}\n"),
            );
        std::fs::write(&p, text).unwrap();
        p
    };
    let wide = config("rl-pinned-64", "64");
    let narrow = config("rl-pinned-1", "1");
    run_to_end(&wide, None, &[]);
    run_to_end(&narrow, None, &[]);
    let (a, b) = (
        run_files(&d.join("rl-pinned-64")),
        run_files(&d.join("rl-pinned-1")),
    );
    let stale: u64 =
        a.2.iter()
            .map(|r| r["staleness_counts"][1].as_u64().unwrap_or(0))
            .sum();
    assert!(stale > 0, "no sample was one version old: {:?}", a.2);
    assert!(a.0 == b.0, "the weights depend on rollout_max_concurrency");
    assert_eq!(a.2, b.2, "step records differ");
    assert_eq!(a.3, b.3, "trajectory logs differ");
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
        ("max_steps = 80", "max_steps = 4"),
        ("every_steps = 10", "every_steps = 1"),
        (
            "trajectories = true",
            "trajectories = true\ntrajectory_tokens = true",
        ),
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

    // Enough retries that no episode runs out of them (an episode of 8 turns meets a hard fault
    // in about 40 % of its attempts): every fault is then absorbed and the run is the clean one.
    let faulty = rl_config(d, "rl-faults");
    let text = std::fs::read_to_string(&faulty).unwrap();
    assert!(text.contains("[rollout]\n"));
    let text = text.replace("[rollout]\n", "[rollout]\nmax_retries = 6\n");
    std::fs::write(&faulty, text).unwrap();
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
        "every failing fault is retried once it strikes: {recs:#?}"
    );
    assert!(recs
        .iter()
        .all(|r| r.episodes_errored == 0 && r.groups_replaced == 0));
    let got = run_files(&d.join("rl-faults"));
    assert!(got.0 == want.0, "the faulty run trained other weights");
}

/// `cfg` with its episodes run by the agent at `url` (`[rollout] environment = "agent"`).
fn through_agent(
    cfg: &std::path::Path,
    name: &str,
    url: &str,
    protocol: &str,
) -> std::path::PathBuf {
    let text = std::fs::read_to_string(cfg).unwrap();
    let from = "environment = \"search\"";
    assert!(text.contains(from), "{} has no `{from}`", cfg.display());
    let to =
        format!("environment = \"agent\"\nagent_url = \"{url}\"\nagent_protocol = \"{protocol}\"");
    let p = cfg.with_file_name(format!("{name}.toml"));
    std::fs::write(&p, text.replace(from, &to)).unwrap();
    p
}

/// A free loopback port (for agents that take `--port N`).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts an example agent app on a free port and waits for `GET /ping`.
fn start_agent(script: &str, tools: &str) -> (common::Child, String) {
    start_agent_with(script, tools, &[])
}

fn start_agent_with(script: &str, tools: &str, env: &[(&str, &str)]) -> (common::Child, String) {
    let port = free_port();
    let mut c = std::process::Command::new(common::agent_python());
    c.envs(env.iter().copied());
    c.arg(common::repo().join(script))
        .args(["--port", &port.to_string(), "--tools-url", tools])
        .stdout(std::process::Stdio::null());
    let child = common::Child(c.spawn().unwrap());
    let url = format!("http://127.0.0.1:{port}");
    let t0 = std::time::Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(t0.elapsed().as_secs() < 60, "{script} did not start");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    (child, url)
}

/// An evaluation's per-task figures (wall times aside) and every episode's tokens.
fn eval_rows(out: &std::path::Path) -> Vec<serde_json::Value> {
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("eval.json")).unwrap()).unwrap();
    let mut rows: Vec<serde_json::Value> = v["datasets"][0]["runs"][0]["tasks"]
        .as_array()
        .unwrap()
        .clone();
    let episodes: Vec<serde_json::Value> = std::fs::read_to_string(out.join("trajectories.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["trajectory"].clone())
        .collect();
    assert!(!episodes.is_empty());
    rows.extend(tokens_of(&episodes));
    rows
}

/// An evaluation's episodes in the trajectory log's shape (`ids` holding the token record).
fn eval_episodes(out: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(out.join("trajectories.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let t = serde_json::from_str::<serde_json::Value>(l).unwrap()["trajectory"].clone();
            let ids: serde_json::Map<_, _> = [
                "tokens",
                "loss_mask",
                "logprobs",
                "versions",
                "prompt_len",
                "segment_starts",
            ]
            .iter()
            .map(|k| (k.to_string(), t[*k].clone()))
            .collect();
            let mut o = serde_json::json!({"ids": ids});
            for k in [
                "task_id",
                "reward",
                "failure",
                "turns",
                "tool_calls",
                "messages",
            ] {
                o[k] = t[k].clone();
            }
            o
        })
        .collect()
}

/// Checks strands-run episodes (`got`) against their in-process twins (`want`, same tasks, same
/// weights, same seeds) Each is the in-process one — ids,
/// mask, log-probs, versions, reward, failure and turns — or, where the in-process episode has a
/// tool-call block the policy wrote malformed, its prefix: a standard OpenAI client cannot see
/// such a block (in-process the model gets an `error: …` tool response), so strands ends the
/// episode there. At least one must be identical.
fn strands_twins(got: &[serde_json::Value], want: &[serde_json::Value], agent: &str) {
    assert_eq!(got.len(), want.len(), "{agent}: episode count");
    let mut identical = 0;
    for (g, w) in got.iter().zip(want) {
        let (gi, wi) = (&g["ids"], &w["ids"]);
        assert_eq!(g["task_id"], w["task_id"]);
        let n = gi["tokens"].as_array().unwrap().len();
        assert!(n > 0);
        let key = |v: &serde_json::Value| {
            (
                v["ids"].clone(),
                v["reward"].clone(),
                v["failure"].clone(),
                v["turns"].clone(),
            )
        };
        if key(g) == key(w) {
            identical += 1;
            continue;
        }
        let unreadable = w["tool_calls"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "error" && c["arguments"].is_null());
        let Some(bad) = unreadable else {
            panic!("the {agent} episode differs without a malformed call:\n{g}\n{w}");
        };
        eprintln!(
            "{agent}: task {} cut at a malformed call ({}); in-process wrote {}",
            w["task_id"], bad["error"], w["messages"]
        );
        for key in ["tokens", "loss_mask", "logprobs", "versions"] {
            assert_eq!(
                gi[key].as_array().unwrap()[..],
                wi[key].as_array().unwrap()[..n],
                "{agent}: {key}"
            );
        }
    }
    eprintln!(
        "{agent}: {identical} of {} episodes equal their in-process twins, the rest are their prefixes",
        got.len()
    );
    assert!(
        identical >= 1,
        "no {agent} episode equals its in-process twin"
    );
}

/// What must match between an in-process and an external episode: the exact ids, mask,
/// log-probs and versions, the reward, the failure and the number of model calls.
fn tokens_of(trajs: &[serde_json::Value]) -> Vec<serde_json::Value> {
    trajs
        .iter()
        .map(|t| {
            let keep = [
                "task_id",
                "tokens",
                "loss_mask",
                "logprobs",
                "versions",
                "prompt_len",
                "reward",
                "failure",
                "turns",
                "segment_starts",
            ];
            let mut o = t.as_object().unwrap().clone();
            o.retain(|k, _| keep.contains(&k.as_str()));
            serde_json::Value::Object(o)
        })
        .collect()
}

fn eval(cfg: &std::path::Path, model: &std::path::Path, out: &std::path::Path, extra: &[&str]) {
    let mut args = vec![
        "eval",
        "--quiet",
        "--config",
        cfg.to_str().unwrap(),
        "--model",
        model.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let (ok, stdout, stderr) = mtrl(&args);
    assert!(ok, "mtrl eval failed:\n{stdout}\n{stderr}");
}

/// Bring your own agent, on the demo's SFT policy (it searches and submits over several turns):
/// - the plain Python agent (`openai` + the standard library) evaluated through the policy
///   endpoint gives, task by task, the in-process evaluation's trajectories — the same token
///   ids, masks, log-probs and versions — and rewards, greedy and sampled (pass@k);
/// - the agentcore-rl-toolkit agent (`AgentCoreRuntimeApp`, which runs the strands episode)
///   gives them too, each episode whole or, after a malformed tool call strands cannot see, cut
///   there (`strands_twins`);
/// - RL steps through the strands-agents search agent in a bedrock-agentcore app record
///   exactly what the engine sampled: the run's trajectory log equals the in-process run's
///   (`rl-plain`, same seeds), so its groups reach the learner as in-process groups do.
fn agents(d: &std::path::Path) {
    let demo = d.join("demo.toml");
    let sft = d.join("demo/sft");
    let mut tools_cmd = std::process::Command::new(env!("CARGO_BIN_EXE_mtrl"));
    tools_cmd.args([
        "serve-tools",
        "--quiet",
        "--config",
        demo.to_str().unwrap(),
        "--addr",
        "127.0.0.1:0",
    ]);
    let (_tools, tools_url) = common::start_server(tools_cmd);

    let mut plain = std::process::Command::new(common::agent_python());
    plain
        .arg(common::repo().join("examples/agents/plain_agent.py"))
        .args(["--port", "0", "--tools-url", &tools_url]);
    let (_plain, plain_url) = common::start_server(plain);
    let flags = ["--limit", "8", "--k", "2", "--samples", "2"];
    eval(&demo, &sft, &d.join("eval-inproc"), &flags);
    let agent_cfg = through_agent(&demo, "demo-plain-agent", &plain_url, "sagemaker");
    eval(&agent_cfg, &sft, &d.join("eval-plain"), &flags);
    let (want, got) = (
        eval_rows(&d.join("eval-inproc")),
        eval_rows(&d.join("eval-plain")),
    );
    assert_eq!(
        got, want,
        "the plain agent's evaluation differs from the in-process one"
    );
    let turns: u64 = want
        .iter()
        .filter_map(|t| t["turns"].as_f64())
        .map(|t| t as u64)
        .sum();
    assert!(turns > 8, "the episodes are multi-turn: {want:?}");

    let (_toolkit, toolkit_url) = start_agent("examples/agents/toolkit_agent/app.py", &tools_url);
    let toolkit_cfg = through_agent(
        &demo,
        "demo-toolkit-agent",
        &format!("{toolkit_url}/invocations"),
        "agentcore-toolkit",
    );
    eval(
        &toolkit_cfg,
        &sft,
        &d.join("eval-toolkit"),
        &["--limit", "4", "--k", "0"],
    );
    eval(
        &demo,
        &sft,
        &d.join("eval-inproc4"),
        &["--limit", "4", "--k", "0"],
    );
    // The toolkit app runs the strands episode, so it matches in-process as strands does (below):
    // episode for episode, or cut after a turn whose tool call the policy wrote malformed.
    let (got, want) = (
        eval_episodes(&d.join("eval-toolkit")),
        eval_episodes(&d.join("eval-inproc4")),
    );
    assert_eq!(got.len(), 4);
    strands_twins(&got, &want, "toolkit");

    let (_strands, strands_url) = start_agent("examples/agents/search_agent/app.py", &tools_url);
    let rl = through_agent(
        &rl_config(d, "rl-strands"),
        "rl-strands-agent",
        &format!("{strands_url}/invocations"),
        "sagemaker",
    );
    run_to_end(&rl, None, &["--max-steps", "2"]);
    let logs = |run: &str| {
        let mut files: Vec<_> = std::fs::read_dir(d.join(run).join("trajectories"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        lines(&files)
    };
    let (want, got) = (logs("rl-plain"), logs("rl-strands"));
    assert_eq!(got.len(), 2 * 8, "two steps of 8 episodes");
    // Step 1 (policy version 0, the same weights both ways): each episode is the in-process one,
    // id for id, log-prob for log-prob, or its prefix (see `strands_twins`).
    strands_twins(&got[..8], &want[..8], "strands");
    // Step 2 was sampled by version 1, the weights after step 1.
    for g in &got[8..] {
        let ids = &g["ids"];
        let sampled: Vec<u64> = ids["versions"]
            .as_array()
            .unwrap()
            .iter()
            .zip(ids["loss_mask"].as_array().unwrap())
            .filter(|(_, m)| m.as_u64() == Some(1))
            .map(|(v, _)| v.as_u64().unwrap())
            .collect();
        assert!(
            !sampled.is_empty() && sampled.iter().all(|&v| v == 1),
            "{g}"
        );
    }
}
