//! The default job's claim, checked at full length: with the embedded demo settings (only the
//! paths moved into a temporary folder and pass@k sampling skipped), the RL-tuned policy beats its
//! warm-start base on the held-out queries — higher nDCG@10 and fewer failed episodes. Several
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
        "0",
        "--quiet",
    ]);
    assert!(ok, "stdout:\n{out}\nstderr:\n{err}");
    let path = dir.path().join("demo/rl/eval/eval.json");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let runs = report["datasets"][0]["runs"].as_array().unwrap();
    let summary = |label: &str| {
        let run = runs.iter().find(|r| r["label"] == label).unwrap();
        let s = &run["summary"];
        (
            s["ndcg_at_10"].as_f64().unwrap(),
            s["fail_rate"].as_f64().unwrap(),
        )
    };
    let (base_ndcg, base_fail) = summary("base");
    let (tuned_ndcg, tuned_fail) = summary("tuned");
    let table = format!("{out}\n{err}");
    assert!(tuned_ndcg > base_ndcg, "nDCG@10 did not improve:\n{table}");
    assert!(tuned_fail < base_fail, "failures did not drop:\n{table}");
    // The gain is not noise: the paired bootstrap interval of the difference excludes zero.
    let cmp = &report["datasets"][0]["comparisons"][0];
    assert_eq!(
        (cmp["a"].as_str(), cmp["b"].as_str()),
        (Some("tuned"), Some("base"))
    );
    assert!(cmp["ndcg_at_10"]["low"].as_f64().unwrap() > 0.0, "{table}");
}
