//! `mtrl-rollout`: the producing half of training — episodes run concurrently over one batched
//! generation engine, under a bounded-staleness admission gate, and finished groups go to the
//! learner on a bounded channel.
//!
//! Threads and tasks:
//! - the **engine thread** ([`engine_thread`]) owns `mtrl-model`'s synchronous [`mtrl_model::Engine`]:
//!   it submits queued requests, applies weight updates between decode steps, steps, and answers
//!   each request's oneshot when its sequence finishes;
//! - the **scheduler** (a tokio task, [`runner`]) admits group i only while
//!   `i < (η + v + 1) · B` ([`gate`]); each admitted group spawns `group_size` episode tasks that
//!   wait on a fair semaphore of `rollout_max_concurrency` permits;
//! - each **episode** ([`episode`]) drives an `mtrl-env` [`mtrl_env::Environment`]: generation
//!   requests go to the engine thread, environment calls (tools, tokenization, reward) run on
//!   tokio's blocking pool;
//! - a finished group `(index, trajectories)` goes on a bounded crossbeam channel; [`InOrder`]
//!   hands the learner batch k = groups `k·B .. (k+1)·B`.
//!
//! Invariants: this crate never imports `mtrl-learner` (weights come back through
//! [`Rollout::publish`] as plain candle tensors); every sampled token carries the version of the
//! weights that produced its logits; with η = 0 every token of batch k was sampled by version k;
//! with pinned rollouts ([`pin`]) every token of group i was sampled by version
//! max(v₀, ⌊i/B⌋ − η), whatever the timing.
//! [`pick`] is a one-token toy environment used by CI to show that the loop learns.

pub mod engine_thread;
pub mod episode;
pub mod error;
pub mod faults;
pub mod gate;
mod group;
mod in_order;
pub mod pick;
pub mod pin;
pub mod runner;

pub use engine_thread::{EngineStats, GenClient, WeightUpdate};
pub use episode::{in_process, sample_seed, Driver, EpisodeFuture, EpisodeId};
pub use error::{Result, RolloutError};
pub use faults::{FaultKind, Faults, FAULTS_VAR};
pub use gate::Gate;
pub use in_order::InOrder;
pub use pick::PickEnv;
pub use pin::{Pins, WeightSync};
pub use runner::{
    EnvFactory, FaultCounters, Group, Rollout, RolloutCounters, RolloutSettings, Shard, TaskSource,
};
