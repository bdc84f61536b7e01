//! The learner side of mtrl: an AdamW whose state can be saved and restored exactly, learning
//! rate schedules, global gradient clipping and (with the RL engine) the training step and
//! checkpoints.
//!
//! Invariants: the learner never imports `mtrl-rollout` (they meet only through `mtrl-core` types
//! on a channel); no tokio here; optimizer updates are deterministic on CPU (same inputs → same
//! bits), which exact resume relies on.

pub mod adamw;
mod adamw_cpu;
pub mod batch;
pub mod checkpoint;
pub mod checkpoint_writer;
pub mod clip;
pub mod dist;
pub mod error;
pub mod schedule;
pub mod sft;
pub mod step;
mod update;

pub use adamw::{AdamW, AdamWConfig};
pub use checkpoint::{BestCheckpoint, CheckpointManager, Rejected, TrainerState};
pub use checkpoint_writer::{CheckpointJob, CheckpointWriter};
pub use clip::{clip_global_norm, global_norm};
pub use dist::{Collective, CommStats, Local, ReduceOptions};
pub use error::{LearnerError, Result};
pub use schedule::{Decay, LrSchedule};
pub use sft::{sft_step, SftConfig, SftExample, SftMetrics};
pub use step::{Learner, RatioBase, StepConfig, StepMetrics};
