//! A blocking client for the MLflow tracking server's REST API 2.0 — only the calls a training
//! run makes. Every call is one HTTP request with a timeout; none retries (the [`super::Tracker`]
//! worker does), and every failure says whether a retry can help.
//!
//! Endpoints (checked against an MLflow 3.17 server, `scripts/mlflow-server.sh`):
//! - `GET  /api/2.0/mlflow/experiments/get-by-name?experiment_name=…` → `{experiment: {experiment_id}}`
//!   (404 `RESOURCE_DOES_NOT_EXIST` when absent)
//! - `POST /api/2.0/mlflow/experiments/create {name}` → `{experiment_id}`
//! - `POST /api/2.0/mlflow/runs/create {experiment_id, run_name, start_time, tags}` → `{run: {info}}`
//! - `GET  /api/2.0/mlflow/runs/get?run_id=…` → `{run: {info, data}}`
//! - `POST /api/2.0/mlflow/runs/log-batch {run_id, metrics, params, tags}` (≤ 1000 metrics,
//!   ≤ 100 params per request)
//! - `POST /api/2.0/mlflow/runs/update {run_id, status, end_time}`
//! - `PUT  /api/2.0/mlflow-artifacts/artifacts/<experiment>/<run>/artifacts/<path>` (the artifact
//!   proxy of a server started with `--serve-artifacts`, MLflow ≥ 2's default), derived from the
//!   run's `artifact_uri` (`mlflow-artifacts:/<experiment>/<run>/artifacts`).

use std::fs::File;
use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

/// Most params one `log-batch` request may carry.
pub const MAX_PARAMS_PER_BATCH: usize = 100;
/// Most metrics one `log-batch` request may carry.
pub const MAX_METRICS_PER_BATCH: usize = 1000;
/// Longest param value MLflow (≥ 2.x, SQL store) accepts.
pub const MAX_PARAM_CHARS: usize = 6000;

/// A failed call: what went wrong and whether trying again may help (network errors, 5xx, 429).
#[derive(Debug, Clone)]
pub struct CallError {
    pub retryable: bool,
    pub message: String,
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

type CallResult<T> = std::result::Result<T, CallError>;

/// The run that metrics and artifacts go to.
#[derive(Debug, Clone, PartialEq)]
pub struct RunInfo {
    pub experiment_id: String,
    pub run_id: String,
    pub artifact_uri: String,
}

/// How a run ended (MLflow's `RunStatus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunStatus {
    Running,
    Finished,
    Failed,
    Killed,
}

impl RunStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Running => "RUNNING",
            RunStatus::Finished => "FINISHED",
            RunStatus::Failed => "FAILED",
            RunStatus::Killed => "KILLED",
        }
    }
}

/// One tracking server.
pub struct Client {
    base: String,
    agent: ureq::Agent,
    /// Upper bound for one artifact upload (large trajectory files).
    upload_timeout: Duration,
}

/// Milliseconds since the Unix epoch (MLflow's timestamps).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// A metric key MLflow accepts (letters, digits, `_ - . / : space`); `@` becomes `_at_` so
/// `ndcg@10` reads `ndcg_at_10`, anything else outside the set becomes `_`.
pub fn sanitize_key(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for c in key.chars() {
        match c {
            '@' => out.push_str("_at_"),
            c if c.is_ascii_alphanumeric() || "_-./: ".contains(c) => out.push(c),
            _ => out.push('_'),
        }
    }
    out
}

/// Percent-encodes an artifact path, keeping `/` as the separator.
fn encode_path(p: &str) -> String {
    let mut out = String::with_capacity(p.len());
    for b in p.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn transport(what: &str, e: ureq::Error) -> CallError {
    CallError {
        retryable: true,
        message: format!("{what}: {e}"),
    }
}

impl Client {
    /// `url` is the server's base URL (`http://host:port`); `timeout` bounds each JSON call.
    pub fn new(url: &str, timeout: Duration) -> crate::Result<Client> {
        let base = url.trim_end_matches('/').to_string();
        if base.starts_with("https://") {
            if !cfg!(feature = "mlflow-tls") {
                crate::bail!(
                    "MLflow tracking URI `{url}` is https: build mtrl with `--features mlflow-tls`"
                );
            }
        } else if !base.starts_with("http://") {
            crate::bail!("MLflow tracking URI `{url}` must start with http:// or https://");
        }
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(5).min(timeout)))
            .timeout_global(Some(timeout))
            .build();
        Ok(Client {
            base,
            agent: ureq::Agent::new_with_config(config),
            upload_timeout: Duration::from_secs(600),
        })
    }

    fn api(&self, endpoint: &str) -> String {
        format!("{}/api/2.0/mlflow/{endpoint}", self.base)
    }

    /// Reads a response: 2xx → its JSON body; otherwise an error with MLflow's `error_code` and
    /// `message` (retryable for 5xx, 408 and 429).
    fn answer(what: &str, mut resp: ureq::http::Response<ureq::Body>) -> CallResult<Value> {
        let status = resp.status().as_u16();
        let text = resp
            .body_mut()
            .read_to_string()
            .map_err(|e| transport(what, e))?;
        if (200..300).contains(&status) {
            if text.trim().is_empty() {
                return Ok(json!({}));
            }
            return serde_json::from_str(&text).map_err(|e| CallError {
                retryable: false,
                message: format!("{what}: response is not JSON ({e}): {text:.200}"),
            });
        }
        let detail = serde_json::from_str::<Value>(&text)
            .ok()
            .map(|v| {
                format!(
                    "{} {}",
                    v["error_code"].as_str().unwrap_or(""),
                    v["message"].as_str().unwrap_or("")
                )
            })
            .unwrap_or_else(|| text.chars().take(200).collect());
        Err(CallError {
            retryable: status >= 500 || status == 408 || status == 429,
            message: format!("{what}: HTTP {status}: {}", detail.trim()),
        })
    }

    fn post(&self, endpoint: &str, body: &Value) -> CallResult<Value> {
        let what = format!("POST {endpoint}");
        let resp = self
            .agent
            .post(&self.api(endpoint))
            .send_json(body)
            .map_err(|e| transport(&what, e))?;
        Self::answer(&what, resp)
    }

    fn get(&self, endpoint: &str, query: &[(&str, &str)]) -> CallResult<Value> {
        let what = format!("GET {endpoint}");
        let mut req = self.agent.get(&self.api(endpoint));
        for (k, v) in query {
            req = req.query(*k, *v);
        }
        let resp = req.call().map_err(|e| transport(&what, e))?;
        Self::answer(&what, resp)
    }

    /// The id of experiment `name`, created when it does not exist.
    pub fn experiment_id(&self, name: &str) -> CallResult<String> {
        match self.get("experiments/get-by-name", &[("experiment_name", name)]) {
            Ok(v) => return string_field(&v["experiment"]["experiment_id"], "experiment_id"),
            Err(e) if e.message.contains("RESOURCE_DOES_NOT_EXIST") => {}
            Err(e) => return Err(e),
        }
        match self.post("experiments/create", &json!({ "name": name })) {
            Ok(v) => string_field(&v["experiment_id"], "experiment_id"),
            // Created meanwhile by another client.
            Err(e) if e.message.contains("RESOURCE_ALREADY_EXISTS") => {
                let v = self.get("experiments/get-by-name", &[("experiment_name", name)])?;
                string_field(&v["experiment"]["experiment_id"], "experiment_id")
            }
            Err(e) => Err(e),
        }
    }

    /// Creates a run in `experiment_id`.
    pub fn create_run(
        &self,
        experiment_id: &str,
        run_name: &str,
        tags: &[(String, String)],
    ) -> CallResult<RunInfo> {
        let tags: Vec<Value> = tags
            .iter()
            .map(|(k, v)| json!({"key": k, "value": v}))
            .collect();
        let v = self.post(
            "runs/create",
            &json!({
                "experiment_id": experiment_id,
                "run_name": run_name,
                "start_time": now_ms(),
                "tags": tags,
            }),
        )?;
        run_info(&v["run"]["info"])
    }

    /// The run `run_id` (to continue it after a resume) and the params it already has.
    pub fn get_run(&self, run_id: &str) -> CallResult<(RunInfo, Vec<(String, String)>)> {
        let v = self.get("runs/get", &[("run_id", run_id)])?;
        let params = v["run"]["data"]["params"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|p| Some((p["key"].as_str()?.into(), p["value"].as_str()?.into())))
                    .collect()
            })
            .unwrap_or_default();
        Ok((run_info(&v["run"]["info"])?, params))
    }

    /// Sets a run's status (and its end time unless it is running again).
    pub fn update_run(&self, run_id: &str, status: RunStatus) -> CallResult<()> {
        let mut body = json!({ "run_id": run_id, "status": status.as_str() });
        if status != RunStatus::Running {
            body["end_time"] = json!(now_ms());
        }
        self.post("runs/update", &body).map(|_| ())
    }

    /// One `log-batch` request; callers keep within the per-request limits.
    pub fn log_batch(&self, run_id: &str, metrics: &[Value], params: &[Value]) -> CallResult<()> {
        self.post(
            "runs/log-batch",
            &json!({ "run_id": run_id, "metrics": metrics, "params": params, "tags": [] }),
        )
        .map(|_| ())
    }

    /// Uploads `local` as `artifact_path` (relative, `/`-separated) of the run, streaming the file.
    pub fn upload_artifact(
        &self,
        run: &RunInfo,
        local: &Path,
        artifact_path: &str,
    ) -> CallResult<()> {
        let root = proxied_artifact_root(&run.artifact_uri).ok_or_else(|| CallError {
            retryable: false,
            message: format!(
                "the run's artifact store `{}` is not served by the tracking server \
                 (start it with --serve-artifacts)",
                run.artifact_uri
            ),
        })?;
        let file = File::open(local).map_err(|e| CallError {
            retryable: false,
            message: format!("artifact {}: {e}", local.display()),
        })?;
        let url = format!(
            "{}/api/2.0/mlflow-artifacts/artifacts/{}/{}",
            self.base,
            encode_path(root.trim_matches('/')),
            encode_path(artifact_path.trim_start_matches('/'))
        );
        let what = format!("PUT artifact {artifact_path}");
        let resp = self
            .agent
            .put(&url)
            .header("Content-Type", "application/octet-stream")
            .config()
            .timeout_global(Some(self.upload_timeout))
            .build()
            .send(file)
            .map_err(|e| transport(&what, e))?;
        Self::answer(&what, resp).map(|_| ())
    }
}

/// `mlflow-artifacts:/0/abc/artifacts` (or `mlflow-artifacts://host:port/0/abc/artifacts`) →
/// `0/abc/artifacts`; `None` for stores the server does not proxy (`file:`, `s3:`, …).
pub fn proxied_artifact_root(uri: &str) -> Option<String> {
    let rest = uri.strip_prefix("mlflow-artifacts:")?;
    let path = match rest.strip_prefix("//") {
        Some(with_host) => with_host.find('/').map_or("", |i| &with_host[i..]),
        None => rest,
    };
    Some(path.trim_matches('/').to_string())
}

fn string_field(v: &Value, name: &str) -> CallResult<String> {
    v.as_str().map(str::to_string).ok_or_else(|| CallError {
        retryable: false,
        message: format!("the server's answer has no `{name}`"),
    })
}

fn run_info(info: &Value) -> CallResult<RunInfo> {
    Ok(RunInfo {
        experiment_id: string_field(&info["experiment_id"], "run.info.experiment_id")?,
        run_id: string_field(&info["run_id"], "run.info.run_id")?,
        artifact_uri: string_field(&info["artifact_uri"], "run.info.artifact_uri")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_made_valid() {
        assert_eq!(sanitize_key("ndcg@10"), "ndcg_at_10");
        assert_eq!(sanitize_key("failures.no_answer"), "failures.no_answer");
        assert_eq!(sanitize_key("a[b]#c"), "a_b__c");
    }

    #[test]
    fn artifact_roots() {
        assert_eq!(
            proxied_artifact_root("mlflow-artifacts:/1/r/artifacts").as_deref(),
            Some("1/r/artifacts")
        );
        assert_eq!(
            proxied_artifact_root("mlflow-artifacts://h:5000/1/r/artifacts").as_deref(),
            Some("1/r/artifacts")
        );
        assert_eq!(proxied_artifact_root("file:///tmp/x"), None);
        assert_eq!(encode_path("a b/c#d.jsonl"), "a%20b/c%23d.jsonl");
    }
}
