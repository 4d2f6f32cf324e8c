//! The host-kernel oracle: runs a scenario in real processes and on the engine, and compares.
//!
//! `usermm oracle FILE` is [`compare()`]: every scenario process is a real process, a
//! *server* ([`server`]: the small static host agent) started by this process, the
//! *controller* ([`host`]), which sends it one request per statement (the system call or
//! memory access to perform in that process) and reads what the kernel shows about it from `/proc` ([`procfs`]). The engine runs the
//! same statements beside it, and [`compare`](mod@compare) reports every outcome, verdict
//! and observable the two disagree on ([`report`]). The host's THP policy knobs are saved,
//! set per file, and restored ([`knobs`]); `set memory` and `set swap` put the file's host
//! processes in a memory cgroup ([`cgroup`]) and add a swap file ([`swapfile`]), both
//! journaled and removed after the file ([`hostres`]). [`timed`] runs a file on the host
//! alone and times it (the host column of `usermm bench scenario`).
//!
//! All of this crate's libc calls are in [`sys`] (plus the C of the fault-catching memory
//! accessors and of the host agent, which `build.rs` compiles). [`sys`] is also the
//! workspace's host side: bench's host cells and `usermm record` call the host through it
//! (its `mmap` flags, errno text, signals, memory accessors); only the recorder's own
//! `perf_event_open`/`ptrace` wrappers live apart, in `trace::sys`.

#![deny(unsafe_code)]

pub mod cgroup;
pub mod compare;
pub mod damon;
pub mod files;
pub mod host;
pub mod hostres;
pub mod knobs;
pub mod output;
pub mod procfs;
pub mod proto;
pub mod report;
pub mod server;
pub mod swapfile;
#[allow(unsafe_code)]
pub mod sys;
pub mod timed;

pub use compare::{compare, observables, CompareOptions, Observable, Session};
pub use host::HostBackend;
pub use report::{Difference, OracleReport};

/// Why the oracle cannot run on this host.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// Not root.
    #[error("the oracle needs root (to write the THP knobs, read PFNs and /proc/kpageflags, and drop privileges per process)")]
    NotRoot,
    /// A THP knob (or a file of the oracle's lock directory) could not be read or written.
    #[error("{0}: {1}")]
    Knob(String, #[source] std::io::Error),
    /// The oracle's lock directory, lock file or knob journal is not safe for root to use
    /// (a symbolic link, not ours, writable by others, hard-linked…): refused untouched.
    #[error("{path}: {problem}; refusing to use it (remove or fix it, or set USERMM_LOCK_DIR to another directory)")]
    UnsafeLock {
        /// The offending path.
        path: String,
        /// What is wrong with it.
        problem: String,
    },
    /// The knob journal a killed run left is malformed; it is kept for inspection.
    #[error("{path}: {problem}; inspect it, then remove it to let the oracle run")]
    Journal {
        /// The journal's path.
        path: String,
        /// What is wrong with it.
        problem: String,
    },
    /// The stop-signal handlers could not be installed.
    #[error("cannot install SIGINT/SIGTERM handlers: errno {0}")]
    Signals(i32),
}

/// Runs each file on the host alone (no engine, nothing compared), printing every failed
/// expectation and where a file stopped; returns the worst exit code as [`run_files`] does.
/// For checking a scenario's expectations against the host kernel while the engine cannot
/// run it yet (`cargo run -p oracle --example host_run -- FILE…`).
pub fn run_files_host_only(files: &[String], verbose: bool) -> u8 {
    for_each_file(files, |session, parsed| match parsed {
        Ok(script) => session.run_host(script, verbose),
        Err((_, message)) => {
            eprintln!("{}", message.trim_end());
            2
        }
    })
}

/// Runs the oracle on each file, printing every report to stdout (and parse errors to
/// stderr); returns the worst exit code: 0 all agreed, 1 a difference or failed
/// expectation, 2 a file could not be read, parsed or run.
pub fn run_files(files: &[String], opts: &CompareOptions) -> u8 {
    run_files_each(files, opts, |outcome| match outcome {
        FileOutcome::Report(r) => println!("{r}"),
        FileOutcome::Error { message, .. } => eprintln!("{}", message.trim_end()),
    })
}

/// What [`run_files_each`] hands over for one file.
#[derive(Debug)]
pub enum FileOutcome<'a> {
    /// The file ran: its comparison.
    Report(&'a OracleReport),
    /// The file could not be read or parsed (`FILE:LINE:COL: message` lines).
    Error {
        /// The file as named.
        file: &'a str,
        /// Why.
        message: String,
    },
}

/// [`run_files`] with the caller deciding what to do with each file's outcome (the CLI's
/// JSON and TAP formats), in the order of `files`; returns the worst exit code.
pub fn run_files_each(
    files: &[String],
    opts: &CompareOptions,
    mut each: impl FnMut(FileOutcome<'_>),
) -> u8 {
    for_each_file(files, |session, parsed| match parsed {
        Ok(script) => {
            let report = session.compare(script, opts);
            each(FileOutcome::Report(&report));
            report.exit_code()
        }
        Err((file, message)) => {
            each(FileOutcome::Error { file, message });
            2
        }
    })
}

/// Reads and parses each file in one session and runs `run` on it, or on the reason it
/// could not be read or parsed; returns the worst exit code, stopping early on Ctrl-C.
fn for_each_file(
    files: &[String],
    mut run: impl FnMut(&mut Session, Result<&scenario::Script, (&str, String)>) -> u8,
) -> u8 {
    let mut session = match Session::new() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("usermm oracle: {e}");
            return 2;
        }
    };
    let mut worst = 0u8;
    for file in files {
        let parsed = scenario::read_source(file)
            .map_err(|e| e.to_string())
            .and_then(|text| {
                scenario::Script::parse_checked(file, &text).map_err(|errs| errs.to_string())
            });
        let code = match &parsed {
            Ok(script) => run(&mut session, Ok(script)),
            Err(message) => run(&mut session, Err((file, message.clone()))),
        };
        worst = worst.max(code);
        if sys::stop_requested() {
            eprintln!("usermm oracle: interrupted; THP knobs restored");
            return worst.max(2);
        }
    }
    worst
}
