//! What the oracle found in one file, and how it is printed.
//!
//! Each difference is one line `FILE:LINE: PROCESS FIELD: engine=V host=V`; failed
//! expectations name the side they failed on; fields the host could not show are listed as
//! skipped with the reason, never dropped silently.

use std::fmt;

/// One observable the two sides disagree on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Difference {
    /// Line of the statement after which it was seen.
    pub line: u32,
    /// The scenario process, if the field belongs to one.
    pub process: Option<String>,
    /// What differs (`outcome`, `maps`, `smaps a-a+0x4000 rw-p Rss`, `pages a..a+0x1000 lru`).
    pub field: String,
    /// The engine's value.
    pub engine: String,
    /// The host's value.
    pub host: String,
}

/// The result of comparing one scenario file.
#[derive(Clone, Debug, Default)]
pub struct OracleReport {
    /// The file.
    pub file: String,
    /// Statements executed.
    pub statements: usize,
    /// Disagreements.
    pub differences: Vec<Difference>,
    /// Failed expectations: line, side (`engine`, `host`, `both`), message.
    pub expect_failures: Vec<(u32, &'static str, String)>,
    /// A statement failed (without `expect`) on both sides: line and message.
    pub failed: Option<(u32, String)>,
    /// Observables left out: line and reason.
    pub skipped: Vec<(u32, String)>,
    /// The file could not be run: line (0 before any) and why.
    pub cannot_run: Option<(u32, String)>,
}

impl OracleReport {
    /// An empty report for `file`.
    pub fn new(file: &str) -> OracleReport {
        OracleReport {
            file: file.to_string(),
            ..OracleReport::default()
        }
    }

    /// Records a field that could not be observed.
    pub fn skip(&mut self, line: u32, reason: String) {
        self.skipped.push((line, reason));
    }

    /// Keeps the first occurrence of each skip reason.
    pub fn dedup_skipped(&mut self) {
        let mut seen = std::collections::HashSet::new();
        self.skipped.retain(|(_, r)| seen.insert(r.clone()));
    }

    /// 0 all agreed and held, 1 a difference or a failed expectation, 2 not runnable.
    pub fn exit_code(&self) -> u8 {
        if self.cannot_run.is_some() {
            2
        } else if self.differences.is_empty()
            && self.expect_failures.is_empty()
            && self.failed.is_none()
        {
            0
        } else {
            1
        }
    }
}

impl fmt::Display for OracleReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let file = &self.file;
        for d in &self.differences {
            let who = d
                .process
                .as_deref()
                .map(|p| format!("{p} "))
                .unwrap_or_default();
            writeln!(
                f,
                "{file}:{}: {who}{}: engine={} host={}",
                d.line, d.field, d.engine, d.host
            )?;
        }
        for (line, side, m) in &self.expect_failures {
            writeln!(f, "{file}:{line}: expect failed on {side}: {m}")?;
        }
        if let Some((line, m)) = &self.failed {
            writeln!(f, "{file}:{line}: statement failed: {m}")?;
        }
        for (line, r) in &self.skipped {
            writeln!(f, "{file}:{line}: skipped: {r}")?;
        }
        if let Some((line, m)) = &self.cannot_run {
            writeln!(f, "{file}:{line}: cannot run: {m}")?;
        }
        let status = match self.exit_code() {
            0 => "ok",
            1 => "DIFFERENT",
            _ => "NOT RUN",
        };
        write!(
            f,
            "{file}: {status}: {} statements, {} differences, {} failed expectations, {} skipped",
            self.statements,
            self.differences.len(),
            self.expect_failures.len(),
            self.skipped.len()
        )
    }
}
