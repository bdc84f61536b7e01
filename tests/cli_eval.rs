//! End-to-end test of `mtrl eval` through the real binary: the tiny random Qwen3 fixture as base
//! and tuned policy plus the bm25-once baseline on the first tasks of the prepared Cranfield test
//! split (hashing embedder, index and data in a temporary folder); then the refusals (leaked test
//! prompts, a missing model folder, a test file without judgments).

mod common;
use common::{cranfield_config, json, mtrl, prepared_cranfield, repo};

const LIMIT: &str = "4";

#[test]
fn eval_reports_policies_and_baselines_and_refuses_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let split = prepared_cranfield(d);
    // Short budgets: a random policy writes 8 tokens and fails (token_limit) in its first turn.
    let budgets = "[env]\nmax_turns = 2\nmax_tokens_per_turn = 8\nmax_context_tokens = 1024\n\
                   [rollout]\nrollout_max_concurrency = 8\ntemperature = 1.0\n";
    let cfg = cranfield_config(
        d,
        "cran",
        "eval.toml",
        &format!(
            "[data]\ntrain = '{s}/train.jsonl'\ntest = '{s}/test.jsonl'\n{budgets}",
            s = split.display()
        ),
    );
    let cfg = cfg.to_str().unwrap();
    let model = repo().join("tests/fixtures/tiny-qwen3");
    let model = model.to_str().unwrap();
    let out = d.join("eval-out");

    let (ok, stdout, err) = mtrl(&[
        "eval",
        "--config",
        cfg,
        "--model",
        model,
        "--baseline",
        model,
        "--policy",
        "bm25-once",
        "--k",
        "2",
        "--limit",
        LIMIT,
        "--out",
        out.to_str().unwrap(),
        "--quiet",
    ]);
    assert!(ok, "{err}");
    assert!(
        stdout.contains(
            "| benchmark | size | model | ndcg@10 | fail_rate | turns | pass@2 | reward | reward~ | tokens/task | s/task |"
        ),
        "{stdout}"
    );
    for row in [
        "| cran/test | 4 | base |",
        "| cran/test | 4 | tuned |",
        "| cran/test | 4 | bm25-once |",
        "| cran/test | 4 | Δ tuned − base |",
    ] {
        assert!(stdout.contains(row), "{row}\n{stdout}");
    }
    let report = json(&std::fs::read_to_string(out.join("eval.json")).unwrap());
    assert_eq!(
        std::fs::read_to_string(out.join("eval.md")).unwrap().trim(),
        stdout.trim()
    );
    let csv = std::fs::read_to_string(out.join("eval.csv")).unwrap();
    assert_eq!(csv.lines().count(), 5, "{csv}");
    assert!(csv
        .lines()
        .nth(3)
        .unwrap()
        .starts_with("cran/test,4,bm25-once,"));

    let ds = &report["datasets"][0];
    assert_eq!(ds["size"], 4);
    let run = |label: &str| {
        ds["runs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["label"] == label)
            .unwrap()
            .clone()
    };
    let (base, tuned, bm25) = (run("base"), run("tuned"), run("bm25-once"));
    // A random policy fails most tasks; its failures count nDCG 0 and carry the failure reward.
    let fail = base["summary"]["fail_rate"].as_f64().unwrap();
    assert!(fail >= 0.5, "{base}");
    for t in base["tasks"].as_array().unwrap() {
        assert_eq!(t["samples"], 2);
        if !t["failure"].is_null() {
            assert_eq!(t["ndcg_at_10"], 0.0);
            assert_eq!(t["reward"], -1.0);
        }
        assert!(t["tokens"].as_u64().unwrap() >= 1);
    }
    // The same weights greedily give the same episodes: a zero difference and interval.
    assert_eq!(
        base["summary"]["ndcg_at_10"],
        tuned["summary"]["ndcg_at_10"]
    );
    let cmp = &ds["comparisons"][0];
    assert_eq!(
        (cmp["a"].as_str(), cmp["b"].as_str()),
        (Some("tuned"), Some("base"))
    );
    for k in ["diff", "low", "high"] {
        assert_eq!(cmp["ndcg_at_10"][k], 0.0, "{cmp}");
    }
    // bm25-once: no failures, two turns, no tokens, and the nDCG@10 that `mtrl rollout` gives.
    assert_eq!(bm25["summary"]["fail_rate"], 0.0);
    assert_eq!(bm25["summary"]["turns"], 2.0);
    assert!(bm25["summary"]["tokens_per_task"].is_null());
    let (ok, rollout, err) = mtrl(&[
        "rollout",
        "--policy",
        "bm25-once",
        "--config",
        cfg,
        "--limit",
        LIMIT,
        "--json",
    ]);
    assert!(ok, "{err}");
    let r = json(&rollout);
    let ndcg = bm25["summary"]["ndcg_at_10"].as_f64().unwrap();
    assert!(
        (ndcg - r["mean_ndcg_at_10"].as_f64().unwrap()).abs() < 1e-12,
        "{ndcg} vs {rollout}"
    );
    assert!(ndcg > 0.0);

    // Test prompts that are also training prompts: refused, naming both files.
    let leaky = cranfield_config(
        d,
        "cran",
        "leaky.toml",
        &format!(
            "[data]\ntrain = ['{s}/train.jsonl', '{s}/test.jsonl']\ntest = '{s}/test.jsonl'\n{budgets}",
            s = split.display()
        ),
    );
    let (ok, _, err) = mtrl(&[
        "eval",
        "--config",
        leaky.to_str().unwrap(),
        "--policy",
        "bm25-once",
        "--quiet",
    ]);
    assert!(!ok, "a leaking test set was evaluated");
    let test_file = split.join("test.jsonl").display().to_string();
    assert!(
        err.contains("refusing") && err.matches(&test_file).count() >= 2,
        "{err}"
    );

    // A missing model folder is named.
    let missing = d.join("no-such-model");
    let (ok, _, err) = mtrl(&[
        "eval",
        "--config",
        cfg,
        "--model",
        missing.to_str().unwrap(),
        "--quiet",
    ]);
    assert!(!ok && err.contains(missing.to_str().unwrap()), "{err}");

    // A test file without judgments is named.
    let bare = d.join("bare.jsonl");
    std::fs::write(
        &bare,
        "{\"id\": \"q1\", \"prompt\": {\"query\": \"wing flutter\"}}\n",
    )
    .unwrap();
    let no_qrels = cranfield_config(
        d,
        "cran",
        "noqrels.toml",
        &format!("[data]\ntest = '{}'\n{budgets}", bare.display()),
    );
    let (ok, _, err) = mtrl(&[
        "eval",
        "--config",
        no_qrels.to_str().unwrap(),
        "--policy",
        "bm25-once",
        "--quiet",
    ]);
    assert!(
        !ok && err.contains(bare.to_str().unwrap()) && err.contains("judgments"),
        "{err}"
    );
}
