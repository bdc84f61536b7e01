//! Both HTTP servers under bad input, through real sockets on 127.0.0.1: the policy endpoint
//! (`mtrl serve`: a [`Gateway`] on the tiny fixture engine, with a run token) and the tool
//! service (`mtrl serve-tools`: a real BM25 index over a small corpus, and `submit`, no token)
//! take [`REQUESTS`] generated requests ([`gen`]: every route of both, bodies kept, bent,
//! mangled or replaced; credentials and trajectory names mixed; broken HTTP framing, oversized
//! and truncated bodies, closed connections), seeded, from [`CLIENTS`] clients at once.
//!
//! Asserted: no panic anywhere in the process; every request that parses as HTTP is answered,
//! a failure with a 4xx JSON error (OpenAI shape) whose message names its `param` when it
//! blames one, and nothing is ever a 5xx; a call authenticated as one trajectory that names
//! another never succeeds, and the two victim trajectories read back byte for byte unchanged at
//! the end; bodies declared or sent past the 8 MiB bound get 413; and afterwards both servers
//! still serve valid requests. Answers to bytes hyper cannot parse as HTTP may be its own
//! bodiless 400/431 (or none, for a stream cut short or dropped).
//!
//! Count and time: 120,000 requests (40,000 from each of 3 clients; about 112,000 answered,
//! the rest cut short or dropped on purpose) in 8.5-9.7 s on a 2-core machine in the dev/test
//! profile, shared with other builds. Each answer is bounded by [`wire::PATIENCE`] (a hang
//! fails the test instead of stalling it).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use candle_core::{DType, Device};
use mtrl_core::config::{Bm25Config, StopWords};
use mtrl_core::rng::SplitMix64;
use mtrl_core::EnvConfig;
use mtrl_env::tools::{SearchTool, SubmitTool};
use mtrl_env::Tool;
use mtrl_model::{Engine, Policy, TemplateCodec, Tokenizer};
use mtrl_rollout::engine_thread::EngineThread;
use mtrl_search::{Bm25Index, Corpus, Document};
use mtrl_serve::{Budgets, Gateway, HttpOptions, Served, Server, ToolService};
use serde_json::Value;

mod gen;
mod wire;

use wire::{Answer, Client, Mode};

/// Requests in all, both servers together.
const REQUESTS: usize = 120_000;
const CLIENTS: usize = 3;
const TOKEN: &str = "run-sesame";

static PANICS: AtomicUsize = AtomicUsize::new(0);

fn policy_server(rt: &tokio::runtime::Runtime) -> (Server, EngineThread) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny-qwen3");
    let policy = Policy::load(&dir, DType::F32, &Device::Cpu).unwrap();
    // As `mtrl serve` builds it: the engine holds the tokenizer (for `stop` strings).
    let tok = Arc::new(Tokenizer::from_dir(&dir).unwrap());
    let engine =
        EngineThread::spawn(Engine::new(policy, Some(tok.clone()), 0, 16).unwrap()).unwrap();
    let served = Served {
        gen: engine.client.clone(),
        codec: Arc::new(TemplateCodec::qwen(tok).unwrap()),
        model: "tiny".into(),
        budgets: Budgets {
            max_turns: 4,
            max_tokens_per_turn: 2,
            max_context_tokens: 40,
        },
        version: engine.stats.clone(),
    };
    let opts = HttpOptions {
        token: Some(TOKEN.into()),
        ..HttpOptions::default()
    };
    let server = rt
        .block_on(Server::start(
            "127.0.0.1:0",
            Arc::new(Gateway::new(Some(served))),
            opts,
        ))
        .unwrap();
    (server, engine)
}

fn tool_server(rt: &tokio::runtime::Runtime, dir: &std::path::Path) -> Server {
    let docs = (0..12)
        .map(|i| Document {
            id: format!("d{i}"),
            title: format!("wing {i}"),
            text: format!("flutter of wing panel {i} at speed {}", i * 7),
        })
        .collect();
    let corpus = Arc::new(Corpus::from_documents(docs).unwrap());
    let cfg = Bm25Config {
        stopwords: StopWords::English,
        stemming: true,
        k1: 1.2,
        b: 0.75,
    };
    Bm25Index::build(dir, &corpus, &cfg, &mut |_| {}).unwrap();
    let index = Bm25Index::open(dir, corpus.clone(), &cfg, 80).unwrap();
    let env = EnvConfig::default();
    let tools: Vec<Arc<dyn Tool>> = vec![
        Arc::new(SearchTool::new(
            "bm25_search",
            "search",
            Arc::new(index),
            3,
            10,
            20,
        )),
        Arc::new(SubmitTool::new(env.final_k, Some(corpus))),
    ];
    let service = Arc::new(ToolService::new(tools, &env, "system".into()));
    rt.block_on(Server::start(
        "127.0.0.1:0",
        service,
        HttpOptions::default(),
    ))
    .unwrap()
}

/// A well-formed JSON request; its answer.
fn ask(c: &mut Client, method: &str, path: &str, auth: Option<&str>, body: &str) -> Answer {
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n");
    if let Some(a) = auth {
        head.push_str(&format!("Authorization: Bearer {a}\r\n"));
    }
    head.push_str(&format!(
        "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    ));
    c.send(head.as_bytes(), Mode::Whole, false)
        .unwrap_or_else(|| panic!("no answer to {method} {path}"))
}

fn json(a: &Answer) -> Value {
    serde_json::from_slice(&a.body)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", String::from_utf8_lossy(&a.body)))
}

fn create(c: &mut Client) -> String {
    let a = ask(c, "POST", "/trajectories", Some(TOKEN), "{}");
    assert_eq!(a.status, 200);
    json(&a)["id"].as_str().unwrap().to_string()
}

/// Checks one answer against the rules in the module header.
fn check(a: &Answer, req: &gen::Request, what: &str) {
    assert!(a.status < 500, "{what}: a 5xx: {a:?}");
    if req.names_victim {
        assert!(a.status >= 400, "{what}: acted on the victim: {a:?}");
    }
    if req.head_only || (req.broken && a.body.is_empty() && a.status >= 400) {
        return;
    }
    if a.status < 300 {
        if !a.content_type.starts_with("text/event-stream") {
            json(a);
        }
        return;
    }
    assert!(a.status >= 400, "{what}: {a:?}");
    let v = json(a);
    let e = &v["error"];
    let message = e["message"]
        .as_str()
        .unwrap_or_else(|| panic!("{what}: {v}"));
    assert!(e["type"].is_string(), "{what}: {v}");
    if let Some(p) = e["param"].as_str() {
        assert!(message.contains(p), "{what}: `{p}` not in {message:?}");
    }
    // A message that blames a field (`x`: …) says so in `param` too.
    if let Some(rest) = message.strip_prefix('`') {
        if let Some((field, _)) = rest.split_once("`: ") {
            assert_eq!(e["param"].as_str(), Some(field), "{what}: {v}");
        }
    }
}

/// One client's share of the requests; the count of answers per (route, status).
fn client(
    seed: u64,
    n: usize,
    policy: SocketAddr,
    tools: SocketAddr,
    victim: &str,
) -> BTreeMap<(usize, u16), usize> {
    let mut r = SplitMix64(seed);
    let (mut p, mut t) = (Client::new(policy), Client::new(tools));
    let mut own = create(&mut p);
    let mut seen = BTreeMap::new();
    for i in 0..n {
        let ids = gen::Ids {
            run_token: TOKEN,
            own: &own,
            victim,
        };
        let req = gen::request(&mut r, &ids);
        let route = &gen::ROUTES[req.route];
        let c = match route.server {
            gen::Server::Policy => &mut p,
            gen::Server::Tools => &mut t,
        };
        let what = format!(
            "seed {seed} request {i} ({} {}): {:?}",
            route.method,
            route.path,
            String::from_utf8_lossy(&req.bytes[..req.bytes.len().min(600)])
        );
        match c.send(&req.bytes, req.mode, req.head_only) {
            Some(a) => {
                check(&a, &req, &what);
                *seen.entry((req.route, a.status)).or_insert(0) += 1;
            }
            None => assert!(req.broken, "{what}: no answer to a well-formed request"),
        }
        if req.deletes_own {
            own = create(&mut p);
        }
    }
    seen
}

#[test]
fn both_servers_survive_120k_generated_requests() {
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        PANICS.fetch_add(1, Ordering::SeqCst);
        default_hook(info);
    }));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (policy, engine) = policy_server(&rt);
    let index_dir = tempfile::tempdir().unwrap();
    let tools = tool_server(&rt, index_dir.path());
    let (pa, ta) = (policy.addr, tools.addr);
    assert!(pa.ip().is_loopback() && ta.ip().is_loopback());

    // Two victims: one with a recorded model call, one fresh.
    let mut admin = Client::new(pa);
    let victims = [create(&mut admin), create(&mut admin)];
    let chat = r#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}"#;
    let a = ask(
        &mut admin,
        "POST",
        "/v1/chat/completions",
        Some(&victims[0]),
        chat,
    );
    assert_eq!(a.status, 200, "{a:?}");
    let snapshot = |c: &mut Client| -> Vec<Vec<u8>> {
        victims
            .iter()
            .map(|v| {
                let a = ask(c, "GET", &format!("/trajectories/{v}"), Some(TOKEN), "");
                assert_eq!(a.status, 200);
                a.body
            })
            .collect()
    };
    let before = snapshot(&mut admin);

    let t0 = Instant::now();
    let per = REQUESTS / CLIENTS;
    let seen: Vec<BTreeMap<(usize, u16), usize>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..CLIENTS)
            .map(|k| {
                let victim = victims[k % 2].clone();
                s.spawn(move || client(20_261_215 + k as u64, per, pa, ta, &victim))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let took = t0.elapsed();

    let mut by_route = vec![0usize; gen::ROUTES.len()];
    let mut by_status: BTreeMap<u16, usize> = BTreeMap::new();
    for m in &seen {
        for (&(route, status), &n) in m {
            by_route[route] += n;
            *by_status.entry(status).or_insert(0) += n;
        }
    }
    let answered: usize = by_route.iter().sum();
    eprintln!(
        "{} requests ({answered} answered) in {:.1} s; statuses {by_status:?}",
        per * CLIENTS,
        took.as_secs_f64()
    );
    // Every route was reached, and both sides of each: some calls served, many refused.
    for (i, n) in by_route.iter().enumerate() {
        let r = &gen::ROUTES[i];
        assert!(
            *n >= 500,
            "{:?} {} {}: {n} answers",
            r.server,
            r.method,
            r.path
        );
    }
    assert!(
        by_status.get(&200).copied().unwrap_or(0) > 2_000,
        "{by_status:?}"
    );
    for s in [400, 401, 403, 404, 413] {
        assert!(
            by_status.get(&s).copied().unwrap_or(0) > 100,
            "{s}: {by_status:?}"
        );
    }

    // Bodies past the bound, sent in full (chunked: no length to refuse them by).
    let mut t = Client::new(ta);
    let big = vec![b'7'; (8 << 20) + 1];
    let mut head = b"POST /tools/bm25_search HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    head.extend_from_slice(format!("{:x}\r\n", big.len()).as_bytes());
    head.extend_from_slice(&big);
    head.extend_from_slice(b"\r\n0\r\n\r\n");
    let a = t
        .send(&head, Mode::Fresh, false)
        .expect("an answer to a large body");
    assert_eq!(a.status, 413, "{a:?}");
    assert_eq!(json(&a)["error"]["code"], "body_too_large");

    // Still serving, and the victims untouched.
    assert_eq!(snapshot(&mut admin), before, "a victim trajectory changed");
    let a = ask(
        &mut admin,
        "POST",
        "/v1/chat/completions",
        Some(TOKEN),
        chat,
    );
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(json(&a)["choices"][0]["message"]["role"], "assistant");
    let a = ask(
        &mut t,
        "POST",
        "/tools/bm25_search",
        None,
        r#"{"query": "wing flutter", "k": 2}"#,
    );
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(json(&a)["ids"].as_array().unwrap().len(), 2);
    assert_eq!(PANICS.load(Ordering::SeqCst), 0, "something panicked");
    rt.block_on(policy.shutdown()).unwrap();
    rt.block_on(tools.shutdown()).unwrap();
    engine.shutdown().unwrap();
}
