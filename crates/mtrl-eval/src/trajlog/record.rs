//! The line of a trajectory log: [`TrajectoryRecord`] and the types it is made of.

use mtrl_core::trajectory::ToolCallRecord;
use mtrl_core::{FailureReason, Message, Trajectory};
use serde::{Deserialize, Serialize};

/// Version of the [`TrajectoryRecord`] line layout.
pub const TRAJLOG_FORMAT_VERSION: u32 = 1;
/// File name prefix of the log files (`trajectories-00001.jsonl`).
pub const FILE_PREFIX: &str = "trajectories-";

/// Which loop produced a trajectory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Train,
    Eval,
}

impl Kind {
    pub fn as_str(&self) -> &'static str {
        match self {
            Kind::Train => "train",
            Kind::Eval => "eval",
        }
    }
}

/// Where in a run a trajectory belongs: a training step, or an evaluation label (`base`, …).
/// Serialised as a JSON number or string.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(untagged)]
pub enum At {
    Step(u64),
    Label(String),
}

impl At {
    /// A number is a step, anything else a label.
    pub fn parse(s: &str) -> At {
        s.trim()
            .parse::<u64>()
            .map_or_else(|_| At::Label(s.trim().to_string()), At::Step)
    }
}

impl std::fmt::Display for At {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            At::Step(s) => write!(f, "{s}"),
            At::Label(l) => f.write_str(l),
        }
    }
}

impl From<u64> for At {
    fn from(s: u64) -> At {
        At::Step(s)
    }
}

impl From<&str> for At {
    fn from(s: &str) -> At {
        At::Label(s.to_string())
    }
}

impl From<String> for At {
    fn from(s: String) -> At {
        At::Label(s)
    }
}

/// Token counts of an episode (all 0 in text mode).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenCounts {
    pub prompt: usize,
    /// Policy-sampled tokens (under the loss mask).
    pub sampled: usize,
    /// Everything: prompt, sampled, tool output and template glue.
    pub total: usize,
}

/// Oldest and newest policy version among the sampled tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionRange {
    pub min: u64,
    pub max: u64,
}

/// One line of the log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrajectoryRecord {
    pub format_version: u32,
    pub kind: Kind,
    /// The training step the trajectory was trained in, or the evaluation's label.
    pub step: At,
    pub task_id: String,
    /// Index within its group (0 when written alone).
    pub sample: u32,
    /// Milliseconds since the Unix epoch when the record was made.
    pub unix_ms: u64,
    pub reward: f64,
    /// Named reward components (`ndcg@10`, …).
    pub scores: Vec<(String, f64)>,
    pub failure: Option<FailureReason>,
    pub turns: u32,
    pub tokens: TokenCounts,
    /// Policy versions that sampled the episode (absent in text mode).
    pub versions: Option<VersionRange>,
    pub tool_calls: Vec<ToolCallRecord>,
    /// Tool calls answered with an error.
    pub tool_errors: u32,
    pub answer: Option<Vec<String>>,
    pub messages: Vec<Message>,
    /// The token vectors (`[logging] trajectory_tokens`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ids: Option<TokenVectors>,
}

/// A trajectory's tokens as the learner sees them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenVectors {
    pub tokens: Vec<u32>,
    pub loss_mask: Vec<u8>,
    pub logprobs: Vec<f32>,
    pub versions: Vec<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub segment_starts: Vec<usize>,
}

impl TokenVectors {
    pub fn of(t: &Trajectory) -> TokenVectors {
        TokenVectors {
            tokens: t.tokens.clone(),
            loss_mask: t.loss_mask.clone(),
            logprobs: t.logprobs.clone(),
            versions: t.versions.clone(),
            segment_starts: t.segment_starts.clone(),
        }
    }
}

impl TrajectoryRecord {
    /// The record of `t`.
    pub fn new(kind: Kind, step: At, sample: u32, t: &Trajectory) -> TrajectoryRecord {
        let sampled = t
            .loss_mask
            .iter()
            .zip(&t.versions)
            .filter(|(m, _)| **m == 1);
        let versions = sampled.fold(None, |acc: Option<VersionRange>, (_, &v)| {
            Some(match acc {
                None => VersionRange { min: v, max: v },
                Some(r) => VersionRange {
                    min: r.min.min(v),
                    max: r.max.max(v),
                },
            })
        });
        let unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        TrajectoryRecord {
            format_version: TRAJLOG_FORMAT_VERSION,
            kind,
            step,
            task_id: t.task_id.clone(),
            sample,
            unix_ms,
            reward: t.reward,
            scores: t.scores.clone(),
            failure: t.failure,
            turns: t.turns,
            tokens: TokenCounts {
                prompt: t.prompt_len,
                sampled: t.sampled_tokens(),
                total: t.tokens.len(),
            },
            versions,
            tool_calls: t.tool_calls.clone(),
            tool_errors: t.tools.errors,
            answer: t.answer.clone(),
            messages: t.messages.clone(),
            ids: None,
        }
    }

    /// A named score (`ndcg@10`).
    pub fn score(&self, name: &str) -> Option<f64> {
        self.scores.iter().find(|(n, _)| n == name).map(|(_, s)| *s)
    }
}
