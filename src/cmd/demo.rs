//! `mtrl demo` (and `mtrl` with no command): the default job of `mtrl_train::demo` on the
//! embedded `configs/demo.toml` (or `--config`); prints the evaluation table, the curves and the
//! report's path.

use std::path::PathBuf;

use anyhow::Result;
use mtrl_train::demo::DemoOptions;

use super::common::load_config;

#[derive(clap::Args, Debug)]
pub struct DemoArgs {
    /// Use this config instead of the embedded demo config.
    #[arg(long, short)]
    pub config: Option<PathBuf>,
    /// Stop RL after this step (a shorter run; CI uses it).
    #[arg(long)]
    pub max_steps: Option<u64>,
    /// No progress bars.
    #[arg(long)]
    pub quiet: bool,
    /// pass@k's k (sampled attempts per test task) of the final evaluation; 0: greedy only.
    #[arg(long, default_value_t = 4)]
    pub eval_k: usize,
    /// Evaluate on at most this many test tasks.
    #[arg(long)]
    pub eval_limit: Option<usize>,
}

impl Default for DemoArgs {
    fn default() -> Self {
        DemoArgs {
            config: None,
            max_steps: None,
            quiet: false,
            eval_k: 4,
            eval_limit: None,
        }
    }
}

pub fn run(args: &DemoArgs) -> Result<()> {
    let cfg = load_config(args.config.as_deref())?;
    let opts = DemoOptions {
        max_steps: args.max_steps,
        progress: !args.quiet,
        eval_k: args.eval_k,
        eval_limit: args.eval_limit,
        watch_signals: true,
        ..DemoOptions::default()
    };
    let out = mtrl_train::demo::run(&cfg, &opts)?;
    println!("{}", out.report.markdown());
    for p in &out.plots {
        println!("curves: {}", p.display());
    }
    println!(
        "report: {}  (total {:.0} s)",
        out.report_dir.join("eval.md").display(),
        out.total_s
    );
    Ok(())
}
