//! `mtrl train --config FILE [--fresh] [--max-steps N]`: RL training with asynchronous rollouts
//! (`mtrl_train::train`); without `--config`, the default job (`mtrl demo`); with a config whose
//! `[warm_start]` warm-starts a pretrained model (no `model_config`), that whole job (teacher, SFT,
//! RL, evaluation). Prints the run's summary as JSON;
//! Ctrl-C / SIGTERM checkpoint and exit 0.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use mtrl_train::TrainOptions;

use super::demo::{self, DemoArgs};

#[derive(clap::Args, Debug)]
pub struct TrainArgs {
    /// The run's TOML config ([model], [data], [rollout], [algorithm], [train], [checkpoint], …).
    /// Without it, the default job runs: the embedded `configs/demo.toml` pipeline (warm start,
    /// RL, evaluation; see `mtrl demo`).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Start from scratch instead of resuming (with [warm_start]: also redo a finished SFT
    /// stage): earlier checkpoints and metrics in
    /// `checkpoint.dir` are moved into `previous-<unix time>/`, never deleted.
    #[arg(long)]
    pub fresh: bool,
    /// Stop after this step (the LR schedule still follows the config's length).
    #[arg(long)]
    pub max_steps: Option<u64>,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
}

pub fn run(args: &TrainArgs) -> Result<()> {
    let Some(path) = &args.config else {
        return demo::run(&DemoArgs {
            max_steps: args.max_steps,
            quiet: args.quiet,
            ..DemoArgs::default()
        });
    };
    let cfg = mtrl_core::Config::load(path)?;
    // A config that warm-starts a pretrained model is a whole job: teacher, SFT, RL, evaluation
    // (a from-scratch [warm_start] config is `mtrl demo`'s; here it trains RL from its [model]).
    if cfg.warm_start.as_ref().is_some_and(|w| w.scratch.is_none()) {
        return demo::run(&DemoArgs {
            config: Some(path.clone()),
            max_steps: args.max_steps,
            quiet: args.quiet,
            fresh: args.fresh,
            ..DemoArgs::default()
        });
    }
    // Under `mpirun` / `srun` this process is one data-parallel rank (MPI is set up here).
    let on_cuda = cfg
        .model
        .as_ref()
        .is_some_and(|m| m.device.starts_with("cuda"));
    let comm = mtrl_dist::init(&mtrl_dist::InitOptions {
        grad_reduce: cfg.distributed.grad_reduce.clone(),
        on_cuda,
        lora: cfg.lora.is_some(),
        timeout: Duration::from_secs_f64(cfg.distributed.timeout_s),
    })?;
    let lead = comm.rank() == 0;
    let opts = TrainOptions {
        fresh: args.fresh,
        max_steps: args.max_steps,
        progress: !args.quiet && lead,
        watch_signals: true,
        comm: comm.clone(),
        ..TrainOptions::default()
    };
    match mtrl_train::train(&cfg, opts) {
        Ok(s) => {
            if lead {
                println!("{}", s.to_json());
            }
            Ok(())
        }
        // One rank's failure ends the job: the others may be waiting in a collective.
        Err(e) if comm.world() > 1 => {
            eprintln!("error: rank {} of {}: {e}", comm.rank(), comm.world());
            comm.abort(1)
        }
        Err(e) => Err(e.into()),
    }
}
