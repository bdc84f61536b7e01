//! The default job's claim, checked at full length on one seed: with the embedded demo settings
//! (only the paths moved into a temporary folder), the RL-tuned policy beats its warm-start base
//! on the held-out test queries in greedy nDCG@10. Only that is asserted, because only that held
//! on every run of recipe 5's Cranfield seed 0 (three runs, RL reruns differ): in one of them (this
//! test, dev profile) the sampled reward fell below the base's (0.1372 vs 0.1976) and one greedy
//! episode failed; tuned vs the RFT control went either way (README, "What it shows"). Several
//! minutes on 2 cores; its own test binary, so it does not share the cores with another test of
//! this file.

mod common;
use common::mtrl;

#[test]
fn tuned_policy_beats_its_base_on_held_out_queries() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = common::demo_config(dir.path(), &[]);
    let (ok, out, err) = mtrl(&[
        "demo",
        "--config",
        cfg.to_str().unwrap(),
        "--eval-k",
        "4",
        "--quiet",
    ]);
    assert!(ok, "stdout:\n{out}\nstderr:\n{err}");
    let path = dir.path().join("demo/rl/eval/eval.json");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let d = &report["datasets"][0];
    let summary = |label: &str| {
        let run = d["runs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["label"] == label)
            .unwrap();
        &run["summary"]
    };
    let figure = |label: &str, key: &str| summary(label)[key].as_f64().unwrap();
    let table = format!("{out}\n{err}");
    assert!(
        figure("tuned", "ndcg_at_10") > figure("base", "ndcg_at_10"),
        "RL did not beat its base on greedy nDCG@10:\n{table}"
    );
}
