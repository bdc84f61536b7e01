//! The HTTP surface shared by the policy endpoint and the tool service (axum over hyper).
//!
//! Invariants, each tested over real sockets (`tests/http.rs`, `tests/http_fuzz.rs`):
//! - **bind**: a listener on a non-loopback address needs both [`HttpOptions::allow_remote`]
//!   and a bearer token; without them [`Server::start`] refuses before binding anything;
//! - **who a call acts for** ([`handle`]): the run token (`Authorization: Bearer <token>`) or a
//!   live trajectory's id authenticates a call. Every place that names a trajectory — the
//!   `/t/<id>` prefix, the trajectory header, an `mtrl-` bearer, a route's own path id (see
//!   [`Service::path_trajectory`]) and, checked by the service, a report's `trajectoryId` —
//!   must name the same one, else 403 `trajectory_mismatch`: a call acts on the one trajectory
//!   it is authenticated as and never reads or writes another;
//! - **size**: a body larger than `max_body_bytes` (default [`MAX_BODY_BYTES`], 8 MiB) is
//!   refused with 413 `body_too_large` as soon as its declared length or the bytes read so far
//!   exceed it; nothing beyond the bound is buffered;
//! - **time**: reading the body and serving the call share one deadline, `request_timeout`
//!   (default 600 s) after the head arrived: a body not in by then is 408 `body_timeout`, a call
//!   not done 504; a body cut off by its client is 400 `body_unreadable`;
//! - **shutdown**: stop accepting, let in-flight calls finish for at most `shutdown_grace`
//!   (default 10 s), then drop them ([`Server::shutdown`] returns within that bound).
//!
//! Every request that parses as HTTP/1.1 is answered with JSON (an OpenAI error body on
//! failure). Bytes hyper cannot parse as a request (a bad request line or header, a head over
//! its size limit) get hyper's own bodiless 400 / 431 and a closed connection.

use std::future::{Future, IntoFuture};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body as AxBody, HttpBody};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use tokio::net::TcpListener;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::{ApiError, Result, ServeError};
use crate::gateway::Body;

/// The header the managed service names a call's trajectory with.
pub const TRAJECTORY_HEADER: &str = "x-amzn-sagemaker-trajectory-id";

/// The default bound on a request body, in bytes (8 MiB).
pub const MAX_BODY_BYTES: usize = 8 << 20;

/// A fresh bearer token: 128 random bits from the thread's cryptographic generator.
pub fn new_token() -> String {
    format!(
        "run-{:016x}{:016x}",
        rand::random::<u64>(),
        rand::random::<u64>()
    )
}

/// Limits and credentials of a server.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// Required as `Authorization: Bearer <token>` when set (a live trajectory's id is accepted
    /// in its place for the calls that name that trajectory).
    pub token: Option<String>,
    /// Listening on a non-loopback address is allowed (a token is then required too).
    pub allow_remote: bool,
    pub max_body_bytes: usize,
    /// Bounds reading a body and serving its call, together.
    pub request_timeout: Duration,
    /// How long calls in flight at shutdown may run on before they are dropped.
    pub shutdown_grace: Duration,
}

impl Default for HttpOptions {
    fn default() -> Self {
        HttpOptions {
            token: None,
            allow_remote: false,
            max_body_bytes: MAX_BODY_BYTES,
            request_timeout: Duration::from_secs(600),
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

/// One request as the services see it.
pub struct Call<'a> {
    pub method: &'a Method,
    /// The path without a `/t/<id>` prefix.
    pub path: &'a str,
    /// The one trajectory the call names (prefix, header, an `mtrl-` bearer or the route's
    /// path id, all agreeing); the only one it may act on.
    pub trajectory: Option<String>,
    pub body: &'a [u8],
}

pub type Reply<'a> = Pin<Box<dyn Future<Output = std::result::Result<Body, ApiError>> + Send + 'a>>;

/// A service behind the HTTP surface.
pub trait Service: Send + Sync + 'static {
    fn call<'a>(&'a self, call: Call<'a>) -> Reply<'a>;
    /// Whether `id` is a live trajectory (its id then authenticates its calls).
    fn knows(&self, _id: &str) -> bool {
        false
    }
    /// A trajectory id a route carries in its path (beyond the `/t/<id>` prefix).
    fn path_trajectory(&self, _path: &str) -> Option<String> {
        None
    }
}

struct App<S> {
    service: Arc<S>,
    opts: HttpOptions,
}

/// A running server.
pub struct Server {
    pub addr: SocketAddr,
    stop: CancellationToken,
    handle: tokio::task::JoinHandle<std::io::Result<()>>,
}

/// Why `addr` may not be listened on with `opts`, if it may not (resolved, not bound).
async fn refuse_remote(addr: &str, opts: &HttpOptions) -> Result<()> {
    let resolved: Vec<SocketAddr> = tokio::net::lookup_host(addr)
        .await
        .map_err(|e| ServeError::Bind {
            addr: addr.to_string(),
            message: e.to_string(),
        })?
        .collect();
    if resolved.iter().all(|a| a.ip().is_loopback()) {
        return Ok(());
    }
    let missing = if !opts.allow_remote {
        "remote listening was not allowed explicitly"
    } else if opts.token.is_none() {
        "no bearer token is set"
    } else {
        return Ok(());
    };
    Err(ServeError::Remote {
        addr: addr.to_string(),
        missing,
    })
}

impl Server {
    /// Starts serving `service` on `addr` (on the current tokio runtime).
    pub async fn start<S: Service>(
        addr: &str,
        service: Arc<S>,
        opts: HttpOptions,
    ) -> Result<Server> {
        refuse_remote(addr, &opts).await?;
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|e| ServeError::Bind {
                addr: addr.to_string(),
                message: e.to_string(),
            })?;
        let addr = listener.local_addr()?;
        let grace = opts.shutdown_grace;
        let app = Arc::new(App { service, opts });
        let router = Router::new().fallback(handle::<S>).with_state(app);
        let stop = CancellationToken::new();
        let s = stop.clone();
        let handle = tokio::spawn(async move {
            let serve =
                axum::serve(listener, router).with_graceful_shutdown(s.clone().cancelled_owned());
            // The drain is bounded: past the grace, the serving future (and the listener) is
            // dropped; connections still open die with the runtime that runs them.
            tokio::select! {
                r = serve.into_future() => r,
                () = async { s.cancelled().await; tokio::time::sleep(grace).await } => Ok(()),
            }
        });
        Ok(Server { addr, stop, handle })
    }

    /// A token that stops the server when cancelled (e.g. on Ctrl-C).
    pub fn stopper(&self) -> CancellationToken {
        self.stop.clone()
    }

    /// Stops accepting connections and waits for in-flight calls to finish (at most the
    /// shutdown grace).
    pub async fn shutdown(self) -> Result<()> {
        self.stop.cancel();
        self.wait().await
    }

    /// Waits until the server stops (after [`Server::stopper`] is cancelled, within the
    /// shutdown grace).
    pub async fn wait(self) -> Result<()> {
        match self.handle.await {
            Ok(r) => Ok(r?),
            Err(e) => Err(ServeError::Config(format!("the server task: {e}"))),
        }
    }
}

fn respond(r: std::result::Result<Body, ApiError>) -> Response {
    match r {
        Ok(Body::Json(v)) => {
            ([(header::CONTENT_TYPE, "application/json")], v.to_string()).into_response()
        }
        Ok(Body::Events(s)) => (
            [
                (header::CONTENT_TYPE, "text/event-stream"),
                (header::CACHE_CONTROL, "no-cache"),
            ],
            s,
        )
            .into_response(),
        Err(e) => {
            let status =
                StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            (
                status,
                [(header::CONTENT_TYPE, "application/json")],
                e.body().to_string(),
            )
                .into_response()
        }
    }
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    v.strip_prefix("Bearer ")
        .or_else(|| v.strip_prefix("bearer "))
        .map(str::trim)
}

/// Splits `/t/<id>/rest` into (`/rest`, id).
fn split_prefix(path: &str) -> (&str, Option<&str>) {
    if let Some(rest) = path.strip_prefix("/t/") {
        let (id, tail) = rest.split_once('/').unwrap_or((rest, ""));
        if !id.is_empty() {
            return (
                if tail.is_empty() {
                    "/"
                } else {
                    &path[3 + id.len()..]
                },
                Some(id),
            );
        }
    }
    (path, None)
}

/// The one trajectory named by `(place, id)` pairs; 403 when two places name different ones.
pub fn one_trajectory(
    names: &[(&'static str, Option<&str>)],
) -> std::result::Result<Option<String>, ApiError> {
    let mut found: Option<(&str, &str)> = None;
    for &(place, id) in names {
        let Some(id) = id.filter(|id| !id.is_empty()) else {
            continue;
        };
        match found {
            None => found = Some((place, id)),
            Some((first, seen)) if seen != id => {
                return Err(ApiError::status(
                    403,
                    format!(
                        "{first} names trajectory `{seen}` but {place} names `{id}`: a call acts \
                         only on the trajectory it is authenticated as"
                    ),
                )
                .with_code("trajectory_mismatch"))
            }
            Some(_) => {}
        }
    }
    Ok(found.map(|(_, id)| id.to_string()))
}

/// Reads a body of at most `max` bytes.
async fn read_body(mut body: AxBody, max: usize) -> std::result::Result<Vec<u8>, ApiError> {
    let too_large = || {
        ApiError::status(413, format!("the body is larger than {max} bytes"))
            .with_code("body_too_large")
    };
    if body.size_hint().lower() > max as u64 {
        return Err(too_large());
    }
    let mut buf = Vec::new();
    while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        let frame = frame.map_err(|e| {
            ApiError::status(400, format!("the body could not be read: {e}"))
                .with_code("body_unreadable")
        })?;
        if let Ok(data) = frame.into_data() {
            if buf.len() + data.len() > max {
                return Err(too_large());
            }
            buf.extend_from_slice(&data);
        }
    }
    Ok(buf)
}

async fn handle<S: Service>(State(app): State<Arc<App<S>>>, req: Request) -> Response {
    let deadline = Instant::now() + app.opts.request_timeout;
    let (parts, body) = req.into_parts();
    let full = parts.uri.path().to_string();
    let (path, prefixed) = split_prefix(&full);
    let header_id = parts
        .headers
        .get(TRAJECTORY_HEADER)
        .and_then(|v| v.to_str().ok());
    let bearer = bearer(&parts.headers);
    let run_token = bearer.is_some() && bearer == app.opts.token.as_deref();
    let bearer_id = bearer.filter(|b| b.starts_with("mtrl-") && !run_token);
    let routed = app.service.path_trajectory(path);
    let trajectory = match one_trajectory(&[
        ("the bearer token", bearer_id),
        ("the /t/<id> prefix", prefixed),
        ("the trajectory header", header_id),
        ("the path", routed.as_deref()),
    ]) {
        Ok(t) => t,
        Err(e) => return respond(Err(e)),
    };
    if app.opts.token.is_some() {
        // A live trajectory's id (128 random bits, handed only to its agent) authenticates the
        // calls that name it, and only those.
        let ok = run_token || trajectory.as_deref().is_some_and(|t| app.service.knows(t));
        if !ok && path != "/healthz" && path != "/ping" {
            return respond(Err(
                ApiError::status(401, "missing or wrong bearer token").with_code("unauthorized")
            ));
        }
    }
    let limit = app.opts.request_timeout;
    let read = tokio::time::timeout_at(
        deadline,
        read_body(AxBody::new(body), app.opts.max_body_bytes),
    );
    let bytes = match read.await {
        Ok(Ok(b)) => b,
        Ok(Err(e)) => return respond(Err(e)),
        Err(_) => {
            return respond(Err(ApiError::status(
                408,
                format!(
                    "the body did not arrive within {:.0} s",
                    limit.as_secs_f64()
                ),
            )
            .with_code("body_timeout")))
        }
    };
    let call = Call {
        method: &parts.method,
        path,
        trajectory,
        body: &bytes,
    };
    let r = match tokio::time::timeout_at(deadline, app.service.call(call)).await {
        Ok(r) => r,
        Err(_) => Err(ApiError::status(
            504,
            format!("the call took longer than {:.0} s", limit.as_secs_f64()),
        )),
    };
    respond(r)
}

/// 404 / 405 for a path no route serves.
pub fn no_route(method: &Method, path: &str) -> ApiError {
    ApiError::status(404, format!("no route {method} {path}")).with_code("no_route")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_prefix_names_the_trajectory() {
        assert_eq!(
            split_prefix("/t/mtrl-ab/v1/chat/completions"),
            ("/v1/chat/completions", Some("mtrl-ab"))
        );
        assert_eq!(split_prefix("/v1/models"), ("/v1/models", None));
        assert_eq!(split_prefix("/t/x"), ("/", Some("x")));
        assert_eq!(split_prefix("/t//v1"), ("/t//v1", None));
    }

    #[test]
    fn places_naming_a_trajectory_must_agree() {
        let one = one_trajectory(&[("a", Some("x")), ("b", None), ("c", Some("x"))]);
        assert_eq!(one.unwrap().as_deref(), Some("x"));
        assert_eq!(
            one_trajectory(&[("a", None), ("b", Some(""))]).unwrap(),
            None
        );
        let e = one_trajectory(&[("the bearer token", Some("x")), ("the path", Some("y"))])
            .unwrap_err();
        assert_eq!((e.status, e.code), (403, Some("trajectory_mismatch")));
        assert!(
            e.message.contains("`x`") && e.message.contains("`y`"),
            "{}",
            e.message
        );
    }

    #[tokio::test]
    async fn a_remote_listener_needs_permission_and_a_token() {
        let opts = HttpOptions::default();
        assert!(refuse_remote("127.0.0.1:0", &opts).await.is_ok());
        assert!(refuse_remote("[::1]:0", &opts).await.is_ok());
        let e = refuse_remote("0.0.0.0:0", &opts).await.unwrap_err();
        assert!(e.to_string().contains("not allowed explicitly"), "{e}");
        let allowed = HttpOptions {
            allow_remote: true,
            ..HttpOptions::default()
        };
        let e = refuse_remote("0.0.0.0:0", &allowed).await.unwrap_err();
        assert!(e.to_string().contains("no bearer token"), "{e}");
        let with_token = HttpOptions {
            token: Some("t".into()),
            ..allowed
        };
        assert!(refuse_remote("0.0.0.0:0", &with_token).await.is_ok());
    }
}
