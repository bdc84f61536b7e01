//! `mtrl-train`: a training run end to end, as a library — so the command line, tests and other
//! front ends (the agent runtime, `mpirun` ranks) start runs in-process.
//!
//! A run is built from a validated [`mtrl_core::Config`] and plain options (no command-line
//! types): [`setup`] turns the config into a device, tokenizer and codec, the initial policy, task
//! mixers, the search index and the environment factory; [`run::train`] is the RL loop — the only
//! place where the rollout side (`mtrl-rollout`) and the learner (`mtrl-learner`) meet, through a
//! bounded channel of finished groups one way and published weights the other; [`resume`] holds
//! what a resume checks and what a checkpoint carries; [`sft`] is supervised fine-tuning on
//! trajectory files; [`warm_start`] and [`demo`] build the default job (teacher episodes, a
//! tokenizer trained on the collection, SFT, RL, evaluation); [`data`] writes task splits;
//! [`selftest`] is the model's golden checks for machines without cargo; [`bench_train`] runs the
//! same short run under several staleness bounds.
//!
//! Every step of a run becomes a typed, versioned record ([`mtrl_core::StepRecord`],
//! [`mtrl_core::SftRecord`]) handed to the run's [`telemetry::Telemetry`], which fans it out to
//! [`telemetry::Sink`]s: the `metrics.jsonl` writer, the progress bar, Prometheus and MLflow.
//!
//! Invariants: nothing here parses arguments or prints results (the binary does; progress and
//! warnings go to stderr); errors are [`TrainError`] values that name the file, key or step; a
//! network sink never stops or slows a run.

pub mod agent;
pub mod baselines;
pub mod bench_agent;
pub mod bench_allreduce;
pub mod bench_lora;
pub mod bench_train;
pub mod data;
pub mod data_parallel;
pub mod demo;
pub mod demo_eval;
pub mod demo_table;
pub mod error;
pub mod eval;
pub mod pretrained_job;
pub mod resume;
pub mod rft;
pub mod run;
pub mod selftest;
mod selftest_kernels;
pub mod serve;
pub mod setup;
pub mod sft;
pub mod signals;
mod step_record;
pub mod telemetry;
pub mod validate;
pub mod warm_start;

pub use error::{Context, Result, TrainError};
pub use run::{train, Summary, TrainOptions};
