//! `mtrl search`: ranked hits of one tool for a query.

use std::path::PathBuf;

use anyhow::{Context, Result};

use mtrl_train::setup::open_index;

use super::common::load_config;

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tool {
    Bm25,
    Vector,
}

impl Tool {
    pub fn name(self) -> &'static str {
        match self {
            Tool::Bm25 => "bm25",
            Tool::Vector => "vector",
        }
    }
}

#[derive(clap::Args, Debug)]
pub struct SearchArgs {
    /// TOML config with a [search] section (indexes built on first use).
    #[arg(long, short)]
    pub config: PathBuf,
    /// Which tool answers.
    #[arg(long, value_enum, default_value_t = Tool::Bm25)]
    pub tool: Tool,
    /// Number of hits.
    #[arg(short, long, default_value_t = 10)]
    pub k: usize,
    /// Print the hits as JSON.
    #[arg(long)]
    pub json: bool,
    /// The query text (any text: it is searched as plain terms).
    pub query: String,
}

pub fn run(args: &SearchArgs) -> Result<()> {
    let cfg = load_config(Some(&args.config))?;
    let (index, _) = open_index(&cfg, true)?;
    let tool = index.retriever(args.tool.name()).context("unknown tool")?;
    let hits = tool.search(&args.query, args.k)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&hits)?);
        return Ok(());
    }
    if hits.is_empty() {
        println!("no hits");
    }
    for (i, h) in hits.iter().enumerate() {
        println!("{:>3}. [{}] {:.4}  {}", i + 1, h.doc_id, h.score, h.title);
        println!("     {}", h.snippet);
    }
    Ok(())
}
