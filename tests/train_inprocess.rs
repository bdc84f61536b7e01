//! A run started in-process through the library (`mtrl_train::train`, no binary): a short RL run
//! on the one-token `pick` task, stopped after step 2 and resumed, ends bit for bit where an
//! uninterrupted run ends (records and weights), and every step reaches a caller's sink as a typed
//! record equal to the `metrics.jsonl` line.

mod train_common;

use std::path::Path;
use std::sync::{Arc, Mutex};

use mtrl_core::{read_jsonl, StepRecord};
use mtrl_train::telemetry::{Record, Sink};
use mtrl_train::{train, TrainOptions};
use train_common::write_config;

struct Collect(Arc<Mutex<Vec<StepRecord>>>);

impl Sink for Collect {
    fn record(&mut self, r: Record<'_>) -> mtrl_train::Result<()> {
        if let Record::Step(s) = r {
            self.0.lock().unwrap().push(s.clone());
        }
        Ok(())
    }
}

fn config(dir: &Path, background: bool) -> mtrl_core::Config {
    let path = write_config(
        dir,
        "group_size = 4\nrollout_max_concurrency = 4",
        "global_batch_size = 4\nmax_steps = 4",
        &format!("every_steps = 2\nkeep_last = 2\nbackground = {background}"),
    );
    mtrl_core::Config::load(&path).unwrap()
}

fn weights(run: &Path, step: u64) -> Vec<u8> {
    std::fs::read(run.join(format!("step-{step:08}/policy/model.safetensors"))).unwrap()
}

#[test]
fn in_process_run_resumes_bitwise() {
    let a = tempfile::tempdir().unwrap();
    // Run a writes its checkpoints on the learner thread, run b on the background writer: the
    // files are the same.
    let cfg_a = config(a.path(), false);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let opts = TrainOptions {
        sinks: vec![Box::new(Collect(seen.clone()))],
        ..TrainOptions::default()
    };
    let s = train(&cfg_a, opts).unwrap();
    assert_eq!((s.steps_done, s.resumed_from), (4, None));
    let on_disk: Vec<StepRecord> = read_jsonl(&a.path().join("run/metrics.jsonl")).unwrap();
    assert_eq!(*seen.lock().unwrap(), on_disk);
    assert_eq!(s.records, on_disk);
    assert!(on_disk.iter().all(|r| r.grad_norm > 0.0));

    let b = tempfile::tempdir().unwrap();
    let cfg_b = config(b.path(), true);
    let first = TrainOptions {
        max_steps: Some(2),
        ..TrainOptions::default()
    };
    assert_eq!(train(&cfg_b, first).unwrap().steps_done, 2);
    let s = train(&cfg_b, TrainOptions::default()).unwrap();
    assert_eq!((s.steps_done, s.resumed_from), (4, Some(2)));
    let resumed: Vec<StepRecord> = read_jsonl(&b.path().join("run/metrics.jsonl")).unwrap();
    assert_eq!(resumed.len(), 4);
    for (x, y) in on_disk.iter().zip(&resumed) {
        assert_eq!(
            (
                x.loss,
                x.grad_norm,
                x.reward_mean,
                x.entropy,
                x.tokens,
                x.lr
            ),
            (
                y.loss,
                y.grad_norm,
                y.reward_mean,
                y.entropy,
                y.tokens,
                y.lr
            ),
            "step {}",
            x.step
        );
    }
    assert!(weights(&a.path().join("run"), 4) == weights(&b.path().join("run"), 4));
}

/// `train.val_every = 2` on the pick task, the training tasks as validation set: greedy passes
/// after steps 2 and 4 land in the records (and `mtrl plot`'s curves), the best step's checkpoint
/// is named by `best.json`, survives `keep_last = 1` and is what `--model best` resolves to; the
/// training figures are those of the run without validation (greedy decoding draws no seeds).
#[test]
fn validation_runs_during_training_and_keeps_the_best() {
    let plain = tempfile::tempdir().unwrap();
    let p = write_config(
        plain.path(),
        "group_size = 4\nrollout_max_concurrency = 4",
        "global_batch_size = 4\nmax_steps = 4",
        "every_steps = 1\nkeep_last = 1",
    );
    let cfg = mtrl_core::Config::load(&p).unwrap();
    let base = train(&cfg, TrainOptions::default()).unwrap().records;

    let dir = tempfile::tempdir().unwrap();
    let s = validated_run(dir.path(), "");
    let run = dir.path().join("run");
    let recs: Vec<StepRecord> = read_jsonl(&run.join("metrics.jsonl")).unwrap();
    assert_eq!(recs.len(), 4);
    for r in &recs {
        let due = r.step % 2 == 0;
        assert_eq!(r.val_reward_mean.is_some(), due, "step {}", r.step);
        assert_eq!(r.val_failure_rate.is_some(), due);
        assert_eq!(r.val_turns_mean, due.then_some(1.0));
        assert_eq!(r.val_sampled_reward_mean, None);
    }
    for (a, b) in base.iter().zip(&s.records) {
        assert_eq!(
            (a.loss, a.reward_mean, a.grad_norm),
            (b.loss, b.reward_mean, b.grad_norm)
        );
    }
    // The best step by val_reward: ties keep the earlier one.
    let (v2, v4) = (
        recs[1].val_reward_mean.unwrap(),
        recs[3].val_reward_mean.unwrap(),
    );
    let best_step = if v4 > v2 { 4 } else { 2 };
    let best: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("best.json")).unwrap()).unwrap();
    assert_eq!(best["step"], best_step);
    assert_eq!(best["metric"], "val_reward");
    let resolved = mtrl_train::validate::checkpoint_policy(&run, "best").unwrap();
    assert_eq!(resolved, run.join(format!("step-{best_step:08}/policy")));
    assert!(resolved.join("config.json").is_file());
    let last = mtrl_train::validate::checkpoint_policy(&run, "last").unwrap();
    assert_eq!(last, run.join("step-00000004/policy"));
    // The validation curve is read by `mtrl plot`.
    let curves = mtrl_eval::plot::read_curves(&run).unwrap();
    assert_eq!(
        curves.val["validation"][&mtrl_eval::plot::Metric::Reward].len(),
        2
    );
    let written = mtrl_eval::plot::plot_run(&run, &run.join("plots")).unwrap();
    assert!(!written.is_empty());
}

/// A run of the pick task with validation every 2 steps on the training tasks; `extra` is added
/// to `[train]`.
fn validated_run(dir: &Path, extra: &str) -> mtrl_train::Summary {
    let p = write_config(
        dir,
        "group_size = 4\nrollout_max_concurrency = 4",
        &format!("global_batch_size = 4\nmax_steps = 4\nval_every = 2\nval_metric = 'val_reward'\n{extra}"),
        "every_steps = 1\nkeep_last = 1",
    );
    let text = std::fs::read_to_string(&p).unwrap().replace(
        "validation_fraction = 0.0",
        &format!(
            "validation = \"{}\"",
            train_common::fixtures().join("pick/tasks.jsonl").display()
        ),
    );
    std::fs::write(&p, text).unwrap();
    let cfg = mtrl_core::Config::load(&p).unwrap();
    train(&cfg, TrainOptions::default()).unwrap()
}

/// `train.val_samples = 4`: each validation pass also samples 4 episodes per task, whose mean
/// reward and failure rate land in the records and break ties of the greedy metric; training is
/// that of the run without them (validation samples from its own seeds), and a second run draws
/// the same validation samples.
#[test]
fn sampled_validation_is_recorded_and_breaks_ties() {
    let plain = tempfile::tempdir().unwrap();
    let greedy_only = validated_run(plain.path(), "").records;
    let dir = tempfile::tempdir().unwrap();
    let s = validated_run(dir.path(), "val_samples = 4");
    let run = dir.path().join("run");
    let recs: Vec<StepRecord> = read_jsonl(&run.join("metrics.jsonl")).unwrap();
    for (a, b) in greedy_only.iter().zip(&recs) {
        assert_eq!(
            (a.loss, a.reward_mean, a.grad_norm, a.val_reward_mean),
            (b.loss, b.reward_mean, b.grad_norm, b.val_reward_mean)
        );
        let due = b.step % 2 == 0;
        assert_eq!(b.val_sampled_reward_mean.is_some(), due, "step {}", b.step);
        assert_eq!(b.val_sampled_failure_rate.is_some(), due);
    }
    // The rule: a higher greedy val_reward, or an equal one with a higher sampled reward.
    let (g2, g4) = (recs[1].val_reward_mean, recs[3].val_reward_mean);
    let (s2, s4) = (
        recs[1].val_sampled_reward_mean,
        recs[3].val_sampled_reward_mean,
    );
    let best_step = if g4 > g2 || (g4 == g2 && s4 > s2) {
        4
    } else {
        2
    };
    let best: mtrl_learner::BestCheckpoint =
        serde_json::from_str(&std::fs::read_to_string(run.join("best.json")).unwrap()).unwrap();
    assert_eq!(best.step, best_step);
    let at = &recs[best_step as usize - 1];
    assert_eq!(
        (Some(best.value), best.tiebreak),
        (at.val_reward_mean, at.val_sampled_reward_mean)
    );
    // The same seeds at every run: a second run records the same sampled figures.
    let again = tempfile::tempdir().unwrap();
    let r = validated_run(again.path(), "val_samples = 4").records;
    let sampled =
        |v: &[StepRecord]| -> Vec<_> { v.iter().map(|r| r.val_sampled_reward_mean).collect() };
    assert_eq!(sampled(&r), sampled(&s.records));
}

/// A run configured with the managed service's names only (`[hyperparameters]`; `[model]`,
/// `[data]` and the environment have no service name) trains, with those values.
#[test]
fn a_config_in_the_service_names_trains() {
    let dir = tempfile::tempdir().unwrap();
    let f = train_common::fixtures();
    let text = format!(
        r#"[model]
path = "random:tiny"
tokenizer = "{tok}"
[data]
train = "{tasks}"
validation_fraction = 0.0
[rollout]
environment = "pick"
top_k = 16
[checkpoint]
dir = "{run}"
[hyperparameters]
global_batch_size = 2
group_size = "4"
advantage_method = "rloo"
loss_fn = "cispo"
clip_low_threshold = 0.8
clip_high_threshold = 1.2
temperature = 1.0
learning_rate = "0.01"
max_steps = 3
rollout_max_concurrency = 4
rollout_max_retries = 1
async_config = {{ max_steps_off_policy = 0 }}
"#,
        tok = f.join("tiny-qwen3").display(),
        tasks = f.join("pick/tasks.jsonl").display(),
        run = dir.path().join("run").display(),
    );
    let p = dir.path().join("service.toml");
    std::fs::write(&p, text).unwrap();
    let cfg = mtrl_core::Config::load(&p).unwrap();
    assert_eq!(
        (
            cfg.algorithm.loss.as_str(),
            cfg.algorithm.advantage.as_str()
        ),
        ("cispo", "rloo")
    );
    let s = train(&cfg, TrainOptions::default()).unwrap();
    assert_eq!(s.steps_done, 3);
    for r in &s.records {
        assert_eq!(r.sequences, 8, "2 prompts × 4 samples");
        assert!(r.lr == 0.01 && r.grad_norm > 0.0 && r.staleness_counts == vec![8]);
    }
}
