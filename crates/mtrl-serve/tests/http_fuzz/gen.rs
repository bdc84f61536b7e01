//! The request generator: every route of both servers, each with a valid body of its own shape
//! that is then kept, bent (a field replaced by a value of another type, a huge or negative
//! number, an unknown key, deep nesting), mangled byte by byte, replaced by random JSON or raw
//! bytes, or dropped; credentials and trajectory names drawn from the caller's own trajectory,
//! an unknown id and — only when the caller is authenticated as its own — the victim's; and
//! the HTTP framing itself bent (methods, paths, headers, lying or invalid lengths, chunked
//! bodies, truncated streams, closed connections, broken heads). Seeded: one draw of
//! [`SplitMix64`] decides everything.

use mtrl_core::rng::SplitMix64;
use serde_json::{json, Map, Value};

use super::wire::Mode;

/// Which server a route is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Server {
    Policy,
    Tools,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    Empty,
    Chat,
    Completion,
    Sample,
    Report,
    S3,
    Search,
    Submit,
    Shortcut,
}

/// `{id}` in a path is a trajectory id.
pub struct Route {
    pub server: Server,
    pub method: &'static str,
    pub path: &'static str,
    shape: Shape,
}

const fn route(server: Server, method: &'static str, path: &'static str, shape: Shape) -> Route {
    Route {
        server,
        method,
        path,
        shape,
    }
}

use Server::{Policy as P, Tools as T};

/// Every route both servers serve, and one neither does.
pub const ROUTES: &[Route] = &[
    route(P, "GET", "/healthz", Shape::Empty),
    route(P, "GET", "/ping", Shape::Empty),
    route(P, "GET", "/v1/models", Shape::Empty),
    route(P, "GET", "/models", Shape::Empty),
    route(P, "POST", "/v1/chat/completions", Shape::Chat),
    route(P, "POST", "/chat/completions", Shape::Chat),
    route(P, "POST", "/v1/completions", Shape::Completion),
    route(P, "POST", "/completions", Shape::Completion),
    route(P, "POST", "/sample", Shape::Sample),
    route(P, "POST", "/v1/sample", Shape::Sample),
    route(P, "POST", "/update-reward", Shape::Report),
    route(P, "POST", "/v1/update-reward", Shape::Report),
    route(P, "POST", "/complete-rollout", Shape::Report),
    route(P, "POST", "/v1/complete-rollout", Shape::Report),
    route(P, "POST", "/trajectories", Shape::Empty),
    route(P, "GET", "/trajectories/{id}", Shape::Empty),
    route(P, "DELETE", "/trajectories/{id}", Shape::Empty),
    route(P, "PUT", "/s3/mtrl/exp/{id}/session.json", Shape::S3),
    route(P, "POST", "/v2/nothing", Shape::Chat),
    route(T, "GET", "/healthz", Shape::Empty),
    route(T, "GET", "/ping", Shape::Empty),
    route(T, "GET", "/tools", Shape::Empty),
    route(T, "POST", "/tools/bm25_search", Shape::Search),
    route(T, "POST", "/tools/submit", Shape::Submit),
    route(T, "POST", "/tools/nope", Shape::Search),
    route(T, "POST", "/shortcuts/submit", Shape::Shortcut),
    route(T, "POST", "/shortcuts/bm25_search", Shape::Shortcut),
    route(T, "POST", "/shortcuts/nope", Shape::Shortcut),
    route(T, "POST", "/v2/nothing", Shape::Search),
];

/// The ids a request may name.
pub struct Ids<'a> {
    pub run_token: &'a str,
    /// A live trajectory of this client's own.
    pub own: &'a str,
    /// Another client's trajectory nothing may change.
    pub victim: &'a str,
}

/// One generated request.
pub struct Request {
    pub route: usize,
    pub bytes: Vec<u8>,
    pub mode: Mode,
    pub head_only: bool,
    /// The HTTP framing was broken on purpose (hyper's own bodiless 4xx is then an answer).
    pub broken: bool,
    /// Authenticated as its own trajectory while naming the victim (the prefix, the header or
    /// the path): must not succeed.
    pub names_victim: bool,
    /// `DELETE /trajectories/<own>` sent well-formed (the caller then needs a new one).
    pub deletes_own: bool,
}

const WORDS: &[&str] = &[
    "user",
    "assistant",
    "tool",
    "system",
    "robot",
    "",
    "hi",
    "{oops",
    "mtrl-",
    "é\u{0}",
    "[1]",
    "failed",
    "ready",
    "no_answer",
    "bm25_search",
    "submit",
    "d0",
];
const KEYS: &[&str] = &[
    "messages",
    "role",
    "content",
    "tool_calls",
    "tools",
    "temperature",
    "top_p",
    "top_k",
    "max_tokens",
    "seed",
    "stop",
    "n",
    "logprobs",
    "stream",
    "prompt",
    "echo",
    "input_ids",
    "trajectoryId",
    "reward",
    "rewards",
    "status",
    "failure",
    "metrics",
    "status_code",
    "query",
    "k",
    "doc_ids",
    "arguments",
    "question",
    "earlier",
    "hits",
    "top",
    "name",
    "ids",
];
/// Numbers at and past every bound a field has.
const NUMBERS: &[&str] = &[
    "-1",
    "0",
    "1",
    "2.5",
    "-0.0",
    "65536",
    "1048577",
    "4294967296",
    "18446744073709551615",
    "18446744073709551616",
    "-9223372036854775809",
    "1e308",
    "-1e308",
    "1e400",
    "3e-400",
    "1.0e",
];

fn any(r: &mut SplitMix64, depth: usize) -> Value {
    match r.below(if depth > 2 { 5 } else { 8 }) {
        0 => Value::Null,
        1 => json!(r.below(2) == 1),
        2 => serde_json::from_str(NUMBERS[r.below(NUMBERS.len())]).unwrap_or(json!(-7)),
        3 | 4 => json!(WORDS[r.below(WORDS.len())]),
        5 | 6 => {
            let mut m = Map::new();
            for _ in 0..r.below(4) {
                m.insert(KEYS[r.below(KEYS.len())].into(), any(r, depth + 1));
            }
            Value::Object(m)
        }
        _ => Value::Array((0..r.below(4)).map(|_| any(r, depth + 1)).collect()),
    }
}

/// A valid body of `shape`; `id` fills a report's `trajectoryId` when given.
fn valid(shape: Shape, r: &mut SplitMix64, id: Option<&str>) -> Value {
    let word = ["hi", "wings", "find flutter"][r.below(3)];
    match shape {
        Shape::Empty => json!({}),
        Shape::Chat => {
            let mut v = json!({"messages": [{"role": "user", "content": word}],
                "max_tokens": 1 + r.below(2), "temperature": 0});
            if r.below(3) == 0 {
                v["stream"] = json!(true);
                v["logprobs"] = json!(true);
                v["tools"] = json!([{"type": "function", "function": {"name": "bm25_search"}}]);
            }
            v
        }
        Shape::Completion => json!({"prompt": word, "max_tokens": 1, "logprobs": 1}),
        Shape::Sample => json!({"input_ids": [1, 2, 3 + r.below(50)], "max_tokens": 1}),
        Shape::Report => {
            let mut v = match r.below(4) {
                0 => json!({"reward": 0.5, "metrics": {"ndcg@10": 0.5}}),
                1 => json!({"reward": [0.25, 1]}),
                2 => json!({"status": "failed"}),
                _ => json!({"status": "failed", "failure": "no_answer"}),
            };
            if let Some(id) = id {
                v["trajectoryId"] = json!(id);
            }
            v
        }
        Shape::S3 => json!({"rewards": [0.1, 1.0], "status_code": 200 + 300 * r.below(2)}),
        Shape::Search => json!({"query": word, "k": 1 + r.below(5)}),
        Shape::Submit => json!({"doc_ids": ["d0", "d1"]}),
        Shape::Shortcut => json!({"arguments": {"top": 1 + r.below(3)}, "question": word,
            "earlier": [{"name": "bm25_search", "ids": ["d0", "d1"]}]}),
    }
}

/// A body for `shape`: kept valid, bent, mangled, or replaced.
fn body(shape: Shape, r: &mut SplitMix64, id: Option<&str>) -> Vec<u8> {
    let mut v = valid(shape, r, id);
    match r.below(20) {
        // Valid as it is (generation routes rarely: each one runs the model).
        0..=2 if !matches!(shape, Shape::Chat | Shape::Completion | Shape::Sample) => {
            v.to_string().into_bytes()
        }
        0 => v.to_string().into_bytes(),
        1..=7 => {
            // One field set to a value of any type, or a number past its bounds.
            let key = KEYS[r.below(KEYS.len())].to_string();
            let x = any(r, 1);
            if let Some(m) = v.as_object_mut() {
                let key = match (r.below(2), m.keys().nth(r.below(m.len().max(1)))) {
                    (0, Some(k)) => k.clone(),
                    _ => key,
                };
                m.insert(key, x);
            }
            v.to_string().into_bytes()
        }
        8..=9 => {
            // A number written out of any float's or integer's range, in place.
            let text = v.to_string();
            let n = NUMBERS[r.below(NUMBERS.len())];
            text.replacen(|c: char| c.is_ascii_digit(), n, 1)
                .into_bytes()
        }
        10..=12 => {
            let mut b = v.to_string().into_bytes();
            for _ in 0..1 + r.below(4) {
                let i = r.below(b.len().max(1));
                match r.below(3) {
                    0 if !b.is_empty() => b[i] = r.next_u64() as u8,
                    1 => b.truncate(i),
                    _ => b.insert(i.min(b.len()), b"{}[]\",:\\0e-\xff"[r.below(12)]),
                }
            }
            b
        }
        13..=15 => any(r, 0).to_string().into_bytes(),
        16 => {
            // Nesting past any parser's recursion limit.
            let d = 100 + r.below(200);
            let mut s = "[".repeat(d);
            s.push_str(&"]".repeat(d));
            s.into_bytes()
        }
        17 => (0..r.below(96)).map(|_| r.next_u64() as u8).collect(),
        _ => Vec::new(),
    }
}

fn unknown_id(r: &mut SplitMix64) -> String {
    format!("mtrl-{:016x}", r.next_u64())
}

/// A request drawn for a client whose ids are `ids`.
pub fn request(r: &mut SplitMix64, ids: &Ids<'_>) -> Request {
    let route = r.below(ROUTES.len());
    let rt = &ROUTES[route];
    // Credentials, then the trajectory the call names (the victim only while authenticated as
    // its own: a call naming the victim alone would be the victim's own call).
    let own_bearer = rt.server == Server::Policy && r.below(3) == 0;
    let bearer: Option<String> = if own_bearer {
        Some(ids.own.to_string())
    } else {
        match r.below(10) {
            0..=1 => None,
            2..=6 => Some(ids.run_token.to_string()),
            7 => Some("nope".into()),
            8 => Some(unknown_id(r)),
            _ => Some(String::new()),
        }
    };
    let named = match r.below(10) {
        0..=5 => ids.own.to_string(),
        6..=7 if own_bearer => ids.victim.to_string(),
        _ => unknown_id(r),
    };
    let victim = named == ids.victim;
    let prefix = rt.server == Server::Policy && r.below(8) == 0;
    let header = rt.server == Server::Policy && r.below(8) == 0;
    let in_body = rt.shape == Shape::Report && r.below(2) == 0;
    let mut method = rt.method.to_string();
    let mut path = rt.path.replace("{id}", &named);
    if prefix {
        path = format!("/t/{named}{path}");
    }
    let mut broken = false;
    match r.below(25) {
        0 => {
            method = [
                "GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD", "FOO", "get",
            ][r.below(9)]
            .to_string()
        }
        1 => path.push_str(["/", "/x", "?a=b&c", "//", "/../..", "%00", "%ff%2F"][r.below(7)]),
        2 => path.push_str(&"a".repeat(1 + r.below(4000))),
        _ => {}
    }
    let body = if method == "GET" || method == "HEAD" {
        Vec::new()
    } else {
        body(rt.shape, r, in_body.then_some(named.as_str()))
    };
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n");
    match bearer.as_deref() {
        Some(b) if r.below(20) == 0 => head.push_str(&format!("authorization: bearer {b}\r\n")),
        Some(b) => head.push_str(&format!("Authorization: Bearer {b}\r\n")),
        None if r.below(10) == 0 => head.push_str("Authorization: Basic Zm9vOmJhcg==\r\n"),
        None => {}
    }
    if header {
        head.push_str(&format!("X-Amzn-SageMaker-Trajectory-Id: {named}\r\n"));
    }
    match r.below(20) {
        0 => head.push_str("Content-Type: text/plain\r\n"),
        1 => head.push_str("X-Amzn-SageMaker-Trajectory-Id:\r\n"),
        2 => head.push_str("X-Odd: \u{e9}t\u{e9}\r\n"),
        3 => head.push_str(&format!("X-Long: {}\r\n", "v".repeat(r.below(20_000)))),
        _ => head.push_str("Content-Type: application/json\r\n"),
    }
    let mut mode = Mode::Whole;
    let mut bytes = head.into_bytes();
    match r.below(50) {
        // A length that lies, one that is no number, both framings at once, a broken head.
        0..=1 => {
            bytes.extend_from_slice(
                format!("Content-Length: {}\r\n\r\n", body.len() + 1 + r.below(100)).as_bytes(),
            );
            bytes.extend_from_slice(&body);
            mode = Mode::Truncated(bytes.len());
        }
        2 => {
            bytes.extend_from_slice(
                format!("Content-Length: {}\r\n\r\n", body.len() / 2).as_bytes(),
            );
            bytes.extend_from_slice(&body);
            bytes.extend_from_slice(b"\r\n");
            mode = Mode::Fresh;
            broken = true;
        }
        3 => {
            bytes.extend_from_slice(b"Content-Length: ten\r\n\r\n");
            mode = Mode::Fresh;
            broken = true;
        }
        4 => {
            bytes.extend_from_slice(
                b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            );
            mode = Mode::Fresh;
            broken = true;
        }
        5 => {
            // In the request line only: the credentials stay what they were drawn as.
            let line = bytes
                .iter()
                .position(|&b| b == b'\r')
                .unwrap_or(bytes.len());
            let i = r.below(line);
            bytes[i] = [b'\0', b' ', b'\n', 0xff, b':'][r.below(5)];
            bytes.extend_from_slice(b"\r\n");
            bytes.extend_from_slice(&body);
            mode = Mode::Fresh;
            broken = true;
        }
        // A body declared past the bound (8 MiB), sent in part.
        6 => {
            let n = (8 << 20) + 1 + r.below(1 << 30);
            bytes.extend_from_slice(format!("Content-Length: {n}\r\n\r\n").as_bytes());
            bytes.extend_from_slice(&body);
            mode = Mode::Fresh;
        }
        7..=9 => {
            bytes.extend_from_slice(b"Transfer-Encoding: chunked\r\n\r\n");
            for piece in body.chunks(1 + r.below(16)) {
                bytes.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
                bytes.extend_from_slice(piece);
                bytes.extend_from_slice(b"\r\n");
            }
            bytes.extend_from_slice(b"0\r\n\r\n");
        }
        _ => {
            bytes.extend_from_slice(format!("Content-Length: {}\r\n\r\n", body.len()).as_bytes());
            bytes.extend_from_slice(&body);
        }
    }
    match r.below(40) {
        0..=1 => mode = Mode::Truncated(r.below(bytes.len())),
        2 => mode = Mode::Dropped(r.below(bytes.len() + 1)),
        _ => {}
    }
    Request {
        route,
        head_only: method == "HEAD",
        names_victim: victim && (prefix || header || rt.path.contains("{id}")),
        deletes_own: method == "DELETE"
            && rt.path.starts_with("/trajectories/")
            && named == ids.own,
        broken: broken || mode != Mode::Whole,
        mode,
        bytes,
    }
}
