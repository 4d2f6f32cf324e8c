//! The replay's counters per operation: each replayed event's engine counter deltas, filed
//! under the operation of the cost model (`usermm_model::profile::features` and the
//! calibration probes name them) that the kernel would run for it, so that a calibrated
//! profile can price the whole workload ([`ReplayReport::ops`], [`ReplayReport::op_calls`]).
//!
//! | event | operation |
//! |---|---|
//! | FAULT | `fault`, or `fault_file` where the engine took the file fault path (`faults_file`); `touch` where the engine took no fault (its walk found the entry that fault-around or a large folio had mapped: a TLB refill, no kernel work, not priced); a TLB hit: no engine work, nothing filed |
//! | FORK (own mm) | `fork`; a thread or vfork child shares the mm: no engine work, nothing filed |
//! | SPAWN (the traced root) | `fork` (the recorder forked it) |
//! | EXIT | `munmap`: the last user's exit tears the mm down as an unmap of every VMA (the same zap batching, TLB gather, folio, page-table and VMA frees); the task's own exit work and the parent's wait are no engine work, and not priced |
//! | EXEC | as the engine does it, in steps: the old mm's teardown `munmap` (as an exit), the new mm and each image mapping `mmap`, each present image page `fault` |
//! | mmap, munmap, mprotect, mremap, madvise | the same operation |
//! | brk | `mmap` (growth) or `munmap` (shrink), as replayed |
//! | mlock, mlock2, mlockall / munlock, munlockall | `mlock` / `munlock` |
//! | FILE | `file`: the engine creates the recorded file (one `syscalls` each); the host's file existed before the program ran, so this is no work of the workload and no model operation: it is not priced |
//! | CACHE | `file`: the engine reads the folios the host had cached into its page cache; they were there before the program ran, so this is not priced either |
//! | VALIDATE, LOST | none: they make the engine count nothing (if one ever did, its counts are filed under `other`, so the sums stay exact; `other` is not priced) |
//!
//! Each filed step is one *call* of its operation: a distinct delta is kept once with its
//! multiplicity ([`OpCall`]), so the model prices every call as its own operation (a fork's
//! fixed work once per fork, zeroing beyond the cache per call) at the cost of the distinct
//! deltas only. The per-operation sums add up to the replay's counters exactly (nothing the
//! engine counts falls between two steps: the running snapshot starts at zero).

use super::*;

/// A distinct engine counter delta of one operation and how many calls had it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct OpCall {
    /// The operation, as the cost model names it.
    pub op: &'static str,
    /// The non-zero counters of one call.
    pub counters: Vec<(&'static str, u64)>,
    /// How many calls had exactly these counters.
    pub count: u64,
}

impl OpCall {
    /// The counters as the cost model takes them.
    pub fn counter_map(&self) -> BTreeMap<String, u64> {
        self.counters
            .iter()
            .map(|&(k, v)| (k.to_string(), v))
            .collect()
    }
}

/// One call's operation and its non-zero counters.
type CallKey = (&'static str, Vec<(&'static str, u64)>);

/// The running attribution of a replay's counters to operations.
#[derive(Default)]
pub(super) struct OpAccount {
    /// The machine's counters at the last filed step (zero before the first).
    last: Snapshot,
    /// Distinct deltas per operation, with their multiplicity.
    distinct: HashMap<CallKey, u64>,
}

impl OpAccount {
    /// Files everything the engine counted since the last step under `op`, as one call.
    pub(super) fn settle(&mut self, m: &Machine, op: &'static str) {
        let now = m.counters();
        let d = now.delta(&self.last);
        self.last = now;
        let nz = d.nonzero();
        // A fault on a file page runs the file fault path (`filemap_fault`, fault-around):
        // the model prices it as its own operation.
        // A recorded fault the engine served without faulting (its page-table walk found
        // the entry: a page its fault-around or a THP had mapped already) costs the kernel
        // nothing; the hardware walk that refilled the TLB is not priced.
        let op = match op {
            "fault" if d.get(usermm::Ev::Fault) == 0 => "touch",
            "fault" if d.get(usermm::Ev::FaultFile) > 0 => "fault_file",
            op => op,
        };
        if !nz.is_empty() {
            *self.distinct.entry((op, nz)).or_insert(0) += 1;
        }
    }

    /// The per-operation sums, calls and distinct calls (sorted: deterministic).
    pub(super) fn finish(self, r: &mut ReplayReport) {
        let mut calls: Vec<OpCall> = self
            .distinct
            .into_iter()
            .map(|((op, counters), count)| OpCall {
                op,
                counters,
                count,
            })
            .collect();
        calls.sort();
        for c in &calls {
            let sums = r.ops.entry(c.op.to_string()).or_default();
            for &(k, v) in &c.counters {
                let s = sums.entry(k.to_string()).or_insert(0);
                *s = s.saturating_add(v.saturating_mul(c.count));
            }
            let n = r.op_calls.entry(c.op.to_string()).or_insert(0);
            *n = n.saturating_add(c.count);
        }
        r.op_distinct = calls;
    }
}

/// The operations of the cost model a replay files counters under (`touch`, `file` and
/// `other` are not among them: see the module's table).
pub const MODEL_OPS: [&str; 10] = [
    "fault",
    "fault_file",
    "fork",
    "munmap",
    "mmap",
    "mprotect",
    "mremap",
    "madvise",
    "mlock",
    "munlock",
];

/// The operation an event is filed under (exec and brk decide in their steps; a fault on a
/// file page is filed as `fault_file` when settled).
pub(super) fn op_of(ev: &Event) -> &'static str {
    match ev {
        Event::Fault { .. } => "fault",
        Event::Spawn { .. } | Event::Fork { .. } => "fork",
        Event::Exit { .. } | Event::Munmap { .. } => "munmap",
        Event::Exec { .. } | Event::Mmap { .. } | Event::Brk { .. } => "mmap",
        Event::Mprotect { .. } => "mprotect",
        Event::Mremap { .. } => "mremap",
        Event::Madvise { .. } => "madvise",
        Event::Mlock { .. } | Event::Mlockall { .. } => "mlock",
        Event::Munlock { .. } | Event::Munlockall { .. } => "munlock",
        Event::File { .. } | Event::Cache { .. } => "file",
        _ => "other",
    }
}
