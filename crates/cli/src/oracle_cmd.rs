//! `usermm oracle FILE…`: runs each scenario on the host kernel (real processes) and on the
//! engine, and prints every difference. `usermm oracle --restore-knobs` only puts back the
//! THP knobs a killed run left changed (from its journal in the lock directory).
//!
//! Environment: `USERMM_LOCK_DIR` overrides the lock directory (default `/run/lock/usermm`)
//! and `USERMM_THP_DIR` the THP knob directory (default
//! `/sys/kernel/mm/transparent_hugepage`); see `oracle::knobs`.

use anyhow::Context;

/// Arguments of `usermm oracle`.
#[derive(clap::Args, Debug)]
pub struct OracleArgs {
    /// Scenario files.
    #[arg(required_unless_present = "restore_knobs")]
    pub files: Vec<String>,
    /// Only restore the THP knobs a killed oracle run (or benchmark) left changed, from the
    /// journal it keeps in the lock directory, report what was done, and exit.
    #[arg(long, conflicts_with = "files")]
    pub restore_knobs: bool,
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
    if args.restore_knobs {
        return restore_knobs();
    }
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

/// `--restore-knobs`: takes the oracle lock, restores from a journal if there is one, and
/// says what it did; exit code 0 (errors, e.g. not root or an unsafe lock directory, are 2).
fn restore_knobs() -> anyhow::Result<u8> {
    if oracle::sys::geteuid() != 0 {
        return Err(oracle::HostError::NotRoot.into());
    }
    let journal = oracle::knobs::journal_path();
    match oracle::knobs::recover()? {
        None => println!(
            "no THP knob journal at {}: no killed run left knobs to restore",
            journal.display()
        ),
        Some(rec) => {
            println!("{}", rec.note().trim_start_matches("usermm: "));
            for (path, value) in &rec.restored {
                println!("  {} = {value}", path.display());
            }
            for why in &rec.ignored {
                println!("  ignored {why}");
            }
            println!("removed {}", rec.journal.display());
        }
    }
    Ok(0)
}
