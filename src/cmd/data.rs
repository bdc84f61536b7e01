//! `mtrl data prepare`: corpus + train/validation/test task files for collections
//! (`mtrl_train::data`), one folder per config name under `--out`.

use std::path::{Path, PathBuf};

use anyhow::Result;
use mtrl_train::data::PrepareOptions;

use super::common::load_config;

#[derive(clap::Subcommand, Debug)]
pub enum DataCommand {
    /// Write corpus + train/validation/test task files for collections.
    #[command(after_help = super::examples::DATA_PREPARE)]
    Prepare(PrepareArgs),
}

#[derive(clap::Args, Debug)]
pub struct PrepareArgs {
    /// Collection configs (repeatable); default: the bundled cranfield, vaswani and musique
    /// `-hash` configs.
    #[arg(long, short)]
    pub config: Vec<PathBuf>,
    /// Output folder (one subfolder per config name).
    #[arg(long, default_value = "runs/data")]
    pub out: PathBuf,
    /// Share of the judged queries held out as the test split.
    #[arg(long, default_value_t = 0.2)]
    pub test_fraction: f64,
    /// Share of the judged queries held out as the validation split.
    #[arg(long, default_value_t = 0.1)]
    pub validation_fraction: f64,
    /// Seed of the split (the same seed gives the same split).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Task file format: jsonl, parquet, csv or json.
    #[arg(long, default_value = "jsonl")]
    pub format: String,
}

pub fn run(cmd: &DataCommand) -> Result<()> {
    let DataCommand::Prepare(a) = cmd;
    let opts = PrepareOptions {
        test_fraction: a.test_fraction,
        validation_fraction: a.validation_fraction,
        seed: a.seed,
        format: a.format.clone(),
    };
    let configs = if a.config.is_empty() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("configs");
        ["cranfield-hash", "vaswani-hash", "musique-hash"]
            .iter()
            .map(|n| root.join(format!("{n}.toml")))
            .collect()
    } else {
        a.config.clone()
    };
    for path in &configs {
        let cfg = load_config(Some(path))?;
        println!(
            "{}",
            mtrl_train::data::prepare(&cfg, &a.out.join(&cfg.name), &opts)?
        );
    }
    Ok(())
}
