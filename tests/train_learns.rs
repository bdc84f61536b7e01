//! "RL works": from a seeded random tiny Qwen3, `mtrl train` on the one-token pick task (8
//! queries, 4 documents, one relevant each; reward nDCG@10, so a random pick earns 0.25 on
//! average) must clearly raise the mean reward within 100 steps (~20 s on 2 cores).

mod train_common;

use train_common::*;

#[test]
fn reward_rises_well_above_chance() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(
        dir.path(),
        "group_size = 8\nrollout_max_concurrency = 16",
        "global_batch_size = 8\nmax_steps = 100",
        "every_steps = 50\nkeep_last = 1",
    );
    let out = train(&cfg, &[]);
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["steps"], 100);
    let recs = records(&dir.path().join("run"));
    assert_eq!(recs.len(), 100);
    let mean = |r: &[serde_json::Value]| {
        r.iter()
            .map(|x| x["reward_mean"].as_f64().unwrap())
            .sum::<f64>()
            / r.len() as f64
    };
    let (first, last) = (mean(&recs[..10]), mean(&recs[90..]));
    let chance = 0.25;
    eprintln!("mean reward: first 10 steps {first:.3}, last 10 steps {last:.3}, chance {chance}");
    assert!(last > first + 0.2, "first {first:.3} last {last:.3}");
    assert!(last > chance + 0.25, "last {last:.3}");
    for r in &recs {
        assert_eq!(r["staleness_violations"], 0);
        assert_eq!(r["sequences"], 64);
    }
}
