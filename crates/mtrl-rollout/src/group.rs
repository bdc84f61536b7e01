//! One admitted group ([`GroupRun`]): its episodes run concurrently under the shared semaphore,
//! each retried ([`Episode`]) on error or timeout; a group whose episode fails all its attempts is
//! replaced (run again on the same task with fresh sampling seeds), and the finished group is sent
//! to the learner.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crossbeam_channel::Sender;
use mtrl_env::{Task, Trajectory};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::episode::{Driver, EpisodeContext, EpisodeId};
use crate::error::{Result, RolloutError};
use crate::runner::{fail, FaultCounters, Group, RolloutSettings};

/// One admitted group with what its episodes share.
pub(crate) struct GroupRun {
    pub(crate) index: u64,
    pub(crate) task: Task,
    pub(crate) settings: RolloutSettings,
    pub(crate) driver: Arc<dyn Driver>,
    pub(crate) cx: Arc<EpisodeContext>,
    pub(crate) sem: Arc<Semaphore>,
    pub(crate) cancel: CancellationToken,
    pub(crate) failure: Arc<Mutex<Option<RolloutError>>>,
    pub(crate) counts: Arc<FaultCounters>,
}

impl GroupRun {
    /// Runs the group (replacing it while an episode fails) and sends it to the learner.
    pub(crate) async fn run(self, tx: Sender<Group>) {
        let mut replacement = 0u32;
        let trajs = loop {
            match self.attempt_group(replacement).await {
                Ok(trajs) => break trajs,
                Err(RolloutError::Cancelled) => return,
                Err(e) => {
                    if let Some(stop) = self.too_many_errors(&e) {
                        return fail(&self.failure, &self.cancel, stop);
                    }
                    if replacement as usize >= self.settings.max_retries {
                        let e = RolloutError::Internal(format!(
                            "group {} (task {}) failed {} times; last error: {e}",
                            self.index,
                            self.task.id,
                            replacement + 1
                        ));
                        return fail(&self.failure, &self.cancel, e);
                    }
                    replacement += 1;
                    self.counts.replaced.fetch_add(1, Ordering::Relaxed);
                    metrics::counter!("mtrl_rollout_groups_replaced_total").increment(1);
                }
            }
        };
        // The channel holds (η + 1)·B groups, which the gate never exceeds; block off the
        // runtime threads anyway in case a consumer is slow.
        let item = (self.index, trajs);
        if let Err(crossbeam_channel::TrySendError::Full(item)) = tx.try_send(item) {
            let _ = tokio::task::spawn_blocking(move || tx.send(item)).await;
        }
    }

    /// The run-stopping error once errored episodes exceed the allowed fraction.
    fn too_many_errors(&self, last: &RolloutError) -> Option<RolloutError> {
        let errored = self.counts.errored.load(Ordering::Relaxed);
        let finished = self.counts.finished.load(Ordering::Relaxed);
        let f = self.settings.max_failed_fraction;
        let allowed = (f * (errored + finished) as f64).max(if f > 0.0 { 1.0 } else { 0.0 });
        (errored as f64 > allowed).then(|| {
            RolloutError::Internal(format!(
                "{errored} of {} episodes failed after {} retries each, over \
                 rollout.max_failed_fraction = {f}; last error: {last}",
                errored + finished,
                self.settings.max_retries
            ))
        })
    }

    /// Every episode of the group; the first episode that fails all its attempts fails it.
    async fn attempt_group(&self, replacement: u32) -> Result<Vec<Trajectory>> {
        let mut handles = Vec::with_capacity(self.settings.group_size);
        for sample in 0..self.settings.group_size as u64 {
            let id = EpisodeId {
                group: self.index,
                sample,
                attempt: 0,
                replacement,
            };
            let ep = Episode {
                id,
                task: self.task.clone(),
                driver: self.driver.clone(),
                cx: self.cx.clone(),
                timeout: self.settings.timeout,
                max_retries: self.settings.max_retries,
                counts: self.counts.clone(),
            };
            let (sem, cancel) = (self.sem.clone(), self.cancel.clone());
            handles.push(tokio::spawn(async move {
                let work = async {
                    let _permit = sem
                        .acquire_owned()
                        .await
                        .map_err(|_| RolloutError::Cancelled)?;
                    ep.run().await
                };
                tokio::select! {
                    _ = cancel.cancelled() => Err(RolloutError::Cancelled),
                    r = work => r,
                }
            }));
        }
        let mut trajs = Vec::with_capacity(handles.len());
        let mut first_err = None;
        for h in handles {
            match h.await {
                Ok(Ok(t)) => trajs.push(t),
                Ok(Err(e)) => {
                    first_err.get_or_insert(e);
                }
                Err(e) => {
                    first_err.get_or_insert(RolloutError::Internal(format!("episode task: {e}")));
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(trajs),
        }
    }
}

/// One episode with its retries.
struct Episode {
    id: EpisodeId,
    task: Task,
    driver: Arc<dyn Driver>,
    cx: Arc<EpisodeContext>,
    timeout: Option<Duration>,
    max_retries: usize,
    counts: Arc<FaultCounters>,
}

impl Episode {
    async fn run(mut self) -> Result<Trajectory> {
        loop {
            let r = self.attempt().await;
            match r {
                Ok(t) => {
                    self.counts.finished.fetch_add(1, Ordering::Relaxed);
                    return Ok(t);
                }
                Err(RolloutError::Cancelled) => return Err(RolloutError::Cancelled),
                // The engine is gone: retrying cannot help.
                Err(RolloutError::EngineStopped) => return Err(RolloutError::EngineStopped),
                Err(e) if self.id.attempt as usize >= self.max_retries => {
                    self.counts.errored.fetch_add(1, Ordering::Relaxed);
                    metrics::counter!("mtrl_rollout_episodes_errored_total").increment(1);
                    return Err(e);
                }
                Err(_) => {
                    self.id.attempt += 1;
                    self.counts.retries.fetch_add(1, Ordering::Relaxed);
                    metrics::counter!("mtrl_rollout_episode_retries_total").increment(1);
                }
            }
        }
    }

    async fn attempt(&self) -> Result<Trajectory> {
        let work = self
            .driver
            .episode(self.cx.clone(), self.task.clone(), self.id);
        match self.timeout {
            None => work.await,
            Some(limit) => match tokio::time::timeout(limit, work).await {
                Ok(r) => r,
                Err(_) => {
                    self.counts.timeouts.fetch_add(1, Ordering::Relaxed);
                    metrics::counter!("mtrl_rollout_episode_timeouts_total").increment(1);
                    Err(RolloutError::Timeout {
                        task: self.task.id.clone(),
                        seconds: limit.as_secs_f64(),
                    })
                }
            },
        }
    }
}
