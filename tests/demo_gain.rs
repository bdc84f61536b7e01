//! The default job's claim, checked at full length on one seed: with the embedded demo settings
//! (only the paths moved into a temporary folder), the RL-tuned policy beats its warm-start base
//! on the held-out test queries in greedy nDCG@10 and in mean sampled reward, and beats the RFT
//! control in mean sampled reward. Up to recipe 5 the RL stage depended on timing (rollouts took
//! up new weights mid-episode): four runs of this seed gave sampled rewards from 0.1372 (this
//! test's own run, below base) to 0.2983. Since recipe 6 each group is pinned to one weight
//! version (`weight_sync = "pinned"`), so the run is a function of its seeds (recipe 8, release
//! build, Cranfield seed 0: greedy tuned 0.3101 vs base 0.1021, sampled tuned 0.2991 vs base
//! 0.2056 vs RFT 0.2299; docs/results/default-job-recipes.md). Tuned vs RFT greedy is level on this seed (+0.0077, interval
//! spanning zero), so it is not asserted. Several minutes on 2 cores; its own test binary, so it
//! does not share the cores with another test of this file.
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
    assert!(
        figure("tuned", "sampled_reward") > figure("base", "sampled_reward"),
        "RL did not beat its base on sampled reward:\n{table}"
    );
    assert!(
        figure("tuned", "sampled_reward") > figure("rft", "sampled_reward"),
        "RL did not beat the RFT control on sampled reward:\n{table}"
    );
}
