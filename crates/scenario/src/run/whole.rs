//! A whole file on a fresh engine (`usermm run`): every statement in order through a
//! [`Runner`], `validate` after each when asked, what `dump` printed, each statement's
//! counter deltas (`--stats`), and the region between `bench begin` and `bench end`.

use super::{Abort, Failure, Runner};
use crate::ast::{BenchMark, Script, StmtKind};
use crate::engine::EngineBackend;
use std::time::{Duration, Instant};
use usermm::Snapshot;

/// How to run.
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    /// Print each statement as it runs.
    pub verbose: bool,
    /// Run `validate()` after every statement.
    pub validate: bool,
    /// Tunables applied when the machine is built (before the file's own `set tunable`).
    pub tunables: Vec<(String, String)>,
    /// Record each statement's counter deltas ([`RunReport::stats`]).
    pub stats: bool,
}

/// What one statement moved (`usermm run --stats`).
#[derive(Clone, Debug)]
pub struct StmtStats {
    /// Its line.
    pub line: u32,
    /// Its text, as the parser understood it.
    pub text: String,
    /// The counters it moved (name, delta), in the engine's order.
    pub deltas: Vec<(&'static str, u64)>,
}

/// Result of a run.
#[derive(Debug)]
pub struct RunReport {
    /// Failed expectations.
    pub failures: Vec<Failure>,
    /// Set if the run stopped early (with where).
    pub abort: Option<(Failure, Abort)>,
    /// Counters of the whole run.
    pub counters: Snapshot,
    /// Wall time of the run.
    pub wall: Duration,
    /// Statements executed.
    pub statements: usize,
    /// What `dump` statements printed, with their line numbers.
    pub dumps: Vec<(u32, String)>,
    /// With [`RunOptions::stats`]: each statement's counter deltas.
    pub stats: Vec<StmtStats>,
    /// With `bench begin`/`bench end`: the time spent between them (every pair summed; a
    /// `begin` left open runs to the end of the file) and the counters that moved there.
    pub timed: Option<(Duration, Snapshot)>,
}

impl RunReport {
    /// Exit code: 0 all held, 1 an expectation failed, 2 the file could not be run.
    pub fn exit_code(&self) -> i32 {
        match (&self.abort, self.failures.is_empty()) {
            (Some((_, Abort::CannotRun(_))), _) => 2,
            (Some((_, Abort::Failed(_))), _) | (None, false) => 1,
            (None, true) => 0,
        }
    }
}

/// Runs `script` on a fresh engine.
pub fn run(script: &Script, opts: &RunOptions) -> RunReport {
    /// Broken invariants shown per statement under `validate`.
    const MAX_VALIDATE_SHOWN: usize = 3;
    let start = Instant::now();
    let mut seen_invalid = std::collections::HashSet::new();
    let mut r = Runner::new(EngineBackend::new(opts.tunables.clone()));
    let mut failures = Vec::new();
    let mut abort = None;
    let mut statements = 0;
    let mut dumps = Vec::new();
    let mut stats = Vec::new();
    // Within `bench begin` … `bench end`: since when, and the counters then.
    let mut timing: Option<(Instant, Snapshot)> = None;
    let mut timed: Option<(Duration, Snapshot)> = None;
    let snapshot =
        |r: &Runner<EngineBackend>| r.backend.built().map(|m| m.counters()).unwrap_or_default();
    for stmt in &script.stmts {
        let (line, col) = (stmt.pos.line, stmt.pos.col);
        if opts.verbose {
            eprintln!("{}:{line}: {stmt}", script.file);
        }
        statements += 1;
        if stmt.kind == StmtKind::Bench(BenchMark::End) {
            if let Some((t0, c0)) = timing.take() {
                let (d, c) = timed.get_or_insert_with(Default::default);
                *d += t0.elapsed();
                c.accumulate(&snapshot(&r).delta(&c0));
            }
        }
        let before = opts.stats.then(|| snapshot(&r));
        let step = r.run_stmt(stmt);
        if let Some(before) = before {
            stats.push(StmtStats {
                line,
                text: stmt.kind.to_string(),
                deltas: snapshot(&r).delta(&before).nonzero(),
            });
        }
        if let StmtKind::Bench(BenchMark::Begin) = &stmt.kind {
            timing = Some((Instant::now(), snapshot(&r)));
        }
        if let Some(text) = step.output {
            dumps.push((line, text));
        }
        if let Some(m) = step.expect_failure {
            failures.push(Failure {
                line,
                col,
                message: m,
            });
        }
        if let Some(a) = step.abort {
            let msg = match &a {
                Abort::Failed(m) | Abort::CannotRun(m) => m.clone(),
            };
            abort = Some((
                Failure {
                    line,
                    col,
                    message: msg,
                },
                a,
            ));
            break;
        }
        if opts.validate {
            if let Some(m) = r.backend.built() {
                if let Err(errs) = m.validate() {
                    // Each broken invariant is reported once, at the first statement that
                    // broke it, and at most a few per statement.
                    let new: Vec<String> = errs
                        .into_iter()
                        .filter(|e| seen_invalid.insert(e.clone()))
                        .collect();
                    if !new.is_empty() {
                        let shown = new.len().min(MAX_VALIDATE_SHOWN);
                        let mut message = format!("validate: {}", new[..shown].join("; "));
                        if new.len() > shown {
                            message.push_str(&format!(" (and {} more)", new.len() - shown));
                        }
                        failures.push(Failure { line, col, message });
                    }
                }
            }
        }
    }
    if let Some((t0, c0)) = timing.take() {
        let (d, c) = timed.get_or_insert_with(Default::default);
        *d += t0.elapsed();
        c.accumulate(&snapshot(&r).delta(&c0));
    }
    let counters = snapshot(&r);
    RunReport {
        failures,
        abort,
        counters,
        wall: start.elapsed(),
        statements,
        dumps,
        stats,
        timed,
    }
}
