//! Teacher forcing: the token ids a text-mode conversation (a scripted or logged trajectory) would
//! have had in a token-mode episode, with a loss mask on the assistant's messages — the training
//! rows of supervised fine-tuning.
//!
//! The ids are built the way a token-mode episode builds them (see `search_env`): the prompt from
//! [`ChatCodec::encode_prompt`], each assistant message as its raw text followed by the codec's
//! first stop id (`<|im_end|>`), and each run of tool messages from
//! [`ChatCodec::encode_tool_turn`]. So a policy fine-tuned on these rows sees, at rollout time,
//! exactly the context shapes it was trained on. Tool messages after the last assistant message
//! are dropped (nothing follows them to learn).

use mtrl_core::chat::Role;
use mtrl_core::{ChatCodec, Message};
use serde_json::Value;

use crate::error::{EnvError, Result};

/// One supervised row: ids and a 0/1 mask (1 on assistant-written ids, end-of-turn id included).
#[derive(Debug, Clone, PartialEq)]
pub struct SupervisedRow {
    pub tokens: Vec<u32>,
    pub loss_mask: Vec<u8>,
}

fn codec_err(e: impl std::fmt::Display) -> EnvError {
    EnvError::Agent(format!("tokenizing a transcript: {e}"))
}

/// The row of `messages` under `codec` with the tool schemas `tools`.
pub fn tokenize_transcript(
    codec: &dyn ChatCodec,
    messages: &[Message],
    tools: &[Value],
) -> Result<SupervisedRow> {
    let stop = *codec
        .stop_token_ids()
        .first()
        .ok_or_else(|| codec_err("the codec has no end-of-turn id"))?;
    let first = messages
        .iter()
        .position(|m| m.role == Role::Assistant)
        .ok_or_else(|| codec_err("the conversation has no assistant message"))?;
    let mut row = SupervisedRow {
        tokens: codec
            .encode_prompt(&messages[..first], tools)
            .map_err(codec_err)?,
        loss_mask: Vec::new(),
    };
    row.loss_mask = vec![0; row.tokens.len()];
    let mut i = first;
    while i < messages.len() {
        let mut ids = codec.encode_text(&messages[i].content).map_err(codec_err)?;
        ids.push(stop);
        row.loss_mask.extend(std::iter::repeat_n(1, ids.len()));
        row.tokens.extend(ids);
        let next = messages[i + 1..]
            .iter()
            .position(|m| m.role == Role::Assistant)
            .map(|p| i + 1 + p);
        let Some(j) = next else { break };
        let glue = codec
            .encode_tool_turn(&messages[..=i], &messages[i + 1..j], tools)
            .map_err(codec_err)?;
        row.loss_mask.extend(std::iter::repeat_n(0, glue.len()));
        row.tokens.extend(glue);
        i = j;
    }
    Ok(row)
}
