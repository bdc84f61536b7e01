//! `mtrl selftest`: the model's golden checks on a device (`mtrl_train::selftest`), one JSON line
//! per check and a summary line; exits non-zero when any check fails. For machines that have the
//! binary but no cargo (the GPU machine).

use std::path::PathBuf;

use anyhow::Result;
use mtrl_train::selftest::SelftestOptions;

#[derive(clap::Args, Debug)]
pub struct SelftestArgs {
    /// The fixtures folder (holds tiny-qwen3/, tiny-qwen2/ and golden/).
    #[arg(long, default_value = "tests/fixtures")]
    pub fixtures: PathBuf,
    /// cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Fixture models to check (those present by default).
    #[arg(long, value_delimiter = ',')]
    pub kinds: Vec<String>,
    /// Skip the bf16 agreement checks.
    #[arg(long)]
    pub no_bf16: bool,
    /// Only print how this binary was built (version, cuda feature) as JSON and exit.
    #[arg(long)]
    pub build_info: bool,
}

pub fn run(args: &SelftestArgs) -> Result<()> {
    if args.build_info {
        println!("{}", mtrl_train::selftest::build_info());
        return Ok(());
    }
    let opts = SelftestOptions {
        fixtures: args.fixtures.clone(),
        device: args.device.clone(),
        kinds: args.kinds.clone(),
        bf16: !args.no_bf16,
    };
    mtrl_train::selftest::run(&opts, &mut |v| println!("{v}"))?;
    Ok(())
}
