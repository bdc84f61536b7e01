//! `pick`: a one-token environment in which learning is visible within seconds on a CPU — the
//! CI proof that the RL loop (rollout → advantages → loss → AdamW → weight publishing) learns.
//!
//! The prompt is the task's query as a user message, through the same [`ChatCodec`] the search
//! environment uses. The policy writes one token; token id `t` picks candidate
//! `candidates[t mod n]` (the judged documents of all tasks, sorted), which is submitted as a
//! one-document ranking and scored with nDCG@10 against the task's qrels. A uniformly random
//! policy earns [`PickEnv::chance`] on average; a policy that learned the query → document map
//! earns 1.
//!
//! The episode follows the [`Environment`] protocol exactly (token mode, loss mask on the sampled
//! token), so the rollout and learner code paths are the ones a search run uses.

use std::collections::BTreeSet;
use std::sync::Arc;

use mtrl_core::{ChatCodec, FailureReason, Message, Trajectory};
use mtrl_env::reward::{NdcgAt, Reward};
use mtrl_env::{Action, Answer, EnvError, Environment, Observation, SearchTask, Step, Task};

/// The candidate documents of a task set: every judged id, sorted.
pub fn candidates(tasks: &[Task]) -> mtrl_env::Result<Vec<String>> {
    let mut set = BTreeSet::new();
    for t in tasks {
        set.extend(SearchTask::parse(t)?.qrels.into_keys());
    }
    Ok(set.into_iter().collect())
}

struct Episode {
    task: SearchTask,
    traj: Trajectory,
    choice: Option<String>,
    done: bool,
    finished: bool,
}

/// The pick-a-document environment.
pub struct PickEnv {
    codec: Arc<dyn ChatCodec>,
    candidates: Arc<Vec<String>>,
    failure_reward: f64,
    episode: Option<Episode>,
}

impl PickEnv {
    /// Errors when there is no candidate.
    pub fn new(
        codec: Arc<dyn ChatCodec>,
        candidates: Arc<Vec<String>>,
        failure_reward: f64,
    ) -> mtrl_env::Result<PickEnv> {
        if candidates.is_empty() {
            return Err(EnvError::Protocol(
                "the pick environment needs tasks with judged documents".into(),
            ));
        }
        Ok(PickEnv {
            codec,
            candidates,
            failure_reward,
            episode: None,
        })
    }

    /// The document token `t` picks.
    pub fn choice(&self, token: u32) -> &str {
        &self.candidates[token as usize % self.candidates.len()]
    }

    /// Mean reward of a policy that picks uniformly among the candidates, over `tasks`.
    pub fn chance(candidates: &[String], tasks: &[Task]) -> mtrl_env::Result<f64> {
        let mut sum = 0.0;
        for t in tasks {
            let task = SearchTask::parse(t)?;
            for c in candidates {
                sum += NdcgAt(10).score(&task, &one(c));
            }
        }
        Ok(sum / (candidates.len() * tasks.len()).max(1) as f64)
    }

    fn episode(&mut self) -> mtrl_env::Result<&mut Episode> {
        self.episode
            .as_mut()
            .ok_or_else(|| EnvError::Protocol("step or finish before reset".into()))
    }
}

fn one(id: &str) -> Answer {
    Answer {
        doc_ids: vec![id.to_string()],
        text: None,
    }
}

impl Environment for PickEnv {
    fn reset(&mut self, task: &Task) -> mtrl_env::Result<Step> {
        let task = SearchTask::parse(task)?;
        let mut traj = Trajectory::new(task.id.clone());
        traj.messages = vec![Message::user(task.query.clone())];
        let prompt = self.codec.encode_prompt(&traj.messages, &[])?;
        traj.push_context(&prompt);
        traj.prompt_len = prompt.len();
        let obs = Observation {
            messages: traj.messages.clone(),
            context_len: prompt.len(),
            new_tokens: prompt,
            max_new_tokens: 1,
            tools: Vec::new(),
            query: Some(task.query.clone()),
            turn: 0,
        };
        self.episode = Some(Episode {
            task,
            traj,
            choice: None,
            done: false,
            finished: false,
        });
        Ok(Step::Continue(obs))
    }

    fn step(&mut self, action: Action) -> mtrl_env::Result<Step> {
        let Action::Tokens {
            ids,
            logprobs,
            versions,
        } = action
        else {
            return Err(EnvError::Protocol(
                "the pick environment takes tokens".into(),
            ));
        };
        let choice = ids.first().map(|&t| self.choice(t).to_string());
        let ep = self.episode()?;
        if ep.done {
            return Err(EnvError::Protocol("step after the episode ended".into()));
        }
        if !ep.traj.push_sampled(&ids, &logprobs, &versions) {
            return Err(EnvError::Protocol(
                "ids, logprobs and versions differ in length".into(),
            ));
        }
        ep.traj.turns = 1;
        ep.done = true;
        match choice {
            Some(c) => {
                ep.traj.messages.push(Message::assistant(c.clone()));
                ep.traj.answer = Some(vec![c.clone()]);
                ep.choice = Some(c);
            }
            None => ep.traj.failure = Some(FailureReason::NoAnswer),
        }
        Ok(Step::Done)
    }

    fn finish(&mut self) -> mtrl_env::Result<Trajectory> {
        let failure_reward = self.failure_reward;
        let ep = self.episode()?;
        if !ep.done || ep.finished {
            return Err(EnvError::Protocol("finish before the end or twice".into()));
        }
        ep.finished = true;
        let mut traj = ep.traj.clone();
        match &ep.choice {
            Some(c) => {
                traj.reward = NdcgAt(10).score(&ep.task, &one(c));
                traj.scores = vec![("ndcg@10".into(), traj.reward)];
            }
            None => traj.reward = failure_reward,
        }
        Ok(traj)
    }
}
