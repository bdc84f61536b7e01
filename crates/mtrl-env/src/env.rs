//! The [`Environment`] trait (reset with a task, step with the policy's text or tokens, finish
//! with a reward), the [`Agent`] trait for anything that acts in it (the candle policy, a scripted
//! baseline, an external agent), and [`run_episode`], the loop that joins them.
//!
//! Protocol: `reset` → [`Step::Continue`] with the first observation (or [`Step::Done`] when the
//! prompt alone does not fit); then `step` once per assistant message until [`Step::Done`]; then
//! `finish` returns the [`Trajectory`] with its reward. Misuse (step before reset or after done)
//! is an [`EnvError::Protocol`], never a panic.

use mtrl_core::{Message, Trajectory};
use serde_json::Value;

use crate::error::{EnvError, Result};
use crate::task::Task;

/// What the agent sees before writing its next message.
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    /// The whole conversation so far.
    pub messages: Vec<Message>,
    /// Token mode: the ids appended since the agent's last action (the whole prompt after reset).
    /// Empty in text mode.
    pub new_tokens: Vec<u32>,
    /// Token mode: the length of the context the next generation continues.
    pub context_len: usize,
    /// The most tokens the next message may have (the per-turn cap, or less near the context cap).
    pub max_new_tokens: usize,
    /// Tool schemas (also rendered into the prompt by the chat template in token mode).
    pub tools: Vec<Value>,
    /// The task's query in plain form, for scripted policies (model policies read the messages).
    pub query: Option<String>,
    /// Assistant messages written so far.
    pub turn: usize,
}

/// The agent's next assistant message.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Text mode. `truncated`: generation hit its token cap before ending the message.
    Text { text: String, truncated: bool },
    /// Token mode: the sampled ids (ending with a stop token when the message ended), their
    /// behaviour log-probs and the policy version that sampled each.
    Tokens {
        ids: Vec<u32>,
        logprobs: Vec<f32>,
        versions: Vec<u64>,
    },
}

impl Action {
    /// A complete text message.
    pub fn text(text: impl Into<String>) -> Action {
        Action::Text {
            text: text.into(),
            truncated: false,
        }
    }
}

/// What a reset or step led to.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    Continue(Observation),
    Done,
}

/// A multi-turn environment. One instance runs one episode at a time.
pub trait Environment: Send {
    /// Starts an episode for `task`, discarding any unfinished one.
    fn reset(&mut self, task: &Task) -> Result<Step>;
    /// Applies one assistant message: parses tool calls, runs tools, appends their results.
    fn step(&mut self, action: Action) -> Result<Step>;
    /// Ends the episode and returns its record with the reward (the failure reward for a failed
    /// episode). Callable once per episode, after [`Step::Done`].
    fn finish(&mut self) -> Result<Trajectory>;
}

/// Something that writes assistant messages: a model policy, a scripted baseline, a remote agent.
pub trait Agent {
    /// The next message given what the agent observes.
    fn act(&mut self, obs: &Observation) -> Result<Action>;
}

/// Runs one episode of `task` to the end.
pub fn run_episode(
    env: &mut dyn Environment,
    agent: &mut dyn Agent,
    task: &Task,
) -> Result<Trajectory> {
    let mut step = env.reset(task)?;
    // Each step consumes a turn and the environment enforces max_turns, so this terminates; the
    // bound guards against an Environment implementation that never says Done.
    for _ in 0..1_000_000 {
        match step {
            Step::Done => return env.finish(),
            Step::Continue(obs) => {
                let action = agent.act(&obs)?;
                step = env.step(action)?;
            }
        }
    }
    Err(EnvError::Protocol(
        "episode did not end within 1,000,000 steps".into(),
    ))
}
