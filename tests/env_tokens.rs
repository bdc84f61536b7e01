//! Token-in/token-out: an episode run in token mode with the fixture Qwen-style tokenizer and its
//! chat template (through `mtrl_model::TemplateCodec`) produces exactly the ids of the chat
//! template's rendering of the final messages, tokenized in one go. The agent here samples the
//! tokenizer's own encoding of its text plus `<|im_end|>`, the case in which equality must hold
//! (see the env ARCHITECTURE section for where a real model's ids may differ).

use std::path::Path;
use std::sync::Arc;

use mtrl_core::{ChatCodec, EnvConfig};
use mtrl_env::reward::NdcgAt;
use mtrl_env::tools::{SearchTool, SubmitTool};
use mtrl_env::{run_episode, Action, Agent, Observation, SearchEnv, Task, Tool};
use mtrl_model::{TemplateCodec, Tokenizer};
use mtrl_search::{Hit, Retriever};

struct Docs;

impl Retriever for Docs {
    fn name(&self) -> &'static str {
        "docs"
    }
    fn search(&self, q: &str, k: usize) -> mtrl_search::Result<Vec<Hit>> {
        Ok((0..k)
            .map(|i| Hit {
                doc_id: format!("{}", 100 + i),
                score: 1.0,
                title: format!("Über «{q}» — part {i}"),
                snippet: "Boundary-layer flow over a flat plate: 漢字 🦀 \"quoted\" text".into(),
            })
            .collect())
    }
}

/// Writes fixed messages, sampling the tokenizer's encoding of each plus `<|im_end|>`.
struct Scripted {
    codec: Arc<TemplateCodec>,
    messages: Vec<&'static str>,
}

impl Agent for Scripted {
    fn act(&mut self, obs: &Observation) -> mtrl_env::Result<Action> {
        let text = self.messages[obs.turn];
        let mut ids = self.codec.encode_text(text)?;
        ids.push(self.codec.stop_token_ids()[0]);
        let n = ids.len();
        Ok(Action::Tokens {
            ids,
            logprobs: vec![-0.5; n],
            versions: vec![1; n],
        })
    }
}

#[test]
fn incremental_ids_equal_the_template_rendering() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer");
    let tok = Arc::new(Tokenizer::from_dir(&dir).unwrap());
    let codec = Arc::new(TemplateCodec::qwen(tok.clone()).unwrap());
    let cfg = EnvConfig {
        max_context_tokens: 100_000,
        ..EnvConfig::default()
    };
    let tools: Vec<Arc<dyn Tool>> = vec![
        Arc::new(SearchTool::new(
            "bm25_search",
            "BM25",
            Arc::new(Docs),
            3,
            10,
            8,
        )),
        Arc::new(SearchTool::new(
            "vector_search",
            "Vector",
            Arc::new(Docs),
            3,
            10,
            8,
        )),
        Arc::new(SubmitTool::new(10, None)),
    ];
    let mut env = SearchEnv::new(cfg, tools, Arc::new(NdcgAt(10)))
        .unwrap()
        .with_codec(codec.clone());
    let mut agent = Scripted {
        codec: codec.clone(),
        messages: vec![
            "Let me search.\n<tool_call>\n{\"name\": \"bm25_search\", \"arguments\": {\"query\": \"flat plate\", \"k\": 2}}\n</tool_call>\n<tool_call>\n{\"name\": \"vector_search\", \"arguments\": {\"query\": \"plaque plane\"}}\n</tool_call>",
            "<tool_call>{broken json</tool_call>",
            "<tool_call>\n{\"name\": \"submit\", \"arguments\": {\"doc_ids\": [\"101\", \"100\"]}}\n</tool_call>",
        ],
    };
    let task = Task {
        id: "q1".into(),
        prompt: r#"{"query":"flat plate boundary layer","qrels":{"100":2,"101":1}}"#.into(),
    };
    let traj = run_episode(&mut env, &mut agent, &task).unwrap();
    traj.check().unwrap();
    assert_eq!(traj.failure, None);
    assert_eq!(traj.turns, 3);
    assert_eq!(traj.tools.errors, 1);

    // The whole conversation rendered and tokenized at once.
    let rendered = codec
        .render(&traj.messages, env.tool_schemas(), false)
        .unwrap();
    let full = tok.encode(&rendered).unwrap();
    // The template closes the last assistant message with "<|im_end|>\n"; the episode ends at
    // the policy's <|im_end|>, so the transcript is the rendering minus the final newline.
    assert!(full.len() > traj.tokens.len());
    assert_eq!(&full[..traj.tokens.len()], traj.tokens.as_slice());
    assert_eq!(tok.decode(&full[traj.tokens.len()..], false).unwrap(), "\n");

    // loss_mask is 1 exactly on the three sampled messages.
    let sampled: usize = agent
        .messages
        .iter()
        .map(|m| codec.encode_text(m).unwrap().len() + 1)
        .sum();
    assert_eq!(traj.sampled_tokens(), sampled);
    let prompt = codec
        .encode_prompt(&traj.messages[..2], env.tool_schemas())
        .unwrap();
    assert_eq!(traj.prompt_len, prompt.len());
    assert_eq!(&traj.tokens[..prompt.len()], prompt.as_slice());
}
