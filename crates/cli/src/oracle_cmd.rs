//! `usermm oracle FILE…`: runs each scenario on the host kernel (real processes) and on the
//! engine, and prints every difference. `usermm oracle --restore-knobs` only puts back the
//! THP knobs a killed run left changed and removes the swap file and memory cgroup it added
//! for `set swap`/`set memory` (from its journals in the lock directory).
//!
//! Environment: `USERMM_LOCK_DIR` overrides the lock directory (default `/run/lock/usermm`)
//! and `USERMM_THP_DIR` the THP knob directory (default
//! `/sys/kernel/mm/transparent_hugepage`); see `oracle::knobs`.

use crate::test_report::{junit, tap, TestPoint};
use anyhow::Context;

/// Arguments of `usermm oracle`.
#[derive(clap::Args, Debug)]
pub struct OracleArgs {
    /// Scenario files.
    #[arg(required_unless_present_any = ["restore_knobs", "observables"])]
    pub files: Vec<String>,
    /// Only list what the oracle compares after each statement (and what it leaves out,
    /// with the reason), then exit; `--format json` gives the list as JSON.
    #[arg(long, conflicts_with_all = ["files", "restore_knobs"])]
    pub observables: bool,
    /// Only restore the THP knobs a killed oracle run (or benchmark) left changed, and remove
    /// the swap file and memory cgroup it added (`set swap`, `set memory`), from the journals
    /// it keeps in the lock directory; report what was done, and exit.
    #[arg(long, conflicts_with = "files")]
    pub restore_knobs: bool,
    /// Set an engine tunable before each file runs (NAME=VALUE; repeatable). The host
    /// ignores it (except `thp_use_zero_page`, which is the host's `use_zero_page`).
    #[arg(long = "tunable", value_name = "NAME=VALUE")]
    pub tunables: Vec<String>,
    /// Compare the processes' state (VMAs, smaps, status, pages) only after every N
    /// statements that may change an address space, before each exit and at the end, not
    /// after each (outcomes and expectations are still compared at every statement): for
    /// long trace exports, whose full observation is linear in their mapped pages.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub observe_every: usize,
    /// Print each statement with both outcomes as it runs.
    #[arg(short, long)]
    pub verbose: bool,
    /// Output format: text (default: one line per difference and a summary per file), json
    /// (one document for all files, docs/cli-json.md), tap or junit (one test per file).
    #[arg(long, value_enum, default_value_t = crate::run_cmd::Format::Text)]
    pub format: crate::run_cmd::Format,
}

/// Runs the oracle; the exit code is 0 (all agreed and held), 1 (a difference or a failed
/// expectation) or 2 (a file could not be read, parsed or run, or the host cannot run the
/// oracle, e.g. not root).
pub fn oracle_main(args: &OracleArgs) -> anyhow::Result<u8> {
    if args.restore_knobs {
        return restore_knobs();
    }
    if args.observables {
        return print_observables(args.format);
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
        observe_every: args.observe_every,
    };
    use crate::run_cmd::Format;
    if args.format == Format::Text {
        return Ok(oracle::run_files(&args.files, &opts));
    }
    let mut files = Vec::new();
    let code = oracle::run_files_each(&args.files, &opts, |outcome| {
        files.push(FileResult::from(outcome));
    });
    match args.format {
        Format::Json => {
            let doc = serde_json::json!({
                "exit_code": code,
                "files": files.iter().map(FileResult::json).collect::<Vec<_>>(),
            });
            println!("{}", serde_json::to_string_pretty(&doc)?);
        }
        Format::Tap => print!("{}", tap(&points(&files))),
        Format::Junit => print!("{}", junit("usermm oracle", &points(&files))),
        Format::Text => {}
    }
    Ok(code)
}

/// `--observables`: one line per observable (`=` compared, `-` not), or a JSON array.
fn print_observables(format: crate::run_cmd::Format) -> anyhow::Result<u8> {
    let list = oracle::observables();
    if format == crate::run_cmd::Format::Json {
        let doc: Vec<_> = list
            .iter()
            .map(|o| serde_json::json!({"name": o.name, "compared": o.compared, "how": o.how}))
            .collect();
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        for o in &list {
            let mark = if o.compared { "=" } else { "-" };
            println!("{mark} {:<33} {}", o.name, o.how);
        }
    }
    Ok(0)
}

/// One file's outcome, owned (the report only lives during the callback), for JSON and TAP.
struct FileResult {
    file: String,
    exit_code: u8,
    /// The report, or the read/parse error.
    report: Result<oracle::OracleReport, String>,
}

impl From<oracle::FileOutcome<'_>> for FileResult {
    fn from(o: oracle::FileOutcome<'_>) -> FileResult {
        match o {
            oracle::FileOutcome::Report(r) => FileResult {
                file: r.file.clone(),
                exit_code: r.exit_code(),
                report: Ok(r.clone()),
            },
            oracle::FileOutcome::Error { file, message } => FileResult {
                file: file.to_string(),
                exit_code: 2,
                report: Err(message),
            },
        }
    }
}

impl FileResult {
    /// The file as JSON: every difference, failed expectation, skip and error.
    fn json(&self) -> serde_json::Value {
        let r = match &self.report {
            Err(message) => {
                return serde_json::json!({
                    "file": self.file,
                    "exit_code": self.exit_code,
                    "status": "not run",
                    "error": message.trim_end(),
                })
            }
            Ok(r) => r,
        };
        let at = |line: &u32, message: &str| serde_json::json!({"line": line, "message": message});
        serde_json::json!({
            "file": self.file,
            "exit_code": self.exit_code,
            "status": match self.exit_code { 0 => "ok", 1 => "different", _ => "not run" },
            "statements": r.statements,
            "differences": r.differences.iter().map(|d| serde_json::json!({
                "line": d.line,
                "process": d.process,
                "field": d.field,
                "engine": d.engine,
                "host": d.host,
            })).collect::<Vec<_>>(),
            "expect_failures": r.expect_failures.iter().map(|(line, side, m)| serde_json::json!({
                "line": line,
                "side": side,
                "message": m,
            })).collect::<Vec<_>>(),
            "failed": r.failed.as_ref().map(|(l, m)| at(l, m)),
            "skipped": r.skipped.iter().map(|(l, m)| at(l, m)).collect::<Vec<_>>(),
            "cannot_run": r.cannot_run.as_ref().map(|(l, m)| at(l, m)),
        })
    }

    /// Its problems, one line each, as the text format prints them.
    fn messages(&self) -> Vec<String> {
        match &self.report {
            Err(message) => message.trim_end().lines().map(str::to_string).collect(),
            Ok(r) => r
                .to_string()
                .lines()
                .filter(|l| !l.starts_with(&format!("{}: ", r.file)))
                .map(str::to_string)
                .collect(),
        }
    }
}

/// The files as test points.
fn points(files: &[FileResult]) -> Vec<TestPoint> {
    files
        .iter()
        .map(|f| TestPoint {
            name: f.file.clone(),
            exit_code: f.exit_code,
            messages: f.messages(),
            seconds: 0.0,
        })
        .collect()
}

/// `--restore-knobs`: takes the oracle lock, restores from a journal if there is one, and
/// says what it did; exit code 0 (errors, e.g. not root or an unsafe lock directory, are 2).
fn restore_knobs() -> anyhow::Result<u8> {
    if oracle::sys::geteuid() != 0 {
        return Err(oracle::HostError::NotRoot.into());
    }
    let journal = oracle::knobs::journal_path();
    let (knobs, resources) = oracle::knobs::recover_all()?;
    match knobs {
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
    let res_journal = oracle::knobs::resource_journal_path();
    match resources {
        None => println!(
            "no resource journal at {}: no killed run left a swap file or memory cgroup",
            res_journal.display()
        ),
        Some(c) => {
            println!(
                "removed what killed run pid {} added to the host (set memory, set swap):",
                c.pid
            );
            for d in &c.done {
                println!("  removed {d}");
            }
            for i in &c.ignored {
                println!("  ignored {i}");
            }
            for l in &c.left {
                println!("  could not remove {l}");
            }
            if c.left.is_empty() {
                println!("removed {}", res_journal.display());
            } else {
                println!("kept {} to retry", res_journal.display());
                return Ok(2);
            }
        }
    }
    Ok(0)
}
