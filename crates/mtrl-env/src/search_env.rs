//! [`SearchEnv`]: the built-in environment — the search agent's episode state machine.
//!
//! One step = one assistant message plus the tool results it triggered:
//! 1. token mode: the sampled ids are appended with `loss_mask = 1`; a message that did not end
//!    with a stop token fails the episode (`token_limit`, or `context_overflow` when the cap was
//!    the context's); the text is the decoding of the ids without the final stop token;
//! 2. the tool calls are parsed; none at all ends the episode (`no_answer`);
//! 3. calls run in order (at most `max_calls_per_turn`); a malformed or failing call becomes an
//!    error tool response and is counted; a valid `submit` ends the episode at once (calls after
//!    it are not run, and no tool turn is appended: the transcript ends with the policy's tokens);
//! 4. after `max_turns` messages without an answer the episode fails (`turn_limit`, or
//!    `invalid_answer` when the last message tried to submit and got it wrong);
//! 5. otherwise the tool messages are appended; in token mode their ids come from
//!    [`ChatCodec::encode_tool_turn`] (only the new segment is tokenized, `loss_mask = 0`), and if
//!    they leave no room to generate the episode fails (`context_overflow`).
//!
//! Text mode (no codec) keeps no tokens and has no context cap.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use mtrl_core::trajectory::ToolCallRecord;
use mtrl_core::{CallErrorKind, ChatCodec, EnvConfig, FailureReason, Message, Role, Trajectory};
use mtrl_search::{Retriever, SearchIndex};
use serde_json::Value;

use crate::env::{Action, Environment, Observation, Step};
use crate::error::{EnvError, Result};
use crate::parser::parse_calls;
use crate::prompt::{default_system_prompt, Conversation, DefaultConversation};
use crate::reward::{self, NdcgAt, Reward};
use crate::shortcuts;
use crate::task::{SearchTask, Task};
use crate::tool::{Answer, Tool, ToolError};
use crate::tools::{SearchTool, SubmitTool};

/// The search environment. Cheap to create per episode worker; tools, reward and codec are shared.
pub struct SearchEnv {
    cfg: EnvConfig,
    tools: Vec<Arc<dyn Tool>>,
    schemas: Vec<Value>,
    reward: Arc<dyn Reward>,
    conversation: Arc<dyn Conversation>,
    codec: Option<Arc<dyn ChatCodec>>,
    episode: Option<Episode>,
}

struct Episode {
    task: SearchTask,
    traj: Trajectory,
    answer: Option<Answer>,
    done: bool,
    finished: bool,
    /// The cap given to the last generation was the context's, not the per-turn one.
    context_capped: bool,
}

impl SearchEnv {
    /// An environment with the given tools and reward (names must be unique).
    pub fn new(
        cfg: EnvConfig,
        tools: Vec<Arc<dyn Tool>>,
        reward: Arc<dyn Reward>,
    ) -> Result<SearchEnv> {
        let mut seen = std::collections::HashSet::new();
        for t in &tools {
            if !seen.insert(t.name().to_string()) {
                return Err(EnvError::DuplicateTool(t.name().to_string()));
            }
        }
        let system_prompt = cfg
            .system_prompt
            .clone()
            .unwrap_or_else(|| default_system_prompt(cfg.max_turns, cfg.final_k));
        Ok(SearchEnv {
            schemas: tools.iter().map(|t| t.schema()).collect(),
            tools,
            reward,
            conversation: Arc::new(DefaultConversation { system_prompt }),
            codec: None,
            episode: None,
            cfg,
        })
    }

    /// The standard tools over `index` — `bm25_search`, `vector_search`, `submit` — and the
    /// configured reward.
    pub fn standard(cfg: EnvConfig, index: Arc<SearchIndex>) -> Result<SearchEnv> {
        let tools = standard_tools(&cfg, index);
        let reward: Arc<dyn Reward> = Arc::from(reward::from_choice(&cfg.reward));
        SearchEnv::new(cfg, tools, reward)
    }

    /// Token mode: prompts and tool turns are tokenized with `codec`.
    pub fn with_codec(mut self, codec: Arc<dyn ChatCodec>) -> SearchEnv {
        self.codec = Some(codec);
        self
    }

    /// Replaces the conversation shape.
    pub fn with_conversation(mut self, conversation: Arc<dyn Conversation>) -> SearchEnv {
        self.conversation = conversation;
        self
    }

    /// The tool schemas shown to the model.
    pub fn tool_schemas(&self) -> &[Value] {
        &self.schemas
    }

    pub fn config(&self) -> &EnvConfig {
        &self.cfg
    }

    fn episode(&mut self) -> Result<&mut Episode> {
        self.episode
            .as_mut()
            .ok_or_else(|| EnvError::Protocol("step or finish before reset".into()))
    }

    fn observation(&self, new_tokens: Vec<u32>) -> Option<Observation> {
        let ep = self.episode.as_ref()?;
        let context_len = ep.traj.tokens.len();
        let max_new_tokens = if self.codec.is_some() {
            self.cfg
                .max_tokens_per_turn
                .min(self.cfg.max_context_tokens.saturating_sub(context_len))
        } else {
            self.cfg.max_tokens_per_turn
        };
        Some(Observation {
            messages: ep.traj.messages.clone(),
            new_tokens,
            context_len,
            max_new_tokens,
            tools: self.schemas.clone(),
            query: Some(ep.task.query.clone()),
            turn: ep.traj.turns as usize,
        })
    }

    fn fail(&mut self, why: FailureReason) -> Result<Step> {
        let ep = self.episode()?;
        ep.traj.failure = Some(why);
        ep.done = true;
        Ok(Step::Done)
    }

    /// Step 1: the assistant's text, or the failure its tokens imply.
    fn take_message(
        &mut self,
        action: Action,
    ) -> Result<std::result::Result<String, FailureReason>> {
        let cap = self.cfg.max_tokens_per_turn;
        let codec = self.codec.clone();
        let ep = self.episode()?;
        let capped = ep.context_capped;
        match (action, codec) {
            (Action::Text { text, truncated }, None) => Ok(if truncated {
                Err(FailureReason::TokenLimit)
            } else {
                Ok(text)
            }),
            (
                Action::Tokens {
                    ids,
                    logprobs,
                    versions,
                },
                Some(codec),
            ) => {
                if !ep.traj.push_sampled(&ids, &logprobs, &versions) {
                    return Err(EnvError::Protocol(format!(
                        "{} ids with {} logprobs and {} versions",
                        ids.len(),
                        logprobs.len(),
                        versions.len()
                    )));
                }
                let stops = codec.stop_token_ids();
                let ended = ids.last().is_some_and(|t| stops.contains(t));
                if !ended || ids.len() > cap {
                    let why = if capped && ids.len() <= cap {
                        FailureReason::ContextOverflow
                    } else {
                        FailureReason::TokenLimit
                    };
                    return Ok(Err(why));
                }
                Ok(Ok(codec.decode(&ids[..ids.len() - 1])?))
            }
            (Action::Text { .. }, Some(_)) => Err(EnvError::Protocol(
                "text action in token mode (the environment has a codec)".into(),
            )),
            (Action::Tokens { .. }, None) => Err(EnvError::Protocol(
                "token action in text mode (the environment has no codec)".into(),
            )),
        }
    }
}

/// `bm25_search`, `vector_search` and `submit` as configured.
pub fn standard_tools(cfg: &EnvConfig, index: Arc<SearchIndex>) -> Vec<Arc<dyn Tool>> {
    standard_tools_over(cfg, index, |r| r)
}

/// [`standard_tools`] with each search tool's retriever passed through `wrap` (e.g. a memo).
pub fn standard_tools_over(
    cfg: &EnvConfig,
    index: Arc<SearchIndex>,
    wrap: impl Fn(Arc<dyn Retriever>) -> Arc<dyn Retriever>,
) -> Vec<Arc<dyn Tool>> {
    let k = cfg.final_k.min(cfg.max_search_k);
    vec![
        Arc::new(
            SearchTool::bm25(index.clone(), k, cfg.max_search_k, cfg.snippet_words)
                .with_format(cfg.hits)
                .with_optional_query(cfg.default_query)
                .map_retriever(&wrap),
        ),
        Arc::new(
            SearchTool::vector(index.clone(), k, cfg.max_search_k, cfg.snippet_words)
                .with_format(cfg.hits)
                .with_optional_query(cfg.default_query)
                .map_retriever(&wrap),
        ),
        Arc::new(
            SubmitTool::new(cfg.final_k, Some(index.corpus().clone()))
                .with_hits(cfg.submit_hits)
                .with_rrf(cfg.submit_rrf)
                .with_excess(cfg.submit_excess),
        ),
    ]
}

impl Environment for SearchEnv {
    fn reset(&mut self, task: &Task) -> Result<Step> {
        let task = SearchTask::parse(task)?;
        let mut traj = Trajectory::new(task.id.clone());
        traj.messages = self.conversation.initial_messages(&task);
        let mut prompt = Vec::new();
        if let Some(codec) = &self.codec {
            prompt = codec.encode_prompt(&traj.messages, &self.schemas)?;
            traj.push_context(&prompt);
            traj.prompt_len = prompt.len();
        }
        let overflow = self.codec.is_some() && prompt.len() >= self.cfg.max_context_tokens;
        self.episode = Some(Episode {
            task,
            traj,
            answer: None,
            done: false,
            finished: false,
            context_capped: false,
        });
        if overflow {
            return self.fail(FailureReason::ContextOverflow);
        }
        let obs = self.observation(prompt);
        let cap = self.cfg.max_tokens_per_turn;
        let ep = self.episode()?;
        ep.context_capped = obs.as_ref().is_some_and(|o| o.max_new_tokens < cap);
        Ok(obs.map(Step::Continue).unwrap_or(Step::Done))
    }

    fn step(&mut self, action: Action) -> Result<Step> {
        let cfg = self.cfg.clone();
        {
            let ep = self.episode()?;
            if ep.done {
                return Err(EnvError::Protocol("step after the episode ended".into()));
            }
            ep.traj.turns += 1;
        }
        let text = match self.take_message(action)? {
            Ok(t) => t,
            Err(why) => return self.fail(why),
        };
        let calls = parse_calls(&text, cfg.tool_calls);
        let history_len = {
            let ep = self.episode()?;
            ep.traj.messages.push(Message::assistant(text));
            ep.traj.messages.len()
        };
        if calls.is_empty() {
            return self.fail(FailureReason::NoAnswer);
        }
        let mut responses: Vec<Message> = Vec::new();
        let mut bad_answer = false;
        let mut answer = None;
        let tools = self.tools.clone();
        let ep = self.episode()?;
        for (i, call) in calls.into_iter().enumerate() {
            let started = Instant::now();
            let arguments = call.as_ref().map_or(Value::Null, |c| c.arguments.clone());
            let mut result_ids = Vec::new();
            let (name, result) = match call {
                _ if i >= cfg.max_calls_per_turn => (
                    "error".to_string(),
                    Err((
                        CallErrorKind::TooManyCalls,
                        format!(
                            "too many tool calls in one message (at most {}); this one was not run",
                            cfg.max_calls_per_turn
                        ),
                    )),
                ),
                Err(e) => (
                    "error".to_string(),
                    Err((CallErrorKind::MalformedCall, e.0)),
                ),
                Ok(call) => match tools.iter().find(|t| t.name() == call.name) {
                    None => (
                        call.name.clone(),
                        Err((
                            CallErrorKind::UnknownTool,
                            format!(
                                "unknown tool `{}` (available: {})",
                                call.name,
                                tools
                                    .iter()
                                    .map(|t| t.name())
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            ),
                        )),
                    ),
                    Some(tool) => match shortcuts::resolve(
                        &cfg,
                        tool.as_ref(),
                        &call.arguments,
                        &ep.task.query,
                        &ep.traj.tool_calls,
                    )
                    .map_err(ToolError::Invalid)
                    .and_then(|args| tool.call(&args))
                    {
                        Ok(out) => {
                            ep.traj.tools.count_call(&call.name);
                            result_ids = out.ids;
                            if out.answer.is_some() {
                                answer = out.answer;
                                ep.traj.tool_calls.push(ToolCallRecord {
                                    turn: ep.traj.turns,
                                    name: call.name.clone(),
                                    arguments,
                                    result_ids,
                                    latency_ms: started.elapsed().as_secs_f64() * 1e3,
                                    error: None,
                                });
                                break;
                            }
                            (call.name.clone(), Ok(out.content))
                        }
                        Err(ToolError::Invalid(msg)) => {
                            bad_answer |= tool.is_final();
                            (
                                call.name.clone(),
                                Err((CallErrorKind::InvalidArguments, msg)),
                            )
                        }
                        Err(ToolError::Fatal(e)) => return Err(e),
                    },
                },
            };
            ep.traj.tool_calls.push(ToolCallRecord {
                turn: ep.traj.turns,
                name: name.clone(),
                arguments,
                result_ids,
                latency_ms: started.elapsed().as_secs_f64() * 1e3,
                error: result.as_ref().err().map(|(_, m)| m.clone()),
            });
            let content = match result {
                Ok(c) => c,
                Err((kind, msg)) => {
                    ep.traj.tools.count_error(kind, &msg);
                    format!("error: {msg}")
                }
            };
            responses.push(Message::tool(name, content));
        }
        if let Some(a) = answer {
            ep.traj.answer = Some(a.doc_ids.clone());
            ep.answer = Some(a);
            ep.done = true;
            return Ok(Step::Done);
        }
        if ep.traj.turns as usize >= cfg.max_turns {
            let why = if bad_answer {
                FailureReason::InvalidAnswer
            } else {
                FailureReason::TurnLimit
            };
            return self.fail(why);
        }
        let mut new_ids = Vec::new();
        if let Some(codec) = self.codec.clone() {
            let schemas = self.schemas.clone();
            let ep = self.episode()?;
            new_ids =
                codec.encode_tool_turn(&ep.traj.messages[..history_len], &responses, &schemas)?;
            ep.traj.push_context(&new_ids);
        }
        let ep = self.episode()?;
        ep.traj.messages.extend(responses);
        let obs = self.observation(new_ids);
        let cap = cfg.max_tokens_per_turn;
        let ep = self.episode()?;
        ep.context_capped = obs.as_ref().is_some_and(|o| o.max_new_tokens < cap);
        match obs {
            Some(o) if o.max_new_tokens == 0 => self.fail(FailureReason::ContextOverflow),
            Some(o) => Ok(Step::Continue(o)),
            None => Ok(Step::Done),
        }
    }

    fn finish(&mut self) -> Result<Trajectory> {
        let failure_reward = self.cfg.failure_reward;
        let reward = self.reward.clone();
        let ep = self.episode()?;
        if !ep.done {
            return Err(EnvError::Protocol("finish before the episode ended".into()));
        }
        if ep.finished {
            return Err(EnvError::Protocol("finish called twice".into()));
        }
        ep.finished = true;
        let mut traj = ep.traj.clone();
        match (&ep.answer, traj.failure) {
            (Some(a), None) => {
                traj.reward = reward.score(&ep.task, a);
                traj.scores = reward.components(&ep.task, a);
                if !traj.scores.iter().any(|(n, _)| n == "ndcg@10") {
                    traj.scores
                        .push(("ndcg@10".into(), NdcgAt(10).score(&ep.task, a)));
                }
            }
            _ => {
                traj.reward = failure_reward;
                traj.failure.get_or_insert(FailureReason::NoAnswer);
            }
        }
        Ok(traj)
    }
}

/// The last tool messages of a conversation (those after the last assistant message), by tool.
pub fn last_tool_results(messages: &[Message]) -> Vec<(&str, &str)> {
    let start = messages
        .iter()
        .rposition(|m| m.role == Role::Assistant)
        .map(|i| i + 1)
        .unwrap_or(messages.len());
    messages[start..]
        .iter()
        .filter(|m| m.role == Role::Tool)
        .map(|m| (m.name.as_deref().unwrap_or(""), m.content.as_str()))
        .collect()
}

/// Scores by name of a trajectory (`scores` as a map).
pub fn score_map(traj: &Trajectory) -> HashMap<&str, f64> {
    traj.scores.iter().map(|(n, s)| (n.as_str(), *s)).collect()
}
