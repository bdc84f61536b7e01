//! `mtrl plot RUN_DIR [--out DIR]`: the run's training figure as PNG (drawn by
//! `mtrl_eval::plot`); prints the paths written.

use std::path::PathBuf;

use anyhow::Result;

#[derive(clap::Args, Debug)]
pub struct PlotArgs {
    /// The run folder (`checkpoint.dir`: `metrics.jsonl`, and `eval/*.json` when present).
    pub run_dir: PathBuf,
    /// Where to write the PNG files (default: `RUN_DIR/plots`).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

pub fn run(args: &PlotArgs) -> Result<()> {
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| args.run_dir.join("plots"));
    for p in mtrl_eval::plot::plot_run(&args.run_dir, &out)? {
        println!("{}", p.display());
    }
    Ok(())
}
