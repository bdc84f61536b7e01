//! Curves read from a synthetic run folder, the PNG written, and bad input.

use mtrl_core::StepRecord;
use serde_json::json;

use super::*;
use crate::report::REPORT_FORMAT_VERSION;

fn write_run(dir: &Path, steps: u64) {
    let mut lines = String::new();
    for s in 1..=steps {
        let r = 0.2 + 0.6 * (s as f64 / steps as f64) + 0.05 * ((s * 7 % 5) as f64 - 2.0);
        let mut v = StepRecord {
            step: s,
            reward_mean: r,
            ndcg_at_10: r.max(0.0),
            failure_rate: 0.5 / s as f64,
            turns_mean: 3.0 - s as f64 / steps as f64,
            staleness_counts: vec![3, 4, 1],
            ..StepRecord::default()
        };
        if s % 10 == 0 {
            v.val_reward_mean = Some(r - 0.1);
            v.val_ndcg_at_10 = Some(r - 0.05);
        }
        lines.push_str(&format!("{}\n", serde_json::to_string(&v).unwrap()));
    }
    std::fs::write(dir.join("metrics.jsonl"), lines).unwrap();
}

fn report(version: u32) -> serde_json::Value {
    let run = |label: &str, source: &str, ndcg: f64| {
        json!({"label": label, "kind": "policy", "source": source, "tasks": [],
               "summary": {"ndcg_at_10": ndcg, "fail_rate": 0.1, "turns": 2.5, "reward": ndcg,
                           "pass_at_k": null, "tokens_per_task": 10.0, "s_per_task": 0.1,
                           "failures": {}}})
    };
    json!({"format_version": version, "datasets": [{"benchmark": "cranfield", "runs": [
        run("base", "models/tiny", 0.3),
        run("trained", "runs/x/step-20/policy", 0.6),
    ]}]})
}

#[test]
fn reads_train_validation_and_evaluations() {
    let dir = tempfile::tempdir().unwrap();
    write_run(dir.path(), 30);
    std::fs::create_dir(dir.path().join("eval")).unwrap();
    let eval = dir.path().join("eval/eval.json");
    std::fs::write(&eval, report(REPORT_FORMAT_VERSION).to_string()).unwrap();
    let c = read_curves(dir.path()).unwrap();
    assert_eq!(c.train[&Metric::Reward].len(), 30);
    let (mean, max) = (
        c.train[&Metric::Staleness][0].1,
        c.train[&Metric::StalenessMax][0].1,
    );
    assert!(
        (mean - 6.0 / 8.0).abs() < 1e-12 && max == 2.0,
        "{mean} {max}"
    );
    assert_eq!(c.val["validation"][&Metric::Reward].len(), 3);
    assert_eq!(c.val["eval: cranfield"][&Metric::Ndcg], vec![(20.0, 0.6)]);
    assert_eq!(c.references.len(), 1);
    assert_eq!(c.references[0].0, "base (cranfield)");
    let out = dir.path().join("plots");
    let paths = plot_run(dir.path(), &out).unwrap();
    assert_eq!(paths, vec![out.join(FIGURE)]);
    let png = std::fs::read(&paths[0]).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    assert!(png.len() > 20_000, "{} bytes", png.len());

    std::fs::write(&eval, report(99).to_string()).unwrap();
    let msg = read_curves(dir.path()).unwrap_err().to_string();
    assert!(
        msg.contains("eval.json") && msg.contains("format_version 99"),
        "{msg}"
    );
}

#[test]
fn a_short_run_and_missing_panels_still_draw() {
    let dir = tempfile::tempdir().unwrap();
    let one = StepRecord {
        step: 1,
        reward_mean: 0.5,
        ..StepRecord::default()
    };
    std::fs::write(
        dir.path().join("metrics.jsonl"),
        format!("{}\n", serde_json::to_string(&one).unwrap()),
    )
    .unwrap();
    let paths = plot_run(dir.path(), dir.path()).unwrap();
    assert!(std::fs::metadata(&paths[0]).unwrap().len() > 10_000);
}

#[test]
fn bad_input_names_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope");
    let msg = plot_run(&missing, dir.path()).unwrap_err().to_string();
    assert!(
        msg.contains("nope") && msg.contains("no such run folder"),
        "{msg}"
    );
    let msg = read_curves(dir.path()).unwrap_err().to_string();
    assert!(msg.contains("nothing to plot"), "{msg}");
    let good = serde_json::to_string(&StepRecord::default()).unwrap();
    std::fs::write(
        dir.path().join("metrics.jsonl"),
        format!("{good}\n{{oops\n"),
    )
    .unwrap();
    let msg = read_curves(dir.path()).unwrap_err().to_string();
    assert!(
        msg.contains("metrics.jsonl:2") && msg.contains("not JSON"),
        "{msg}"
    );
    std::fs::write(
        dir.path().join("metrics.jsonl"),
        "{\"format_version\": 1, \"reward_mean\": 1}\n",
    )
    .unwrap();
    let msg = read_curves(dir.path()).unwrap_err().to_string();
    assert!(
        msg.contains("metrics.jsonl:1") && msg.contains("`step`"),
        "{msg}"
    );
    // A line of another format version is refused, naming the line.
    std::fs::write(
        dir.path().join("metrics.jsonl"),
        "{\"format_version\": 0, \"step\": 1}\n",
    )
    .unwrap();
    let msg = read_curves(dir.path()).unwrap_err().to_string();
    assert!(
        msg.contains("metrics.jsonl:1") && msg.contains("format_version 0"),
        "{msg}"
    );
}

#[test]
fn helpers() {
    assert_eq!(step_in("step-40"), Some(40.0));
    assert_eq!(step_in("runs/x/step_7/policy"), Some(7.0));
    assert_eq!(step_in("12"), Some(12.0));
    assert_eq!(step_in("base"), None);
    let m = moving_mean(&[(1.0, 1.0), (2.0, 3.0), (3.0, 5.0)], 2);
    assert_eq!(m, vec![(1.0, 1.0), (2.0, 2.0), (3.0, 4.0)]);
}
