//! `mtrl serve --model DIR` (the OpenAI-compatible policy endpoint with token capture) and
//! `mtrl serve-tools --config FILE` (the config's search tools over HTTP). Both print
//! `listening on http://ADDR` on stdout once bound and run until Ctrl-C / SIGTERM; the work is
//! `mtrl_train::serve`'s.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use mtrl_serve::HttpOptions;

use super::common::load_config;

/// Flags both servers share.
#[derive(clap::Args, Debug)]
pub struct HttpArgs {
    /// Address to listen on (a loopback address unless --allow-remote; port 0 = any free port).
    #[arg(long, default_value = "127.0.0.1:8000")]
    pub addr: String,
    /// Let --addr be a non-loopback address (other machines can then connect); needs --token.
    #[arg(long)]
    pub allow_remote: bool,
    /// Require `Authorization: Bearer <TOKEN>` (default: the MTRL_SERVE_TOKEN variable, else
    /// none). A live trajectory's id also authenticates the calls that name it (only those).
    #[arg(long)]
    pub token: Option<String>,
    /// Largest request body accepted, in bytes (larger ones get 413).
    #[arg(long, default_value_t = mtrl_serve::http::MAX_BODY_BYTES)]
    pub max_body_bytes: usize,
    /// Reading a request's body and serving it together may take this many seconds; then 408
    /// (body still arriving) or 504.
    #[arg(long, default_value_t = 600.0)]
    pub request_timeout_s: f64,
}

impl HttpArgs {
    fn options(&self) -> Result<HttpOptions> {
        anyhow::ensure!(
            self.request_timeout_s.is_finite() && self.request_timeout_s > 0.0,
            "--request-timeout-s must be > 0"
        );
        let token = self
            .token
            .clone()
            .or_else(|| std::env::var("MTRL_SERVE_TOKEN").ok())
            .filter(|t| !t.is_empty());
        // Hostnames are checked by the server once resolved; addresses here, naming the flags.
        if let Ok(addr) = self.addr.parse::<std::net::SocketAddr>() {
            anyhow::ensure!(
                addr.ip().is_loopback() || self.allow_remote,
                "--addr {} is not a loopback address: pass --allow-remote (and --token) to \
                 serve other machines",
                self.addr
            );
            anyhow::ensure!(
                addr.ip().is_loopback() || token.is_some(),
                "--allow-remote needs --token (or MTRL_SERVE_TOKEN): other machines would \
                 reach the server unauthenticated"
            );
        }
        Ok(HttpOptions {
            token,
            allow_remote: self.allow_remote,
            max_body_bytes: self.max_body_bytes,
            request_timeout: Duration::from_secs_f64(self.request_timeout_s),
            ..HttpOptions::default()
        })
    }
}

#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// Hugging Face checkpoint folder (e.g. `<checkpoint.dir>/step-N/policy`) or a `.gguf` file.
    #[arg(long)]
    pub model: PathBuf,
    /// A run config whose `[env]` budgets (max_turns, max_tokens_per_turn, max_context_tokens)
    /// apply to trajectories created with POST /trajectories, and whose `[model]` gives dtype,
    /// device and the fallback tokenizer.
    #[arg(long, short)]
    pub config: Option<PathBuf>,
    /// Tokenizer folder for checkpoints without one.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Sequences per decode step.
    #[arg(long, default_value_t = 64)]
    pub max_batch: usize,
    #[command(flatten)]
    pub http: HttpArgs,
}

#[derive(clap::Args, Debug)]
pub struct ServeToolsArgs {
    /// The run config whose `[search]` indexes and `[env]` tool settings are served.
    #[arg(long, short)]
    pub config: PathBuf,
    /// No index build progress on stderr.
    #[arg(long)]
    pub quiet: bool,
    #[command(flatten)]
    pub http: HttpArgs,
}

fn announce() -> Box<dyn FnOnce(std::net::SocketAddr) + Send> {
    Box::new(|addr| {
        let mut out = std::io::stdout();
        let _ = writeln!(out, "listening on http://{addr}");
        let _ = out.flush();
    })
}

pub fn run(args: &ServeArgs) -> Result<()> {
    let cfg = args
        .config
        .as_ref()
        .map(|c| load_config(Some(c)))
        .transpose()?;
    let (dtype, device, tokenizer) = match cfg.as_ref().and_then(|c| c.model.as_ref()) {
        Some(m) => (
            mtrl_model::parse_dtype(&m.dtype)?,
            mtrl_model::parse_device(&m.device)?,
            args.tokenizer.clone().or_else(|| m.tokenizer.clone()),
        ),
        None => (
            candle_core::DType::F32,
            candle_core::Device::Cpu,
            args.tokenizer.clone(),
        ),
    };
    if let Some(c) = &cfg {
        anyhow::ensure!(
            c.env_or_default().tool_calls == mtrl_core::config::ToolCallSyntax::Strict,
            "{}: env.tool_calls = \"tolerant\" is for the built-in search environment; `mtrl serve` \
             returns <tool_call> blocks as tool_calls and leaves other text to your agent",
            c.source.display()
        );
    }
    mtrl_train::serve::serve_policy(mtrl_train::serve::ServeOptions {
        model: args.model.clone(),
        tokenizer,
        dtype,
        device,
        env: cfg.as_ref().map(|c| c.env_or_default()).unwrap_or_default(),
        max_batch: args.max_batch,
        addr: args.http.addr.clone(),
        http: args.http.options()?,
        on_listen: announce(),
    })
    .with_context(|| format!("serving {}", args.model.display()))
}

pub fn run_tools(args: &ServeToolsArgs) -> Result<()> {
    let cfg = load_config(Some(&args.config))?;
    mtrl_train::serve::serve_tools(
        &cfg,
        &args.http.addr,
        args.http.options()?,
        args.quiet,
        announce(),
    )
    .with_context(|| format!("serving the tools of {}", args.config.display()))
}
