//! The library API the demo calls: a loaded policy, the same checkpoint by folder and a scripted
//! baseline on a six-document corpus; per-task results, trajectories (greedy and sampled) and a
//! comparison come back; evaluate() refuses to run inside a tokio runtime.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use mtrl_core::Config;
use mtrl_env::{Baseline, Task};
use mtrl_eval::report::RunKind;
use mtrl_eval::{evaluate, load_model, Contender, EvalJob, EvalSettings, TestSet};
use mtrl_search::index::NoProgress;
use mtrl_search::SearchIndex;

fn fixture() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/tiny-qwen3"
    ))
}

fn setup(dir: &Path) -> (Config, Arc<SearchIndex>, TestSet) {
    let docs = [
        ("d1", "wing flutter at supersonic speed"),
        ("d2", "boundary layer transition on flat plates"),
        ("d3", "heat transfer in hypersonic flow"),
        ("d4", "buckling of thin cylindrical shells"),
        ("d5", "shock wave interaction with boundary layers"),
        ("d6", "panel flutter of plates"),
    ];
    let corpus: String = docs
        .iter()
        .map(|(id, text)| format!("{{\"id\": \"{id}\", \"text\": \"{text}\"}}\n"))
        .collect();
    std::fs::write(dir.join("docs.jsonl"), corpus).unwrap();
    let cfg = Config::from_toml_str(
        "[search]\ncorpus = 'docs.jsonl'\nindex_dir = 'index'\nembedder = 'hash'\n\
         [env]\nmax_turns = 2\nmax_tokens_per_turn = 6\nmax_context_tokens = 1024\n\
         [rollout]\nrollout_max_concurrency = 4\n",
        &dir.join("c.toml"),
    )
    .unwrap();
    let (index, _) = SearchIndex::open_or_build(cfg.search().unwrap(), &mut NoProgress).unwrap();
    let tasks = [
        ("q1", "wing flutter supersonic", "d1"),
        ("q2", "boundary layer transition", "d2"),
    ]
    .iter()
    .map(|(id, q, d)| Task {
        id: id.to_string(),
        prompt: format!(r#"{{"query": "{q}", "qrels": {{"{d}": 1}}}}"#),
    })
    .collect();
    let set = TestSet {
        name: "toy".into(),
        path: dir.join("toy.jsonl"),
        tasks,
    };
    (cfg, Arc::new(index), set)
}

#[test]
fn policies_and_baselines_return_results_and_trajectories() {
    let dir = tempfile::tempdir().unwrap();
    let (cfg, index, set) = setup(dir.path());
    let mut settings = EvalSettings::from_config(&cfg, 2).unwrap();
    settings.samples = 3;
    let (policy, codec) = load_model(&fixture(), None, settings.dtype, &settings.device).unwrap();
    let job = EvalJob {
        env: cfg.env_or_default(),
        index,
        sets: vec![set],
        contenders: vec![
            Contender::Policy {
                label: "loaded".into(),
                policy: Box::new(policy),
                codec,
                source: "in memory".into(),
            },
            Contender::ModelDir {
                label: "dir".into(),
                dir: fixture(),
                adapter: None,
            },
            Contender::Scripted(Baseline::Bm25Once),
        ],
        compare: vec![("loaded".into(), "dir".into())],
        settings: settings.clone(),
        agent: None,
        progress: None,
    };
    let report = evaluate(job).unwrap();
    let d = &report.datasets[0];
    assert_eq!((d.size, d.runs.len()), (2, 3));
    let (loaded, by_dir, bm25) = (&d.runs[0], &d.runs[1], &d.runs[2]);
    assert_eq!(
        (loaded.kind, bm25.kind),
        (RunKind::Policy, RunKind::Scripted)
    );
    assert_eq!(loaded.source, "in memory");
    for run in [loaded, by_dir] {
        assert_eq!(run.greedy.len(), 2);
        assert_eq!(run.samples.len(), 2);
        assert!(run.samples.iter().all(|s| s.len() == 3));
        assert_eq!(run.greedy[0].task_id, "q1");
        for t in run.greedy.iter().chain(run.samples.iter().flatten()) {
            t.check().unwrap();
            assert!(t.sampled_tokens() >= 1 && t.sampled_tokens() <= 6);
        }
        assert!(run
            .tasks
            .iter()
            .all(|t| t.samples == 3 && t.pass_at_k.is_some()));
        assert!(run.summary.tokens_per_task.is_some());
    }
    // Greedy decoding of the same weights: the same tokens, so a zero difference.
    assert_eq!(loaded.greedy[1].tokens, by_dir.greedy[1].tokens);
    let c = &d.comparisons[0];
    assert_eq!(
        (c.ndcg_at_10.diff, c.ndcg_at_10.low, c.ndcg_at_10.high),
        (0.0, 0.0, 0.0)
    );
    // The baseline finds the only relevant document of each query first.
    assert!(bm25.samples.is_empty() && bm25.summary.tokens_per_task.is_none());
    assert_eq!(bm25.summary.fail_rate, 0.0);
    assert!(
        (bm25.summary.ndcg_at_10 - 1.0).abs() < 1e-12,
        "{:?}",
        bm25.tasks
    );
    assert_eq!(bm25.summary.pass_at_k, Some(1.0));

    // Inside a runtime it refuses instead of panicking.
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let (_, index, set) = setup(dir.path());
    let err = rt.block_on(async {
        evaluate(EvalJob {
            env: cfg.env_or_default(),
            index,
            sets: vec![set],
            contenders: vec![Contender::Scripted(Baseline::Bm25Once)],
            compare: Vec::new(),
            settings,
            agent: None,
            progress: None,
        })
        .unwrap_err()
    });
    assert!(err.to_string().contains("tokio runtime"), "{err}");
}
