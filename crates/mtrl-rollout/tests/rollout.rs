//! Rollouts over the tiny Qwen3 fixture in the one-token `pick` environment: the staleness gate
//! admits exactly (η + v + 1)·B groups, published weights are picked up and tag the tokens
//! sampled after them, groups are reassembled in admission order, and an environment error
//! stops rollouts with a message naming the task.

use std::cell::Cell;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use candle_core::{DType, Device};
use mtrl_core::ChatCodec;
use mtrl_env::{EnvError, Task};
use mtrl_model::{Engine, Policy, SamplingParams, TemplateCodec, Tokenizer};
use mtrl_rollout::{
    EnvFactory, Faults, InOrder, PickEnv, Rollout, RolloutError, RolloutSettings, TaskSource,
    WeightSync,
};

fn fixture() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/tiny-qwen3"
    ))
}

struct Cycle(Vec<Task>, usize);

impl TaskSource for Cycle {
    fn next_task(&mut self) -> Task {
        self.1 += 1;
        self.0[(self.1 - 1) % self.0.len()].clone()
    }
}

fn tasks() -> Vec<Task> {
    (0..4)
        .map(|i| Task {
            id: format!("q{i}"),
            prompt: format!(r#"{{"query": "word{i}", "qrels": {{"d{i}": 1}}}}"#),
        })
        .collect()
}

thread_local! {
    /// The dtype the policy of this test thread's rollouts loads in: f32 runs the CPU f32
    /// kernels; bf16 and f64 run candle's ops, the backend CUDA runs (see `per_kernels`).
    static DTYPE: Cell<DType> = const { Cell::new(DType::F32) };
}

/// The scenarios that hand work between the engine's thread and the learner's (the gate,
/// weight publication, pinned versions) once per kernel set.
macro_rules! per_kernels {
    ($($f:ident),* $(,)?) => {
        $(
            mod $f {
                use candle_core::DType;
                fn run(dt: DType) {
                    super::DTYPE.with(|d| d.set(dt));
                    super::$f();
                }
                #[test]
                fn cpu_f32() {
                    run(DType::F32)
                }
                #[test]
                fn candle_f64() {
                    run(DType::F64)
                }
                #[test]
                fn candle_bf16() {
                    run(DType::BF16)
                }
            }
        )*
    };
}

per_kernels!(
    synchronous_gate_and_weight_pickup,
    pinned_groups_see_only_their_version,
    staleness_bound_admits_eta_plus_one_batches,
);

fn start(staleness: u64, envs: Option<EnvFactory>) -> (tokio::runtime::Runtime, Rollout, InOrder) {
    start_with(staleness, envs, "", None)
}

fn start_with(
    staleness: u64,
    envs: Option<EnvFactory>,
    faults: &str,
    timeout: Option<Duration>,
) -> (tokio::runtime::Runtime, Rollout, InOrder) {
    start_synced(staleness, envs, faults, timeout, WeightSync::Latest)
}

fn start_synced(
    staleness: u64,
    envs: Option<EnvFactory>,
    faults: &str,
    timeout: Option<Duration>,
    weight_sync: WeightSync,
) -> (tokio::runtime::Runtime, Rollout, InOrder) {
    start_tweaked(staleness, envs, faults, timeout, weight_sync, &|_| {})
}

fn start_tweaked(
    staleness: u64,
    envs: Option<EnvFactory>,
    faults: &str,
    timeout: Option<Duration>,
    weight_sync: WeightSync,
    tweak: &dyn Fn(&mut RolloutSettings),
) -> (tokio::runtime::Runtime, Rollout, InOrder) {
    let policy = Policy::load(&fixture(), DTYPE.with(Cell::get), &Device::Cpu).unwrap();
    let tok = Arc::new(Tokenizer::from_dir(&fixture()).unwrap());
    let codec: Arc<dyn ChatCodec> = Arc::new(TemplateCodec::qwen(tok).unwrap());
    let cands = Arc::new(mtrl_rollout::pick::candidates(&tasks()).unwrap());
    let c = codec.clone();
    let envs = envs.unwrap_or_else(|| {
        Arc::new(move || Ok(Box::new(PickEnv::new(c.clone(), cands.clone(), -1.0)?) as _))
    });
    let settings = RolloutSettings {
        group_size: 3,
        max_concurrency: 4,
        global_batch_size: 2,
        max_staleness: staleness,
        sampling: SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            seed: 0,
        },
        seed: 7,
        stop_token_ids: codec.stop_token_ids(),
        first_group: 0,
        version: 0,
        end_group: None,
        timeout,
        max_retries: 3,
        max_failed_fraction: 0.1,
        faults: Arc::new(Faults::parse(faults, 7).unwrap()),
        shard: Default::default(),
        weight_sync,
        sampled_logprobs: true,
    };
    let mut settings = settings;
    tweak(&mut settings);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let engine = Engine::new(policy, None, 0, 8).unwrap();
    let (r, rx) = Rollout::start(
        engine,
        mtrl_rollout::in_process(envs),
        Box::new(Cycle(tasks(), 0)),
        settings,
        rt.handle(),
    )
    .unwrap();
    (rt, r, InOrder::new(rx, 0))
}

fn versions(batch: &[Vec<mtrl_core::Trajectory>]) -> Vec<u64> {
    batch
        .iter()
        .flatten()
        .flat_map(|t| {
            t.versions
                .iter()
                .zip(&t.loss_mask)
                .filter(|(_, m)| **m == 1)
                .map(|(v, _)| *v)
        })
        .collect()
}

fn synchronous_gate_and_weight_pickup() {
    let (rt, r, mut batches) = start(0, None);
    let b0 = batches
        .next_batch(2, Duration::from_secs(30))
        .unwrap()
        .unwrap();
    assert_eq!(b0.len(), 2);
    assert!(b0.iter().all(|g| g.len() == 3));
    assert_eq!(b0[0][0].task_id, "q0");
    assert_eq!(b0[1][0].task_id, "q1");
    assert!(versions(&b0).iter().all(|v| *v == 0));
    for t in b0.iter().flatten() {
        t.check().unwrap();
        assert_eq!(t.sampled_tokens(), 1);
    }
    // η = 0: nothing more is admitted until the learner publishes version 1.
    assert!(batches
        .next_batch(1, Duration::from_millis(400))
        .unwrap()
        .is_none());
    assert_eq!(r.counters().admitted, 2);
    r.publish(1, fixture_weights(), Duration::from_secs(30))
        .unwrap();
    let b1 = batches
        .next_batch(2, Duration::from_secs(30))
        .unwrap()
        .unwrap();
    assert_eq!(b1[0][0].task_id, "q2");
    assert!(versions(&b1).iter().all(|v| *v == 1), "{:?}", versions(&b1));
    let c = r.counters();
    assert_eq!((c.admitted, c.engine_version), (4, 1));
    assert!(c.tokens >= 12 && c.generate_s > 0.0);
    rt.block_on(r.shutdown()).unwrap();
}

fn fixture_weights() -> HashMap<String, candle_core::Tensor> {
    Policy::load(&fixture(), DTYPE.with(Cell::get), &Device::Cpu)
        .unwrap()
        .named_parameters()
        .iter()
        .map(|(n, v)| (n.clone(), v.as_tensor().copy().unwrap()))
        .collect()
}

fn pinned_groups_see_only_their_version() {
    // B = 2, η = 1: group i runs on version max(0, ⌊i/2⌋ − 1) whatever the learner publishes
    // meanwhile. The learner here jumps from version 0 to 2 at once; an unpinned engine would
    // take version 2 up for batch 2 (groups 4, 5), a pinned one keeps it on version 1.
    let (rt, r, mut batches) = start_synced(1, None, "", None, WeightSync::Pinned);
    let wait = Duration::from_secs(30);
    let b0 = batches.next_batch(2, wait).unwrap().unwrap();
    assert!(versions(&b0).iter().all(|v| *v == 0));
    r.publish(1, fixture_weights(), wait).unwrap();
    r.publish(2, fixture_weights(), wait).unwrap();
    let b1 = batches.next_batch(2, wait).unwrap().unwrap();
    assert!(versions(&b1).iter().all(|v| *v == 0), "{:?}", versions(&b1));
    let b2 = batches.next_batch(2, wait).unwrap().unwrap();
    assert!(versions(&b2).iter().all(|v| *v == 1), "{:?}", versions(&b2));
    let b3 = batches.next_batch(2, wait).unwrap().unwrap();
    assert!(versions(&b3).iter().all(|v| *v == 2), "{:?}", versions(&b3));
    // Version 2 admits (η + 2 + 1)·B = 8 groups, no more.
    assert!(batches
        .next_batch(1, Duration::from_millis(400))
        .unwrap()
        .is_none());
    let c = r.counters();
    assert_eq!((c.admitted, c.engine_version), (8, 2));
    rt.block_on(r.shutdown()).unwrap();
}

fn staleness_bound_admits_eta_plus_one_batches() {
    let (rt, r, mut batches) = start(1, None);
    let b = batches
        .next_batch(4, Duration::from_secs(30))
        .unwrap()
        .unwrap();
    assert_eq!(b.len(), 4);
    assert!(batches
        .next_batch(1, Duration::from_millis(400))
        .unwrap()
        .is_none());
    assert_eq!(r.counters().admitted, 4);
    assert!(r.failure().is_none());
    rt.block_on(r.shutdown()).unwrap();
}

#[test]
fn environment_errors_stop_rollouts_and_name_the_task() {
    let envs: EnvFactory = Arc::new(|| Err(EnvError::Protocol("no environment today".into())));
    let (rt, r, mut batches) = start(0, Some(envs));
    // The channel closes once every group task has ended.
    let got = batches.next_batch(2, Duration::from_secs(5));
    assert!(
        matches!(got, Ok(None) | Err(RolloutError::Stopped)),
        "{got:?}"
    );
    let msg = r.failure().unwrap().to_string();
    assert!(msg.contains("q0") || msg.contains("q1"), "{msg}");
    assert!(msg.contains("no environment today"), "{msg}");
    let err = rt.block_on(r.shutdown()).unwrap_err().to_string();
    assert!(err.contains("no environment today"), "{err}");
}

#[test]
fn injected_faults_are_retried_and_counted() {
    // 30 % of environment steps fail: retries (same seeds) get every episode through.
    let (rt, r, mut batches) = start_with(1, None, "tool_error:0.3", None);
    let b = batches
        .next_batch(4, Duration::from_secs(60))
        .unwrap()
        .unwrap();
    assert_eq!(b.len(), 4);
    assert!(b.iter().all(|g| g.len() == 3));
    let c = r.counters();
    assert!(
        c.faults[0] > 0 && c.retries >= c.faults[0] - 3 * c.errored_episodes,
        "{c:?}"
    );
    assert_eq!(c.faults[1..], [0, 0]);
    assert!(r.failure().is_none());
    rt.block_on(r.shutdown()).unwrap();
}

#[test]
fn episodes_past_the_timeout_fail_the_run_naming_the_cause() {
    // Every step stalls 300 ms against a 100 ms limit: all attempts time out.
    let (rt, r, mut batches) = start_with(
        0,
        None,
        "slow_tool:1.0:0.3",
        Some(Duration::from_millis(100)),
    );
    let got = batches.next_batch(2, Duration::from_secs(20));
    assert!(
        matches!(got, Ok(None) | Err(RolloutError::Stopped)),
        "{got:?}"
    );
    let c = r.counters();
    assert!(c.timeouts >= 4 && c.retries >= 3, "{c:?}");
    let msg = r.failure().unwrap().to_string();
    assert!(
        msg.contains("rollout.timeout_s") && msg.contains("max_failed_fraction"),
        "{msg}"
    );
    assert!(rt.block_on(r.shutdown()).is_err());
}

/// Issue 43, item 9: with top-p < 1 a token's behaviour log-prob is, by default, its log-prob
/// under the truncated distribution it was drawn from (≥ the full-vocabulary one, greater where
/// the nucleus cut anything); `rollout.behaviour_logprobs = "full"` records the full one. The
/// sampled tokens are the same either way.
#[test]
fn behaviour_logprobs_follow_the_distribution_sampled_from() {
    let run = |sampled: bool| {
        let (rt, r, mut batches) = start_tweaked(0, None, "", None, WeightSync::Latest, &|s| {
            s.sampling.top_p = 0.3;
            s.sampled_logprobs = sampled;
        });
        let b = batches
            .next_batch(2, Duration::from_secs(60))
            .unwrap()
            .unwrap();
        rt.block_on(r.shutdown()).unwrap();
        b.into_iter()
            .flatten()
            .map(|t| {
                let i = t.loss_mask.iter().position(|m| *m == 1).unwrap();
                (t.tokens[i], t.logprobs[i])
            })
            .collect::<Vec<_>>()
    };
    let (trunc, full) = (run(true), run(false));
    assert_eq!(trunc.len(), full.len());
    let mut higher = 0;
    for ((ta, la), (tb, lb)) in trunc.iter().zip(&full) {
        assert_eq!(ta, tb, "same seeds, same tokens");
        assert!(la >= lb, "truncated {la} < full {lb}");
        assert!(*la <= 0.0);
        higher += usize::from(la > lb);
    }
    assert!(
        higher > 0,
        "top_p = 0.3 truncated nothing: {trunc:?} vs {full:?}"
    );
}
