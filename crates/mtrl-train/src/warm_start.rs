//! Building a policy from scratch for the default job (`[warm_start]`): teacher episodes, a
//! tokenizer trained on the collection, and a seeded random Qwen3 of a given shape.
//!
//! The demo tokenizer's chat template is Qwen's ChatML with one change: the tool list in the
//! system turn is one line per tool (`- name(arg, …)`) instead of full JSON schemas, which would
//! cost a from-scratch model several hundred ids of context on every step for nothing it can use.
//! Tool calls and responses keep Qwen's `<tool_call>` / `<tool_response>` format, so the parser,
//! environment and codec are the ones real Qwen checkpoints use.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use mtrl_core::config::WarmStartConfig;
use mtrl_core::rng::hash_str;
use mtrl_core::{Config, EnvConfig, Trajectory};
use mtrl_env::{run_episode, SearchEnv, SearchTask, Task, Teacher, TeacherSpec};
use mtrl_model::{ChatOptions, ChatTemplate, TokenizerTraining};
use mtrl_search::SearchIndex;
use serde_json::Value;

use crate::error::{Context, Result};

/// ChatML with a one-line-per-tool list (see the module docs).
pub const COMPACT_CHAT_TEMPLATE: &str = r#"{%- if tools %}{{- '<|im_start|>system\n' }}{%- if messages[0].role == 'system' %}{{- messages[0].content + '\n' }}{%- endif %}{{- '# Tools\n' }}{%- for tool in tools %}{%- set f = tool.function if tool.function is defined else tool %}{{- '- ' + f.name + '(' + (f.parameters.properties | list | join(', ')) + ')\n' }}{%- endfor %}{{- '<|im_end|>\n' }}{%- else %}{%- if messages[0].role == 'system' %}{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}{%- endif %}{%- endif %}{%- for message in messages %}{%- if message.role == 'system' %}{%- if not loop.first %}{{- '<|im_start|>system\n' + message.content + '<|im_end|>\n' }}{%- endif %}{%- elif message.role == 'user' %}{{- '<|im_start|>user\n' + message.content + '<|im_end|>\n' }}{%- elif message.role == 'assistant' %}{{- '<|im_start|>assistant\n' }}{%- if message.content is defined and message.content is string and message.content %}{{- message.content }}{%- elif message.tool_calls is defined and message.tool_calls %}{%- for tool_call in message.tool_calls %}{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}{%- if not loop.first %}{{- '\n' }}{%- endif %}{{- '<tool_call>\n{"name": "' + tool_call.name + '", "arguments": ' }}{%- if tool_call.arguments is string %}{{- tool_call.arguments }}{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}{{- '}\n</tool_call>' }}{%- endfor %}{%- endif %}{{- '<|im_end|>\n' }}{%- elif message.role == 'tool' %}{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}{{- '\n<tool_response>\n' + message.content + '\n</tool_response>' }}{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\n' }}{%- endif %}{%- endif %}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"#;

/// The teacher of `[warm_start]`: it explores the environment's ranges (`max_search_k`,
/// `final_k`) and uses the argument shortcuts `env` switches on.
pub fn teacher_spec(ws: &WarmStartConfig, env: &EnvConfig) -> TeacherSpec {
    TeacherSpec {
        max_searches: ws.max_searches,
        max_k: env.max_search_k,
        final_k: env.final_k,
        p_one_message: ws.p_one_message,
        p_interleave: ws.p_interleave,
        p_reorder: ws.p_reorder,
        p_top: ws.p_top,
        p_rrf: ws.p_rrf,
        keyword_queries: ws.keyword_queries,
        omit_query: env.default_query,
        submit_hits: env.submit_hits,
        ..TeacherSpec::default()
    }
}

/// Teacher episodes: `teacher_samples` per training task, plus one per pseudo-query (the title
/// of every n-th document, judged relevant to its own title) — synthetic queries widen what the
/// student sees of the query-copying skill without touching any judged query of another split.
pub fn teacher_episodes(
    cfg: &Config,
    ws: &WarmStartConfig,
    index: Arc<SearchIndex>,
    train: &[Task],
    seed: u64,
) -> Result<Vec<Trajectory>> {
    let spec = teacher_spec(ws, &cfg.env_or_default());
    let mut env = SearchEnv::standard(cfg.env_or_default(), index.clone())?;
    let mut out = Vec::new();
    for task in train {
        for s in 0..ws.teacher_samples {
            let mut t = Teacher::new(spec.clone(), hash_str(seed, &format!("{}#{s}", task.id)));
            out.push(
                run_episode(&mut env, &mut t, task)
                    .with_context(|| format!("teacher episode of task {}", task.id))?,
            );
        }
    }
    let docs = index.corpus().documents();
    let n = ws.pseudo_queries.min(docs.len());
    if let Some(stride) = docs.len().checked_div(n) {
        for d in docs.iter().step_by(stride.max(1)).take(n) {
            let title = d.title.trim();
            if title.split_whitespace().count() < 3 {
                continue;
            }
            let qrels = std::iter::once((d.id.clone(), 1)).collect();
            let task = Task {
                id: format!("title:{}", d.id),
                prompt: SearchTask::prompt_json(title, &qrels),
            };
            let mut t = Teacher::new(spec.clone(), hash_str(seed, &task.id));
            out.push(run_episode(&mut env, &mut t, &task)?);
        }
    }
    Ok(out)
}

/// Writes trajectories as JSON Lines.
pub fn write_jsonl(path: &Path, trajs: &[Trajectory]) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let mut w = std::io::BufWriter::new(
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
    );
    for t in trajs {
        writeln!(w, "{}", serde_json::to_string(t)?)?;
    }
    w.flush()?;
    Ok(())
}

/// Trains the demo tokenizer on the corpus and the teacher's rendered conversations.
pub fn train_tokenizer(
    ws: &WarmStartConfig,
    index: &SearchIndex,
    teacher: &[Trajectory],
    tools: &[Value],
    out: &Path,
) -> Result<()> {
    let tpl = ChatTemplate::new(COMPACT_CHAT_TEMPLATE, "", "<|im_end|>")?;
    let mut texts: Vec<String> = index
        .corpus()
        .documents()
        .iter()
        .map(|d| format!("{}\n{}", d.title, d.text))
        .collect();
    for t in teacher {
        texts.push(tpl.render(&t.messages, Some(tools), ChatOptions::default())?);
    }
    let opts = TokenizerTraining {
        vocab_size: ws.tokenizer_vocab,
        min_frequency: 2,
        chat_template: COMPACT_CHAT_TEMPLATE.into(),
        model_max_length: 4096,
        // One id per document id: a small model copies one token per id, not a digit string.
        extra_tokens: if ws.id_tokens {
            index
                .corpus()
                .documents()
                .iter()
                .map(|d| d.id.clone())
                .collect()
        } else {
            Vec::new()
        },
    };
    mtrl_model::train_tokenizer(texts.iter(), &opts, out)
        .with_context(|| format!("training the tokenizer into {}", out.display()))
}
