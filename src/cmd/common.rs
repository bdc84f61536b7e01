//! Helpers shared by subcommands: config loading, the progress bar, opening the search index.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use mtrl_core::Config;
use mtrl_search::index::{BuildReport, Progress};
use mtrl_search::SearchIndex;

/// The demo config, compiled into the binary so `mtrl` runs with no arguments. Its relative paths
/// are resolved against the source tree's `configs/` folder.
pub const DEMO_CONFIG: &str = include_str!("../../configs/demo.toml");

pub fn load_config(path: Option<&Path>) -> Result<Config> {
    match path {
        Some(p) => Ok(Config::load(p)?),
        None => {
            let origin = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/configs/demo.toml"));
            Ok(Config::from_toml_str(DEMO_CONFIG, &origin)?)
        }
    }
}

/// An indicatif bar on stderr (hidden when stderr is not a terminal or when `quiet`).
pub struct Bar {
    bar: Option<ProgressBar>,
    quiet: bool,
}

impl Bar {
    pub fn new(quiet: bool) -> Bar {
        Bar { bar: None, quiet }
    }
}

impl Progress for Bar {
    fn start(&mut self, stage: &str, total: u64) {
        if self.quiet {
            return;
        }
        let bar = ProgressBar::new(total);
        bar.set_style(
            ProgressStyle::with_template("{msg:>14} [{bar:40}] {pos}/{len} {per_sec} eta {eta}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        bar.set_message(stage.to_string());
        bar.enable_steady_tick(Duration::from_millis(200));
        self.bar = Some(bar);
    }

    fn set(&mut self, done: u64) {
        if let Some(b) = &self.bar {
            b.set_position(done);
        }
    }

    fn finish(&mut self) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
    }
}

/// Opens (building as needed) the index of the config's `[search]` section.
pub fn open_index(cfg: &Config, quiet: bool) -> Result<(SearchIndex, BuildReport)> {
    let search = cfg.search()?;
    let mut bar = Bar::new(quiet);
    SearchIndex::open_or_build(search, &mut bar)
        .with_context(|| format!("cannot open the search index for {}", cfg.source.display()))
}

/// Human summary of an index build on stderr.
pub fn print_build_report(r: &BuildReport) {
    eprintln!(
        "corpus {}: {} documents, embedder {}",
        r.corpus.display(),
        r.docs,
        r.embedder
    );
    if r.ingest.skipped > 0 {
        eprintln!(
            "  skipped {} bad rows (skip_bad_rows = true):",
            r.ingest.skipped
        );
        for (line, why) in &r.ingest.examples {
            eprintln!("    line {line}: {why}");
        }
    }
    for p in &r.parts {
        match &p.reason {
            None => eprintln!("  {:<10} reused", p.part),
            Some(why) => eprintln!("  {:<10} built in {:.2}s ({why})", p.part, p.seconds),
        }
    }
}
