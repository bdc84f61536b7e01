//! End-to-end test of the default job (`mtrl demo`, what `mtrl` and `mtrl train` run without a
//! config), shortened: the embedded demo config with every path moved into a temporary folder,
//! fewer teacher episodes, one SFT epoch, two RL steps and a greedy-only evaluation on a few test
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
            ("teacher_samples = 4", "teacher_samples = 2"),
            ("epochs = 3", "epochs = 1"),
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
    for stage in ["1/7", "3/7", "5/7", "6/7", "7/7"] {
        assert!(err.contains(stage), "stage {stage} missing:\n{err}");
    }
    // The table: base, tuned, both scripted baselines and the paired difference.
    for row in [
        "| base |",
        "| tuned |",
        "| bm25-once |",
        "| vector-once |",
        "Δ tuned − base",
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
    assert_eq!(runs.len(), 4);
    // The teacher fails on purpose sometimes (it keeps searching past the turn budget), and uses
    // the demo environment's argument shortcuts (no query, submit by rank).
    let teacher = std::fs::read_to_string(d.join("demo/teacher.jsonl")).unwrap();
    assert!(teacher.contains("\"failure\":\"turn_limit\""));
    assert!(
        teacher.contains(r#"{\"hits\":[1,2,3,4,5]}"#),
        "no submit by rank"
    );
    assert!(
        !teacher.contains(r#"\"query\":"#),
        "the teacher wrote a query"
    );
}
