//! Errors: [`ServeError`] for the library's callers, [`ApiError`] for HTTP clients (a status, a
//! message naming the offending field, and the OpenAI error body).

use serde_json::{json, Value};

/// Errors of starting or running the services.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot listen on {addr}: {message}")]
    Bind { addr: String, message: String },
    /// A non-loopback listener without both the explicit permission and a bearer token.
    #[error("refusing to listen on {addr}: it is not a loopback address and {missing}")]
    Remote { addr: String, missing: &'static str },
    #[error("{0}")]
    Config(String),
    #[error("agent at {url}: {message}")]
    Agent { url: String, message: String },
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Env(#[from] mtrl_env::EnvError),
    #[error(transparent)]
    Search(#[from] mtrl_search::SearchError),
}

pub type Result<T, E = ServeError> = std::result::Result<T, E>;

/// What an HTTP client is told when a request fails.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    /// The request field at fault (`messages[2].tool_calls[0].function.arguments`), if one is.
    pub param: Option<String>,
    /// A machine-readable code (`turn_budget_exceeded`, `unknown_trajectory`, …).
    pub code: Option<&'static str>,
}

impl ApiError {
    /// 400 naming `param`.
    pub fn field(param: impl Into<String>, message: impl Into<String>) -> ApiError {
        let param = param.into();
        let message = format!("`{param}`: {}", message.into());
        ApiError {
            status: 400,
            message,
            param: Some(param),
            code: None,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::status(400, message)
    }

    pub fn status(status: u16, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            param: None,
            code: None,
        }
    }

    pub fn with_code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }

    /// The OpenAI error body.
    pub fn body(&self) -> Value {
        let kind = match self.status {
            400 | 413 | 422 => "invalid_request_error",
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            408 | 504 => "timeout_error",
            503 => "service_unavailable",
            _ => "server_error",
        };
        json!({"error": {
            "message": self.message,
            "type": kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status, self.message)
    }
}
