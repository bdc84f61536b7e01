//! The default job (`mtrl` with no command): index the bundled collection named by the embedded
//! demo config and print the retrieval baselines of both tools. Later stages (training and
//! evaluation of a policy) extend this job.

use std::path::PathBuf;

use anyhow::{Context, Result};

use super::common::{load_config, open_index, print_build_report};
use super::search_eval::{evaluate, print_table};

#[derive(clap::Args, Debug, Default)]
pub struct DemoArgs {
    /// Use this config instead of the embedded demo config.
    #[arg(long, short)]
    pub config: Option<PathBuf>,
}

pub fn run(args: &DemoArgs) -> Result<()> {
    let cfg = load_config(args.config.as_deref())?;
    eprintln!("mtrl demo: config {}", cfg.source.display());
    let (index, build) = open_index(&cfg, false)?;
    print_build_report(&build);
    let eval = cfg
        .search()?
        .eval
        .as_ref()
        .with_context(|| format!("{} has no [search.eval] section", cfg.source.display()))?;
    let report = evaluate(&cfg, &index, &eval.queries, &eval.qrels)?;
    println!();
    print_table(&report);
    Ok(())
}
