//! The policy endpoint over real HTTP on the tiny fixture: the safety of the surface (bearer
//! token, unknown trajectory, size limit, malformed input, loopback bind) and graceful shutdown
//! (a call in flight when shutdown starts is answered).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use candle_core::{DType, Device};
use mtrl_model::{Engine, Policy, TemplateCodec, Tokenizer};
use mtrl_rollout::engine_thread::EngineThread;
use mtrl_serve::{Budgets, Gateway, HttpOptions, Served, Server};
use serde_json::Value;

fn served() -> (Served, EngineThread) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny-qwen3");
    let policy = Policy::load(&dir, DType::F32, &Device::Cpu).unwrap();
    let tok = Tokenizer::from_dir(&dir).unwrap();
    let engine = EngineThread::spawn(Engine::new(policy, None, 0, 8).unwrap()).unwrap();
    let s = Served {
        gen: engine.client.clone(),
        codec: Arc::new(TemplateCodec::qwen(Arc::new(tok)).unwrap()),
        model: "tiny".into(),
        budgets: Budgets {
            max_turns: 4,
            max_tokens_per_turn: 8,
            max_context_tokens: 512,
        },
        version: engine.stats.clone(),
    };
    (s, engine)
}

fn call(addr: &str, path: &str, body: Option<&str>, headers: &[(&str, &str)]) -> (u16, Value) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let url = format!("http://{addr}{path}");
    let mut resp = match body {
        Some(b) => {
            let mut r = agent.post(&url);
            for (k, v) in headers {
                r = r.header(*k, *v);
            }
            r.content_type("application/json")
                .send(b.as_bytes())
                .unwrap()
        }
        None => {
            let mut r = agent.get(&url);
            for (k, v) in headers {
                r = r.header(*k, *v);
            }
            r.call().unwrap()
        }
    };
    let status = resp.status().as_u16();
    let text = resp.body_mut().read_to_string().unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

const CHAT: &str =
    r#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "temperature": 0}"#;

#[test]
fn the_surface_refuses_bad_calls_with_named_errors() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (s, engine) = served();
    let opts = HttpOptions {
        token: Some("sesame".into()),
        max_body_bytes: 4096,
        request_timeout: Duration::from_secs(60),
    };
    let server = rt
        .block_on(Server::start(
            "127.0.0.1:0",
            Arc::new(Gateway::new(Some(s))),
            opts,
        ))
        .unwrap();
    let addr = server.addr.to_string();
    assert!(server.addr.ip().is_loopback());
    let auth = [("Authorization", "Bearer sesame")];
    assert_eq!(
        call(&addr, "/healthz", None, &[]).0,
        200,
        "health needs no token"
    );
    let (st, v) = call(&addr, "/v1/chat/completions", Some(CHAT), &[]);
    assert_eq!(
        (st, v["error"]["code"].as_str()),
        (401, Some("unauthorized"))
    );
    let (st, v) = call(&addr, "/v1/chat/completions", Some(CHAT), &auth);
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    // Unknown trajectory, by each way of naming one.
    for (path, h) in [
        ("/t/mtrl-nope/v1/chat/completions", vec![auth[0]]),
        (
            "/v1/chat/completions",
            vec![auth[0], ("X-Amzn-SageMaker-Trajectory-Id", "mtrl-nope")],
        ),
    ] {
        let (st, v) = call(&addr, path, Some(CHAT), &h);
        assert_eq!(
            (st, v["error"]["code"].as_str()),
            (404, Some("unknown_trajectory")),
            "{path}"
        );
    }
    // A created trajectory's id authenticates its own calls.
    let (_, created) = call(&addr, "/trajectories", Some("{}"), &auth);
    let id = created["id"].as_str().unwrap().to_string();
    let bearer = format!("Bearer {id}");
    let (st, _) = call(
        &addr,
        "/v1/chat/completions",
        Some(CHAT),
        &[("Authorization", &bearer)],
    );
    assert_eq!(st, 200);
    let (st, rec) = call(&addr, &format!("/trajectories/{id}"), None, &auth);
    assert_eq!(st, 200);
    assert_eq!(rec["turns"], 1);
    assert!(!rec["tokens"].as_array().unwrap().is_empty());
    // Malformed JSON, a bad field, an unknown field, an oversized body, an unknown route.
    let (st, v) = call(
        &addr,
        "/v1/chat/completions",
        Some("{\"messages\": ["),
        &auth,
    );
    assert_eq!(st, 400);
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("not valid JSON"));
    let (st, v) = call(
        &addr,
        "/v1/chat/completions",
        Some(r#"{"messages": [{"role": "robot", "content": "x"}]}"#),
        &auth,
    );
    assert_eq!(
        (st, v["error"]["param"].as_str()),
        (400, Some("messages[0].role"))
    );
    let (st, v) = call(
        &addr,
        "/sample",
        Some(r#"{"input_ids": [1], "n": 2}"#),
        &auth,
    );
    assert_eq!((st, v["error"]["param"].as_str()), (400, Some("n")));
    let big = format!(
        r#"{{"messages": [{{"role": "user", "content": "{}"}}]}}"#,
        "x".repeat(5000)
    );
    assert_eq!(
        call(&addr, "/v1/chat/completions", Some(&big), &auth).0,
        413
    );
    assert_eq!(call(&addr, "/v2/nothing", Some("{}"), &auth).0, 404);
    // Rewards for a trajectory nobody registered.
    let (st, _) = call(
        &addr,
        "/update-reward",
        Some(r#"{"trajectoryId": "mtrl-x", "reward": 1}"#),
        &auth,
    );
    assert_eq!(st, 404);
    rt.block_on(server.shutdown()).unwrap();
    engine.shutdown().unwrap();
}

#[test]
fn shutdown_drains_calls_in_flight() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (s, engine) = served();
    let server = rt
        .block_on(Server::start(
            "127.0.0.1:0",
            Arc::new(Gateway::new(Some(s))),
            HttpOptions::default(),
        ))
        .unwrap();
    let addr = server.addr.to_string();
    let body = r#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 100, "n": 16}"#;
    let a = addr.clone();
    let inflight = std::thread::spawn(move || call(&a, "/v1/chat/completions", Some(body), &[]));
    std::thread::sleep(Duration::from_millis(50));
    let t0 = std::time::Instant::now();
    rt.block_on(server.shutdown()).unwrap();
    let (st, v) = inflight.join().unwrap();
    eprintln!("shutdown waited {:?} for the call in flight", t0.elapsed());
    assert_eq!(st, 200, "{v}");
    assert!(
        v["usage"]["completion_tokens"].as_u64().unwrap() > 16 * 20,
        "{v}"
    );
    assert_eq!(v["choices"].as_array().unwrap().len(), 16);
    // After shutdown nothing listens.
    assert!(std::net::TcpStream::connect(&addr).is_err());
    engine.shutdown().unwrap();
}
