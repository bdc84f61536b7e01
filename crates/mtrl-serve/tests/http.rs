//! The policy endpoint over real HTTP on the tiny fixture: the safety of the surface (bearer
//! token, unknown trajectory, size limit, malformed input, loopback bind), a call authenticated
//! as one trajectory acting on no other, bounded waits (a body that never arrives, shutdown with
//! a call stuck) and graceful shutdown (a call in flight when shutdown starts is answered).

use std::io::{Read, Write};
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
        ..HttpOptions::default()
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
    // What only the engine can check is still the client's error, named (was a 503).
    let (st, v) = call(
        &addr,
        "/sample",
        Some(r#"{"input_ids": [1, 4294967295]}"#),
        &auth,
    );
    assert_eq!(
        (st, v["error"]["param"].as_str()),
        (400, Some("input_ids")),
        "{v}"
    );
    let (st, v) = call(
        &addr,
        "/v1/completions",
        Some(r#"{"prompt": "hi", "stop": "x"}"#),
        &auth,
    );
    assert_eq!(
        (st, v["error"]["param"].as_str()),
        (400, Some("stop")),
        "{v}"
    );
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

fn delete(addr: &str, path: &str, headers: &[(&str, &str)]) -> (u16, Value) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let mut r = agent.delete(format!("http://{addr}{path}"));
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    let mut resp = r.call().unwrap();
    let status = resp.status().as_u16();
    let text = resp.body_mut().read_to_string().unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

fn start(rt: &tokio::runtime::Runtime, s: Served, opts: HttpOptions) -> Server {
    rt.block_on(Server::start(
        "127.0.0.1:0",
        Arc::new(Gateway::new(Some(s))),
        opts,
    ))
    .unwrap()
}

#[test]
fn a_call_authenticated_as_one_trajectory_acts_on_no_other() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (s, engine) = served();
    let opts = HttpOptions {
        token: Some("sesame".into()),
        ..HttpOptions::default()
    };
    let server = start(&rt, s, opts);
    let addr = server.addr.to_string();
    let run = [("Authorization", "Bearer sesame")];
    let new = || {
        call(&addr, "/trajectories", Some("{}"), &run).1["id"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let (a, b) = (new(), new());
    let bearer_a = format!("Bearer {a}");
    let as_a = [("Authorization", bearer_a.as_str())];
    let bearer_b = format!("Bearer {b}");
    assert_eq!(
        call(
            &addr,
            "/v1/chat/completions",
            Some(CHAT),
            &[("Authorization", &bearer_b)]
        )
        .0,
        200
    );
    let before = call(&addr, &format!("/trajectories/{b}"), None, &run).1;
    assert_eq!(
        (before["turns"].as_u64(), before["completed"].as_bool()),
        (Some(1), Some(false))
    );
    let refused = |(st, v): (u16, Value), what: &str| {
        assert_eq!(
            (st, v["error"]["code"].as_str()),
            (403, Some("trajectory_mismatch")),
            "{what}: {v}"
        );
    };
    // Read, write and delete B, authenticated as A, by every way of naming B.
    let path_b = format!("/trajectories/{b}");
    refused(call(&addr, &path_b, None, &as_a), "GET /trajectories/B");
    refused(delete(&addr, &path_b, &as_a), "DELETE /trajectories/B");
    let about_b = format!(r#"{{"trajectoryId": "{b}", "reward": 1}}"#);
    refused(
        call(&addr, "/update-reward", Some(&about_b), &as_a),
        "update-reward B",
    );
    refused(
        call(&addr, "/complete-rollout", Some(&about_b), &as_a),
        "complete-rollout B",
    );
    let prefixed = format!("/t/{b}/v1/chat/completions");
    refused(call(&addr, &prefixed, Some(CHAT), &as_a), "/t/B/ prefix");
    let header_b = [as_a[0], ("X-Amzn-SageMaker-Trajectory-Id", b.as_str())];
    refused(
        call(&addr, "/v1/chat/completions", Some(CHAT), &header_b),
        "header B",
    );
    refused(
        call(
            &addr,
            "/sample",
            Some(r#"{"input_ids": [1, 2]}"#),
            &header_b,
        ),
        "/sample, header B",
    );
    // Even the run token acts on one trajectory per call.
    let run_b = [run[0], ("X-Amzn-SageMaker-Trajectory-Id", b.as_str())];
    let about_a = format!(r#"{{"trajectoryId": "{a}", "reward": 1}}"#);
    refused(
        call(&addr, "/update-reward", Some(&about_a), &run_b),
        "run token, two ids",
    );
    assert_eq!(call(&addr, &path_b, None, &run).1, before, "B is untouched");
    // A acts on itself, named in the body or not.
    assert_eq!(call(&addr, "/update-reward", Some(&about_a), &as_a).0, 200);
    assert_eq!(call(&addr, "/complete-rollout", Some("{}"), &as_a).0, 200);
    let path_a = format!("/trajectories/{a}");
    let (st, rec) = call(&addr, &path_a, None, &as_a);
    assert_eq!((st, rec["completed"].as_bool()), (200, Some(true)));
    assert_eq!(delete(&addr, &path_a, &as_a).0, 200);
    assert_eq!(call(&addr, &path_b, None, &run).1, before);
    rt.block_on(server.shutdown()).unwrap();
    engine.shutdown().unwrap();
}

/// Sends `head` and `body` on a fresh connection and reads the answer's status (`None` when the
/// server closed without one), waiting at most `patience`.
fn raw(addr: &str, head: &str, body: &[u8], patience: Duration) -> Option<u16> {
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(patience)).unwrap();
    c.write_all(head.as_bytes()).unwrap();
    c.write_all(body).unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match c.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                if buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    break;
                }
            }
            Err(e) => panic!("no answer within {patience:?}: {e}"),
        }
    }
    let text = String::from_utf8_lossy(&buf);
    text.split(' ').nth(1).and_then(|s| s.parse().ok())
}

#[test]
fn a_body_that_never_arrives_is_answered_within_the_request_timeout() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (s, engine) = served();
    let opts = HttpOptions {
        request_timeout: Duration::from_secs(1),
        ..HttpOptions::default()
    };
    let server = start(&rt, s, opts);
    let addr = server.addr.to_string();
    let head = "POST /sample HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n";
    let t0 = std::time::Instant::now();
    let status = raw(&addr, head, b"{\"input_ids\": [1,", Duration::from_secs(10));
    let waited = t0.elapsed();
    assert_eq!(status, Some(408));
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(4),
        "{waited:?}"
    );
    // The server still serves.
    assert_eq!(call(&addr, "/healthz", None, &[]).0, 200);
    rt.block_on(server.shutdown()).unwrap();
    engine.shutdown().unwrap();
}

#[test]
fn shutdown_is_bounded_when_a_call_never_finishes() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (s, engine) = served();
    let opts = HttpOptions {
        request_timeout: Duration::from_secs(60),
        shutdown_grace: Duration::from_secs(1),
        ..HttpOptions::default()
    };
    let server = start(&rt, s, opts);
    let addr = server.addr.to_string();
    // A call stuck reading a body that never comes.
    let mut stuck = std::net::TcpStream::connect(&addr).unwrap();
    stuck
        .write_all(b"POST /sample HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let t0 = std::time::Instant::now();
    rt.block_on(server.shutdown()).unwrap();
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(4),
        "shutdown took {took:?} (grace 1 s)"
    );
    assert!(std::net::TcpStream::connect(&addr).is_err());
    // The runtime drops the stuck call with it.
    drop(rt);
    let mut rest = Vec::new();
    stuck
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    assert!(
        stuck.read_to_end(&mut rest).is_ok(),
        "the connection is closed"
    );
    engine.shutdown().unwrap();
}

#[test]
fn a_remote_address_is_refused_without_permission_and_a_token() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let start = |opts: HttpOptions| {
        rt.block_on(Server::start(
            "0.0.0.0:0",
            Arc::new(Gateway::new(None)),
            opts,
        ))
    };
    // Refused before anything is bound: no test ever listens beyond loopback.
    let e = start(HttpOptions::default()).err().unwrap().to_string();
    assert!(
        e.contains("0.0.0.0:0") && e.contains("not a loopback address"),
        "{e}"
    );
    let e = start(HttpOptions {
        allow_remote: true,
        ..HttpOptions::default()
    })
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("no bearer token"), "{e}");
}
