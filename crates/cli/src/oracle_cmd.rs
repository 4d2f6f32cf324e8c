//! `usermm oracle FILE…`: runs each scenario on the host kernel (real processes) and on the
//! engine, and prints every difference.

use anyhow::Context;

/// Arguments of `usermm oracle`.
#[derive(clap::Args, Debug)]
pub struct OracleArgs {
    /// Scenario files.
    #[arg(required = true)]
    pub files: Vec<String>,
    /// Set an engine tunable before each file runs (NAME=VALUE; repeatable). The host
    /// ignores it (except `thp_use_zero_page`, which is the host's `use_zero_page`).
    #[arg(long = "tunable", value_name = "NAME=VALUE")]
    pub tunables: Vec<String>,
    /// Print each statement with both outcomes as it runs.
    #[arg(short, long)]
    pub verbose: bool,
}

/// Runs the oracle; the exit code is 0 (all agreed and held), 1 (a difference or a failed
/// expectation) or 2 (a file could not be read, parsed or run, or the host cannot run the
/// oracle, e.g. not root).
pub fn oracle_main(args: &OracleArgs) -> anyhow::Result<u8> {
    let mut tunables = Vec::new();
    for t in &args.tunables {
        let (k, v) = t.split_once('=').context("--tunable takes NAME=VALUE")?;
        let mut probe = usermm::Tunables::default();
        probe
            .set(k, v)
            .map_err(|e| anyhow::anyhow!("--tunable {t}: {e}"))?;
        tunables.push((k.to_string(), v.to_string()));
    }
    let opts = oracle::CompareOptions {
        tunables,
        verbose: args.verbose,
    };
    Ok(oracle::run_files(&args.files, &opts))
}
