//! The policy endpoint's state and operations, free of HTTP: live trajectories (each with the
//! engine, codec, sampling and budgets it is served under) and the calls that reach them.
//!
//! A trajectory is *registered* by the rollout driver (training, evaluation) or created by a
//! client (`POST /trajectories`, standalone `mtrl serve`); calls name it by id. Calls of one
//! trajectory are served one at a time (it is one sequence); different trajectories run
//! concurrently and share the engine's decode batches. A call naming no trajectory is served by
//! the standalone engine and recorded nowhere.
//!
//! A call acts on the one trajectory the HTTP layer says it names (`traj` below, every place
//! that names one agreeing); a report whose `trajectoryId` names another is refused (403).
//!
//! Taking a trajectory ([`Gateway::take`]) empties its slot under the slot's lock: a call in
//! flight finishes first, a call that arrives later finds it gone (404). Nothing depends on
//! being the last holder of the slot.
//!
//! What an agent reports, in the managed service's terms: `status: "failed"` (CompleteRollout's
//! FAILED: "the rollout encountered an error and the trajectory should not be used") is an
//! infrastructure failure — the attempt errs and is retried (`rollout.max_retries`, counted
//! against `max_failed_fraction`) and nothing is trained on it; a policy failure names its
//! reason in mtrl's `failure` field (`turn_limit`, `no_answer`, …) and is trained with the
//! failure reward, whatever `status` says.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use mtrl_core::ChatCodec;
use mtrl_rollout::GenClient;
use serde_json::{json, Value};
use tokio::sync::Notify;

mod calls;

use crate::capture::{Budgets, Capture, Spec};
use crate::error::ApiError;
use crate::openai;
use crate::request;

/// Trajectories alive at once (registered or created) before new ones are refused.
pub const MAX_TRAJECTORIES: usize = 65_536;

/// The engine a standalone server answers unrecorded calls (and created trajectories) with.
#[derive(Clone)]
pub struct Served {
    pub gen: GenClient,
    pub codec: Arc<dyn ChatCodec>,
    pub model: String,
    pub budgets: Budgets,
    /// The engine's policy version, for `/healthz`.
    pub version: Arc<mtrl_rollout::EngineStats>,
}

/// A trajectory's record; `None` once taken.
type Shared = Arc<tokio::sync::Mutex<Option<Capture>>>;

/// A trajectory's record, locked for one call.
pub(crate) type Held = tokio::sync::OwnedMappedMutexGuard<Option<Capture>, Capture>;

struct Slot {
    cap: Shared,
    done: Arc<Notify>,
}

/// A response body.
pub enum Body {
    Json(Value),
    /// Server-sent events (`text/event-stream`).
    Events(String),
}

/// The endpoint's state.
pub struct Gateway {
    served: Option<Served>,
    slots: Mutex<HashMap<String, Slot>>,
    models: Mutex<Vec<String>>,
    /// Wall time of every trajectory model call (prepare, generate, record), in ms.
    latencies: Mutex<Vec<f64>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn unknown(id: &str) -> ApiError {
    ApiError::status(404, format!("unknown trajectory `{id}`")).with_code("unknown_trajectory")
}

/// A fresh trajectory id: `mtrl-` and 128 random bits (it doubles as the bearer credential of
/// the calls that name it).
pub fn new_id() -> String {
    format!(
        "mtrl-{:016x}{:016x}",
        rand::random::<u64>(),
        rand::random::<u64>()
    )
}

impl Gateway {
    pub fn new(served: Option<Served>) -> Gateway {
        let models = served.iter().map(|s| s.model.clone()).collect();
        Gateway {
            served,
            slots: Mutex::new(HashMap::new()),
            models: Mutex::new(models),
            latencies: Mutex::new(Vec::new()),
        }
    }

    /// Registers a trajectory served under `spec`; returns its id and the notification that
    /// `/complete-rollout` fires.
    pub fn register(&self, spec: Spec) -> Result<(String, Arc<Notify>), ApiError> {
        let mut slots = lock(&self.slots);
        if slots.len() >= MAX_TRAJECTORIES {
            return Err(ApiError::status(
                503,
                format!("{MAX_TRAJECTORIES} trajectories are open"),
            ));
        }
        let mut models = lock(&self.models);
        if !models.contains(&spec.model) {
            models.push(spec.model.clone());
        }
        let id = new_id();
        let done = Arc::new(Notify::new());
        slots.insert(
            id.clone(),
            Slot {
                cap: Arc::new(tokio::sync::Mutex::new(Some(Capture::new(spec)))),
                done: done.clone(),
            },
        );
        Ok((id, done))
    }

    /// Removes a trajectory and returns its record (waits for a call in flight to finish; a
    /// call waiting behind it then finds the trajectory gone).
    pub async fn take(&self, id: &str) -> Option<Capture> {
        let slot = lock(&self.slots).remove(id)?;
        let cap = slot.cap.lock().await.take()?;
        cap.spec.gen.release(cap.spec.session);
        Some(cap)
    }

    /// Drops a trajectory at once, whatever it is doing: later calls get 404; a call in flight
    /// finishes unrecorded, and the engine session is released after it.
    pub fn forget(&self, id: &str) {
        let Some(slot) = lock(&self.slots).remove(id) else {
            return;
        };
        fn release(cap: &mut Option<Capture>) {
            if let Some(cap) = cap.take() {
                cap.spec.gen.release(cap.spec.session);
            }
        }
        match slot.cap.clone().try_lock_owned() {
            Ok(mut cap) => release(&mut cap),
            // Not from a runtime (or one shutting down): the session stays parked until the
            // engine stops.
            Err(_) => {
                if let Ok(rt) = tokio::runtime::Handle::try_current() {
                    rt.spawn(async move { release(&mut *slot.cap.lock().await) });
                }
            }
        }
    }

    /// Applies what the agent's response reported (unless `/complete-rollout` came first);
    /// returns whether the rollout is over: completed, a reward or failure known, or a budget
    /// spent. `false`: the agent answered before reporting — wait for `/complete-rollout`.
    pub async fn apply(&self, id: &str, r: request::RewardReport) -> bool {
        let Ok((mut cap, _)) = self.open(id).await else {
            return true;
        };
        if !cap.report.completed {
            cap.report.merge(r);
        }
        let rep = &cap.report;
        rep.completed
            || rep.reward.is_some()
            || rep.agent_failure.is_some()
            || rep.error.is_some()
            || cap.failure().is_some()
    }

    /// The latencies of the trajectory calls served since the last take, in ms.
    pub fn take_latencies(&self) -> Vec<f64> {
        std::mem::take(&mut lock(&self.latencies))
    }

    fn timed(&self, t0: std::time::Instant) {
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        metrics::histogram!("mtrl_serve_call_ms").record(ms);
        lock(&self.latencies).push(ms);
    }

    pub fn is_known(&self, id: &str) -> bool {
        lock(&self.slots).contains_key(id)
    }

    /// Trajectory `id`, locked (after a call of it in flight), with its completion signal.
    pub(crate) async fn open(&self, id: &str) -> Result<(Held, Arc<Notify>), ApiError> {
        let (cap, done) = lock(&self.slots)
            .get(id)
            .map(|s| (s.cap.clone(), s.done.clone()))
            .ok_or_else(|| unknown(id))?;
        // Taken while this call waited for the lock: gone, as for a call arriving later.
        let held = tokio::sync::OwnedMutexGuard::try_map(cap.lock_owned().await, Option::as_mut)
            .map_err(|_| unknown(id))?;
        Ok((held, done))
    }

    fn served(&self) -> Result<&Served, ApiError> {
        self.served.as_ref().ok_or_else(|| {
            ApiError::bad_request(
                "this endpoint serves rollouts: name the trajectory (header X-Amzn-SageMaker-Trajectory-Id, \
                 `Authorization: Bearer <id>`, or the path prefix /t/<id>/)",
            )
            .with_code("missing_trajectory")
        })
    }

    pub fn health(&self) -> Value {
        let version = self
            .served
            .as_ref()
            .map(|s| s.version.version.load(std::sync::atomic::Ordering::Relaxed));
        json!({"status": "ok", "policy_version": version, "trajectories": lock(&self.slots).len()})
    }

    pub fn models(&self) -> Value {
        openai::models(&lock(&self.models))
    }

    /// `POST /update-reward` (`complete = false`) and `POST /complete-rollout`.
    pub async fn report(
        &self,
        traj: Option<&str>,
        body: &[u8],
        complete: bool,
    ) -> Result<Body, ApiError> {
        let r = request::reward_report(body)?;
        let id = crate::http::one_trajectory(&[
            ("the call", traj),
            ("`trajectoryId`", r.trajectory.as_deref()),
        ])
        .map_err(|mut e| {
            e.param = Some("trajectoryId".into());
            e
        })?
        .ok_or_else(|| ApiError::field("trajectoryId", "is required (or the trajectory header)"))?;
        let (mut cap, done) = self.open(&id).await?;
        if cap.report.completed {
            return Err(ApiError::status(
                409,
                format!("trajectory `{id}` is already complete"),
            ));
        }
        cap.report.merge(r);
        if complete {
            cap.report.completed = true;
            done.notify_one();
        }
        Ok(Body::Json(json!({"trajectoryId": id, "status": "ok"})))
    }

    /// `PUT /s3/<bucket>/<exp_id>/<input_id>/<session>.json`: the result object an
    /// `agentcore-rl-toolkit` `rollout_entrypoint` app saves through boto3 when
    /// `AWS_ENDPOINT_URL_S3` points here — `{"rewards": x | [.., last], "status_code", "stop_reason",
    /// …}`. It completes the rollout; `status_code` ≥ 400 makes the attempt an error (retried).
    pub async fn s3_result(&self, traj: Option<&str>, body: &[u8]) -> Result<Body, ApiError> {
        let id = traj.ok_or_else(|| {
            ApiError::bad_request("expected /s3/<bucket>/<exp_id>/<input_id>/<session>.json")
        })?;
        let v = request::object(body)?;
        let (mut cap, done) = self.open(id).await?;
        if cap.report.completed {
            return Err(ApiError::status(
                409,
                format!("trajectory `{id}` is already complete"),
            ));
        }
        let status = v.get("status_code").and_then(Value::as_u64).unwrap_or(200);
        if status >= 400 {
            let why = v
                .get("stop_reason")
                .and_then(Value::as_str)
                .unwrap_or("no stop_reason");
            cap.report.error = Some(format!("status_code {status}: {why}"));
        } else {
            // The toolkit's convention: a list of rewards means its last element.
            let mut m = v;
            for key in ["rewards", "reward"] {
                if let Some(Value::Array(a)) = m.get(key) {
                    let last = a.last().cloned().unwrap_or(Value::Null);
                    m.insert(key.to_string(), last);
                }
            }
            cap.report.merge(request::reward_fields(&m)?);
        }
        cap.report.completed = true;
        done.notify_one();
        Ok(Body::Json(json!({})))
    }

    /// `POST /trajectories`: a captured trajectory on the standalone engine.
    pub fn create(&self) -> Result<Body, ApiError> {
        let s = self.served()?.clone();
        let session = rand::random::<u64>();
        let (id, _) = self.register(Spec {
            task_id: String::new(),
            gen: s.gen,
            codec: s.codec,
            model: s.model,
            budgets: s.budgets,
            sampling: None,
            seeds: (0, 0, 0),
            session,
            sampled_logprobs: true,
        })?;
        Ok(Body::Json(json!({"id": id})))
    }

    /// `GET /trajectories/<id>`: the captured record.
    pub async fn get(&self, id: &str) -> Result<Body, ApiError> {
        let (cap, _) = self.open(id).await?;
        let mut v = serde_json::to_value(cap.trajectory())
            .map_err(|e| ApiError::status(500, e.to_string()))?;
        v["completed"] = json!(cap.report.completed);
        Ok(Body::Json(v))
    }

    /// `DELETE /trajectories/<id>`.
    pub async fn delete(&self, id: &str) -> Result<Body, ApiError> {
        self.take(id).await.ok_or_else(|| unknown(id))?;
        Ok(Body::Json(json!({"id": id, "deleted": true})))
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use candle_core::{DType, Device};
    use mtrl_model::{Engine, Policy, TemplateCodec, Tokenizer};
    use mtrl_rollout::engine_thread::EngineThread;

    use super::*;

    fn spec(engine: &EngineThread) -> Spec {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny-qwen3");
        let tok = Tokenizer::from_dir(&dir).unwrap();
        Spec {
            task_id: "t".into(),
            gen: engine.client.clone(),
            codec: Arc::new(TemplateCodec::qwen(Arc::new(tok)).unwrap()),
            model: "tiny".into(),
            budgets: Budgets {
                max_turns: 2,
                max_tokens_per_turn: 4,
                max_context_tokens: 64,
            },
            sampling: None,
            seeds: (0, 0, 0),
            session: 1,
            sampled_logprobs: true,
        }
    }

    #[test]
    fn take_returns_the_record_while_another_task_still_holds_the_slot() {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny-qwen3");
        let policy = Policy::load(&dir, DType::F32, &Device::Cpu).unwrap();
        let engine = EngineThread::spawn(Engine::new(policy, None, 0, 2).unwrap()).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let g = Gateway::new(None);
        let (id, _) = g.register(spec(&engine)).unwrap();
        // A call that has released its guard but not yet its handle on the slot (the moment
        // right after a call on another worker finishes).
        let held = lock(&g.slots)[&id].cap.clone();
        let taken = rt.block_on(g.take(&id));
        assert!(
            taken.is_some(),
            "take lost the record to a handle being dropped"
        );
        assert_eq!(taken.unwrap().spec.task_id, "t");
        drop(held);
        assert!(rt.block_on(g.take(&id)).is_none(), "taken once");
        engine.shutdown().unwrap();
    }
}
