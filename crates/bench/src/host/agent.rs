//! Host cells measured in a fresh process, not in the bench process.
//!
//! The bench process is a poor subject for the host kernel: by the time a host cell runs it
//! holds the engine's binary, threads and whatever heap glibc kept after the engine's large
//! frees (tens of MB of anonymous RSS, 35+ VMAs), and every `fork` of it copies all that. So
//! each host cell is measured by a new process: the `usermm` binary re-executed as
//! `usermm bench __host-cell` with the request in `USERMM_HOST_CELL` (JSON). It starts with
//! only its own program, libraries and stack, inherits the bench thread's CPU pinning, builds
//! exactly the row's layout, measures, prints the result as one JSON line and exits. The THP
//! knobs are set by the bench process, which holds the machine-wide knob lock, before it
//! starts the agent. Each result carries the agent's own VMA count and anonymous RSS at the
//! moment of measurement (`host_vmas`, `host_rss_anon_kb`), so a reader sees what was forked.
//!
//! When the running executable is not `usermm` (the bench crate's own tests), the cell is
//! measured in this process instead, and says so (`host_in_process`).

use super::measure::{fork_exit_rate, fork_time, vma_count};
use super::region::{HostTmpfs, Region, SparseVmas};
use super::{mthp_stat, vmstat, Layout};
use oracle::procfs::status_kb;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The `bench` argument that makes the `usermm` binary an agent.
pub const AGENT_ARG: &str = "__host-cell";
/// The environment variable carrying the request.
const REQUEST_ENV: &str = "USERMM_HOST_CELL";

/// One host measurement.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum HostCell {
    /// fork + child `_exit` + `waitpid` for `secs`, with `vmas` VMAs in all: as many
    /// single-page VMAs are added as the agent lacks (seed 001's 21 + N).
    Spawn {
        /// VMAs of the forked process in all.
        vmas: u64,
        /// Seconds of forking.
        secs: f64,
    },
    /// Populate `size` bytes of `layout` with the mTHP or shmem size already set, PTE-remap
    /// 2M THPs, then time one `fork()` (the call) or the `munmap()` of the whole layout.
    ForkOrMunmap {
        /// Layout size.
        size: u64,
        /// Folio size of the layout.
        folio: u64,
        /// What memory (anonymous, a tmpfs file mapped private or shared).
        layout: Layout,
        /// `true`: munmap; `false`: fork.
        munmap: bool,
    },
    /// Populate `size` bytes of PMD THPs (the knob already set), PTE-map each first but for
    /// `remap` (which times that step), then time `micro` (`crate::sharing`).
    Sharing {
        /// Layout size.
        size: u64,
        /// The micro benchmark.
        micro: super::sharing::Micro,
    },
    /// Read one byte per page of a fresh `MAP_SHARED` mapping of a `size`-byte tmpfs file,
    /// sparse or written first (`cached`).
    TmpfsRead {
        /// File and mapping size.
        size: u64,
        /// Whether the file was written (its pages cached) before the mapping.
        cached: bool,
    },
    /// Map `size` bytes `MAP_LOCKED | MAP_POPULATE` (anonymous, or the first `size` bytes
    /// of a tmpfs file `MAP_SHARED`), interleaved over `interleave` nodes (0 or 1: the
    /// default policy), drain the LRU batches, then time `munlock()` of all of it. The THP
    /// knob is the bench's.
    Munlock {
        /// Mapping size.
        size: u64,
        /// Folio size the THP knob gives the mapping (4 KiB or 2 MiB).
        folio: u64,
        /// A tmpfs file instead of anonymous memory.
        tmpfs: bool,
        /// Nodes to interleave the mapping's pages over (fewer than 2: none).
        interleave: usize,
    },
    /// Populate `area` bytes of PMD THPs (the knob already set), fork `instances` writers
    /// that COW all of it together in `order` and report their summed throughput
    /// (`crate::anon_cow`).
    AnonCow {
        /// Bytes every writer copies.
        area: u64,
        /// The writers' page order.
        order: super::anon_cow::Order,
        /// Writers.
        instances: usize,
    },
    /// A calibration probe (`crate::probes`): its median time over its repetitions.
    Probe(super::probe::Probe),
    /// Write one byte per page of a fresh `size`-byte mapping.
    Fault {
        /// Mapping size.
        size: u64,
        /// Folio size (for the mTHP statistic).
        folio: u64,
    },
}

/// A measurement: (seconds or rate, counters).
pub type CellResult = Result<(f64, BTreeMap<String, u64>), String>;

#[derive(Serialize, Deserialize)]
struct Reply {
    value: f64,
    counters: BTreeMap<String, u64>,
}

/// The static spawn agent (`agent/spawn_agent.c`, built by `build.rs` where a C compiler
/// can), or empty.
#[cfg(static_spawn_agent)]
const STATIC_SPAWN_AGENT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/spawn_agent"));
#[cfg(not(static_spawn_agent))]
const STATIC_SPAWN_AGENT: &[u8] = &[];

/// Whether this build has the static spawn agent.
pub fn has_static_spawn_agent() -> bool {
    !STATIC_SPAWN_AGENT.is_empty()
}

/// A spawn cell forked by the static agent: a freestanding program (no libc) with exactly
/// `vmas` VMAs (its text, data, stack and vDSO, then single pages, the first written, up to
/// 21) forks and reaps children for `secs`. It runs from an in-memory file, inherits this
/// thread's CPU pinning, and reports the forks, the elapsed time, its VMAs and RssAnon.
fn static_spawn(vmas: u64, secs: f64) -> CellResult {
    let f = oracle::sys::memfd_with(c"usermm-spawn-agent", STATIC_SPAWN_AGENT)
        .map_err(|e| super::errno_text("memfd_create", e))?;
    let path = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&f));
    let ms = ((secs * 1e3).ceil() as u64).max(1);
    let out = std::process::Command::new(path)
        .args([vmas.to_string(), ms.to_string()])
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("static spawn agent: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let v: Vec<u64> = text
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    let (forks, wall, got, rss, cpu) = match v[..] {
        [forks, ns, got, rss, cpu] => (forks, ns, got, rss, cpu),
        [forks, ns, got, rss] => (forks, ns, got, rss, 0),
        _ => return Err(format!("static spawn agent failed ({})", out.status)),
    };
    // The loop's CPU time (the parent's forks and waits, the children's exits), as the other
    // host cells are timed (`measure::Stamp`); the wall clock without it or when asked.
    let ns = if cpu > 0 && std::env::var_os("USERMM_HOST_WALL").is_none() {
        cpu
    } else {
        wall
    };
    if ns == 0 || forks == 0 {
        return Err("static spawn agent made no fork".into());
    }
    let c = BTreeMap::from([
        ("host_vmas".to_string(), got),
        ("host_rss_anon_kb".to_string(), rss),
        ("host_static_agent".to_string(), 1),
    ]);
    Ok((forks as f64 * 1e9 / ns as f64, c))
}

/// Measures `cell` in a fresh agent process (or here, outside the `usermm` binary). Spawn
/// cells go to the static agent when the build has one. Where the kernel counts the free
/// memory it reports to the hypervisor, the cell's counters get `host_reported_kib`: how
/// much was reported while it ran (machine-wide). Non-zero means the hypervisor may have
/// taken back pages the cell then touched, which costs several times a kernel fault.
pub fn measure(cell: &HostCell) -> CellResult {
    let before = super::reported_kib();
    let (v, mut c) = measure_cell(cell)?;
    if let (Some(a), Some(b)) = (before, super::reported_kib()) {
        c.insert("host_reported_kib".into(), b.saturating_sub(a));
    }
    Ok((v, c))
}

fn measure_cell(cell: &HostCell) -> CellResult {
    if let HostCell::Spawn { vmas, secs } = *cell {
        if has_static_spawn_agent() {
            return static_spawn(vmas, secs);
        }
    }
    let Some(exe) = agent_exe() else {
        let mut r = run(cell)?;
        r.1.insert("host_in_process".into(), 1);
        return Ok(r);
    };
    let req = serde_json::to_string(cell).map_err(|e| e.to_string())?;
    let (line, out) = ask_agent(&exe, &req).map_err(|e| format!("host agent: {e}"))?;
    match serde_json::from_str::<Result<Reply, String>>(&line) {
        Ok(Ok(r)) => Ok((r.value, r.counters)),
        Ok(Err(why)) => Err(why),
        Err(_) => Err(format!(
            "host agent failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )),
    }
}

/// Runs the agent `exe` on `request`: the last line it printed (its reply) and its output.
fn ask_agent(
    exe: &std::path::Path,
    request: &str,
) -> std::io::Result<(String, std::process::Output)> {
    let out = std::process::Command::new(exe)
        .args(["bench", AGENT_ARG])
        .env(REQUEST_ENV, request)
        .stdin(std::process::Stdio::null())
        .output()?;
    let line = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .to_string();
    Ok((line, out))
}

/// Host counter of the fork and munmap cells: per mille of the layout's folios whose first
/// frame is next to the previous folio's last (read from the agent's `/proc/self/pagemap`
/// at up to 1 024 of the layout's folio boundaries, `costmodel::folio_steps`); the model
/// prices that row's `line_jump` with it and [`FOLIO_FAR`].
pub const FOLIO_ADJACENCY: &str = "host_folio_adjacency_permille";

/// Host counter of the fork and munmap cells: per mille of the layout's folios whose first
/// frame is [`crate::costmodel::FAR_FRAMES`] or more from the previous folio's last (its
/// `struct page` in another 4 KiB of memmap); the model prices those steps at `line_far`.
pub const FOLIO_FAR: &str = usermm_model::profile::HOST_FAR;

/// The `usermm` executable, when this process is one.
fn agent_exe() -> Option<std::path::PathBuf> {
    let exe = std::env::current_exe().ok()?;
    (exe.file_stem()? == "usermm").then_some(exe)
}

/// Bytes the agent primes before measuring the primitives (their buffers, 2 x 64 MiB and
/// the 256 MiB one `zero_page` clears, and the 64 MiB mprotect region, with room to spare).
const PRIMITIVES_PRIME: u64 = 512 << 20;

/// The request that asks the agent for the cost model's primitives instead of a cell.
const PRIMITIVES_REQUEST: &str = "primitives";

/// The primitives as one fresh agent process measures them (on this thread's CPU); `None`
/// when this process is not the `usermm` binary or the agent fails.
pub fn fresh_primitives() -> Option<usermm_model::prices::Primitives> {
    let (line, _) = ask_agent(&agent_exe()?, PRIMITIVES_REQUEST).ok()?;
    serde_json::from_str(&line).ok()
}

/// The agent's side: reads the request from the environment, measures, prints one JSON line.
pub fn serve() -> anyhow::Result<()> {
    let req = std::env::var(REQUEST_ENV)
        .map_err(|_| anyhow::anyhow!("{AGENT_ARG} is internal: it needs {REQUEST_ENV}"))?;
    if req == PRIMITIVES_REQUEST {
        // The primitives allocate about 450 MiB (their buffers and the mprotect region):
        // prime as much, as the host cells do, so that they run on memory the hypervisor
        // backs. Measured between the rows of a bench run without it, right after cells that
        // freed hundreds of MiB, kcall read 7 to 13 ns where the same binary read 2.8 to
        // 3.6 standalone a minute later.
        crate::host::prime(PRIMITIVES_PRIME);
        let p = crate::costmodel::primitives::measure();
        println!("{}", serde_json::to_string(&p)?);
        return Ok(());
    }
    let cell: HostCell = serde_json::from_str(&req)?;
    let reply = run(&cell).map(|(value, counters)| Reply { value, counters });
    println!("{}", serde_json::to_string(&reply)?);
    Ok(())
}

/// What the measured process looked like: its VMAs and anonymous RSS. Read from files
/// that walk no page table (`/proc/self/maps`, `/proc/self/status`), so taking the shape
/// before a timed call leaves the cache as the layout's population left it. Returns the
/// `status` text it read, for a cell that reports more of it.
fn shape(c: &mut BTreeMap<String, u64>) -> String {
    c.insert("host_vmas".into(), vma_count());
    let status = proc_text("/proc/self/status");
    c.insert("host_rss_anon_kb".into(), status_kb(&status, "RssAnon"));
    status
}

/// How much of the process THPs map (`AnonHugePages`, `ShmemPmdMapped`): read from
/// `/proc/self/smaps_rollup`, which walks every page table and reads each mapped folio's
/// `struct page`, so only after the timed call (a `munmap` cell, whose layout is gone by
/// then, has none; its `host_mthp_*` counters say what the layout's folios were).
fn huge_mapped(c: &mut BTreeMap<String, u64>) {
    let rollup = proc_text("/proc/self/smaps_rollup");
    c.insert(
        "host_anon_huge_kb".into(),
        status_kb(&rollup, "AnonHugePages"),
    );
    c.insert(
        "host_shmem_pmd_mapped_kb".into(),
        status_kb(&rollup, "ShmemPmdMapped"),
    );
}

/// A `/proc` file's text (empty if it cannot be read).
fn proc_text(path: &str) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// Interleaves this thread's allocations over `nodes` nodes (fewer than 2: back to the
/// default policy).
fn interleave_allocations(nodes: usize) -> Result<(), String> {
    let (mode, mask) = if nodes >= 2 {
        (3, (1u64 << nodes.min(63)) - 1)
    } else {
        (0, 0)
    };
    oracle::sys::set_mempolicy(mode, mask).map_err(|e| super::errno_text("set_mempolicy", e))
}

/// This process's minor faults so far (`getrusage`'s `ru_minflt`, from `/proc/self/stat`).
fn minor_faults() -> u64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|t| {
            // Fields after the command name (which may hold spaces) start at `state`;
            // minflt is field 10, the 8th after `)`.
            let rest = &t[t.rfind(')')? + 2..];
            rest.split(' ').nth(7)?.parse().ok()
        })
        .unwrap_or(0)
}

/// `size` bytes of anonymous memory populated with the mTHP size already set; how many
/// folios of that size the faults allocated (`host_mthp_anon_fault_alloc`, machine-wide
/// counts before and after: other processes' faults meanwhile would add to it).
fn populated_anon(size: u64, folio: u64, c: &mut BTreeMap<String, u64>) -> Result<Region, String> {
    let r = Region::anon(size)?;
    let alloc0 = mthp_stat(folio, "anon_fault_alloc").unwrap_or(0);
    r.populate()?;
    if folio > 4096 {
        let n = mthp_stat(folio, "anon_fault_alloc")
            .unwrap_or(0)
            .saturating_sub(alloc0);
        c.insert("host_mthp_anon_fault_alloc".into(), n);
    }
    Ok(r)
}

/// Seed 000's anonymous layout: populated with the mTHP size already set, 2M THPs
/// PTE-mapped as the seed does.
fn anon_layout(size: u64, folio: u64, c: &mut BTreeMap<String, u64>) -> Result<Region, String> {
    let r = populated_anon(size, folio, c)?;
    if folio == 2 << 20 {
        let s0 = vmstat("thp_split_pmd").unwrap_or(0);
        r.remap_ptes()?;
        let n = vmstat("thp_split_pmd").unwrap_or(0).saturating_sub(s0);
        c.insert("host_thp_split_pmd".into(), n);
    }
    Ok(r)
}

/// A tmpfs layout of [`Layout`] over the file `f`, as the engine builds it.
fn tmpfs_layout(
    f: &HostTmpfs,
    size: u64,
    folio: u64,
    layout: Layout,
    c: &mut BTreeMap<String, u64>,
) -> Result<Region, String> {
    let shared = layout == Layout::TmpfsShared;
    let a0 = mthp_stat(folio, "shmem_alloc").unwrap_or(0);
    let mut r = Region::file(size, f.fd(), shared, 0)?;
    if shared {
        r.write_each_page()?;
        let skew = layout.skew(folio);
        if skew != 0 {
            drop(r);
            r = Region::file(size, f.fd(), shared, skew)?;
            r.read_each_page()?;
        }
    } else {
        r.read_each_page()?;
        for blk in (r.addr..r.addr + size).step_by(2 << 20) {
            oracle::sys::touch(blk, 4096, true).map_err(|s| format!("signal {s}"))?;
        }
    }
    if folio > 4096 {
        let n = mthp_stat(folio, "shmem_alloc")
            .unwrap_or(0)
            .saturating_sub(a0);
        c.insert("host_mthp_shmem_alloc".into(), n);
    }
    Ok(r)
}

/// Samples the frame steps between the `folio_pages`-page folios of `[addr, addr + len)`
/// into [`FOLIO_ADJACENCY`] and [`FOLIO_FAR`] (nothing where `pagemap` shows no frames).
/// Each sampled boundary's two `struct page`s are read: before a timed call that walks the
/// range, at most 2 048 of them.
fn sample_steps(addr: u64, len: u64, folio_pages: u64, phase: u64, c: &mut BTreeMap<String, u64>) {
    if let Some(s) = crate::costmodel::primitives::folio_steps(
        addr,
        len >> 12,
        folio_pages.max(1),
        phase,
        crate::costmodel::primitives::Samples::Spread,
    ) {
        c.insert(FOLIO_ADJACENCY.into(), (s.adjacent * 1000.0).round() as u64);
        c.insert(FOLIO_FAR.into(), (s.far * 1000.0).round() as u64);
    }
}

/// Measures `cell` in this process.
fn run(cell: &HostCell) -> CellResult {
    let mut c = BTreeMap::new();
    match *cell {
        HostCell::Probe(probe) => {
            let (secs, far) = super::probe::host_run(&probe)?;
            if let Some(far) = far {
                c.insert(FOLIO_FAR.into(), (far * 1000.0).round() as u64);
            }
            Ok((secs, c))
        }
        HostCell::Spawn { vmas, secs } => {
            let extra = vmas.saturating_sub(vma_count());
            let layout = SparseVmas::new(extra)?;
            shape(&mut c);
            let (rate, _) = fork_exit_rate(secs)?;
            drop(layout);
            Ok((rate, c))
        }
        HostCell::ForkOrMunmap {
            size,
            folio,
            layout,
            munmap,
        } => {
            // The tmpfs file (if any) stays open until the timed operation is done.
            let (r, _file) = match layout {
                Layout::Anon => (anon_layout(size, folio, &mut c)?, None),
                _ => {
                    let f = HostTmpfs::new(size)?;
                    (tmpfs_layout(&f, size, folio, layout, &mut c)?, Some(f))
                }
            };
            shape(&mut c);
            sample_steps(r.addr, size, folio >> 12, layout.skew(folio) >> 12, &mut c);
            let secs = if munmap {
                r.unmap_timed()?
            } else {
                let secs = fork_time()?;
                huge_mapped(&mut c);
                secs
            };
            Ok((secs, c))
        }
        HostCell::Sharing { size, micro } => {
            let r = if micro.remapped() {
                anon_layout(size, 2 << 20, &mut c)?
            } else {
                populated_anon(size, 2 << 20, &mut c)?
            };
            shape(&mut c);
            // Read after the timed call: the walk would warm every struct page before it.
            let secs = super::sharing::host_timed(r, size, micro, || huge_mapped(&mut c))?;
            Ok((secs, c))
        }
        HostCell::TmpfsRead { size, cached } => {
            if !cached {
                super::prime(size);
            }
            let f = HostTmpfs::new(size)?;
            if cached {
                f.fill(size, 0x5a)?;
            }
            let r = Region::file(size, f.fd(), true, 0)?;
            shape(&mut c);
            let flt0 = minor_faults();
            let t = super::measure::Stamp::now();
            r.read_each_page()?;
            let secs = t.secs();
            c.insert("host_faults".into(), minor_faults().saturating_sub(flt0));
            huge_mapped(&mut c);
            // The page-cache folios' frames, mapped only now: read after the timed reads.
            sample_steps(r.addr, size, 1, 0, &mut c);
            drop(r);
            drop(f);
            Ok((secs, c))
        }
        HostCell::Munlock {
            size,
            folio,
            tmpfs,
            interleave,
        } => {
            if interleave >= 2 {
                interleave_allocations(interleave)?;
            }
            let file = if tmpfs {
                Some(HostTmpfs::new(size)?)
            } else {
                None
            };
            let r = match &file {
                Some(f) => Region::file_locked(size, f.fd()),
                None => Region::locked(size),
            };
            if interleave >= 2 {
                interleave_allocations(0)?;
            }
            let r = r?;
            oracle::sys::drain_lru_batches();
            let status = shape(&mut c);
            c.insert("host_locked_kb".into(), status_kb(&status, "VmLck"));
            // Small folios only: a sample of PMD-mapped THPs would read every head the timed
            // munlock is about to (each boundary's second entry is one).
            if folio < 2 << 20 {
                sample_steps(r.addr, size, folio >> 12, 0, &mut c);
            }
            let secs = super::measure::timed(|| {
                oracle::sys::munlock(r.addr, r.len).map_err(|e| super::errno_text("munlock", e))
            })?;
            // munlock splits nothing: the THP setup's check, after the timed call.
            huge_mapped(&mut c);
            drop(r);
            drop(file);
            Ok((secs, c))
        }
        HostCell::AnonCow {
            area,
            order,
            instances,
        } => {
            let r = Region::anon(area)?;
            r.populate()?;
            shape(&mut c);
            let rate = super::anon_cow::host_writers(&r, order, instances, &mut c)?;
            huge_mapped(&mut c);
            Ok((rate, c))
        }
        HostCell::Fault { size, folio } => {
            super::prime(size);
            let r = Region::anon(size)?;
            let a0 = mthp_stat(folio, "anon_fault_alloc").unwrap_or(0);
            shape(&mut c);
            let t = super::measure::Stamp::now();
            r.write_each_page()?;
            let secs = t.secs();
            huge_mapped(&mut c);
            if folio > 4096 {
                let n = mthp_stat(folio, "anon_fault_alloc")
                    .unwrap_or(0)
                    .saturating_sub(a0);
                c.insert("host_mthp_anon_fault_alloc".into(), n);
            }
            Ok((secs, c))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spawn_cell_forks_a_process_of_the_asked_size() {
        let (rate, c) = measure(&HostCell::Spawn {
            vmas: 300,
            secs: 0.01,
        })
        .expect("fork works here");
        assert!(rate > 0.0);
        assert!(c.contains_key("host_rss_anon_kb"));
        if !has_static_spawn_agent() {
            // Outside the usermm binary the cell runs here and says so.
            assert_eq!(c.get("host_in_process"), Some(&1));
            // Other test threads of this process come and go (a stack VMA each) while it
            // counts.
            assert!(c["host_vmas"] >= 280, "{c:?}");
        } else {
            // The static agent has exactly the VMAs asked for, and little anonymous memory
            // (its stack and the written pages).
            assert_eq!(c.get("host_static_agent"), Some(&1));
            assert_eq!(c["host_vmas"], 300, "{c:?}");
            assert!(c["host_rss_anon_kb"] < 1024, "{c:?}");
        }
    }

    #[test]
    fn the_static_agent_forks_the_smallest_row_exactly() {
        if !has_static_spawn_agent() {
            return;
        }
        let (rate, c) = static_spawn(21, 0.01).expect("static agent");
        assert!(rate > 0.0);
        assert_eq!(c["host_vmas"], 21, "{c:?}");
    }

    #[test]
    fn requests_survive_the_environment() {
        let cell = HostCell::ForkOrMunmap {
            size: 2 << 20,
            folio: 64 << 10,
            layout: Layout::TmpfsShared,
            munmap: true,
        };
        let text = serde_json::to_string(&cell).expect("json");
        assert_eq!(serde_json::from_str::<HostCell>(&text).expect("back"), cell);
        let cell = HostCell::AnonCow {
            area: 4 << 20,
            order: crate::anon_cow::Order::Rand,
            instances: 2,
        };
        let text = serde_json::to_string(&cell).expect("json");
        assert_eq!(serde_json::from_str::<HostCell>(&text).expect("back"), cell);
    }
}
