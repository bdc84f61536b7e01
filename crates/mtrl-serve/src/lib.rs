//! `mtrl-serve`: bring your own agent.
//!
//! - [`gateway`] + [`policy`]: the OpenAI-compatible policy endpoint (`/v1/chat/completions`,
//!   `/v1/completions`, `/v1/models`, `/sample`, `/update-reward`, `/complete-rollout`,
//!   `/trajectories`, `/healthz`), served by the same engine thread as in-process rollouts;
//! - [`capture`]: per-trajectory token capture (exact prompt ids, sampled ids, log-probs,
//!   versions; continuation vs new segment) and budgets;
//! - [`agent`]: the rollout [`mtrl_rollout::Driver`] that dispatches tasks to the user's agent
//!   (`sagemaker` or `agentcore-toolkit` protocol);
//! - [`tools`]: `mtrl serve-tools`, a config's search tools over HTTP;
//! - [`http`]: the shared HTTP surface (loopback unless allowed and token-protected, bearer
//!   token, one trajectory per call, body-size and time limits, bounded graceful shutdown);
//!   [`request`]: the request parser, [`render`], [`openai`]: the wire shapes. Both the parsers
//!   (`tests/request_fuzz.rs`) and the servers over real sockets (`tests/http_fuzz/`) are
//!   fuzzed.
//!
//! Invariant: this crate never depends on `mtrl-learner`, `mtrl-eval` or `mtrl-train`; the
//! trainer reaches it through `mtrl-rollout`'s `Driver`.

pub mod agent;
pub mod capture;
pub mod error;
pub mod gateway;
pub mod http;
pub mod openai;
pub mod policy;
pub mod render;
pub mod request;
pub mod tools;

pub use agent::{AgentDriver, AgentSettings, Protocol};
pub use capture::{Budgets, Capture, Spec};
pub use error::{ApiError, Result, ServeError};
pub use gateway::{Gateway, Served};
pub use http::{HttpOptions, Server};
pub use tools::ToolService;
