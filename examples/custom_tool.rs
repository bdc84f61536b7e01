//! Extending the environment without touching `mtrl-env`: a custom tool (`read_document`, the
//! full text of one document) and a custom reward (precision of the first 3 ids), plugged into
//! `SearchEnv` next to the built-in search and submit tools, and driven by a small scripted agent.
//!
//! Run: `cargo run --example custom_tool`

use std::collections::HashMap;
use std::sync::Arc;

use mtrl_core::EnvConfig;
use mtrl_env::tool::{function_schema, Args};
use mtrl_env::tools::{SearchTool, SubmitTool};
use mtrl_env::{
    format_tool_call, run_episode, Action, Agent, Answer, Observation, Reward, SearchEnv,
    SearchTask, Task, Tool, ToolCall, ToolError, ToolOutput,
};
use mtrl_search::{Hit, Retriever};
use serde_json::{json, Value};

/// A three-document collection.
fn docs() -> HashMap<&'static str, &'static str> {
    HashMap::from([
        (
            "a",
            "Laminar boundary layers on flat plates at zero incidence.",
        ),
        ("b", "Shock waves in supersonic flow past a wedge."),
        ("c", "Heat transfer in a turbulent boundary layer."),
    ])
}

/// Keyword overlap ranking over `docs()`, standing in for a real index.
struct Overlap;

impl Retriever for Overlap {
    fn name(&self) -> &'static str {
        "overlap"
    }
    fn search(&self, query: &str, k: usize) -> mtrl_search::Result<Vec<Hit>> {
        let words: Vec<String> = query.split_whitespace().map(str::to_lowercase).collect();
        let mut hits: Vec<Hit> = docs()
            .into_iter()
            .map(|(id, text)| Hit {
                doc_id: id.into(),
                score: words
                    .iter()
                    .filter(|w| text.to_lowercase().contains(*w))
                    .count() as f32,
                title: String::new(),
                snippet: text.into(),
            })
            .collect();
        hits.sort_by(|x, y| y.score.total_cmp(&x.score).then(x.doc_id.cmp(&y.doc_id)));
        hits.truncate(k);
        Ok(hits)
    }
}

/// The custom tool: `read_document(doc_id)`.
struct ReadDocument;

impl Tool for ReadDocument {
    fn name(&self) -> &str {
        "read_document"
    }
    fn schema(&self) -> Value {
        function_schema(
            "read_document",
            "The full text of one document.",
            json!({"type": "object", "properties": {"doc_id": {"type": "string"}}, "required": ["doc_id"]}),
        )
    }
    fn call(&self, arguments: &Value) -> Result<ToolOutput, ToolError> {
        let args = Args::new("read_document", arguments, &["doc_id"])?;
        let id = args.string("doc_id")?;
        match docs().get(id) {
            Some(text) => Ok(ToolOutput::text(*text)),
            None => Err(ToolError::Invalid(format!("no document `{id}`"))),
        }
    }
}

/// The custom reward: fraction of the first 3 submitted ids that are relevant. Pure.
struct PrecisionAt3;

impl Reward for PrecisionAt3 {
    fn name(&self) -> String {
        "p@3".into()
    }
    fn score(&self, task: &SearchTask, answer: &Answer) -> f64 {
        let rel = answer
            .doc_ids
            .iter()
            .take(3)
            .filter(|d| task.qrels.get(*d).is_some_and(|g| *g > 0))
            .count();
        rel as f64 / 3.0
    }
}

/// Searches, reads the top hit, then submits the ranking.
struct Reader;

fn call(name: &str, arguments: Value) -> String {
    format_tool_call(&ToolCall {
        name: name.into(),
        arguments,
    })
}

impl Agent for Reader {
    fn act(&mut self, obs: &Observation) -> mtrl_env::Result<Action> {
        let query = obs.query.clone().unwrap_or_default();
        let text = match obs.turn {
            0 => call("bm25_search", json!({"query": query, "k": 3})),
            1 => {
                let hits = mtrl_env::scripted::hit_ids(&obs.messages.last().unwrap().content);
                call("read_document", json!({"doc_id": hits[0]}))
            }
            _ => {
                // The search results are the first tool message of the conversation.
                let results = obs
                    .messages
                    .iter()
                    .find(|m| m.role == mtrl_core::Role::Tool);
                let ranked = mtrl_env::scripted::hit_ids(&results.unwrap().content);
                call("submit", json!({"doc_ids": ranked}))
            }
        };
        Ok(Action::text(text))
    }
}

/// Runs one episode with the custom tool and reward.
pub fn run() -> anyhow::Result<mtrl_core::Trajectory> {
    let cfg = EnvConfig::default();
    let tools: Vec<Arc<dyn Tool>> = vec![
        Arc::new(SearchTool::new(
            "bm25_search",
            "Keyword search.",
            Arc::new(Overlap),
            3,
            10,
            20,
        )),
        Arc::new(ReadDocument),
        Arc::new(SubmitTool::new(cfg.final_k, None)),
    ];
    let mut env = SearchEnv::new(cfg, tools, Arc::new(PrecisionAt3))?;
    let task = Task {
        id: "demo".into(),
        prompt: r#"{"query": "boundary layer", "qrels": {"a": 1, "c": 1}}"#.into(),
    };
    Ok(run_episode(&mut env, &mut Reader, &task)?)
}

fn main() -> anyhow::Result<()> {
    let traj = run()?;
    for m in &traj.messages {
        println!("[{:?}] {}", m.role, m.content.replace('\n', " "));
    }
    println!(
        "turns {}, tool calls {}, answer {:?}, reward (p@3) {:.4}, failure {:?}",
        traj.turns,
        traj.tools.total_calls(),
        traj.answer,
        traj.reward,
        traj.failure
    );
    Ok(())
}
