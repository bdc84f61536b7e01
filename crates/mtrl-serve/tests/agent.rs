//! The rollout driver against agents over real HTTP on 127.0.0.1 (each agent a small server
//! written here): every wait of an attempt is bounded — an agent that answers without ever
//! calling `/complete-rollout`, one that never answers, a runtime dropped mid-call (Ctrl-C) —
//! and an agent's `status: "failed"` is an infrastructure error (the attempt is retried), not a
//! policy failure to train on.

use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use candle_core::{DType, Device};
use mtrl_model::{Engine, Policy, SamplingParams, TemplateCodec, Tokenizer};
use mtrl_rollout::engine_thread::EngineThread;
use mtrl_rollout::episode::{Driver, EnvStats, EpisodeContext};
use mtrl_rollout::{EpisodeId, Faults};
use mtrl_serve::gateway::Body;
use mtrl_serve::http::{Call, Reply, Service};
use mtrl_serve::{
    AgentDriver, AgentSettings, ApiError, Budgets, Gateway, HttpOptions, Protocol, Server,
};
use serde_json::{json, Value};

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny-qwen3")
}

/// An agent that answers every task with `answer`.
struct Agent {
    answer: Value,
}

impl Service for Agent {
    fn call<'a>(&'a self, _c: Call<'a>) -> Reply<'a> {
        Box::pin(async move { Ok::<_, ApiError>(Body::Json(self.answer.clone())) })
    }
}

struct Setup {
    engine: EngineThread,
    gateway: Arc<Gateway>,
    cx: Arc<EpisodeContext>,
}

fn setup() -> Setup {
    let policy = Policy::load(&fixture(), DType::F32, &Device::Cpu).unwrap();
    let engine = EngineThread::spawn(Engine::new(policy, None, 0, 4).unwrap()).unwrap();
    let cx = Arc::new(EpisodeContext {
        gen: engine.client.clone(),
        sampling: SamplingParams::default(),
        seed: 7,
        stop_token_ids: Vec::new(),
        stats: Arc::new(EnvStats::default()),
        faults: Arc::new(Faults::none()),
        sampled_logprobs: true,
    });
    Setup {
        engine,
        gateway: Arc::new(Gateway::new(None)),
        cx,
    }
}

fn driver(s: &Setup, url: &str, timeout: Duration) -> AgentDriver {
    let tok = Tokenizer::from_dir(&fixture()).unwrap();
    let settings = AgentSettings {
        url: url.to_string(),
        protocol: Protocol::SageMaker,
        endpoint: "http://127.0.0.1:9".into(),
        model: "tiny".into(),
        budgets: Budgets {
            max_turns: 2,
            max_tokens_per_turn: 4,
            max_context_tokens: 256,
        },
        failure_reward: -1.0,
        job: "test".into(),
        timeout,
    };
    AgentDriver::new(
        s.gateway.clone(),
        Arc::new(TemplateCodec::qwen(Arc::new(tok)).unwrap()),
        settings,
    )
}

fn task() -> mtrl_env::Task {
    mtrl_env::Task {
        id: "t1".into(),
        prompt: "find wings".into(),
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Starts an agent answering `answer`; its URL.
fn agent(rt: &tokio::runtime::Runtime, answer: Value) -> (Server, String) {
    let server = rt
        .block_on(Server::start(
            "127.0.0.1:0",
            Arc::new(Agent { answer }),
            HttpOptions::default(),
        ))
        .unwrap();
    let url = format!("http://{}/invocations", server.addr);
    (server, url)
}

#[test]
fn an_agent_that_never_completes_fails_the_attempt_within_its_timeout() {
    let rt = runtime();
    let s = setup();
    // Answers without a reward and never calls /complete-rollout.
    let (_agent, url) = agent(&rt, json!({}));
    let d = driver(&s, &url, Duration::from_secs(2));
    let t0 = Instant::now();
    let r = rt.block_on(async {
        tokio::time::timeout(
            Duration::from_secs(20),
            d.episode(s.cx.clone(), task(), EpisodeId::new(0, 0)),
        )
        .await
    });
    let waited = t0.elapsed();
    let r = r.expect("the attempt waited for /complete-rollout with no bound");
    let e = r
        .expect_err("an attempt without a reward is an error")
        .to_string();
    assert!(e.contains("complete-rollout"), "{e}");
    assert!(waited < Duration::from_secs(5), "{waited:?}");
    assert_eq!(
        s.gateway.health()["trajectories"],
        0,
        "the trajectory is forgotten"
    );
    s.engine.shutdown().unwrap();
}

#[test]
fn dropping_the_runtime_does_not_wait_for_an_agent_that_never_answers() {
    // Accepts connections and never answers them.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/invocations", silent.local_addr().unwrap());
    let held = std::thread::spawn(move || {
        let mut open = Vec::new();
        while let Ok((c, _)) = silent.accept() {
            open.push(c);
        }
    });
    let s = setup();
    let d = driver(&s, &url, Duration::from_secs(30));
    let rt = runtime();
    let attempt = rt.spawn(d.episode(s.cx.clone(), task(), EpisodeId::new(0, 0)));
    std::thread::sleep(Duration::from_millis(300));
    assert!(!attempt.is_finished(), "the agent has not answered");
    // Ctrl-C: the run drops its runtime with the attempt in flight.
    let t0 = Instant::now();
    drop(rt);
    let took = t0.elapsed();
    assert!(
        took < Duration::from_secs(3),
        "dropping the runtime waited {took:?} for the agent's POST"
    );
    assert_eq!(s.gateway.health()["trajectories"], 0);
    s.engine.shutdown().unwrap();
    drop(held);
}

#[test]
fn an_agent_reporting_status_failed_errs_the_attempt_for_a_retry() {
    let rt = runtime();
    let s = setup();
    // The managed service's CompleteRollout status FAILED: the rollout hit an error and its
    // trajectory must not be used.
    let (_agent, url) = agent(&rt, json!({"status": "failed"}));
    let d = driver(&s, &url, Duration::from_secs(10));
    let r = rt.block_on(d.episode(s.cx.clone(), task(), EpisodeId::new(0, 0)));
    let e = r
        .expect_err("status failed must not become a trained trajectory")
        .to_string();
    assert!(e.contains("failed"), "{e}");
    // A policy failure names its reason: a trajectory, scored with the failure reward.
    let (_agent2, url2) = agent(&rt, json!({"status": "failed", "failure": "no_answer"}));
    let d = driver(&s, &url2, Duration::from_secs(10));
    let t = rt
        .block_on(d.episode(s.cx.clone(), task(), EpisodeId::new(0, 1)))
        .unwrap();
    assert_eq!(t.failure, Some(mtrl_core::FailureReason::NoAnswer));
    assert_eq!(t.reward, -1.0);
    s.engine.shutdown().unwrap();
}
