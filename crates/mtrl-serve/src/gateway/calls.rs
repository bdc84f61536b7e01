//! The generation routes of the [`Gateway`]: chat completions, text completions and `/sample`,
//! on a named trajectory (captured) or on the standalone engine.

use std::sync::Arc;

use mtrl_core::ChatCodec;
use mtrl_model::{Completion, GenerationRequest, SamplingParams};
use mtrl_rollout::{GenClient, RolloutError};
use serde_json::json;

use super::{new_id, Body, Gateway, Served};
use crate::error::ApiError;
use crate::openai::{self, ChatShape, Choice, Usage};
use crate::render;
use crate::request::{self, Sampling};

impl Gateway {
    /// `POST /v1/chat/completions`.
    pub async fn chat(&self, traj: Option<&str>, body: &[u8]) -> Result<Body, ApiError> {
        let req = request::chat(body)?;
        let (choices, prompt, model, id) = match traj {
            Some(t) => {
                if req.sampling.n != 1 {
                    return Err(ApiError::field(
                        "n",
                        "a trajectory is one sequence: n must be 1",
                    ));
                }
                if !req.sampling.stop.is_empty() {
                    return Err(ApiError::field(
                        "stop",
                        "stop strings are not served on trajectories (the policy's end-of-turn token ends a message)",
                    ));
                }
                let t0 = std::time::Instant::now();
                let (mut cap, _) = self.open(t).await?;
                let p = cap.prepare(&req.messages, &req.tools, req.sampling.max_tokens)?;
                let prompt = p.prompt.clone();
                let sampling = cap.sampling(client_sampling(&req.sampling));
                let spec = cap.spec.clone();
                let c = generate(
                    "messages",
                    &spec.gen,
                    &spec.codec,
                    prompt.clone(),
                    sampling,
                    p.max_new_tokens,
                    Vec::new(),
                    Some(spec.session),
                )
                .await?;
                let turn = cap.turns();
                let (reply, ended) = cap.record(
                    p,
                    &c,
                    req.parse_tools,
                    req.parallel_tool_calls,
                    &format!("{turn}"),
                )?;
                let choice = choice(&spec.codec, reply, String::new(), ended, &c, req.logprobs)?;
                self.timed(t0);
                (
                    vec![choice],
                    prompt,
                    spec.model.clone(),
                    format!("chatcmpl-{t}-{turn}"),
                )
            }
            None => {
                let s = self.served()?.clone();
                let msgs = render::messages(&req.messages);
                let prompt = s
                    .codec
                    .encode_prompt(&msgs, &req.tools)
                    .map_err(|e| ApiError::bad_request(e.to_string()))?;
                let max_new = room(&s, prompt.len(), req.sampling.max_tokens)?;
                let mut out = Vec::new();
                for c in self
                    .sample_n("messages", &s, &prompt, &req.sampling, max_new)
                    .await?
                {
                    let text = decode_body(&s.codec, &c)?;
                    let reply = render::reply(
                        &text.0,
                        req.parse_tools,
                        req.parallel_tool_calls,
                        &new_id()[5..13],
                    );
                    out.push(choice(
                        &s.codec,
                        reply,
                        String::new(),
                        text.1,
                        &c,
                        req.logprobs,
                    )?);
                }
                (
                    out,
                    prompt,
                    s.model.clone(),
                    format!("chatcmpl-{}", &new_id()[5..]),
                )
            }
        };
        let usage = Usage {
            prompt_tokens: prompt.len(),
            completion_tokens: choices.iter().map(|c| c.tokens.len()).sum(),
        };
        let shape = ChatShape {
            id: &id,
            model: req.model.as_deref().unwrap_or(&model),
            logprobs: req.logprobs,
            token_ids: req.return_token_ids.then_some(&prompt[..]),
        };
        Ok(if req.stream {
            Body::Events(openai::chat_chunks(
                &shape,
                &choices,
                &usage,
                req.include_usage,
            ))
        } else {
            Body::Json(openai::chat(&shape, &choices, &usage))
        })
    }

    async fn sample_n(
        &self,
        param: &'static str,
        s: &Served,
        prompt: &[u32],
        sp: &Sampling,
        max_new: usize,
    ) -> Result<Vec<Completion>, ApiError> {
        let base = client_sampling(sp);
        let mut set = tokio::task::JoinSet::new();
        for i in 0..sp.n {
            let sampling = SamplingParams {
                seed: base.seed.wrapping_add(i as u64),
                ..base.clone()
            };
            let (gen, codec, prompt, stop) = (
                s.gen.clone(),
                s.codec.clone(),
                prompt.to_vec(),
                sp.stop.clone(),
            );
            set.spawn(async move {
                (
                    i,
                    generate(param, &gen, &codec, prompt, sampling, max_new, stop, None).await,
                )
            });
        }
        let mut out: Vec<Option<Completion>> = vec![None; sp.n];
        while let Some(r) = set.join_next().await {
            let (i, c) = r.map_err(|e| ApiError::status(500, format!("generation task: {e}")))?;
            out[i] = Some(c?);
        }
        Ok(out.into_iter().flatten().collect())
    }

    /// `POST /v1/completions` (standalone engine; a trajectory's calls go through chat or
    /// `/sample`).
    pub async fn completion(&self, traj: Option<&str>, body: &[u8]) -> Result<Body, ApiError> {
        let req = request::completion(body)?;
        if traj.is_some() {
            return Err(ApiError::bad_request(
                "trajectories are served by /v1/chat/completions and /sample; /v1/completions records nothing",
            ));
        }
        let s = self.served()?.clone();
        let (prompt, echo) = match &req.prompt {
            request::Prompt::Text(t) => (
                s.codec
                    .encode_text(t)
                    .map_err(|e| ApiError::bad_request(e.to_string()))?,
                t.clone(),
            ),
            request::Prompt::Ids(ids) => (
                ids.clone(),
                s.codec
                    .decode(ids)
                    .map_err(|e| ApiError::bad_request(e.to_string()))?,
            ),
        };
        if prompt.is_empty() {
            return Err(ApiError::field("prompt", "encodes to no tokens"));
        }
        let max_new = room(&s, prompt.len(), req.sampling.max_tokens.or(Some(16)))?;
        let mut choices = Vec::new();
        for c in self
            .sample_n("prompt", &s, &prompt, &req.sampling, max_new)
            .await?
        {
            let text = s
                .codec
                .decode(&c.tokens)
                .map_err(|e| ApiError::status(500, e.to_string()))?;
            let ended = c.finish != mtrl_model::FinishReason::Length
                && c.finish != mtrl_model::FinishReason::ContextFull;
            let reply = render::reply("", false, false, "");
            choices.push(choice(&s.codec, reply, text, ended, &c, req.logprobs)?);
        }
        let usage = Usage {
            prompt_tokens: prompt.len(),
            completion_tokens: choices.iter().map(|c| c.tokens.len()).sum(),
        };
        let id = format!("cmpl-{}", &new_id()[5..]);
        Ok(Body::Json(openai::completion(
            &id,
            &s.model,
            &choices,
            req.logprobs,
            req.echo.then_some(&echo[..]),
            &usage,
        )))
    }

    /// `POST /sample`: ids in, ids + log-probs + versions out; recorded when a trajectory is named.
    pub async fn sample(&self, traj: Option<&str>, body: &[u8]) -> Result<Body, ApiError> {
        let req = request::sample(body)?;
        let c = match traj {
            Some(t) => {
                let t0 = std::time::Instant::now();
                let (mut cap, _) = self.open(t).await?;
                let p = cap.prepare_ids(&req.input_ids, req.sampling.max_tokens)?;
                let sampling = cap.sampling(client_sampling(&req.sampling));
                let spec = cap.spec.clone();
                let c = generate(
                    "input_ids",
                    &spec.gen,
                    &spec.codec,
                    p.prompt.clone(),
                    sampling,
                    p.max_new_tokens,
                    Vec::new(),
                    Some(spec.session),
                )
                .await?;
                cap.record(p, &c, false, false, "")?;
                self.timed(t0);
                c
            }
            None => {
                let s = self.served()?.clone();
                let max_new = room(&s, req.input_ids.len(), req.sampling.max_tokens)?;
                let mut stops = req.stop_token_ids.clone();
                if stops.is_empty() {
                    stops = s.codec.stop_token_ids();
                }
                let g = GenerationRequest {
                    prompt: req.input_ids.clone(),
                    sampling: client_sampling(&req.sampling),
                    max_new_tokens: max_new,
                    stop_token_ids: stops,
                    stop_strings: Vec::new(),
                    session: None,
                };
                let mut c = submit("input_ids", &s.gen, g).await?;
                c.prompt.clear();
                c
            }
        };
        Ok(Body::Json(json!({
            "output_ids": c.tokens,
            "logprobs": c.logprobs,
            "versions": c.versions,
            "finish_reason": c.finish.as_str(),
        })))
    }
}

fn room(s: &Served, prompt: usize, asked: Option<usize>) -> Result<usize, ApiError> {
    let room = s.budgets.max_context_tokens.saturating_sub(prompt);
    if room == 0 {
        return Err(ApiError::bad_request(format!(
            "the prompt has {prompt} tokens; the context window is {}",
            s.budgets.max_context_tokens
        ))
        .with_code("context_length_exceeded"));
    }
    Ok(asked.unwrap_or(s.budgets.max_tokens_per_turn).min(room))
}

/// The client's sampling (OpenAI defaults: temperature 1, top-p 1; a random seed).
fn client_sampling(s: &Sampling) -> SamplingParams {
    SamplingParams {
        temperature: s.temperature.unwrap_or(1.0),
        top_p: s.top_p.unwrap_or(1.0),
        top_k: s.top_k.unwrap_or(0),
        seed: s.seed.unwrap_or_else(rand::random),
    }
}

#[allow(clippy::too_many_arguments)]
async fn generate(
    param: &'static str,
    gen: &GenClient,
    codec: &Arc<dyn ChatCodec>,
    prompt: Vec<u32>,
    sampling: SamplingParams,
    max_new: usize,
    stop_strings: Vec<String>,
    session: Option<u64>,
) -> Result<Completion, ApiError> {
    let req = GenerationRequest {
        prompt,
        sampling,
        max_new_tokens: max_new,
        stop_token_ids: codec.stop_token_ids(),
        stop_strings,
        session,
    };
    submit(param, gen, req).await
}

/// Runs `req` on the engine. A request the engine refuses to run is the client's error (400):
/// a prompt id outside the vocabulary blamed on `param` (the field the prompt came from), stop
/// strings on an engine without a tokenizer on `stop`. Anything else is the engine's (503).
async fn submit(
    param: &'static str,
    gen: &GenClient,
    req: GenerationRequest,
) -> Result<Completion, ApiError> {
    gen.generate(req).await.map_err(|e| match e {
        RolloutError::Engine(m) if m.starts_with("invalid argument") => {
            let param = if m.contains("stop string") {
                "stop"
            } else {
                param
            };
            ApiError::field(param, m).with_code("invalid_request")
        }
        e => ApiError::status(503, format!("the engine: {e}")),
    })
}

/// Text of a completion without its end-of-turn token; whether the message ended.
fn decode_body(codec: &Arc<dyn ChatCodec>, c: &Completion) -> Result<(String, bool), ApiError> {
    let (text, ended) = render::message_text(codec.as_ref(), &c.tokens)?;
    let stopped = matches!(c.finish, mtrl_model::FinishReason::StopString(_));
    Ok((text, ended || stopped))
}

fn choice(
    codec: &Arc<dyn ChatCodec>,
    reply: render::Reply,
    text: String,
    ended: bool,
    c: &Completion,
    logprobs: bool,
) -> Result<Choice, ApiError> {
    let pieces = if logprobs {
        c.tokens
            .iter()
            .map(|t| {
                codec
                    .decode(&[*t])
                    .map_err(|e| ApiError::status(500, e.to_string()))
            })
            .collect::<Result<_, _>>()?
    } else {
        Vec::new()
    };
    Ok(Choice {
        reply,
        text,
        ended,
        tokens: c.tokens.clone(),
        logprobs: c.logprobs.clone(),
        pieces,
    })
}
