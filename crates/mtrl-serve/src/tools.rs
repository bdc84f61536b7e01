//! `mtrl serve-tools`: a config's tools over HTTP, the same objects the in-process environment
//! calls (`mtrl_env::standard_tools` over the config's indexes), so a result is the text the
//! policy would be shown in-process.
//!
//! Routes: `GET /tools` (the OpenAI function schemas, the environment's system prompt and the
//! `[env]` settings an agent needs to behave like the built-in environment), `POST /tools/<name>`
//! (body: the tool's JSON arguments → `{"content", "ids", "answer"?}`; invalid arguments → 422
//! with the message the model would be shown after `error: `), `POST /shortcuts/<name>`, and
//! `GET /healthz`.
//!
//! Tools are stateless, but the environment's argument shortcuts (`default_query`, `submit_hits`,
//! `top`, `interleave`, `submit_rrf`: [`mtrl_env::shortcuts`]) resolve against an episode's own
//! history. An agent asks `POST /shortcuts/<name>` with `{"arguments", "question", "earlier":
//! [{"name", "ids", "error"?}, …]}` (the episode's calls so far, in order) and calls the tool
//! with the answer's `arguments`; a refused shortcut is a 422 with the model's message, as a
//! refused call is. The resolution is the in-process environment's own code, so an agent over
//! HTTP cannot drift from it (the example agents once carried a Python copy that did).

use std::sync::Arc;

use axum::http::Method;
use mtrl_core::trajectory::ToolCallRecord;
use mtrl_core::EnvConfig;
use mtrl_env::{Tool, ToolError};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::gateway::Body;
use crate::http::{no_route, Call, Reply, Service};

/// The tool service.
pub struct ToolService {
    tools: Vec<Arc<dyn Tool>>,
    env: EnvConfig,
    info: Value,
}

/// The body of `POST /shortcuts/<name>`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ShortcutRequest {
    /// The arguments the model wrote.
    arguments: Value,
    /// The task's question (what a search without `query` searches for).
    #[serde(default)]
    question: String,
    /// The episode's calls so far, in order.
    #[serde(default)]
    earlier: Vec<EarlierCall>,
}

/// One earlier call of the episode, as the shortcuts read it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EarlierCall {
    name: String,
    #[serde(default)]
    ids: Vec<String>,
    #[serde(default)]
    error: Option<String>,
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
        ToolService {
            tools,
            env: env.clone(),
            info,
        }
    }

    fn tool(&self, name: &str) -> Result<Arc<dyn Tool>, ApiError> {
        self.tools
            .iter()
            .find(|t| t.name() == name)
            .cloned()
            .ok_or_else(|| {
                let names: Vec<&str> = self.tools.iter().map(|t| t.name()).collect();
                ApiError::status(
                    404,
                    format!("unknown tool `{name}` (available: {})", names.join(", ")),
                )
            })
    }

    /// `POST /shortcuts/<name>`: the arguments `name` is to be called with.
    fn shortcuts(&self, name: &str, body: &[u8]) -> Result<Body, ApiError> {
        let tool = self.tool(name)?;
        let req: ShortcutRequest = serde_json::from_slice(body).map_err(|e| {
            ApiError::bad_request(format!(
                "the body is not a shortcut request ({{\"arguments\", \"question\", \"earlier\"}}): {e}"
            ))
        })?;
        let earlier: Vec<ToolCallRecord> = req
            .earlier
            .into_iter()
            .map(|c| ToolCallRecord {
                turn: 0,
                name: c.name,
                arguments: Value::Null,
                result_ids: c.ids,
                latency_ms: 0.0,
                error: c.error,
            })
            .collect();
        mtrl_env::shortcuts::resolve(
            &self.env,
            tool.as_ref(),
            &req.arguments,
            &req.question,
            &earlier,
        )
        .map(|arguments| Body::Json(json!({ "arguments": arguments })))
        .map_err(|m| ApiError::status(422, m).with_code("invalid_arguments"))
    }

    async fn run(&self, name: &str, body: &[u8]) -> Result<Body, ApiError> {
        let tool = self.tool(name)?;
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
                (&Method::POST, p) if p.starts_with("/shortcuts/") => {
                    self.shortcuts(&p["/shortcuts/".len()..], c.body)
                }
                (m, p) => Err(no_route(m, p)),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mtrl_env::tools::SubmitTool;

    fn service(rrf: bool) -> ToolService {
        let env = EnvConfig {
            submit_hits: true,
            submit_rrf: rrf,
            ..EnvConfig::default()
        };
        let submit = SubmitTool::new(env.final_k, None)
            .with_hits(true)
            .with_rrf(rrf);
        ToolService::new(vec![Arc::new(submit)], &env, String::new())
    }

    fn ask(s: &ToolService, body: Value) -> Result<Value, ApiError> {
        match s.shortcuts("submit", body.to_string().as_bytes())? {
            Body::Json(v) => Ok(v),
            Body::Events(_) => unreachable!("shortcuts answer JSON"),
        }
    }

    #[test]
    fn shortcuts_resolve_against_the_calls_sent_with_the_request() {
        let earlier = json!([
            {"name": "bm25_search", "ids": ["a", "b", "c"]},
            {"name": "bm25_search", "ids": [], "error": "`k` must be …"},
            {"name": "vector_search", "ids": ["c", "d"]},
        ]);
        let s = service(true);
        let go = |args: Value| ask(&s, json!({"arguments": args, "earlier": earlier}));
        let ids = |v: Value| v["arguments"]["doc_ids"].clone();
        assert_eq!(ids(go(json!({"hits": [4, 1]})).unwrap()), json!(["c", "a"]));
        assert_eq!(
            ids(go(json!({"top": 4})).unwrap()),
            json!(["a", "b", "c", "d"])
        );
        let fused = mtrl_env::scripted::rrf(&[
            vec!["a".into(), "b".into(), "c".into()],
            vec!["c".into(), "d".into()],
        ]);
        assert_eq!(
            ids(go(json!({"top": 4, "rrf": true})).unwrap()),
            json!(fused)
        );
        // rrf switched off: the flag is left for the tool to refuse, as in-process.
        let off = ask(
            &service(false),
            json!({"arguments": {"top": 2, "rrf": true}, "earlier": earlier}),
        )
        .unwrap();
        assert_eq!(
            off["arguments"],
            json!({"doc_ids": ["a", "b"], "rrf": true})
        );
    }

    #[test]
    fn a_refused_shortcut_or_a_bad_request_says_what_is_wrong() {
        let s = service(true);
        let e = ask(&s, json!({"arguments": {"top": 3}})).unwrap_err();
        assert_eq!((e.status, e.code), (422, Some("invalid_arguments")));
        assert!(e.message.contains("there was none yet"), "{}", e.message);
        let e = ask(&s, json!({"arguments": {}, "earlir": []})).unwrap_err();
        assert_eq!(e.status, 400);
        assert!(
            e.message.contains("unknown field `earlir`"),
            "{}",
            e.message
        );
        let e = ask(&s, json!({"arguments": {}, "earlier": [{"ids": []}]})).unwrap_err();
        assert!(e.message.contains("missing field `name`"), "{}", e.message);
        let Err(e) = s.shortcuts("nope", b"{}") else {
            panic!("an unknown tool is refused")
        };
        assert_eq!(e.status, 404);
        assert!(e.message.contains("available: submit"), "{}", e.message);
    }
}
