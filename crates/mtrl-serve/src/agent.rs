//! Rollout dispatch to the user's agent: [`AgentDriver`] is an `mtrl-rollout` [`Driver`], so
//! external episodes go through the same scheduler, staleness gate, retries, timeouts and
//! learner batches as in-process ones.
//!
//! One attempt: register a trajectory in the [`Gateway`] (served by the run's engine, codec,
//! sampling — seeded per call like in-process turns — and `[env]` budgets); send the task's
//! `prompt` column verbatim to the agent in the configured protocol; the agent calls the policy
//! endpoint naming the trajectory; the reward comes back in the agent's response
//! (`{"reward": x}` or one per model call) or through `/update-reward` and `/complete-rollout`;
//! the captured ids, mask, log-probs and versions become the [`Trajectory`]. The trajectory is
//! forgotten on every way out (done, error, timeout, cancellation), so a late call from the agent
//! gets 404 and cannot touch another attempt.
//!
//! The agent's credential is its trajectory id (128 random bits, new per attempt), sent in the
//! API-key slot (`metadata.trajectoryId` / `_config.api_key`, and as the bearer of our POST);
//! the endpoint lets it act on that trajectory only.
//!
//! Every wait of an attempt is bounded by [`AgentSettings::timeout`] from the moment the task is
//! sent: the POST (connect, send, answer), then, when the agent answered without a reward, the
//! wait for its `/complete-rollout`. The POST runs on a thread of its own, not on the runtime's
//! blocking pool, so an attempt dropped mid-call (a cancelled run, Ctrl-C) ends at once and a
//! runtime being dropped never waits for an agent; the abandoned thread ends with the POST's
//! own timeout.
//!
//! `status: "failed"` in an agent's answer or report is the agent's failure (retried), a named
//! `failure` the policy's (trained): see [`crate::gateway`].

use std::sync::Arc;
use std::time::Duration;

use mtrl_core::{ChatCodec, Trajectory};
use mtrl_env::Task;
use mtrl_rollout::episode::{session_key, Driver, EpisodeContext, EpisodeFuture};
use mtrl_rollout::{EpisodeId, RolloutError};
use serde_json::{json, Value};

use crate::capture::{Budgets, Spec};
use crate::gateway::Gateway;
use crate::request;

/// How the agent is called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// The managed service's: `{"prompt", "metadata": {jobArn, trajectoryId, endpoint, region},
    /// "inferenceParams"}`; the response (or `/complete-rollout`) carries the reward.
    SageMaker,
    /// `agentcore-rl-toolkit`'s `AgentCoreRuntimeApp`: the payload gains `_config` (base URL,
    /// model id, and the session id as the API key, so it rides in the Bearer slot) and the
    /// `_agentcore_runtime` envelope (`operation: "start"`, foreground), the session id goes in
    /// `X-Amzn-Bedrock-AgentCore-Runtime-Session-Id`; the answer is the invocation state, whose
    /// `result` holds the handler's `{"reward": x, …}`.
    AgentCoreToolkit,
}

impl Protocol {
    pub fn parse(s: &str) -> Option<Protocol> {
        match s {
            "sagemaker" => Some(Protocol::SageMaker),
            "agentcore-toolkit" => Some(Protocol::AgentCoreToolkit),
            _ => None,
        }
    }
}

/// What every external episode shares.
#[derive(Clone)]
pub struct AgentSettings {
    pub url: String,
    pub protocol: Protocol,
    /// The policy endpoint's base URL as the agent reaches it (`http://127.0.0.1:PORT`).
    pub endpoint: String,
    pub model: String,
    pub budgets: Budgets,
    pub failure_reward: f64,
    /// Names the run in the payload (`metadata.jobArn`).
    pub job: String,
    /// Bounds one attempt: the POST to the agent and the wait for its `/complete-rollout`
    /// together (the episode's own timeout applies too).
    pub timeout: Duration,
}

/// Episodes run by an external agent.
pub struct AgentDriver {
    gateway: Arc<Gateway>,
    codec: Arc<dyn ChatCodec>,
    settings: AgentSettings,
    http: ureq::Agent,
}

impl AgentDriver {
    pub fn new(
        gateway: Arc<Gateway>,
        codec: Arc<dyn ChatCodec>,
        settings: AgentSettings,
    ) -> AgentDriver {
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(10).min(settings.timeout)))
            .timeout_global(Some(settings.timeout))
            .build();
        AgentDriver {
            gateway,
            codec,
            settings,
            http: ureq::Agent::new_with_config(config),
        }
    }
}

/// The request body for one attempt.
fn payload(s: &AgentSettings, task: &Task, id: &str, cx: &EpisodeContext) -> Value {
    let params = json!({
        "temperature": cx.sampling.temperature,
        "top_p": cx.sampling.top_p,
        "max_tokens": s.budgets.max_tokens_per_turn,
        "model": s.model,
    });
    match s.protocol {
        Protocol::SageMaker => json!({
            "prompt": task.prompt,
            "metadata": {"jobArn": s.job, "trajectoryId": id, "endpoint": s.endpoint,
                         "region": "local", "taskId": task.id},
            "inferenceParams": params,
        }),
        Protocol::AgentCoreToolkit => json!({
            "prompt": task.prompt,
            "_config": {"base_url": format!("{}/v1", s.endpoint), "model_id": s.model, "api_key": id,
                        "sampling_params": params},
            // For `AgentCoreRLApp` / `rollout_entrypoint` apps: the result goes to
            // s3://mtrl/<exp_id>/<id>/<session>.json, which the policy endpoint takes at
            // PUT /s3/… when the app runs with AWS_ENDPOINT_URL_S3=<endpoint>/s3.
            "_rollout": {"base_url": format!("{}/v1", s.endpoint), "model_id": s.model, "api_key": id,
                         "sampling_params": params, "exp_id": s3_safe(&s.job), "input_id": id,
                         "s3_bucket": "mtrl"},
            "_agentcore_runtime": {"version": 1, "operation": "start", "invocation_id": id,
                                   "background": false},
        }),
    }
}

/// A path segment of an S3 key: letters, digits, `-`, `_`, `.`.
fn s3_safe(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '-'
            }
        })
        .collect()
}

/// Drops the trajectory when the attempt ends however it ends.
struct Forget(Arc<Gateway>, String);

impl Drop for Forget {
    fn drop(&mut self) {
        self.0.forget(&self.1);
    }
}

/// The reward fields of an agent's response (other fields are the agent's business).
fn response_report(v: &Value, protocol: Protocol) -> Result<request::RewardReport, String> {
    let Some(obj) = v.as_object() else {
        return Ok(request::RewardReport::default());
    };
    let obj = match protocol {
        Protocol::SageMaker => obj,
        // The invocation state: `{"status": "completed", "result": {…}}` or an `error`.
        Protocol::AgentCoreToolkit => {
            if let Some(e) = obj.get("error") {
                return Err(format!("the agent's handler failed: {e}"));
            }
            match obj.get("status").and_then(Value::as_str) {
                Some("completed") => {}
                // A `rollout_entrypoint` app: the result arrives at PUT /s3/….
                Some("processing") => return Ok(request::RewardReport::default()),
                s => return Err(format!("invocation status {s:?}, not \"completed\"")),
            }
            obj.get("result")
                .and_then(Value::as_object)
                .ok_or("a completed invocation without a `result` object")?
        }
    };
    request::reward_fields(obj).map_err(|e| e.message)
}

impl Driver for AgentDriver {
    fn episode(&self, cx: Arc<EpisodeContext>, task: Task, id: EpisodeId) -> EpisodeFuture {
        let (gateway, codec, settings, http) = (
            self.gateway.clone(),
            self.codec.clone(),
            self.settings.clone(),
            self.http.clone(),
        );
        Box::pin(async move {
            let err = |message: String| RolloutError::Env {
                task: task.id.clone(),
                message,
            };
            let spec = Spec {
                task_id: task.id.clone(),
                gen: cx.gen.clone(),
                codec,
                model: settings.model.clone(),
                budgets: settings.budgets,
                sampling: Some(cx.sampling.clone()),
                seeds: (cx.seed, id.group, id.seed_sample()),
                session: session_key(cx.seed, id),
                sampled_logprobs: cx.sampled_logprobs,
            };
            let (tid, done) = gateway.register(spec).map_err(|e| err(e.message))?;
            let _forget = Forget(gateway.clone(), tid.clone());
            let deadline = tokio::time::Instant::now() + settings.timeout;
            let body = payload(&settings, &task, &tid, &cx);
            let (url, bearer, protocol) = (settings.url.clone(), tid.clone(), settings.protocol);
            let sent = off_runtime(move || post(&http, &url, &bearer, protocol, &body))
                .map_err(|e| err(format!("agent call thread: {e}")))?
                .await
                .map_err(|_| err("agent call thread ended without an answer".into()))?;
            let response = sent.map_err(|m| err(format!("agent at {}: {m}", settings.url)))?;
            let report = response_report(&response, settings.protocol)
                .map_err(|m| err(format!("agent response: {m}")))?;
            let completed = gateway.apply(&tid, report).await;
            if !completed
                && tokio::time::timeout_at(deadline, done.notified())
                    .await
                    .is_err()
            {
                return Err(err(format!(
                    "the agent answered without a reward and did not call /complete-rollout \
                     within {:.0} s of the task",
                    settings.timeout.as_secs_f64()
                )));
            }
            let cap = gateway
                .take(&tid)
                .await
                .ok_or_else(|| err("trajectory vanished".into()))?;
            let t: Trajectory = cap
                .finish(settings.failure_reward)
                .map_err(|m| err(format!("trajectory {tid}: {m}")))?;
            Ok(t)
        })
    }
}

/// Runs `f` on a thread of its own; its result arrives on the receiver. Unlike
/// `spawn_blocking`, no runtime waits for the thread: dropping the receiver abandons it.
fn off_runtime<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> std::io::Result<tokio::sync::oneshot::Receiver<T>> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("mtrl-agent-call".into())
        .spawn(move || {
            // The attempt may be gone (cancelled): nobody to tell.
            let _ = tx.send(f());
        })?;
    Ok(rx)
}

/// One POST to the agent; its JSON answer (`{}` for an empty body).
fn post(
    http: &ureq::Agent,
    url: &str,
    bearer: &str,
    protocol: Protocol,
    body: &Value,
) -> Result<Value, String> {
    let header = match protocol {
        Protocol::SageMaker => crate::http::TRAJECTORY_HEADER,
        Protocol::AgentCoreToolkit => "X-Amzn-Bedrock-AgentCore-Runtime-Session-Id",
    };
    let mut resp = http
        .post(url)
        .header("Authorization", &format!("Bearer {bearer}"))
        .header(header, bearer)
        .send_json(body)
        .map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let text = resp
        .body_mut()
        .read_to_string()
        .map_err(|e| e.to_string())?;
    if !(200..300).contains(&status) {
        return Err(format!(
            "HTTP {status}: {}",
            text.chars().take(300).collect::<String>()
        ));
    }
    if text.trim().is_empty() {
        return Ok(json!({}));
    }
    serde_json::from_str(&text).map_err(|e| {
        format!(
            "the response is not JSON ({e}): {}",
            text.chars().take(200).collect::<String>()
        )
    })
}
