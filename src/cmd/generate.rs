//! `mtrl generate`: sample from a policy checkpoint, from text (optionally through the chat
//! template) or from raw token ids; `--json` prints the new ids with their log-probs.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use mtrl_model::{ChatOptions, Engine, GenerationRequest, Policy, SamplingParams, Tokenizer};

#[derive(clap::Args, Debug)]
pub struct GenerateArgs {
    /// Hugging Face checkpoint folder (config.json, *.safetensors, tokenizer.json …) or a
    /// Qwen2/Qwen3 `.gguf` file (converted once into a folder beside it).
    #[arg(long)]
    pub model: PathBuf,
    /// Wrap the prompt as one user message in the checkpoint's chat template.
    #[arg(long)]
    pub chat: bool,
    /// Maximum number of new tokens.
    #[arg(long, default_value_t = 256)]
    pub max_new_tokens: usize,
    /// Sampling temperature; 0 = greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f64,
    /// Nucleus sampling mass (1 = off).
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f64,
    /// Top-k sampling (0 = off).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// RNG seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Comma-separated prompt token ids instead of text.
    #[arg(long, value_delimiter = ',')]
    pub prompt_ids: Option<Vec<u32>>,
    /// Print one JSON object with the new token ids and their log-probs.
    #[arg(long)]
    pub json: bool,
    /// cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// f32, bf16 or f16.
    #[arg(long, default_value = "f32")]
    pub dtype: String,
    /// The prompt text.
    pub prompt: Option<String>,
}

/// The prompt's ids: `--prompt-ids`, or the text encoded (through the chat template with
/// `--chat`).
fn prompt_ids(args: &GenerateArgs, tokenizer: Option<&Arc<Tokenizer>>) -> Result<Vec<u32>> {
    Ok(match (&args.prompt_ids, &args.prompt) {
        (Some(ids), None) => ids.clone(),
        (None, Some(text)) => {
            let tok =
                tokenizer.context("the model folder has no tokenizer.json; pass --prompt-ids")?;
            if args.chat {
                let msgs = serde_json::json!([{"role": "user", "content": text}]);
                let opts = ChatOptions {
                    add_generation_prompt: true,
                    enable_thinking: None,
                };
                tok.encode_chat(&msgs, None::<&serde_json::Value>, opts)?
            } else {
                tok.encode(text)?
            }
        }
        (Some(_), Some(_)) => bail!("give either a prompt text or --prompt-ids, not both"),
        (None, None) => bail!("give a prompt text or --prompt-ids"),
    })
}

/// End-of-sequence ids of the checkpoint's generation config, model config and tokenizer.
fn stop_ids(policy: &Policy, tokenizer: Option<&Arc<Tokenizer>>) -> Vec<u32> {
    let mut stop: Vec<u32> = policy.generation_config().eos_token_ids.clone();
    stop.extend(policy.config().eos_token_ids.iter().copied());
    if let Some(id) = tokenizer.and_then(|t| t.eos_token_id()) {
        stop.push(id);
    }
    stop.sort_unstable();
    stop.dedup();
    stop
}

pub fn run(args: &GenerateArgs) -> Result<()> {
    let device = mtrl_model::parse_device(&args.device)?;
    let dtype = mtrl_model::parse_dtype(&args.dtype)?;
    let policy = Policy::load(&args.model, dtype, &device)
        .with_context(|| format!("loading model from {}", args.model.display()))?;
    // A `.gguf` model was converted into a folder by the load above.
    let dir = mtrl_model::gguf::checkpoint_dir(&args.model)?;
    let tokenizer = if dir.join("tokenizer.json").exists() {
        let t = Tokenizer::from_dir(&dir)?;
        t.check_vocab(policy.config().vocab_size)?;
        Some(Arc::new(t))
    } else {
        None
    };
    let prompt = prompt_ids(args, tokenizer.as_ref())?;
    let req = GenerationRequest {
        prompt: prompt.clone(),
        sampling: SamplingParams {
            temperature: args.temperature,
            top_p: args.top_p,
            top_k: args.top_k,
            seed: args.seed,
        },
        max_new_tokens: args.max_new_tokens,
        stop_token_ids: stop_ids(&policy, tokenizer.as_ref()),
        stop_strings: vec![],
        session: None,
    };
    let mut engine = Engine::new(policy, tokenizer.clone(), 0, 1)?;
    let Some(c) = engine.generate(vec![req])?.into_iter().next() else {
        bail!("the engine returned no completion")
    };
    let text = match &tokenizer {
        Some(t) => Some(t.decode(&c.tokens, false)?),
        None => None,
    };
    if args.json {
        let out = serde_json::json!({
            "prompt_ids": prompt,
            "token_ids": c.tokens,
            "logprobs": c.logprobs,
            "finish_reason": c.finish.as_str(),
            "text": text,
        });
        println!("{out}");
        return Ok(());
    }
    match text {
        Some(t) => println!("{t}"),
        None => println!("{:?}", c.tokens),
    }
    Ok(())
}
