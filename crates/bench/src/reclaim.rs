//! Reclaim: anonymous memory swapped out and in, and page cache reclaimed, on a machine of
//! [`Options::reclaim_memory`](crate::options::Options::reclaim_memory) (64 MiB by default)
//! with [`SWAP_MULT`] times as much swap, on the engine (a `usermm::Machine` of that RAM and
//! swap: direct reclaim at the watermark, `MADV_PAGEOUT`, swap-in with readahead) and on the
//! host kernel (a memory cgroup of that size and a swap file of that size, made and removed
//! by the oracle's host backend exactly as for a scenario's `set memory` and `set swap`).
//!
//! Rows, each one fresh process (and, on the engine, a fresh machine) per repetition:
//!
//! * `anon 2x`, `anon 4x`: a private anonymous working set of 2 (4) times the memory,
//!   written (every byte) and then read back (one access per page), sequentially: the write
//!   pass swaps out what does not fit, the read pass swaps it back in (and out again);
//! * `pageout`: half the memory written, then `MADV_PAGEOUT` of all of it and a read pass:
//!   no pressure, every page written to swap and read back; its counters are exact;
//! * `file 4x`: a disk file of 4 times the memory, none of it cached, read through a
//!   `MAP_SHARED` mapping (one access per page): page-cache reclaim, no swap.
//!
//! The sample is the timed part's time divided by the row's pages (its working set):
//! time per page. Engine: wall time of the calls (single-threaded, no device latency
//! modelled). Host: the CPU time of the server process that performs the accesses
//! (`/proc/PID/schedstat`; wall time with `USERMM_HOST_WALL` set, as for the other host
//! cells), so the host's swap and disk waits are left out as the engine has none; the
//! wall time is in `host_wall_us`. THP is off on both sides (order-0 folios).
//!
//! No `model:` column: the cost model has no calibrated recipe for reclaim.

use crate::ctx::Ctx;
use crate::engine::{counters, size_label, RO, RW};
use crate::host::HostSession;
use crate::model::{Better, Column, Row, Stat, Table, Unit, Variant};
use oracle::HostBackend;
use scenario::backend::{Backend, Fail, FileId, MmapReq, Place, ProcId};
use scenario::Setting;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;
use usermm::{
    Access, Advice, Ev, InodeKind, Machine, MachineConfig, MmapArgs, Privilege, Sharing, ThpPolicy,
};

/// Swap is this many times the memory.
pub const SWAP_MULT: u64 = 4;
/// The default memory of the machine (engine) and of the cgroup (host).
pub const DEFAULT_MEMORY: u64 = 64 << 20;
const PAGE: u64 = 4096;
/// The byte the anonymous working sets and the file hold.
const FILL: u8 = 0x5a;

/// What a row does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Case {
    /// Write then read back an anonymous working set of this many times the memory.
    Anon(u64),
    /// Write half the memory, then `MADV_PAGEOUT` all of it and read it back.
    Pageout,
    /// Read a disk file of this many times the memory through a shared mapping.
    File(u64),
}

/// The rows, in order.
pub const CASES: [Case; 4] = [Case::Anon(2), Case::Anon(4), Case::Pageout, Case::File(4)];

impl Case {
    /// The row label.
    pub fn label(self) -> String {
        match self {
            Case::Anon(k) => format!("anon {k}x"),
            Case::Pageout => "pageout".into(),
            Case::File(k) => format!("file {k}x"),
        }
    }

    fn layout(self) -> &'static str {
        match self {
            Case::Anon(_) | Case::Pageout => "private anon",
            Case::File(_) => "disk file MAP_SHARED",
        }
    }

    /// The bytes of the working set (what the time is divided by, in pages).
    pub fn bytes(self, memory: u64) -> u64 {
        match self {
            Case::Anon(k) | Case::File(k) => k * memory,
            Case::Pageout => memory / 2,
        }
    }
}

/// One engine repetition: (seconds per page, counter deltas of the timed part).
pub fn engine_once(case: Case, memory: u64) -> anyhow::Result<(f64, BTreeMap<String, u64>)> {
    let mut cfg = MachineConfig {
        memory,
        swap: SWAP_MULT * memory,
        ..MachineConfig::default()
    };
    cfg.tunables.check_tlb = false;
    let m = Machine::new(cfg);
    m.update_tunables(|t| t.thp.top = ThpPolicy::Never);
    let cpu = m.enter_cpu(0)?;
    let p = cpu.spawn(Privilege::Ordinary, 8 << 20)?;
    // The arena's frames backed by the host before the timed part (half of them: more
    // would start reclaim here).
    crate::engine::warm_up(&cpu, p, memory / 2)?;
    let size = case.bytes(memory);
    let sig = crate::engine::sig;
    let (secs, before) = match case {
        Case::Anon(_) => {
            let a = cpu.mmap(p, MmapArgs::anon(size, RW))?;
            let before = m.counters();
            let t = Instant::now();
            cpu.write_fill(p, a, size, FILL).map_err(sig)?;
            cpu.touch(p, a, size, Access::Read).map_err(sig)?;
            (t.elapsed().as_secs_f64(), before)
        }
        Case::Pageout => {
            let a = cpu.mmap(p, MmapArgs::anon(size, RW))?;
            cpu.write_fill(p, a, size, FILL).map_err(sig)?;
            let before = m.counters();
            let t = Instant::now();
            cpu.madvise(p, a, size, Advice::PageOut)?;
            cpu.touch(p, a, size, Access::Read).map_err(sig)?;
            (t.elapsed().as_secs_f64(), before)
        }
        Case::File(_) => {
            let f = cpu.file_create(size, InodeKind::Disk, Some(FILL))?;
            let a = cpu.mmap(
                p,
                MmapArgs {
                    sharing: Sharing::Shared,
                    file: Some((f, 0)),
                    ..MmapArgs::anon(size, RO)
                },
            )?;
            let before = m.counters();
            let t = Instant::now();
            cpu.touch(p, a, size, Access::Read).map_err(sig)?;
            (t.elapsed().as_secs_f64(), before)
        }
    };
    let c = counters(&m.counters().delta(&before));
    Ok((secs / (size / PAGE) as f64, c))
}

/// A host failure as text.
fn fail_text(what: &str, f: Fail) -> String {
    match f {
        Fail::Unsupported(m) => format!("{what}: {m}"),
        Fail::Outcome(o) => format!("{what}: {o:?}"),
    }
}

/// The host's machine for one table: the oracle's host backend with `set memory` and
/// `set swap` applied (the cgroup is made at the first spawn; both go when it is dropped).
fn host_rig<'k>(session: &'k HostSession, memory: u64) -> Result<HostBackend<'k>, String> {
    session.thp(false)?;
    let mut b = HostBackend::new(session.knobs()).map_err(|e| format!("host backend: {e}"))?;
    b.set_engine(&Setting::Memory(memory))
        .map_err(|f| fail_text("set memory", f))?;
    b.set_engine(&Setting::Swap(SWAP_MULT * memory, false))
        .map_err(|f| fail_text("set swap", f))?;
    Ok(b)
}

/// A process's CPU time so far, ns (`/proc/PID/schedstat`: time on a CPU). The server is
/// waiting for its next request when this is read, so the value is up to date.
fn cpu_ns(pid: ProcId) -> Result<u64, String> {
    let p = format!("/proc/{pid}/schedstat");
    let t = std::fs::read_to_string(&p).map_err(|e| format!("{p}: {e}"))?;
    t.split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("{p}: unexpected contents {t:?}"))
}

/// The `/proc/vmstat` counters the host column shows, under the engine's names
/// (machine-wide).
const VMSTAT: [(&str, &str); 7] = [
    ("pswpout", "pswpout"),
    ("pswpin", "pswpin"),
    ("pgscan_anon", "pgscan_anon"),
    ("pgsteal_anon", "pgsteal_anon"),
    ("pgscan_file", "pgscan"),
    ("pgsteal_file", "pgsteal"),
    ("pgmajfault", "host_pgmajfault"),
];

/// The event counters of the cgroup's `memory.stat` the host column shows as deltas,
/// prefixed `cg_` (v1 has the first three; v2 all of them).
const CG_EVENTS: [&str; 8] = [
    "pgmajfault",
    "pgpgin",
    "pgpgout",
    "pgscan",
    "pgsteal",
    "pswpin",
    "pswpout",
    "workingset_refault_anon",
];

fn parse_stat(text: &str) -> BTreeMap<String, u64> {
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k.to_string(), v.trim().parse().ok()?))
        })
        .collect()
}

/// What the host counters are read from, before and after the timed part.
struct HostStats {
    vmstat: BTreeMap<String, u64>,
    cg: BTreeMap<String, u64>,
}

impl HostStats {
    fn read(cgroup: Option<&PathBuf>) -> HostStats {
        let vmstat = parse_stat(&std::fs::read_to_string("/proc/vmstat").unwrap_or_default());
        let cg = cgroup
            .and_then(|d| std::fs::read_to_string(d.join("memory.stat")).ok())
            .map(|t| parse_stat(&t))
            .unwrap_or_default();
        HostStats { vmstat, cg }
    }

    /// The deltas since `before`, and the cgroup's swap usage now (`cg_swap_kb`).
    fn delta(&self, before: &HostStats, cgroup: Option<&PathBuf>) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for (k, name) in VMSTAT {
            if let (Some(a), Some(b)) = (before.vmstat.get(k), self.vmstat.get(k)) {
                out.insert(name.to_string(), b.saturating_sub(*a));
            }
        }
        for k in CG_EVENTS {
            if let (Some(a), Some(b)) = (before.cg.get(k), self.cg.get(k)) {
                out.insert(format!("cg_{k}"), b.saturating_sub(*a));
            }
        }
        // v1: `swap` of memory.stat; v2: memory.swap.current.
        let swap = self.cg.get("swap").copied().or_else(|| {
            let d = cgroup?;
            std::fs::read_to_string(d.join("memory.swap.current"))
                .ok()?
                .trim()
                .parse()
                .ok()
        });
        if let Some(s) = swap {
            out.insert("cg_swap_kb".into(), s >> 10);
        }
        out
    }
}

/// Runs `work` in the server `p` and measures it: (seconds per page, counters).
fn host_timed(
    b: &mut HostBackend<'_>,
    p: ProcId,
    pages: u64,
    work: impl FnOnce(&mut HostBackend<'_>) -> Result<(), String>,
) -> Result<(f64, BTreeMap<String, u64>), String> {
    let cg = b.machine().cgroup().map(|c| c.path().to_path_buf());
    let before = HostStats::read(cg.as_ref());
    let cpu0 = cpu_ns(p)?;
    let t = Instant::now();
    work(b)?;
    let wall = t.elapsed();
    let cpu = cpu_ns(p)?.saturating_sub(cpu0);
    let mut c = HostStats::read(cg.as_ref()).delta(&before, cg.as_ref());
    c.insert("host_wall_us".into(), wall.as_micros() as u64);
    c.insert("host_cpu_us".into(), cpu / 1000);
    let secs = if std::env::var_os("USERMM_HOST_WALL").is_some() {
        wall.as_secs_f64()
    } else {
        cpu as f64 * 1e-9
    };
    Ok((secs / pages as f64, c))
}

fn anon_req(len: u64) -> MmapReq {
    MmapReq {
        len,
        prot: scenario::Prot::Rw,
        sharing: scenario::Sharing::Private,
        populate: false,
        locked: false,
        noreserve: false,
        place: Place::Anywhere,
        file: None,
    }
}

/// One host repetition in a fresh server process of the rig's cgroup.
fn host_once(
    b: &mut HostBackend<'_>,
    case: Case,
    memory: u64,
) -> Result<(f64, BTreeMap<String, u64>), String> {
    let size = case.bytes(memory);
    let pages = size / PAGE;
    let p = b
        .spawn(false, Some(usermm::machine::DEFAULT_RLIMIT_MEMLOCK))
        .map_err(|f| fail_text("spawn", f))?;
    let mut file: Option<FileId> = None;
    let res = (|| match case {
        Case::Anon(_) => {
            let a = b
                .mmap(p, &anon_req(size))
                .map_err(|f| fail_text("mmap", f))?;
            host_timed(b, p, pages, |b| {
                b.write(p, a, size, FILL)
                    .map_err(|f| fail_text("write", f))?;
                b.touch(p, a, size, false).map_err(|f| fail_text("read", f))
            })
        }
        Case::Pageout => {
            let a = b
                .mmap(p, &anon_req(size))
                .map_err(|f| fail_text("mmap", f))?;
            b.write(p, a, size, FILL)
                .map_err(|f| fail_text("write", f))?;
            host_timed(b, p, pages, |b| {
                b.madvise(p, a, size, scenario::Advice::Pageout)
                    .map_err(|f| fail_text("madvise pageout", f))?;
                b.touch(p, a, size, false).map_err(|f| fail_text("read", f))
            })
        }
        Case::File(_) => {
            // Written, synced and dropped from the cache by the controller (outside the
            // cgroup): the first access of each page reads it from the disk.
            let f = b
                .file_create(size, scenario::FileKind::Disk, Some(FILL))
                .map_err(|f| fail_text("file", f))?;
            file = Some(f);
            let req = MmapReq {
                prot: scenario::Prot::R,
                sharing: scenario::Sharing::Shared,
                file: Some((f, 0)),
                ..anon_req(size)
            };
            let a = b.mmap(p, &req).map_err(|f| fail_text("mmap", f))?;
            host_timed(b, p, pages, |b| {
                b.touch(p, a, size, false).map_err(|f| fail_text("read", f))
            })
        }
    })();
    let exit = b.exit(p).map_err(|f| fail_text("exit", f));
    if let Some(f) = file {
        // The blocks go back to the disk; the backend keeps the (empty) file until the end.
        let _ = b.ftruncate(p, f, 0);
    }
    let r = res?;
    exit?;
    Ok(r)
}

/// Measurements (for the progress bar).
pub fn steps(reps: usize) -> u64 {
    (reps * CASES.len() * 2) as u64
}

fn variants() -> Vec<Variant> {
    vec![
        Variant::engine(
            "engine",
            "the usermm engine: a machine of that memory and swap (direct reclaim at the watermark, swap with readahead; no device time)",
        ),
        Variant::host(
            "the host kernel: the oracle's server process in a memory cgroup of that size with a swap file of that size (CPU time of the process)",
        ),
    ]
}

/// The engine counters shown under the timings (the host column has the same names from
/// /proc/vmstat, machine-wide, and `cg_` ones from its cgroup).
fn shown() -> Vec<String> {
    let mut v: Vec<String> = [
        Ev::PswpOut,
        Ev::PswpIn,
        Ev::PgScanAnon,
        Ev::PgStealAnon,
        Ev::SwapRa,
        Ev::FaultSwap,
        Ev::SwapCacheHit,
        Ev::PgScan,
        Ev::PgSteal,
        Ev::FaultFileMajor,
        Ev::DiskReads,
    ]
    .iter()
    .map(|e| e.name().to_string())
    .collect();
    v.extend(
        [
            "host_pgmajfault",
            "cg_pgmajfault",
            "cg_pswpout",
            "cg_pswpin",
            "cg_pgscan",
            "cg_pgsteal",
            "cg_swap_kb",
            "host_cpu_us",
            "host_wall_us",
        ]
        .map(String::from),
    );
    v
}

/// The reclaim table.
pub fn table(ctx: &Ctx<'_>) -> anyhow::Result<Table> {
    let memory = ctx.opts.reclaim_memory;
    let session = ctx.host.session();
    let mut rig = session
        .as_ref()
        .map_err(Clone::clone)
        .and_then(|s| host_rig(s, memory));
    let mut rows = Vec::new();
    for case in CASES {
        let mut cols = vec![
            Column::new("engine", vec![], BTreeMap::new()),
            Column::new("host", vec![], BTreeMap::new()),
        ];
        let mut reps = ctx.repetitions(&variants(), "engine", Better::Lower);
        while let Some(rep) = reps.next(&cols) {
            for i in crate::stats::rotation_host_last(rep, cols.len()) {
                if i == 0 {
                    let (secs, c) = engine_once(case, memory)?;
                    cols[0].samples.push(secs);
                    cols[0].counters = c;
                } else if cols[1].unavailable.is_none() {
                    let res = match &mut rig {
                        Ok(b) => host_once(b, case, memory),
                        Err(why) => Err(why.clone()),
                    };
                    cols[1].record(res);
                }
                ctx.task
                    .step(&format!("{} {}", case.label(), cols[i].variant))?;
            }
        }
        rows.push(Row {
            label: case.label(),
            columns: cols,
            published: vec![],
            layout: Some(case.layout().into()),
        });
    }
    // The servers, the cgroup and the swap file go before the knobs are restored.
    drop(rig);
    drop(session);
    let mib = |b: u64| size_label(b);
    Ok(Table {
        host_matches: None,
        cost_model: None,
        id: "reclaim".into(),
        title: format!(
            "reclaim: {} of memory, {} of swap (anonymous working sets, MADV_PAGEOUT, page cache)",
            mib(memory),
            mib(SWAP_MULT * memory)
        ),
        seed: None,
        metric: "time per page of the working set".into(),
        unit: Unit::Seconds,
        better: Better::Lower,
        stats: vec![Stat::Min, Stat::Median, Stat::Max],
        baseline: "engine".into(),
        variants: variants(),
        row_label: "working set".into(),
        rows,
        counters_shown: shown(),
        published_source: None,
        notes: vec![
            format!(
                "anon Nx: N x {} of private anonymous memory written (every byte), then read back (one access per page), in order; pageout: {} written, then MADV_PAGEOUT of it and a read pass (timed: both); file Nx: a disk file of N x {} not cached, read through a MAP_SHARED mapping; THP off on both sides",
                mib(memory),
                mib(Case::Pageout.bytes(memory)),
                mib(memory)
            ),
            "engine: wall time of the calls on a fresh machine per repetition (RAM = the memory, swap device of the swap size); no device latency is modelled, so its time is reclaim's and swap's bookkeeping and copying; its counters are exact deltas of the timed part".into(),
            "host: a fresh oracle server process per repetition in a memory cgroup of the memory (+1 MiB for the server itself) with a swap file of the swap size on /var/tmp (oracle set memory/set swap, removed after the table); the sample is the server's CPU time (/proc/PID/schedstat), so swap and disk waits are not in it (host_wall_us has the wall time)".into(),
            "host counters: pswpout, pswpin, pgscan_anon, pgsteal_anon, pgscan (pgscan_file), pgsteal (pgsteal_file) and host_pgmajfault are /proc/vmstat deltas, machine-wide (other processes' reclaim adds to them; no other swap is on while the oracle's lock is held); cg_* are the cgroup's own memory.stat (v1: pgmajfault, pgpgin/out, swap usage at the end)".into(),
            "engine swap faults: faults_swap counts every fault on a swap entry, swap_cache_hit those that found the page in the swap cache (minor); the others are the major ones the host counts as pgmajfault".into(),
            "pageout on the host: MADV_PAGEOUT (reclaim_pages) counts no pgscan_anon/pgsteal_anon, and returns with the pages' writeback in flight, so they stay in the swap cache and the read pass finds them there (no pswpin); the engine counts them stolen and reads them back".into(),
            "no model: column: the cost model has no calibrated recipe for reclaim".into(),
        ],
    })
}
