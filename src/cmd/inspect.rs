//! `mtrl inspect RUN_DIR [--step S] [--failed] [--worst N] [--task ID] [--compare A B]`: a run's
//! trajectories in the terminal (rendering lives in `mtrl_eval::inspect`).
//!
//! Without a filter it prints one line per step (count, reward, nDCG@10, failures, turns); with
//! one, the matching trajectories turn by turn; `--compare A B` shows each task at two steps.

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::Result;
use mtrl_eval::inspect::{self, Query, Style};
use mtrl_eval::trajlog::{read_run, At, Kind};

#[derive(clap::Args, Debug)]
pub struct InspectArgs {
    /// The run folder (`checkpoint.dir`; logs in its `trajectories/`, evaluations' in `eval/`).
    pub run_dir: PathBuf,
    /// Only this training step (a number) or evaluation label.
    #[arg(long)]
    pub step: Option<String>,
    /// Only training (`train`) or evaluation (`eval`) trajectories.
    #[arg(long, value_parser = ["train", "eval"])]
    pub kind: Option<String>,
    /// Only failed episodes.
    #[arg(long)]
    pub failed: bool,
    /// The N lowest-reward trajectories, worst first.
    #[arg(long, value_name = "N")]
    pub worst: Option<usize>,
    /// Only this task id.
    #[arg(long, value_name = "ID")]
    pub task: Option<String>,
    /// The same tasks at two steps (or evaluation labels), side by side.
    #[arg(long, num_args = 2, value_names = ["STEP_A", "STEP_B"])]
    pub compare: Option<Vec<String>>,
    /// Show at most this many trajectories (with --compare: tasks).
    #[arg(long, default_value_t = 20)]
    pub limit: usize,
    /// Whole messages (system prompt, tool responses) instead of cut ones.
    #[arg(long)]
    pub full: bool,
    /// ANSI colours: auto (when stdout is a terminal and NO_COLOR is unset), always, never.
    #[arg(long, default_value = "auto", value_parser = ["auto", "always", "never"])]
    pub color: String,
}

pub fn run(args: &InspectArgs) -> Result<()> {
    let log = read_run(&args.run_dir)?;
    let color = match args.color.as_str() {
        "always" => true,
        "never" => false,
        _ => std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none(),
    };
    let style = Style {
        color,
        full: args.full,
    };
    if let Some(pair) = &args.compare {
        let (a, b) = (At::parse(&pair[0]), At::parse(&pair[1]));
        let text = inspect::compare(&log, &a, &b, args.task.as_deref(), args.limit, &style)?;
        print!("{text}");
        return Ok(());
    }
    let query = Query {
        step: args.step.as_deref().map(At::parse),
        kind: args.kind.as_deref().map(|k| match k {
            "eval" => Kind::Eval,
            _ => Kind::Train,
        }),
        task: args.task.clone(),
        failed: args.failed,
        worst: args.worst,
    };
    if query.is_empty() {
        print!("{}", inspect::summary(&log, &style));
        return Ok(());
    }
    let selected = inspect::select(&log, &query);
    if selected.is_empty() {
        println!(
            "no trajectory matches (logged: {})",
            inspect::describe_steps(&log)
        );
        return Ok(());
    }
    print!("{}", inspect::render_all(&selected, args.limit, &style));
    Ok(())
}
