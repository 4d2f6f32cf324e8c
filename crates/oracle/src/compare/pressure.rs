//! What is compared once memory pressure has made each side choose its own victims.
//!
//! Under `set memory` pressure (direct reclaim on an allocation) or a `reclaim` statement,
//! both kernels evict by the same rules, but from lists that differ in their details: the
//! host's cgroup also holds the oracle server's own pages, charges a little differently
//! (its limit is the scenario's memory plus a per-process allowance) and reclaims in batches
//! of its own size. Measured on 6.18 with a 1 GiB working set in 256 MiB: the two sides keep
//! 253 and 255 MiB resident, and the same structure (what is shared after a fork, what is
//! dirty), but not the same pages. So from the first statement that reclaimed under
//! pressure on either side on:
//! - the sizes that depend on which pages stay resident (smaps `Rss`, `Pss`, the
//!   clean/dirty split, `Anonymous`, `AnonHugePages`, `Swap`, `SwapPss`; status `VmRSS`,
//!   `RssFile`, `RssShmem`, `VmSwap`) are compared within a tolerance of the larger of
//!   4 MiB and 1/32 of `set memory`;
//! - a private anonymous mapping's `Rss` + `Swap` is still compared exactly when the file
//!   never uses `madvise … free` (every page it touched is resident or swapped out, whoever
//!   chose which);
//! - its pages are no longer compared one by one (present, swapped, exclusive, flags);
//! - everything else (outcomes, expectations, maps, locked sizes) stays exact.
//!
//! `madvise … pageout` does not count as pressure: it names its pages.

use scenario::{Action, Advice, Script, Setting, StmtKind};

/// The smaps fields whose values depend on which pages reclaim kept.
pub(super) const RESIDENCY_SMAPS: &[&str] = &[
    "Rss",
    "Pss",
    "Shared_Clean",
    "Shared_Dirty",
    "Private_Clean",
    "Private_Dirty",
    "Anonymous",
    "AnonHugePages",
    "Swap",
    "SwapPss",
];

/// The status fields that do.
pub(super) const RESIDENCY_STATUS: &[&str] = &["VmRSS", "RssFile", "RssShmem", "VmSwap"];

/// The engine counters that move only when reclaim scans its lists (direct reclaim and
/// `reclaim`, not MADV_PAGEOUT).
const SCAN_COUNTERS: &[&str] = &["pgscan", "pgscan_anon"];

/// The file's pressure state.
#[derive(Clone, Copy, Debug)]
pub(super) struct Pressure {
    /// The tolerance on sizes, in bytes.
    pub(super) tolerance: u64,
    /// Whether `Rss` + `Swap` of private anonymous memory is exact (no lazy-free).
    pub(super) anon_total_exact: bool,
    /// The first line that reclaimed under pressure, once one did.
    pub(super) since: Option<u32>,
    scans: u64,
}

impl Pressure {
    /// The state before the first statement of `script`.
    pub(super) fn new(script: &Script) -> Pressure {
        let mut memory = 4u64 << 30;
        let mut free = false;
        for s in &script.stmts {
            match &s.kind {
                StmtKind::Set(Setting::Memory(m)) => memory = *m,
                StmtKind::Action {
                    action:
                        Action::Madvise {
                            advice: Advice::Free,
                            ..
                        },
                    ..
                } => free = true,
                _ => {}
            }
        }
        Pressure {
            tolerance: (4 << 20).max(memory / 32),
            anon_total_exact: !free,
            since: None,
            scans: 0,
        }
    }

    /// Notes the engine's counters after the statement at `line` (and whether it was a
    /// `reclaim`): pressure starts at the first statement that scanned.
    pub(super) fn note(&mut self, line: u32, counters: &[(&'static str, u64)], reclaim: bool) {
        let scans: u64 = counters
            .iter()
            .filter(|(n, _)| SCAN_COUNTERS.contains(n))
            .map(|&(_, v)| v)
            .sum();
        if self.since.is_none() && (reclaim || scans > self.scans) {
            self.since = Some(line);
        }
        self.scans = scans;
    }

    /// Whether two values of field `f` agree: within the tolerance for a residency field
    /// once under pressure, exactly otherwise.
    pub(super) fn agree(&self, f: &str, a: u64, b: u64, residency: &[&str]) -> bool {
        if self.since.is_some() && residency.contains(&f) {
            a.abs_diff(b) <= self.tolerance
        } else {
            a == b
        }
    }
}

/// Whether a statement is `reclaim`.
pub(super) fn is_reclaim(kind: &StmtKind) -> bool {
    matches!(
        kind,
        StmtKind::Action {
            action: Action::Reclaim { .. },
            ..
        }
    )
}
