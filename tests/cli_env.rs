//! End-to-end tests of `mtrl rollout` and `mtrl data prepare` through the real binary on the
//! bundled Cranfield collection (hashing embedder, index in a temporary folder), and a run of the
//! `custom_tool` example.

mod common;
use common::{cranfield_config, json, mtrl};

// The example, compiled into this test so that it is run, not only built.
#[path = "../examples/custom_tool.rs"]
#[allow(dead_code)]
mod custom_tool;

#[test]
fn baselines_match_search_eval_and_prepared_splits_run() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = cranfield_config(dir.path(), "cranfield-test", "cranfield.toml", "");
    let cfg = cfg.to_str().unwrap();

    let (ok, out, err) = mtrl(&["search-eval", "--config", cfg, "--json"]);
    assert!(ok, "{err}");
    let eval = json(&out);
    let tool_ndcg = |name: &str| {
        eval["tools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["tool"] == name)
            .unwrap()["mean"]["ndcg_at_10"]
            .as_f64()
            .unwrap()
    };
    let judged = eval["queries"].as_u64().unwrap();

    // bm25-once and vector-once submit exactly the tools' top 10: same nDCG@10 as search-eval.
    for (policy, tool) in [("bm25-once", "bm25"), ("vector-once", "vector")] {
        let (ok, out, err) = mtrl(&["rollout", "--policy", policy, "--config", cfg, "--json"]);
        assert!(ok, "{err}");
        let r = json(&out);
        assert_eq!(r["episodes"].as_u64().unwrap(), judged);
        assert_eq!(r["failure_rate"], 0.0);
        assert_eq!(r["mean_turns"], 2.0);
        let ndcg = r["mean_ndcg_at_10"].as_f64().unwrap();
        assert!(
            (ndcg - tool_ndcg(tool)).abs() < 1e-9,
            "{policy}: {ndcg} vs {}",
            tool_ndcg(tool)
        );
        assert!((r["mean_reward"].as_f64().unwrap() - ndcg).abs() < 1e-12);
    }
    let (ok, out, err) = mtrl(&[
        "rollout",
        "--policy",
        "hybrid-rrf",
        "--config",
        cfg,
        "--json",
    ]);
    assert!(ok, "{err}");
    assert!(json(&out)["mean_ndcg_at_10"].as_f64().unwrap() > 0.1);

    // data prepare: deterministic splits covering every judged query once.
    let out_dir = dir.path().join("data");
    let od = out_dir.to_str().unwrap();
    let (ok, _, err) = mtrl(&["data", "prepare", "--config", cfg, "--out", od]);
    assert!(ok, "{err}");
    let split_dir = out_dir.join("cranfield-test");
    let first = std::fs::read_to_string(split_dir.join("test.jsonl")).unwrap();
    let (ok, _, err) = mtrl(&["data", "prepare", "--config", cfg, "--out", od]);
    assert!(ok, "{err}");
    assert_eq!(
        first,
        std::fs::read_to_string(split_dir.join("test.jsonl")).unwrap()
    );
    let manifest = json(&std::fs::read_to_string(split_dir.join("manifest.json")).unwrap());
    let t = &manifest["tasks"];
    let total = t["train"].as_u64().unwrap()
        + t["validation"].as_u64().unwrap()
        + t["test"].as_u64().unwrap();
    assert_eq!(total, judged);
    assert_eq!(manifest["documents"], 1398);

    // A config with [data] runs the prepared test split (also as Parquet).
    let (ok, _, err) = mtrl(&[
        "data", "prepare", "--config", cfg, "--out", od, "--format", "parquet",
    ]);
    assert!(ok, "{err}");
    for ext in ["jsonl", "parquet"] {
        let extra = format!(
            "[data]\ntrain = '{d}/train.{ext}'\ntest = '{d}/test.{ext}'\n[env]\nmax_turns = 4\n",
            d = split_dir.display()
        );
        let cfg2 = cranfield_config(
            dir.path(),
            "cranfield-test",
            &format!("with-data-{ext}.toml"),
            &extra,
        );
        let traj = dir.path().join("traj.jsonl");
        let (ok, out, err) = mtrl(&[
            "rollout",
            "--policy",
            "bm25-once",
            "--config",
            cfg2.to_str().unwrap(),
            "--json",
            "--limit",
            "5",
            "--trajectories",
            traj.to_str().unwrap(),
        ]);
        assert!(ok, "{err}");
        let r = json(&out);
        assert_eq!(r["split"], "test");
        assert_eq!(r["episodes"], 5);
        let lines = std::fs::read_to_string(&traj).unwrap();
        let first: serde_json::Value = serde_json::from_str(lines.lines().next().unwrap()).unwrap();
        assert_eq!(
            first["format_version"],
            mtrl_core::TRAJECTORY_FORMAT_VERSION
        );
        assert_eq!(lines.lines().count(), 5);
    }

    // Errors name what is wrong.
    let (ok, _, err) = mtrl(&["rollout", "--policy", "oracle", "--config", cfg]);
    assert!(!ok && err.contains("unknown policy"), "{err}");
    let (ok, _, err) = mtrl(&[
        "rollout",
        "--policy",
        "bm25-once",
        "--config",
        cfg,
        "--split",
        "train",
    ]);
    assert!(!ok && err.contains("[data]"), "{err}");
}

#[test]
fn custom_tool_example_runs() {
    let traj = custom_tool::run().unwrap();
    assert_eq!(traj.failure, None);
    assert_eq!(traj.turns, 3);
    assert_eq!(traj.tools.total_calls(), 3);
    // Submitted [a, c, b] with a and c relevant: p@3 = 2/3.
    assert!((traj.reward - 2.0 / 3.0).abs() < 1e-12, "{}", traj.reward);
}
