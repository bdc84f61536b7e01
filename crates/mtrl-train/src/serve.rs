//! `mtrl serve` (the policy endpoint on a checkpoint) and `mtrl serve-tools` (a config's search
//! tools), run until Ctrl-C / SIGTERM, then drained: the listener stops accepting and in-flight
//! calls finish before the engine stops. The drain is bounded: calls get the server's shutdown
//! grace (10 s), then the runtime is dropped without waiting more than [`EXIT_WAIT`] for a tool
//! call still running on its blocking pool.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use candle_core::{DType, Device};
use mtrl_core::{Config, EnvConfig};
use mtrl_model::Engine;
use mtrl_rollout::engine_thread::EngineThread;
use mtrl_serve::{Budgets, Gateway, HttpOptions, Served, Server, ToolService};

use crate::error::{Result, TrainError};
use crate::run::on_signal;

/// How `mtrl serve` runs.
pub struct ServeOptions {
    pub model: PathBuf,
    pub tokenizer: Option<PathBuf>,
    pub dtype: DType,
    pub device: Device,
    /// `[env]` budgets of created trajectories (defaults without a config).
    pub env: EnvConfig,
    pub max_batch: usize,
    pub addr: String,
    pub http: HttpOptions,
    /// Called with the bound address once the server listens.
    pub on_listen: Box<dyn FnOnce(std::net::SocketAddr) + Send>,
}

/// How long a stopping server waits for blocking work (a tool call) past the drain.
pub const EXIT_WAIT: Duration = Duration::from_secs(1);

fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?)
}

/// Serves the policy at `opts.model` until a signal.
pub fn serve_policy(opts: ServeOptions) -> Result<()> {
    let (policy, codec) = mtrl_eval::load_model(
        &opts.model,
        opts.tokenizer.as_deref(),
        opts.dtype,
        &opts.device,
    )?;
    let window = policy.config().max_position_embeddings;
    // The engine gets the tokenizer too: a client's `stop` strings are matched on decoded text
    // (without it every call with `stop` was refused as an engine failure).
    let model_dir = mtrl_model::gguf::checkpoint_dir(&opts.model)?;
    let tok_dir = match &opts.tokenizer {
        Some(t) if !model_dir.join("tokenizer.json").is_file() => t.as_path(),
        _ => model_dir.as_path(),
    };
    let tokenizer = Arc::new(mtrl_model::Tokenizer::from_dir(tok_dir)?);
    let engine = EngineThread::spawn(Engine::new(policy, Some(tokenizer), 0, opts.max_batch)?)?;
    let model = opts
        .model
        .canonicalize()
        .ok()
        .and_then(|p| {
            let name =
                |p: &std::path::Path| p.file_name().map(|n| n.to_string_lossy().into_owned());
            // `…/step-N/policy` is named after its step folder.
            match name(&p).as_deref() {
                Some("policy") => p.parent().and_then(name),
                n => n.map(str::to_string),
            }
        })
        .unwrap_or_else(|| "mtrl".into());
    let served = Served {
        gen: engine.client.clone(),
        codec,
        model,
        budgets: Budgets {
            max_turns: opts.env.max_turns,
            max_tokens_per_turn: opts.env.max_tokens_per_turn,
            max_context_tokens: opts.env.max_context_tokens.min(window),
        },
        version: engine.stats.clone(),
    };
    let gateway = Arc::new(Gateway::new(Some(served)));
    let rt = runtime()?;
    let server = rt.block_on(Server::start(&opts.addr, gateway, opts.http))?;
    (opts.on_listen)(server.addr);
    let stop = server.stopper();
    let _signals = on_signal(move || stop.cancel());
    let served = rt.block_on(server.wait());
    rt.shutdown_timeout(EXIT_WAIT);
    let stopped = engine.shutdown();
    served?;
    stopped?;
    Ok(())
}

/// Serves `cfg`'s tools (`[search]` indexes, `[env]` settings) until a signal.
pub fn serve_tools(
    cfg: &Config,
    addr: &str,
    http: HttpOptions,
    quiet: bool,
    on_listen: Box<dyn FnOnce(std::net::SocketAddr) + Send>,
) -> Result<()> {
    let (index, report) = crate::setup::open_index(cfg, quiet)?;
    if !quiet {
        eprintln!("{report}");
    }
    let env = cfg.env_or_default();
    let tools = mtrl_env::standard_tools(&env, Arc::new(index));
    let system = env
        .system_prompt
        .clone()
        .unwrap_or_else(|| mtrl_env::prompt::default_system_prompt(env.max_turns, env.final_k));
    let service = Arc::new(ToolService::new(tools, &env, system));
    let rt = runtime()?;
    let server = rt
        .block_on(Server::start(addr, service, http))
        .map_err(|e| TrainError::msg(e.to_string()))?;
    on_listen(server.addr);
    let stop = server.stopper();
    let _signals = on_signal(move || stop.cancel());
    let served = rt.block_on(server.wait());
    rt.shutdown_timeout(EXIT_WAIT);
    Ok(served?)
}
