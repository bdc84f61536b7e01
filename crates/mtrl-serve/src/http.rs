//! The HTTP surface shared by the policy endpoint and the tool service (axum over hyper):
//! binding (loopback unless told otherwise), the bearer check, body-size and time limits, the
//! trajectory id of a call, JSON / event-stream responses, and graceful shutdown (stop accepting,
//! let in-flight calls finish).

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{to_bytes, Body as AxBody};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::error::{ApiError, Result, ServeError};
use crate::gateway::Body;

/// The header the managed service names a call's trajectory with.
pub const TRAJECTORY_HEADER: &str = "x-amzn-sagemaker-trajectory-id";

/// Limits and credentials of a server.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// Required as `Authorization: Bearer <token>` when set (a registered trajectory id is
    /// accepted in its place for that trajectory's calls).
    pub token: Option<String>,
    pub max_body_bytes: usize,
    pub request_timeout: Duration,
}

impl Default for HttpOptions {
    fn default() -> Self {
        HttpOptions {
            token: None,
            max_body_bytes: 8 << 20,
            request_timeout: Duration::from_secs(600),
        }
    }
}

/// One request as the services see it.
pub struct Call<'a> {
    pub method: &'a Method,
    /// The path without a `/t/<id>` prefix.
    pub path: &'a str,
    /// The trajectory the call names (prefix, header, or an `mtrl-` bearer).
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

impl Server {
    /// Starts serving `service` on `addr` (on the current tokio runtime).
    pub async fn start<S: Service>(
        addr: &str,
        service: Arc<S>,
        opts: HttpOptions,
    ) -> Result<Server> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|e| ServeError::Bind {
                addr: addr.to_string(),
                message: e.to_string(),
            })?;
        let addr = listener.local_addr()?;
        let app = Arc::new(App { service, opts });
        let router = Router::new().fallback(handle::<S>).with_state(app);
        let stop = CancellationToken::new();
        let s = stop.clone();
        let handle = tokio::spawn(async move {
            axum::serve(listener, router)
                .with_graceful_shutdown(async move { s.cancelled().await })
                .await
        });
        Ok(Server { addr, stop, handle })
    }

    /// A token that stops the server when cancelled (e.g. on Ctrl-C).
    pub fn stopper(&self) -> CancellationToken {
        self.stop.clone()
    }

    /// Stops accepting connections and waits for in-flight calls to finish.
    pub async fn shutdown(self) -> Result<()> {
        self.stop.cancel();
        self.wait().await
    }

    /// Waits until the server stops (after [`Server::stopper`] is cancelled).
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

async fn handle<S: Service>(State(app): State<Arc<App<S>>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let full = parts.uri.path().to_string();
    let (path, prefixed) = split_prefix(&full);
    let header_id = parts
        .headers
        .get(TRAJECTORY_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let bearer = bearer(&parts.headers).map(str::to_string);
    let bearer_id = bearer.clone().filter(|b| b.starts_with("mtrl-"));
    let trajectory = prefixed
        .map(str::to_string)
        .or_else(|| app.service.path_trajectory(path))
        .or(header_id)
        .or(bearer_id);
    if let Some(token) = &app.opts.token {
        // A live trajectory's id (128 random bits, handed only to its agent) authenticates the
        // calls that name it.
        let ok = bearer.as_deref() == Some(token.as_str())
            || trajectory.as_deref().is_some_and(|t| app.service.knows(t));
        if !ok && path != "/healthz" && path != "/ping" {
            return respond(Err(
                ApiError::status(401, "missing or wrong bearer token").with_code("unauthorized")
            ));
        }
    }
    let bytes = match to_bytes(AxBody::new(body), app.opts.max_body_bytes).await {
        Ok(b) => b,
        Err(_) => {
            return respond(Err(ApiError::status(
                413,
                format!(
                    "the body is larger than {} bytes (or could not be read)",
                    app.opts.max_body_bytes
                ),
            )))
        }
    };
    let call = Call {
        method: &parts.method,
        path,
        trajectory,
        body: &bytes,
    };
    let limit = app.opts.request_timeout;
    let r = match tokio::time::timeout(limit, app.service.call(call)).await {
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
}
