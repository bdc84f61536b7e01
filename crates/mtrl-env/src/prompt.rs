//! The conversation shape: what comes before the agent's first message. Replaceable through the
//! [`Conversation`] trait (or just the system prompt through `[env] system_prompt`).
//!
//! Default: a system message with the instructions (the tool schemas are passed to the chat
//! template separately, which lists them in the system turn), the task's own `messages` (e.g.
//! few-shot turns), then the user message with the query.

use mtrl_core::Message;

use crate::task::SearchTask;

/// Builds the initial messages of an episode.
pub trait Conversation: Send + Sync {
    fn initial_messages(&self, task: &SearchTask) -> Vec<Message>;
}

/// The built-in conversation.
pub struct DefaultConversation {
    pub system_prompt: String,
}

/// The built-in instructions, for an episode of `max_turns` turns scoring `final_k` ids.
pub fn default_system_prompt(max_turns: usize, final_k: usize) -> String {
    format!(
        "You are a search agent. Find the documents of the collection that are most relevant to the \
user's query. Call the search tools as often as useful (you have at most {max_turns} turns; each of \
your messages is one turn), then call `submit` with the ids of the most relevant documents, best \
first. Only the first {final_k} ids are scored. A message without a tool call ends the episode \
without an answer."
    )
}

impl Conversation for DefaultConversation {
    fn initial_messages(&self, task: &SearchTask) -> Vec<Message> {
        let mut m = vec![Message::system(self.system_prompt.clone())];
        m.extend(task.messages.iter().cloned());
        m.push(Message::user(format!("Query: {}", task.query)));
        m
    }
}
