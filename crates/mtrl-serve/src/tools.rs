//! `mtrl serve-tools`: a config's tools over HTTP, the same objects the in-process environment
//! calls (`mtrl_env::standard_tools` over the config's indexes), so a result is the text the
//! policy would be shown in-process.
//!
//! Routes: `GET /tools` (the OpenAI function schemas, the environment's system prompt and the
//! `[env]` settings an agent needs to behave like the built-in environment), `POST /tools/<name>`
//! (body: the tool's JSON arguments → `{"content", "ids", "answer"?}`; invalid arguments → 422
//! with the message the model would be shown after `error: `), `GET /healthz`.
//!
//! Tools are stateless: the environment's shortcuts (`default_query`, `submit_hits`) resolve
//! against an episode's own history, so an agent applies them before calling (as
//! `examples/agents/plain_agent.py` does).

use std::sync::Arc;

use axum::http::Method;
use mtrl_core::EnvConfig;
use mtrl_env::{Tool, ToolError};
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::gateway::Body;
use crate::http::{no_route, Call, Reply, Service};

/// The tool service.
pub struct ToolService {
    tools: Vec<Arc<dyn Tool>>,
    info: Value,
}

impl ToolService {
    /// `tools` as the environment configured by `env` builds them; `system_prompt` is the
    /// environment's.
    pub fn new(tools: Vec<Arc<dyn Tool>>, env: &EnvConfig, system_prompt: String) -> ToolService {
        let schemas: Vec<Value> = tools.iter().map(|t| t.schema()).collect();
        let info = json!({
            "tools": schemas,
            "system_prompt": system_prompt,
            "env": {
                "max_turns": env.max_turns,
                "max_tokens_per_turn": env.max_tokens_per_turn,
                "max_context_tokens": env.max_context_tokens,
                "max_calls_per_turn": env.max_calls_per_turn,
                "final_k": env.final_k,
                "submit_excess": env.submit_excess.name(),
                "default_query": env.default_query,
                "submit_hits": env.submit_hits,
                "submit_rrf": env.submit_rrf,
                "failure_reward": env.failure_reward,
            },
        });
        ToolService { tools, info }
    }

    async fn run(&self, name: &str, body: &[u8]) -> Result<Body, ApiError> {
        let tool = self
            .tools
            .iter()
            .find(|t| t.name() == name)
            .cloned()
            .ok_or_else(|| {
                let names: Vec<&str> = self.tools.iter().map(|t| t.name()).collect();
                ApiError::status(
                    404,
                    format!("unknown tool `{name}` (available: {})", names.join(", ")),
                )
            })?;
        let args: Value = if body.iter().all(u8::is_ascii_whitespace) {
            json!({})
        } else {
            serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}")))?
        };
        let out = tokio::task::spawn_blocking(move || tool.call(&args))
            .await
            .map_err(|e| ApiError::status(500, format!("tool task: {e}")))?;
        match out {
            Ok(o) => {
                let mut v = json!({"content": o.content, "ids": o.ids});
                if let Some(a) = o.answer {
                    v["answer"] = json!(a.doc_ids);
                }
                Ok(Body::Json(v))
            }
            Err(ToolError::Invalid(m)) => {
                Err(ApiError::status(422, m).with_code("invalid_arguments"))
            }
            Err(ToolError::Fatal(e)) => Err(ApiError::status(500, e.to_string())),
        }
    }
}

impl Service for ToolService {
    fn call<'a>(&'a self, c: Call<'a>) -> Reply<'a> {
        Box::pin(async move {
            match (c.method, c.path.trim_end_matches('/')) {
                (&Method::GET, "/healthz" | "/ping") => Ok(Body::Json(json!({"status": "ok"}))),
                (&Method::GET, "/tools") => Ok(Body::Json(self.info.clone())),
                (&Method::POST, p) if p.starts_with("/tools/") => {
                    self.run(&p["/tools/".len()..], c.body).await
                }
                (m, p) => Err(no_route(m, p)),
            }
        })
    }
}
