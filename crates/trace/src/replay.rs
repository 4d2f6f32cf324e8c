//! `usermm replay`: a trace's processes, system calls and page faults on the engine.
//!
//! Every process of the trace becomes an engine process (the root is spawned, a fork is an
//! engine fork, a vfork/`CLONE_VM` child shares its parent's engine process until its exec,
//! an exec replaces the process by a new one whose address space is the recorded image, an
//! exit tears it down). Every system call runs with the recorded arguments; a placement the
//! kernel chose is replayed as `MAP_FIXED` at the address the host returned, so addresses
//! match. Every recorded fault is a one-byte access of that page (`Cpu::touch`) through the
//! engine's MMU: a TLB hit when the page is already mapped, otherwise the engine's fault path.
//! File mappings go through engine disk files (one per recorded file, its recorded size) and
//! the page cache. The engine's result of each call is compared with the recorded one;
//! differences are counted and listed, not fatal. At each recorded exit the engine's
//! `RssAnon` is compared with the host's.
//!
//! Two things are replayed differently, on purpose:
//! - `brk`: the engine's heap starts at its own `START_BRK`, and its API cannot place it
//!   where the host's was, so each change of the break is replayed as a fixed anonymous
//!   `mmap` (grow) or `munmap` (shrink) of the same pages: the same addresses, RSS and faults;
//! - the main stack of an exec image is mapped as exec left it, and a fault below it first
//!   maps the pages down to the faulting one, as the kernel's stack expansion moves the
//!   stack's start (the engine has no `VM_GROWSDOWN`; see the `stack` module).
//!
//! A replay runs within a [`Budget`] (`ReplayOptions::budget`): events, seconds, and bytes
//! made present. Each event is charged *before* it runs with what its arguments can make the
//! engine populate or copy (see [`Budget::max_touch`]), so one `mmap(MAP_POPULATE)` of 3 GiB
//! in a 100-byte file is refused instead of run; after it runs, the engine's frames in use
//! are checked against the same bound (read-ahead, page tables and large folios are not
//! known in advance). Calls that walk what is already there (mprotect, mremap, madvise,
//! munlock, munmap, an mmap over a mapping) are charged what they may walk against a second
//! sum ([`Budget::max_walk`]): a populated range protected back and forth a million times
//! costs no memory but took minutes. Running out is an error naming the event and its
//! payload byte.

use crate::format::{Decoder, Event, FormatError, Trace, FORK_SHARES_VM};
use crate::stack::Stack;
use crate::{placed_at, Budget};
use scenario::ThpSetting;
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::BufRead;
use std::time::Instant;
use usermm::{
    Access, Advice, Cpu, Errno, FileId, InodeKind, Machine, MachineConfig, MapFlags, MlockallFlags,
    MmapArgs, MremapFlags, Pid, Placement, Privilege, Prot, Snapshot, MLOCK_ONFAULT,
};

mod budget;
mod image;
mod ops;

pub use ops::{OpCall, MODEL_OPS};

/// Options of [`replay`].
#[derive(Clone, Debug)]
pub struct ReplayOptions {
    /// Tunables (NAME, VALUE) applied to the machine.
    pub tunables: Vec<(String, String)>,
    /// THP policy (SIZE or `top`, POLICY) applied over the recorded policy (the trace
    /// header's: `never` at every size unless recorded with `usermm record --thp`).
    pub thp: Vec<(String, String)>,
    /// Simulated RAM.
    pub memory: u64,
    /// Run the engine's invariant checks at the end.
    pub validate: bool,
    /// What the replay may cost (events, seconds, bytes made present).
    pub budget: Budget,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions {
            tunables: Vec::new(),
            thp: Vec::new(),
            memory: 4 << 30,
            validate: false,
            budget: Budget::default(),
        }
    }
}

/// An error that stops a replay before it starts.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// A bad tunable or THP setting.
    #[error("{0}")]
    Setting(String),
    /// The machine could not be built.
    #[error("engine: {0}")]
    Engine(String),
    /// The trace could not be read (a streamed replay stops at the first bad byte).
    #[error(transparent)]
    Format(#[from] FormatError),
    /// The trace asks for more than the budget: the replay stopped before this event.
    #[error("{}event {event}: {what}", .offset.map(|o| format!("payload byte {o}, ")).unwrap_or_default())]
    Budget {
        /// Index of the event in the trace.
        event: u64,
        /// Its payload offset, when the replay reads the file.
        offset: Option<u64>,
        /// Which budget, and how to raise it.
        what: String,
    },
}

/// One call whose engine result differs from the recorded one.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Mismatch {
    /// Index of the event in the trace.
    pub event: u64,
    /// The call.
    pub call: String,
    /// Recorded result (`-errno` on failure).
    pub host: i64,
    /// Engine result (`-errno` on failure).
    pub engine: i64,
}

/// RSS at one recorded exit, host and engine.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct RssCheck {
    /// Trace pid.
    pub pid: u32,
    /// Host RssAnon (kB).
    pub host_anon_kb: u64,
    /// Engine RssAnon (kB).
    pub engine_anon_kb: u64,
    /// Host RssFile (kB).
    pub host_file_kb: u64,
    /// Engine RssFile (kB).
    pub engine_file_kb: u64,
    /// |engine − host| / host of RssAnon (0 when both are 0).
    pub anon_rel_err: f64,
    /// Host and engine AnonHugePages (kB): compared where the replay may map PMD THPs (a
    /// THP policy recorded or given) or the host had some; `None` otherwise.
    pub anon_huge_kb: Option<(u64, u64)>,
}

/// How far the engine's AnonHugePages at an exit may be from the host's: 5 % of the host's.
pub const ANON_HUGE_TOLERANCE: f64 = 0.05;

impl RssCheck {
    /// Whether the exit's AnonHugePages is off by more than [`ANON_HUGE_TOLERANCE`].
    pub fn anon_huge_off(&self) -> bool {
        self.anon_huge_kb
            .is_some_and(|(h, e)| (e as f64 - h as f64).abs() > h as f64 * ANON_HUGE_TOLERANCE)
    }
}

/// What a replay did.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct ReplayReport {
    /// Events replayed (all of the trace's events).
    pub events: u64,
    /// Page faults replayed.
    pub faults: u64,
    /// System calls replayed.
    pub syscalls: u64,
    /// Processes created (spawn, fork, exec).
    pub processes: u64,
    /// Calls whose outcome (success, errno) differs from the host's.
    pub errno_mismatches: u64,
    /// The first mismatches.
    pub mismatches: Vec<Mismatch>,
    /// Recorded faults the engine answered with a signal (no mapping or no permission) that
    /// the host did not answer with the same signal (a trace without signal records: every
    /// one).
    pub fault_signals: u64,
    /// Signals the host sent for a fault (`SIGSEGV`, `SIGBUS`), as recorded.
    pub host_signals: u64,
    /// Host signals the engine sent too, for a fault at the same page.
    pub signals_matched: u64,
    /// Host signals the engine did not send (it mapped the page).
    pub signals_missed: u64,
    /// File mappings without an identified file, replayed as anonymous.
    pub file_as_anon: u64,
    /// Calls with arguments the engine does not model (counted, skipped).
    pub unsupported: u64,
    /// Events of processes the replay does not know.
    pub unknown_process: u64,
    /// Records the kernel lost while recording (saturating).
    pub lost: u64,
    /// Bytes charged against [`Budget::max_touch`].
    pub touched: u64,
    /// Bytes charged against [`Budget::max_walk`].
    pub walked: u64,
    /// Exec-image pages made present, and those that failed.
    pub image_pages: u64,
    /// Exec-image mappings or pages the engine refused.
    pub image_errors: u64,
    /// Pages put into the engine's page cache as the host had them cached when the
    /// recording first saw their file mapped (`CACHE` events; none in a version-1 trace).
    pub cache_seeded: u64,
    /// Cached folios the engine could not seed (no frame free).
    pub cache_errors: u64,
    /// `brk` changes replayed as fixed anonymous mmap/munmap.
    pub brk_as_mmap: u64,
    /// RSS at the recorded exits (the first [`MAX_RSS_LISTED`]).
    pub rss: Vec<RssCheck>,
    /// Recorded exits whose RSS was compared (all of them, listed or not).
    pub rss_compared: u64,
    /// The largest relative RssAnon difference over every compared exit.
    pub rss_max_anon_err: f64,
    /// The engine's counters.
    pub counters: BTreeMap<String, u64>,
    /// The engine's counters per operation of the cost model (`fault`, `fork`, `munmap`,
    /// `mmap`…; see `replay/ops.rs` for which event is which): they sum to `counters`.
    pub ops: BTreeMap<String, BTreeMap<String, u64>>,
    /// Calls filed per operation (events, or exec's steps, that made the engine count).
    pub op_calls: BTreeMap<String, u64>,
    /// The distinct calls behind `ops`, each with its multiplicity (what a cost model prices).
    #[serde(skip)]
    pub op_distinct: Vec<OpCall>,
    /// Wall time of the replay (seconds, machine creation excluded).
    pub wall_seconds: f64,
    /// Events per second.
    pub events_per_sec: f64,
    /// `validate` result, when asked.
    pub validate: Option<String>,
    /// The counters as the engine's snapshot.
    #[serde(skip)]
    pub snapshot: Snapshot,
}

impl ReplayReport {
    /// What in this replay disagrees with what the host recorded, one line each (empty:
    /// none): errno mismatches, faults the engine answered with a signal, file mappings
    /// replayed as anonymous, unsupported calls, events of unknown processes, lost records,
    /// cached folios not seeded, a failed `validate`, and an exit whose RssAnon is not the
    /// host's. RssFile is not among them: a page or a few more or less than the host's
    /// (within 0.4 % with `CACHE` events, 1.1 % on the shipped version-1 traces, which
    /// replay from a cold page cache).
    pub fn problems(&self) -> Vec<String> {
        let mut p: Vec<String> = [
            (self.errno_mismatches, "errno mismatches"),
            (
                self.fault_signals,
                "faults answered by a signal the host did not send",
            ),
            (self.signals_missed, "host signals the engine did not send"),
            (self.file_as_anon, "file mappings replayed as anonymous"),
            (self.unsupported, "unsupported calls"),
            (self.unknown_process, "events of unknown processes"),
            (self.lost, "lost records"),
            (self.cache_errors, "cached folios the engine could not seed"),
        ]
        .into_iter()
        .filter(|&(n, _)| n > 0)
        .map(|(n, what)| format!("{n} {what}"))
        .collect();
        if let Some(v) = self.validate.as_deref().filter(|v| *v != "ok") {
            p.push(format!("validate: {v}"));
        }
        p.extend(
            self.rss
                .iter()
                .filter(|c| c.host_anon_kb != c.engine_anon_kb)
                .map(|c| {
                    format!(
                        "exit of {}: RssAnon host {} kB, engine {} kB",
                        c.pid, c.host_anon_kb, c.engine_anon_kb
                    )
                }),
        );
        p.extend(self.rss.iter().filter(|c| c.anon_huge_off()).map(|c| {
            let (h, e) = c.anon_huge_kb.unwrap_or_default();
            format!(
                "exit of {}: AnonHugePages host {h} kB, engine {e} kB (over 5 %)",
                c.pid
            )
        }));
        p
    }
}

impl ReplayReport {
    /// The largest relative RssAnon error over exits with at least `min_kb` recorded.
    pub fn max_anon_err(&self) -> f64 {
        self.rss_max_anon_err
    }
}

const MAX_LISTED: usize = 20;
/// Most RSS checks listed in a report.
pub const MAX_RSS_LISTED: usize = 4096;

fn page_up(v: u64) -> u64 {
    v.saturating_add(4095) & !4095
}

/// A THP folio size, `NK` or `NM` (`k`, `m` too): `None` for anything else, including a
/// non-ASCII unit (`64é` once split inside the `é` and panicked) and a product past 2⁶⁴ (it
/// wrapped: 18014398509481984064K was taken as 64K).
pub fn thp_size(size: &str) -> Option<u64> {
    if !size.ends_with(['K', 'k', 'M', 'm']) {
        return None;
    }
    usermm::units::parse_size(size).ok()
}

/// One `--thp` (or recorded) pair, read by the workspace's one THP parser
/// (`scenario::ThpSetting::from_pair`). Replay's size is narrower than `set thp`'s, as
/// documented (docs/record-replay.md): `NK` or `NM` only ([`thp_size`]), so a bare byte
/// count or hex size is refused here. The error says what is wrong; callers say where the
/// pair came from.
fn thp_setting(size: &str, policy: &str) -> Result<ThpSetting, String> {
    if size != "top" && thp_size(size).is_none() {
        return Err(format!(
            "bad THP size `{size}` (expected top or NK or NM, a power of two from 16K to 2M)"
        ));
    }
    ThpSetting::from_pair(size, policy).map_err(|e| e.to_string())
}

/// [`thp_setting`] set on `t` (`scenario::apply_thp`, the engine's one way in).
fn apply_thp(t: &mut usermm::Tunables, size: &str, policy: &str) -> Result<(), ReplayError> {
    let s = thp_setting(size, policy)
        .map_err(|why| ReplayError::Setting(format!("--thp {size}={policy}: {why}")))?;
    scenario::apply_thp(t, &s);
    Ok(())
}

/// The THP policy a trace was recorded under, from its header's `policy`: the form `usermm
/// record --thp` writes, `thp top=P SIZE=P ...`, as pairs over the baseline (`never` at every
/// size); a policy in that form that does not parse is refused (the header comes from the
/// trace file, hostile until parsed). Any other text is an older recorder's note (`thp
/// top=never; SIZES never`: those recorders always set `never`) and means the baseline.
pub fn recorded_policy(policy: &str) -> Result<Vec<(String, String)>, ReplayError> {
    let bad = || ReplayError::Setting(format!("the trace's THP policy `{policy}` cannot be read"));
    let Some(rest) = policy.strip_prefix("thp ").filter(|r| !r.contains(';')) else {
        return Ok(Vec::new());
    };
    rest.split_whitespace()
        .map(|t| {
            t.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .ok_or_else(bad)
        })
        .collect()
}

/// What the recorder sets the host to before a trace's own policy: `never` at every size and
/// at the top, as `SIZE=POLICY` pairs (a replay's machine starts from them, and so does a
/// trace export's `set thp` line).
pub fn baseline_policy() -> Vec<(String, String)> {
    std::iter::once("top".to_string())
        .chain((2..=9u32).map(|order| format!("{}K", 4u64 << order)))
        .map(|k| (k, "never".to_string()))
        .collect()
}

/// [`recorded_policy`]'s pairs, each checked by the engine's THP parser and spelt one way
/// (`top` or `NK`, the policy's name): a pair the machine would refuse is an error.
pub fn recorded_pairs(policy: &str) -> Result<Vec<(String, String)>, ReplayError> {
    recorded_policy(policy)?
        .into_iter()
        .map(|(k, v)| {
            let s = thp_setting(&k, &v).map_err(|why| {
                ReplayError::Setting(format!("the trace's THP policy `{policy}`: {k}={v}: {why}"))
            })?;
            Ok((s.key_kb(), s.policy_word().to_string()))
        })
        .collect()
}

/// The machine a replay runs on: THP `never` at every size (what the recorder sets the host
/// to), then `opts`.
pub fn machine_config(opts: &ReplayOptions) -> Result<MachineConfig, ReplayError> {
    machine_config_with(&[], opts)
}

/// The machine a replay of a trace recorded under `recorded` (its header's policy) runs on:
/// [`baseline_policy`], the recorded policy over that, then `opts`.
pub fn machine_config_recorded(
    recorded: &str,
    opts: &ReplayOptions,
) -> Result<MachineConfig, ReplayError> {
    machine_config_with(&recorded_pairs(recorded)?, opts)
}

/// [`machine_config_recorded`] with the recorded policy's checked pairs.
fn machine_config_with(
    recorded: &[(String, String)],
    opts: &ReplayOptions,
) -> Result<MachineConfig, ReplayError> {
    let mut t = usermm::Tunables::default();
    for (k, v) in baseline_policy().iter().chain(recorded) {
        apply_thp(&mut t, k, v)?;
    }
    for (k, v) in &opts.tunables {
        t.set(k, v)
            .map_err(|e| ReplayError::Setting(format!("--tunable {k}={v}: {e}")))?;
    }
    for (k, v) in &opts.thp {
        apply_thp(&mut t, k, v)?;
    }
    Ok(MachineConfig {
        memory: opts.memory,
        cpus: 1,
        tunables: t,
        ..MachineConfig::default()
    })
}

struct Replayer<'m, 'c> {
    m: &'m Machine,
    cpu: &'c Cpu<'m>,
    budget: Budget,
    /// Bytes charged so far (see [`Budget::max_touch`]).
    touched: u64,
    /// Bytes of ranges walked so far (see [`Budget::max_walk`]).
    walked: u64,
    /// Engine processes that locked memory (mlock, mlockall, `MAP_LOCKED`): their later
    /// mappings, growths and protection changes may populate, and are charged.
    locked: HashSet<Pid>,
    procs: HashMap<u32, Pid>,
    users: HashMap<Pid, u32>,
    brk: HashMap<Pid, u64>,
    /// Each engine process's main stack (from its exec image; a fork inherits it).
    stacks: HashMap<Pid, Stack>,
    /// Each engine process's `[vdso]` and the pages it faulted there (see [`image::Vdso`]).
    vdso: HashMap<Pid, image::Vdso>,
    files: HashMap<u32, FileId>,
    /// Whether the machine may map PMD THPs (its AnonHugePages is compared at exits).
    thp: bool,
    r: ReplayReport,
    index: u64,
    /// The counters per operation so far.
    ops: ops::OpAccount,
    /// The operation the current event is filed under.
    op: &'static str,
    /// Engine signals not yet matched with a host signal, counted per (trace pid, page,
    /// signal number). The host's record follows its fault, with other processes' (and
    /// threads') events possibly between; what is left at the end is `fault_signals`.
    unmatched: HashMap<(u32, u64, u8), u64>,
}

fn engine_ret(r: Result<i64, Errno>) -> i64 {
    match r {
        Ok(v) => v,
        Err(e) => -(e as i64),
    }
}

impl Replayer<'_, '_> {
    fn check(&mut self, call: &str, host: i64, engine: i64) {
        let bad = (host < 0) != (engine < 0) || (host < 0 && host != engine);
        if bad {
            self.r.errno_mismatches += 1;
            if self.r.mismatches.len() < MAX_LISTED {
                self.r.mismatches.push(Mismatch {
                    event: self.index,
                    call: call.to_string(),
                    host,
                    engine,
                });
            }
        }
    }

    fn pid(&mut self, pid: u32) -> Option<Pid> {
        let p = self.procs.get(&pid).copied();
        if p.is_none() {
            self.r.unknown_process += 1;
        }
        p
    }

    fn new_process(&mut self, pid: u32) -> Option<Pid> {
        match self.cpu.spawn(Privilege::Privileged, u64::MAX) {
            Ok(e) => {
                self.r.processes += 1;
                self.procs.insert(pid, e);
                self.users.insert(e, 1);
                Some(e)
            }
            Err(_) => {
                self.r.image_errors += 1;
                None
            }
        }
    }

    /// The trace process `pid` stops using its engine process (exit, exec).
    fn release(&mut self, pid: u32) {
        let Some(e) = self.procs.remove(&pid) else {
            return;
        };
        let n = self.users.entry(e).or_insert(1);
        *n -= 1;
        if *n == 0 {
            self.users.remove(&e);
            self.brk.remove(&e);
            self.stacks.remove(&e);
            self.vdso.remove(&e);
            let _ = self.cpu.exit(e);
        }
    }

    fn event(&mut self, ev: &Event) {
        let cpu = self.cpu;
        match ev {
            Event::Spawn { pid } => {
                self.new_process(*pid);
            }
            Event::Fork {
                parent,
                child,
                flags,
            } => {
                let Some(p) = self.pid(*parent) else { return };
                if flags & FORK_SHARES_VM != 0 {
                    self.procs.insert(*child, p);
                    *self.users.entry(p).or_insert(0) += 1;
                    return;
                }
                match cpu.fork(p) {
                    Ok(c) => {
                        self.r.processes += 1;
                        self.procs.insert(*child, c);
                        self.users.insert(c, 1);
                        if let Some(&b) = self.brk.get(&p) {
                            self.brk.insert(c, b);
                        }
                        if let Some(&s) = self.stacks.get(&p) {
                            self.stacks.insert(c, s);
                        }
                        if let Some(v) = self.vdso.get(&p) {
                            self.vdso.insert(c, v.forked());
                        }
                    }
                    Err(e) => self.check("fork", 0, -(e as i64)),
                }
            }
            Event::Exec { pid, image } => {
                self.release(*pid);
                self.ops.settle(self.m, "munmap");
                if let Some(e) = self.new_process(*pid) {
                    self.image(e, image);
                }
            }
            Event::Exit { pid } => self.release(*pid),
            Event::File { id, size, .. } => {
                match cpu.file_create(page_up(*size).max(4096), InodeKind::Disk, None) {
                    Ok(f) => {
                        self.files.insert(*id, f);
                    }
                    Err(_) => self.r.unsupported += 1,
                }
            }
            Event::Cache { file, folios } => {
                let Some(&f) = self.files.get(file) else {
                    return;
                };
                for c in folios {
                    match cpu.page_cache_seed(f, c.index, u32::from(c.order), c.readahead) {
                        Ok(pages) => self.r.cache_seeded += pages,
                        Err(_) => self.r.cache_errors += 1,
                    }
                }
            }
            Event::Fault {
                pid, addr, write, ..
            } => {
                let Some(e) = self.pid(*pid) else { return };
                self.r.faults += 1;
                if let Some(v) = self.vdso.get_mut(&e) {
                    v.fault(*addr);
                }
                self.grow_stack(e, *addr);
                let acc = if *write { Access::Write } else { Access::Read };
                let signo = match cpu.touch(e, *addr, 1, acc) {
                    Ok(()) => return,
                    Err(usermm::Signal::Bus(_)) => libc::SIGBUS,
                    Err(_) => libc::SIGSEGV,
                };
                *self
                    .unmatched
                    .entry((*pid, *addr & !4095, signo as u8))
                    .or_insert(0) += 1;
            }
            Event::Signal { pid, signo, addr } => {
                self.r.host_signals += 1;
                let key = (*pid, *addr & !4095, *signo);
                match self.unmatched.get_mut(&key) {
                    Some(n) => {
                        *n -= 1;
                        if *n == 0 {
                            self.unmatched.remove(&key);
                        }
                        self.r.signals_matched += 1;
                    }
                    None => self.r.signals_missed += 1,
                }
            }
            Event::Validate {
                pid,
                rss_anon_kb,
                rss_file_kb,
                anon_huge_kb,
            } => {
                let Some(e) = self.pid(*pid) else { return };
                if let Ok(s) = cpu.status(e) {
                    let engine = s.rss_anon / 1024;
                    let err = if *rss_anon_kb == 0 {
                        if engine == 0 {
                            0.0
                        } else {
                            1.0
                        }
                    } else {
                        (engine as f64 - *rss_anon_kb as f64).abs() / *rss_anon_kb as f64
                    };
                    self.r.rss_compared += 1;
                    self.r.rss_max_anon_err = self.r.rss_max_anon_err.max(err);
                    // Listed up to a bound: one check a VALIDATE event, and a trace may hold
                    // a million of them.
                    if self.r.rss.len() < MAX_RSS_LISTED {
                        // A walk of the process's pages: only where PMD THPs may be mapped.
                        let anon_huge_kb = (self.thp || *anon_huge_kb > 0).then(|| {
                            let huge = cpu.smaps(e, 0, u64::MAX).map_or(0, |v| {
                                v.iter().map(|(_, s)| s.anon_huge_pages).sum::<u64>()
                            });
                            (*anon_huge_kb, huge / 1024)
                        });
                        self.r.rss.push(RssCheck {
                            pid: *pid,
                            host_anon_kb: *rss_anon_kb,
                            engine_anon_kb: engine,
                            host_file_kb: *rss_file_kb,
                            engine_file_kb: s.rss_file / 1024
                                + self.vdso.get(&e).map_or(0, image::Vdso::rss_kb),
                            anon_rel_err: err,
                            anon_huge_kb,
                        });
                    }
                }
            }
            // Saturating: two `LOST 2^63` records once wrapped to 0 and passed the no-loss check.
            Event::Lost { count } => self.r.lost = self.r.lost.saturating_add(*count),
            _ => self.syscall(ev),
        }
    }

    fn syscall(&mut self, ev: &Event) {
        let cpu = self.cpu;
        let Some(pid) = ev.pid() else { return };
        let Some(e) = self.pid(pid) else { return };
        self.r.syscalls += 1;
        let unit = |r: Result<(), Errno>| engine_ret(r.map(|()| 0));
        match *ev {
            Event::Mmap {
                addr,
                len,
                prot: p,
                flags,
                offset,
                file,
                ret,
                ..
            } => {
                let mf = MapFlags(flags);
                if mf.hugetlb() || p & !7 != 0 {
                    self.r.unsupported += 1;
                    return;
                }
                let file = if mf.anonymous() {
                    None
                } else {
                    match file.and_then(|f| self.files.get(&f).copied()) {
                        Some(f) => Some((f, offset)),
                        None => {
                            self.r.file_as_anon += 1;
                            None
                        }
                    }
                };
                let args = MmapArgs {
                    len,
                    prot: Prot::from_bits(p),
                    sharing: mf.sharing(),
                    placement: placed_at(mf, addr, ret),
                    populate: mf.populate(),
                    locked: mf.locked(),
                    noreserve: mf.noreserve(),
                    stack: mf.stack(),
                    file,
                };
                let res = cpu.mmap(e, args);
                if mf.locked() && res.is_ok() {
                    self.locked.insert(e);
                }
                if let (Ok(a), true) = (res, ret < 0) {
                    // The host refused what the engine did: undo it to stay in step.
                    let _ = cpu.munmap(e, a, len);
                }
                self.check("mmap", ret, engine_ret(res.map(|a| a as i64)));
            }
            Event::Munmap { addr, len, ret, .. } => {
                let r = unit(cpu.munmap(e, addr, len));
                self.check("munmap", ret, r);
            }
            Event::Mprotect {
                addr,
                len,
                prot: p,
                ret,
                ..
            } => {
                if p & !7 != 0 {
                    self.r.unsupported += 1;
                    return;
                }
                let r = unit(cpu.mprotect(e, addr, len, Prot::from_bits(p)));
                self.check("mprotect", ret, r);
            }
            Event::Mremap {
                addr,
                old_len,
                new_len,
                flags,
                new_addr,
                ret,
                ..
            } => {
                let mut f = MremapFlags::from_bits(flags, new_addr);
                if ret >= 0 && ret as u64 != addr && f.fixed.is_none() {
                    f.maymove = true;
                    f.fixed = Some(ret as u64);
                } else if ret >= 0 && ret as u64 == addr && f.fixed.is_none() {
                    f.maymove = false;
                }
                let r = engine_ret(cpu.mremap(e, addr, old_len, new_len, f).map(|a| a as i64));
                self.check("mremap", ret, r);
            }
            Event::Brk { ret, .. } => {
                if ret < 0 {
                    return;
                }
                let new = ret as u64;
                if let Some(old) = self.brk.insert(e, new) {
                    let (o, n) = (page_up(old), page_up(new));
                    let r = if n > o {
                        self.op = "mmap";
                        self.r.brk_as_mmap += 1;
                        let args = MmapArgs {
                            placement: Placement::Fixed(o),
                            ..MmapArgs::anon(n - o, Prot::RW)
                        };
                        engine_ret(cpu.mmap(e, args).map(|_| 0))
                    } else if n < o {
                        self.op = "munmap";
                        self.r.brk_as_mmap += 1;
                        unit(cpu.munmap(e, n, o - n))
                    } else {
                        0
                    };
                    self.check("brk", 0, r);
                }
            }
            Event::Madvise {
                addr,
                len,
                advice: a,
                ret,
                ..
            } => {
                let Some(adv) = Advice::from_number(i64::from(a)) else {
                    self.r.unsupported += 1;
                    return;
                };
                let r = unit(cpu.madvise(e, addr, len, adv));
                self.check("madvise", ret, r);
            }
            Event::Mlock {
                addr,
                len,
                flags,
                ret,
                ..
            } => {
                let r = unit(cpu.mlock2(e, addr, len, flags & MLOCK_ONFAULT != 0));
                self.locked.insert(e);
                self.check("mlock", ret, r);
            }
            Event::Munlock { addr, len, ret, .. } => {
                let r = unit(cpu.munlock(e, addr, len));
                self.check("munlock", ret, r);
            }
            Event::Mlockall { flags, ret, .. } => {
                let r = unit(cpu.mlockall(e, MlockallFlags::from_bits(flags)));
                self.locked.insert(e);
                self.check("mlockall", ret, r);
            }
            Event::Munlockall { ret, .. } => {
                let r = unit(cpu.munlockall(e));
                self.check("munlockall", ret, r);
            }
            _ => {}
        }
    }
}

/// The next event of a replay, with its payload offset when it comes from a file.
type Next<'e, 'f> = dyn FnMut() -> Result<Option<(Cow<'e, Event>, Option<u64>)>, FormatError> + 'f;

/// Replays `trace` on a new machine built from `opts`.
pub fn replay(trace: &Trace, opts: &ReplayOptions) -> Result<ReplayReport, ReplayError> {
    let mut it = trace.events.iter();
    on_machine(&trace.header.policy, opts, &mut || {
        Ok(it.next().map(|e| (Cow::Borrowed(e), None)))
    })
}

/// Replays the events of `d` as they are decoded: the trace is never held whole, and a
/// decoding error stops the replay at that byte.
pub fn replay_decoder<R: BufRead>(
    d: &mut Decoder<R>,
    opts: &ReplayOptions,
) -> Result<ReplayReport, ReplayError> {
    let recorded = d.header().policy.clone();
    on_machine(&recorded, opts, &mut || {
        Ok(d.next_event()?.map(|e| (Cow::Owned(e), Some(d.offset()))))
    })
}

fn on_machine(
    recorded: &str,
    opts: &ReplayOptions,
    next: &mut Next<'_, '_>,
) -> Result<ReplayReport, ReplayError> {
    let pairs = recorded_pairs(recorded)?;
    let cfg = machine_config_with(&pairs, opts)?;
    // Any policy but `never`, recorded or given, may map PMD THPs: compare AnonHugePages.
    let thp = pairs.iter().chain(&opts.thp).any(|(_, v)| v != "never");
    // The previous replay's RAM, already backed by the host (see `Machine::new_reusing`).
    let m = Machine::new_reusing(cfg, SPARE.with(|s| s.borrow_mut().take()));
    let r = replay_on(&m, next, opts, thp);
    SPARE.with(|s| *s.borrow_mut() = Some(m));
    r
}

thread_local! {
    /// The machine of this thread's last replay, whose RAM the next replay reuses.
    static SPARE: std::cell::RefCell<Option<Machine>> = const { std::cell::RefCell::new(None) };
}

fn replay_on(
    m: &Machine,
    next: &mut Next<'_, '_>,
    opts: &ReplayOptions,
    thp: bool,
) -> Result<ReplayReport, ReplayError> {
    if m.phys.nr_frames() == 0 {
        return Err(ReplayError::Engine(format!(
            "cannot back {} bytes of simulated RAM",
            opts.memory
        )));
    }
    let cpu = m
        .enter_cpu(0)
        .map_err(|e| ReplayError::Engine(e.to_string()))?;
    let mut rp = Replayer {
        m,
        cpu: &cpu,
        budget: opts.budget.clone(),
        touched: 0,
        walked: 0,
        locked: HashSet::new(),
        procs: HashMap::new(),
        users: HashMap::new(),
        brk: HashMap::new(),
        stacks: HashMap::new(),
        vdso: HashMap::new(),
        files: HashMap::new(),
        thp,
        r: ReplayReport::default(),
        index: 0,
        ops: ops::OpAccount::default(),
        op: "other",
        unmatched: HashMap::new(),
    };
    let t0 = Instant::now();
    let deadline = opts.budget.deadline();
    let mut n = 0u64;
    while let Some((ev, offset)) = next()? {
        let stop = |what: String| ReplayError::Budget {
            event: n,
            offset,
            what,
        };
        if n >= opts.budget.max_events {
            return Err(stop(format!(
                "more than {} events: over the budget (--max-events)",
                opts.budget.max_events
            )));
        }
        if deadline.is_some_and(|d| Instant::now() > d) {
            return Err(stop(format!(
                "the replay took more than {} s: over the budget (--max-seconds)",
                opts.budget.max_seconds
            )));
        }
        rp.charge(&ev).map_err(stop)?;
        rp.index = n;
        rp.op = ops::op_of(&ev);
        rp.event(&ev);
        rp.ops.settle(m, rp.op);
        rp.resident(&ev).map_err(stop)?;
        n += 1;
    }
    let wall = t0.elapsed().as_secs_f64();
    // Anything counted after the last event (nothing today) is filed too: the sums stay exact.
    rp.ops.settle(m, "other");
    let mut r = rp.r;
    r.fault_signals = rp.unmatched.values().sum();
    rp.ops.finish(&mut r);
    r.events = n;
    r.touched = rp.touched;
    r.walked = rp.walked;
    r.wall_seconds = wall;
    r.events_per_sec = if wall > 0.0 {
        r.events as f64 / wall
    } else {
        0.0
    };
    drop(cpu);
    r.snapshot = m.counters();
    r.counters = r
        .snapshot
        .nonzero()
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    if opts.validate {
        r.validate = Some(match m.validate() {
            Ok(()) => "ok".to_string(),
            Err(e) => format!("{e:?}"),
        });
    }
    Ok(r)
}
