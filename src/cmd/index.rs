//! `mtrl index`: build or reuse both indexes of the configured corpus.

use std::path::PathBuf;

use anyhow::Result;

use mtrl_train::setup::open_index;

use super::common::load_config;

#[derive(clap::Args, Debug)]
pub struct IndexArgs {
    /// TOML config with a [search] section.
    #[arg(long, short)]
    pub config: PathBuf,
    /// Print the build report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &IndexArgs) -> Result<()> {
    let cfg = load_config(Some(&args.config))?;
    let (_, report) = open_index(&cfg, args.json)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        eprintln!("{report}");
        println!("index ready in {}", cfg.search()?.index_dir.display());
    }
    Ok(())
}
