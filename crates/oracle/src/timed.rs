//! A scenario timed on the host kernel alone: the host column of `usermm bench scenario`.
//!
//! Linux counterpart: none of its own — the statements are the real system calls and memory
//! accesses of Linux's mm (`mmap`, `fork`, page faults, `madvise`…), each performed by the
//! oracle's server process of the scenario process named ([`crate::host`]), with the THP
//! knobs of the file (`set thp`) written under the oracle's machine-wide lock. What is timed
//! is the wall time the controller sees from the statement after `bench begin` to `bench
//! end` (every pair summed; the whole file, server processes started, without marks): each
//! statement is one request to a server and its answer, so a statement's time includes one
//! round trip over a socket (a few microseconds) beside the kernel's work.

use crate::compare::{has_reclaim, Session};
use crate::host::HostBackend;
use crate::sys;
use scenario::run::{Abort, Runner};
use scenario::{BenchMark, Script, StmtKind};
use std::time::{Duration, Instant};

/// One timed run of a file on the host.
#[derive(Clone, Debug, PartialEq)]
pub struct HostTimed {
    /// Seconds between the marks (or of the whole file).
    pub secs: f64,
    /// Whether the file has `bench begin`/`bench end` marks.
    pub marked: bool,
    /// 0 every expectation held, 1 one failed (or a statement failed without `expect`), 2
    /// the host cannot run the file.
    pub code: u8,
    /// The first failure: `LINE:COL: message`.
    pub problem: Option<String>,
    /// Statements run.
    pub statements: usize,
}

impl Session {
    /// Runs `script` on the host alone (Linux's default knobs first, as the oracle does
    /// before each file) and times it as `bench scenario` times the engine.
    pub fn time_host(&mut self, script: &Script) -> HostTimed {
        let mut out = HostTimed {
            secs: 0.0,
            marked: script
                .stmts
                .iter()
                .any(|s| matches!(s.kind, StmtKind::Bench(_))),
            code: 0,
            problem: None,
            statements: 0,
        };
        let fail = |out: &mut HostTimed, code: u8, at: (u32, u32), m: &str| {
            out.code = out.code.max(code);
            if out.problem.is_none() {
                out.problem = Some(format!("{}:{}: host: {m}", at.0, at.1));
            }
        };
        if let Err(e) = self.knobs().set_defaults() {
            fail(&mut out, 2, (0, 0), &e.to_string());
            return out;
        }
        let start = Instant::now();
        let host = match HostBackend::new(self.knobs()) {
            Ok(mut h) => {
                h.set_confine(has_reclaim(script));
                h
            }
            Err(e) => {
                fail(&mut out, 2, (0, 0), &format!("cannot start: {e}"));
                return out;
            }
        };
        let mut host = Runner::new(host);
        let mut timing: Option<Instant> = None;
        let mut timed = Duration::ZERO;
        for stmt in &script.stmts {
            let at = (stmt.pos.line, stmt.pos.col);
            if sys::stop_requested() {
                fail(&mut out, 2, at, "interrupted");
                break;
            }
            if stmt.kind == StmtKind::Bench(BenchMark::End) {
                if let Some(t0) = timing.take() {
                    timed += t0.elapsed();
                }
            }
            out.statements += 1;
            let step = host.run_stmt(stmt);
            if stmt.kind == StmtKind::Bench(BenchMark::Begin) {
                timing = Some(Instant::now());
            }
            if let Some(m) = &step.expect_failure {
                fail(&mut out, 1, at, m);
            }
            match &step.abort {
                Some(Abort::Failed(m)) => {
                    fail(&mut out, 1, at, m);
                    break;
                }
                Some(Abort::CannotRun(m)) => {
                    fail(&mut out, 2, at, m);
                    break;
                }
                None => {}
            }
        }
        if let Some(t0) = timing.take() {
            timed += t0.elapsed();
        }
        out.secs = if out.marked {
            timed.as_secs_f64()
        } else {
            start.elapsed().as_secs_f64()
        };
        out
    }
}
