//! `mtrl-env`: the world the search agent acts in, during rollouts and evaluation.
//!
//! A [`Task`] (a query with relevance judgments, read from Parquet / JSONL / JSON / CSV by
//! [`tasks`]) becomes a multi-turn episode in an [`Environment`]: the agent writes a message, the
//! environment parses its `<tool_call>` blocks ([`parser`]), runs the tools ([`Tool`]: BM25 and
//! vector search from `mtrl-search`, and `submit`), feeds the results back as tool messages, and
//! when the agent submits a ranked list, scores it with a [`Reward`] (nDCG@10 by default). Budgets
//! (turns, tokens per turn, context) end episodes with a [`FailureReason`] and the failure reward.
//!
//! Any [`Agent`] can drive it: the candle policy (token mode, through a [`ChatCodec`] from
//! `mtrl-model`), the [`scripted`] baselines (text mode), later an external agent. In token mode
//! the trajectory's ids are exactly what the model saw and sampled: tool turns are tokenized as
//! new segments only, never by re-tokenizing the transcript.
//!
//! Extending: implement [`Tool`] or [`Reward`] and pass them to [`SearchEnv::new`]; replace the
//! prompt with [`prompt::Conversation`]; or implement [`Environment`] from scratch
//! (`examples/custom_tool.rs` in the repository root shows the first two).
//!
//! Invariants: no model dependency and no tokio (tools block; callers choose the thread); rewards
//! are pure; a model's malformed tool call never aborts an episode and never panics.

pub mod best_fixed;
pub mod dataset;
pub mod env;
pub mod error;
pub mod parser;
pub mod prompt;
pub mod reward;
pub mod scripted;
pub mod search_env;
pub mod shortcuts;
pub mod task;
pub mod tasks;
pub mod teacher;
pub mod tool;
pub mod tools;
pub mod transcript;

pub use best_fixed::best_fixed;
pub use dataset::{hold_out, Cursor, Dataset, Mixer, TaskSets};
pub use env::{run_episode, Action, Agent, Environment, Observation, Step};
pub use error::{EnvError, Result};
pub use mtrl_core::{ChatCodec, FailureReason, Message, ToolCall, Trajectory};
pub use parser::{format_tool_call, parse_calls, parse_tool_calls, CallError};
pub use reward::Reward;
pub use scripted::{Baseline, ScriptedAgent};
pub use search_env::{standard_tools, standard_tools_over, SearchEnv};
pub use task::{SearchTask, Task};
pub use tasks::{load_tasks, LoadReport};
pub use teacher::{FixedStrategy, Reorder, Strategy, Teacher, TeacherSpec};
pub use tool::{Answer, Tool, ToolError, ToolOutput};
pub use transcript::{tokenize_transcript, SupervisedRow};
