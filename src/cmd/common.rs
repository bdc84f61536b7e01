//! Helpers shared by subcommands: config loading (the demo config is compiled in) and JSON
//! printing.

use std::path::{Path, PathBuf};

use anyhow::Result;
use mtrl_core::Config;

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

/// Prints `v` as pretty JSON on stdout.
pub fn print_pretty(v: &impl serde::Serialize) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}
