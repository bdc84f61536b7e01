//! The [`Tool`] trait: what the agent can call, and the argument checks every tool shares.
//!
//! A tool validates its own arguments and answers a mistake with [`ToolError::Invalid`], which
//! the environment turns into an error tool response the model can recover from (and counts).
//! [`ToolError::Fatal`] is reserved for failures that are not the model's fault (index IO) and
//! aborts the episode with an error. A tool whose output carries an [`Answer`] ends the episode.

use serde_json::{Map, Value};

use crate::error::EnvError;

/// The final answer of an episode.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Answer {
    /// Ranked document ids, best first (duplicates and unknown ids already removed).
    pub doc_ids: Vec<String>,
    /// A free-text answer (QA tasks).
    pub text: Option<String>,
}

/// What a successful call produced.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolOutput {
    /// The tool response shown to the model.
    pub content: String,
    /// Set when this call is the final answer.
    pub answer: Option<Answer>,
    /// Document ids the call returned (for the trajectory log; not shown to the model).
    pub ids: Vec<String>,
}

impl ToolOutput {
    pub fn text(content: impl Into<String>) -> ToolOutput {
        ToolOutput {
            content: content.into(),
            answer: None,
            ids: Vec::new(),
        }
    }

    /// The same output, recording the document ids it returned.
    pub fn with_ids(self, ids: Vec<String>) -> ToolOutput {
        ToolOutput { ids, ..self }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// The call's arguments are wrong; the message is shown to the model.
    #[error("{0}")]
    Invalid(String),
    /// The tool itself failed; the episode is aborted with this error.
    #[error(transparent)]
    Fatal(#[from] EnvError),
}

/// A tool the agent can call. Implementations are shared by every episode (`Send + Sync`).
pub trait Tool: Send + Sync {
    /// The name the model calls it by.
    fn name(&self) -> &str;
    /// The JSON schema in the Qwen / OpenAI tool format:
    /// `{"type": "function", "function": {"name", "description", "parameters"}}`.
    fn schema(&self) -> Value;
    /// Runs the call; `arguments` is a JSON object.
    fn call(&self, arguments: &Value) -> Result<ToolOutput, ToolError>;
    /// Whether a call of this tool is an attempt at the final answer (a malformed attempt on the
    /// last turn fails the episode as `invalid_answer` rather than `turn_limit`).
    fn is_final(&self) -> bool {
        false
    }
}

/// Builds a function schema in the Qwen tool format.
pub fn function_schema(name: &str, description: &str, parameters: Value) -> Value {
    serde_json::json!({
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters}
    })
}

/// Checked access to a call's arguments: unknown keys, missing keys and wrong types are
/// [`ToolError::Invalid`] with a message naming the argument.
pub struct Args<'a> {
    tool: &'a str,
    map: &'a Map<String, Value>,
}

impl<'a> Args<'a> {
    /// Wraps `arguments`, refusing keys outside `allowed`.
    pub fn new(tool: &'a str, arguments: &'a Value, allowed: &[&str]) -> Result<Self, ToolError> {
        let Value::Object(map) = arguments else {
            return Err(ToolError::Invalid(format!(
                "{tool}: arguments must be a JSON object"
            )));
        };
        if let Some(k) = map.keys().find(|k| !allowed.contains(&k.as_str())) {
            return Err(ToolError::Invalid(format!(
                "{tool}: unknown argument `{k}` (expected {})",
                allowed.join(", ")
            )));
        }
        Ok(Args { tool, map })
    }

    fn invalid(&self, msg: String) -> ToolError {
        ToolError::Invalid(format!("{}: {msg}", self.tool))
    }

    /// A required non-empty string.
    pub fn string(&self, key: &str) -> Result<&'a str, ToolError> {
        match self.map.get(key) {
            Some(Value::String(s)) if !s.trim().is_empty() => Ok(s),
            Some(Value::String(_)) => Err(self.invalid(format!("`{key}` must not be empty"))),
            Some(v) => Err(self.invalid(format!("`{key}` must be a string, got {v}"))),
            None => Err(self.invalid(format!("missing argument `{key}`"))),
        }
    }

    /// An optional string.
    pub fn opt_string(&self, key: &str) -> Result<Option<&'a str>, ToolError> {
        match self.map.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(self.invalid(format!("`{key}` must be a string, got {v}"))),
        }
    }

    /// An optional integer in `lo..=hi` (integral floats such as `5.0` accepted).
    pub fn opt_int_in(&self, key: &str, lo: usize, hi: usize) -> Result<Option<usize>, ToolError> {
        let v = match self.map.get(key) {
            None | Some(Value::Null) => return Ok(None),
            Some(v) => v,
        };
        let n = match v {
            Value::Number(n) => n.as_i64().or_else(|| {
                n.as_f64()
                    .filter(|f| f.fract() == 0.0 && f.abs() < 1e15)
                    .map(|f| f as i64)
            }),
            Value::String(s) => s.trim().parse::<i64>().ok(),
            _ => None,
        };
        match n {
            Some(n) if n >= lo as i64 && n <= hi as i64 => Ok(Some(n as usize)),
            Some(n) => Err(self.invalid(format!("`{key}` = {n} is out of range {lo}..={hi}"))),
            None => Err(self.invalid(format!("`{key}` must be an integer, got {v}"))),
        }
    }

    /// A list of ids: strings, or numbers written as ids (`[184, "12"]`).
    pub fn id_list(&self, key: &str) -> Result<Vec<String>, ToolError> {
        match self.map.get(key) {
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| match v {
                    Value::String(s) => Ok(s.trim().to_string()),
                    Value::Number(n) => Ok(n.to_string()),
                    other => Err(self.invalid(format!("`{key}` holds {other}, not an id"))),
                })
                .collect(),
            Some(Value::String(s)) => Ok(s
                .split(',')
                .map(|x| x.trim().to_string())
                .filter(|x| !x.is_empty())
                .collect()),
            Some(v) => Err(self.invalid(format!("`{key}` must be a list of ids, got {v}"))),
            None => Err(self.invalid(format!("missing argument `{key}`"))),
        }
    }

    pub fn has(&self, key: &str) -> bool {
        self.map.contains_key(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn argument_checks_name_the_problem() {
        let v = json!({"query": "q", "k": 5.0, "ids": [1, "b"]});
        let a = Args::new("t", &v, &["query", "k", "ids"]).unwrap();
        assert_eq!(a.string("query").unwrap(), "q");
        assert_eq!(a.opt_int_in("k", 1, 10).unwrap(), Some(5));
        assert_eq!(a.id_list("ids").unwrap(), vec!["1", "b"]);
        let msg = a.opt_int_in("k", 1, 3).unwrap_err().to_string();
        assert!(msg.contains("out of range"), "{msg}");
        assert!(a
            .string("nope")
            .unwrap_err()
            .to_string()
            .contains("missing"));
        let msg = Args::new("t", &v, &["query"]).err().unwrap().to_string();
        assert!(msg.contains("unknown argument"), "{msg}");
        let bad = json!({"k": "x", "query": 3, "ids": [[1]]});
        let a = Args::new("t", &bad, &["query", "k", "ids"]).unwrap();
        assert!(a.opt_int_in("k", 1, 3).is_err());
        assert!(a.string("query").is_err());
        assert!(a.id_list("ids").is_err());
    }
}
