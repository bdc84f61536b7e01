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

fn config(dir: &Path) -> mtrl_core::Config {
    let path = write_config(
        dir,
        "group_size = 4\nrollout_max_concurrency = 4",
        "global_batch_size = 4\nmax_steps = 4",
        "every_steps = 2\nkeep_last = 2",
    );
    mtrl_core::Config::load(&path).unwrap()
}

fn weights(run: &Path, step: u64) -> Vec<u8> {
    std::fs::read(run.join(format!("step-{step:08}/policy/model.safetensors"))).unwrap()
}

#[test]
fn in_process_run_resumes_bitwise() {
    let a = tempfile::tempdir().unwrap();
    let cfg_a = config(a.path());
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
    let cfg_b = config(b.path());
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
