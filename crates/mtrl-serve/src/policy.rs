//! The policy endpoint's routes over the [`Gateway`]. Routes that carry a trajectory id in
//! their path (`/trajectories/<id>`, `/s3/…/<id>/…`) declare it through
//! [`Service::path_trajectory`], so the HTTP layer holds it to the id the call is
//! authenticated as.

use axum::http::Method;

use crate::error::ApiError;
use crate::gateway::{Body, Gateway};
use crate::http::{no_route, Call, Reply, Service};

impl Service for Gateway {
    fn call<'a>(&'a self, c: Call<'a>) -> Reply<'a> {
        Box::pin(async move {
            let t = c.trajectory.as_deref();
            let path = c.path.trim_end_matches('/');
            let path = if path.is_empty() { "/" } else { path };
            match (c.method, path) {
                (&Method::GET, "/healthz" | "/ping") => Ok(Body::Json(self.health())),
                (&Method::GET, "/v1/models" | "/models") => Ok(Body::Json(self.models())),
                (&Method::POST, "/v1/chat/completions" | "/chat/completions") => {
                    self.chat(t, c.body).await
                }
                (&Method::POST, "/v1/completions" | "/completions") => {
                    self.completion(t, c.body).await
                }
                (&Method::POST, "/sample" | "/v1/sample") => self.sample(t, c.body).await,
                (&Method::POST, "/update-reward" | "/v1/update-reward") => {
                    self.report(t, c.body, false).await
                }
                (&Method::POST, "/complete-rollout" | "/v1/complete-rollout") => {
                    self.report(t, c.body, true).await
                }
                (&Method::POST, "/trajectories") => self.create(),
                (&Method::PUT, p) if p.starts_with("/s3/") => self.s3_result(t, c.body).await,
                (m, p) if p.starts_with("/trajectories/") => {
                    let id = &p["/trajectories/".len()..];
                    match *m {
                        Method::GET => self.get(id).await,
                        Method::DELETE => self.delete(id).await,
                        _ => Err(ApiError::status(405, format!("{m} {p}: use GET or DELETE"))),
                    }
                }
                (m, p) => Err(no_route(m, p)),
            }
        })
    }

    fn knows(&self, id: &str) -> bool {
        self.is_known(id)
    }

    /// `/trajectories/<id>`; `PUT /s3/<bucket>/<exp_id>/<input_id>/<session>.json`: the input
    /// id is the trajectory.
    fn path_trajectory(&self, path: &str) -> Option<String> {
        let path = path.trim_end_matches('/');
        if let Some(id) = path.strip_prefix("/trajectories/") {
            return Some(id.to_string());
        }
        let parts: Vec<&str> = path.strip_prefix("/s3/")?.split('/').collect();
        (parts.len() == 4).then(|| parts[2].to_string())
    }
}
