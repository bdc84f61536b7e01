//! The default job's claim, checked at full length on one seed: with the embedded demo settings
//! (only the paths moved into a temporary folder, greedy evaluation only), the RL-tuned policy
//! beats its warm-start base and the rejection-sampling control on the held-out test queries —
//! higher nDCG@10 (the paired bootstrap interval against the base above zero) and no more failed
//! episodes than the base. Several minutes on 2 cores; its own test binary, so it does not share
//! the cores with another test of this file.

mod common;
use common::mtrl;

#[test]
fn tuned_policy_beats_its_base_and_the_rft_control_on_held_out_queries() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = common::demo_config(dir.path(), &[]);
    let (ok, out, err) = mtrl(&[
        "demo",
        "--config",
        cfg.to_str().unwrap(),
        "--eval-k",
        "0",
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
        let s = &run["summary"];
        (
            s["ndcg_at_10"].as_f64().unwrap(),
            s["fail_rate"].as_f64().unwrap(),
        )
    };
    let (base_ndcg, base_fail) = summary("base");
    let (rft_ndcg, _) = summary("rft");
    let (tuned_ndcg, tuned_fail) = summary("tuned");
    let table = format!("{out}\n{err}");
    assert!(tuned_ndcg > base_ndcg, "nDCG@10 did not improve:\n{table}");
    assert!(tuned_ndcg > rft_ndcg, "RL did not beat RFT:\n{table}");
    assert!(tuned_fail <= base_fail, "failures rose:\n{table}");
    // The gain over the base is not noise: the paired bootstrap interval excludes zero.
    let cmp = d["comparisons"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["a"] == "tuned" && c["b"] == "base")
        .unwrap();
    assert!(cmp["ndcg_at_10"]["low"].as_f64().unwrap() > 0.0, "{table}");
}
