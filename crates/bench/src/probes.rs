//! The calibration probes: small mm workloads that the host kernel times and the engine
//! counts, so that a fit ([`usermm_model::fit`]) can price the engine's counters on the
//! running kernel.
//!
//! Every probe is one timed operation after an untimed setup, run the same way on both
//! sides: on the host in a fresh agent process (as the bench's host cells are, so the fixed
//! work of a `fork` is the same small process's), the median of [`HOST_REPS`] repetitions,
//! each on a fresh setup; on the engine once (its counters are exact). The grids sweep each
//! family's factors apart (pages, VMAs, folio order, stride), always with a low level of
//! the others, so that per-call, per-VMA, per-page and per-folio counters do not move
//! together. No probe uses a benchmark row's layout and size: the rows are 16, 64, 256 MiB
//! and 1 GiB, 21 + N VMAs with N in 0…6400 and whole-layout operations; the probes are at
//! most 12 MiB but for the fault, COW, fork, munmap, dontneed and mprotect probes of 47 to
//! 156 MiB that zero, copy and walk past the last-level cache, where the rows of 256 MiB
//! are (their own prices per folio and page there: on this AMD guest munmap of 4 KiB folios
//! cost 209 ns a page at 12 MiB and 310 at 47 MiB).
//!
//! Beyond the tables' own operations, three kinds of probes separate what whole-layout
//! calls cannot: one call per page (`dontneed-each`, `mprotect-split`: a system call's own
//! work apart from its pages'), write faults after the child exited (`cow-reuse`: reuse
//! without a copy) and the fork and munmap tables' tmpfs layouts at sizes no row has
//! (`fork-file`, `munmap-shared`: a file folio's work apart from an anonymous one's).
//!
//! Not probed (their recipes stand, and the profile says so): remote TLB shootdowns (the
//! engine's counters do not separate a remote flush from a local one), readahead from disk,
//! PMD-mapped THP copy-on-write, the arm64 linear map.

use crate::engine::{machine, sig, PMD, RO, RW};
use crate::fork::{Layout, Op};
use usermm_model::profile::HOST_FAR;
use crate::host::measure::LiveChild;
use crate::host::region::{HostTmpfs, Region, SparseVmas, MADV_DONTNEED};
use crate::host::{errno_text, HostSession};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use usermm::{
    Access, Advice, Cpu, InodeKind, Machine, MmapArgs, MremapFlags, Pid, Placement, Privilege,
    Sharing, ShmemHuge, ThpPolicy,
};

/// Seconds of forking per spawn probe point.
pub const SPAWN_SECS: f64 = 0.05;

/// Host repetitions per probe point in one agent process; the median is kept.
pub const HOST_REPS: usize = 7;

/// Bytes an agent primes before its repetitions: the largest probe (156 MiB), and more.
const PRIME: u64 = 192 << 20;

const PAGE: u64 = 4096;

/// One probe point.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Probe {
    /// `mprotect(PROT_READ)` of one VMA of `pages` 4 KiB pages, written (each maps its own
    /// frame) or read (each maps the shared zero page).
    Mprotect {
        /// Pages.
        pages: u64,
        /// Folio size of written pages, bytes (read pages are 4 KiB).
        folio: u64,
        /// Written rather than read.
        written: bool,
    },
    /// `fork()` (the call, in the parent) of a process with `vmas` extra single-page VMAs
    /// and `pages` written pages in folios of `folio` bytes (2 MiB ones PTE-mapped).
    Fork {
        /// Extra empty VMAs.
        vmas: u64,
        /// Written pages.
        pages: u64,
        /// Folio size, bytes.
        folio: u64,
    },
    /// fork + the child's `_exit` + `waitpid` of a process of `vmas` VMAs in all, 21 of
    /// them written, measured as the spawn table's host cells are (the static spawn agent
    /// where the build has it, the rate over [`SPAWN_SECS`]), at VMA counts no row has.
    Spawn {
        /// VMAs in all.
        vmas: u64,
    },
    /// `munmap()` of `pages` written pages in folios of `folio` bytes.
    Munmap {
        /// Pages.
        pages: u64,
        /// Folio size, bytes.
        folio: u64,
    },
    /// `madvise(MADV_DONTNEED)` of `pages` written pages in folios of `folio` bytes.
    Dontneed {
        /// Pages.
        pages: u64,
        /// Folio size, bytes.
        folio: u64,
    },
    /// A write to each page of a fresh mapping (first-touch faults, one per folio).
    Fault {
        /// Pages.
        pages: u64,
        /// Folio size, bytes.
        folio: u64,
    },
    /// A read of each page of a fresh mapping (zero-page faults).
    ZeroFault {
        /// Pages.
        pages: u64,
    },
    /// After a fork whose child stays alive, a write to each page in the parent
    /// (copy-on-write faults).
    Cow {
        /// Pages.
        pages: u64,
        /// Folio size, bytes.
        folio: u64,
    },
    /// A read of every `stride`-th page of a fresh `MAP_SHARED` mapping of a cached tmpfs
    /// file of `pages` pages (fault-around maps the rest of each 64 KiB).
    TmpfsRead {
        /// File pages.
        pages: u64,
        /// Pages between reads.
        stride: u64,
    },
    /// `mlock()` of `pages` written 4 KiB pages.
    Mlock {
        /// Pages.
        pages: u64,
    },
    /// `munlock()` of `pages` locked pages in folios of `folio` bytes (4 KiB or 2 MiB).
    Munlock {
        /// Pages.
        pages: u64,
        /// Folio size, bytes.
        folio: u64,
    },
    /// `mremap()` moving `pages` written pages in folios of `folio` bytes to a reserved
    /// address.
    Mremap {
        /// Pages.
        pages: u64,
        /// Folio size, bytes.
        folio: u64,
    },
    /// `mmap()` and `munmap()` of one page with `vmas` extra VMAs present.
    MmapVmas {
        /// Extra VMAs.
        vmas: u64,
    },
    /// `madvise(MADV_DONTNEED)` of each 4 KiB page of `pages` written pages in turn, one
    /// call per page (folios of `folio` bytes, 2 MiB ones PTE-mapped): the system call's own
    /// work apart from the pages'.
    DontneedEach {
        /// Pages (and calls).
        pages: u64,
        /// Folio size, bytes.
        folio: u64,
    },
    /// `mprotect(PROT_READ)` of one 4 KiB subpage of each of `pages / 512` PMD-mapped THPs
    /// in turn: a PMD split and two VMA splits per call.
    MprotectSplit {
        /// Pages (a multiple of 512).
        pages: u64,
    },
    /// After a fork whose child has exited, a write to each page in the parent (write
    /// faults that reuse the exclusive folio: no copy).
    CowReuse {
        /// Pages.
        pages: u64,
        /// Folio size, bytes.
        folio: u64,
    },
    /// `fork()` or `munmap()` of one of the fork and munmap tables' tmpfs layouts, at a size
    /// no row has.
    File {
        /// Pages.
        pages: u64,
        /// Folio size of the tmpfs file, bytes.
        folio: u64,
        /// The layout ([`Layout::TmpfsPrivate`] or [`Layout::TmpfsShared`]).
        layout: Layout,
        /// `munmap` rather than `fork`.
        munmap: bool,
    },
}

impl Probe {
    /// The family: one workload swept over its grid, the unit the fit's validation leaves
    /// out (`munmap/64K`); its operation is the part before the slash.
    pub fn family(&self) -> String {
        let sized = |op: &str, folio: u64| format!("{op}/{}", crate::engine::size_label(folio));
        match *self {
            Probe::Mprotect {
                written: true,
                folio,
                ..
            } => sized("mprotect-written", folio),
            Probe::Mprotect { written: false, .. } => "mprotect-zero".into(),
            Probe::Fork { pages: 0, .. } => "fork-vmas".into(),
            Probe::Fork { vmas, .. } if vmas > 0 => "fork-vmas".into(),
            Probe::Fork { folio, .. } => sized("fork", folio),
            // Two families, so that leaving one out leaves the operation priced.
            Probe::Spawn { vmas } if vmas < 200 => "spawn/few".into(),
            Probe::Spawn { .. } => "spawn/many".into(),
            Probe::Munmap { folio, .. } => sized("munmap", folio),
            Probe::Dontneed { folio, .. } => sized("dontneed", folio),
            Probe::Fault { folio, .. } => sized("fault", folio),
            Probe::ZeroFault { .. } => "zero-fault".into(),
            Probe::Cow { folio, .. } => sized("cow", folio),
            Probe::TmpfsRead { stride: 1, .. } => "tmpfs-read/every".into(),
            Probe::TmpfsRead { .. } => "tmpfs-read/strided".into(),
            Probe::Mlock { .. } => "mlock".into(),
            Probe::Munlock { folio, .. } => sized("munlock", folio),
            Probe::Mremap { folio, .. } => sized("mremap", folio),
            Probe::MmapVmas { .. } => "mmap-vmas".into(),
            Probe::DontneedEach { folio, .. } => sized("dontneed-each", folio),
            Probe::MprotectSplit { .. } => "mprotect-split/2M".into(),
            Probe::CowReuse { folio, .. } => sized("cow-reuse", folio),
            Probe::File {
                folio,
                munmap: false,
                ..
            } => sized("fork-file", folio),
            Probe::File { folio, .. } => sized("munmap-shared", folio),
        }
    }

    /// The point within its family.
    pub fn label(&self) -> String {
        match *self {
            Probe::Fork { vmas, pages, .. } => format!("{vmas}v {pages}p"),
            Probe::Spawn { vmas } | Probe::MmapVmas { vmas } => format!("{vmas}v"),
            Probe::TmpfsRead { pages, stride } => format!("{pages}p /{stride}"),
            Probe::Mprotect { pages, .. }
            | Probe::ZeroFault { pages }
            | Probe::Mlock { pages }
            | Probe::Mremap { pages, .. }
            | Probe::Munmap { pages, .. }
            | Probe::Dontneed { pages, .. }
            | Probe::Fault { pages, .. }
            | Probe::Cow { pages, .. }
            | Probe::Munlock { pages, .. }
            | Probe::DontneedEach { pages, .. }
            | Probe::MprotectSplit { pages }
            | Probe::CowReuse { pages, .. }
            | Probe::File { pages, .. } => format!("{pages}p"),
        }
    }

    /// The anonymous folio size the host's mTHP knobs must give (4 KiB: none).
    fn anon_folio(&self) -> u64 {
        match *self {
            Probe::Fork { folio, .. }
            | Probe::Mprotect { folio, .. }
            | Probe::Mremap { folio, .. }
            | Probe::Munmap { folio, .. }
            | Probe::Dontneed { folio, .. }
            | Probe::Fault { folio, .. }
            | Probe::Cow { folio, .. }
            | Probe::Munlock { folio, .. }
            | Probe::DontneedEach { folio, .. }
            | Probe::CowReuse { folio, .. } => folio,
            Probe::MprotectSplit { .. } => PMD,
            _ => PAGE,
        }
    }

    /// The operation timed, as [`usermm_model::profile::features`] names it (`spawn`: fork,
    /// exit and wait; `fault`: user accesses).
    pub fn op(&self) -> &'static str {
        match self {
            Probe::Spawn { .. } => "spawn",
            Probe::Fork { .. } | Probe::File { munmap: false, .. } => "fork",
            Probe::Mprotect { .. } | Probe::MprotectSplit { .. } => "mprotect",
            Probe::Munmap { .. } | Probe::File { .. } => "munmap",
            Probe::Dontneed { .. } | Probe::DontneedEach { .. } => "madvise",
            Probe::Mlock { .. } => "mlock",
            Probe::Munlock { .. } => "munlock",
            Probe::Mremap { .. } => "mremap",
            Probe::MmapVmas { .. } => "mmap",
            Probe::Fault { .. }
            | Probe::ZeroFault { .. }
            | Probe::Cow { .. }
            | Probe::TmpfsRead { .. }
            | Probe::CowReuse { .. } => "fault",
        }
    }
}

/// The probe catalogue, in the order calibration runs it: each family swept over two to
/// four sizes.
pub fn catalogue() -> Vec<Probe> {
    const K64: u64 = 64 << 10;
    const K16: u64 = 16 << 10;
    let mut v = Vec::new();
    for pages in [8, 100, 700, 3000] {
        v.push(Probe::Mprotect {
            pages,
            folio: PAGE,
            written: true,
        });
        v.push(Probe::Mprotect {
            pages,
            folio: PAGE,
            written: false,
        });
    }
    for pages in [640, 2560] {
        v.push(Probe::Mprotect {
            pages,
            folio: K64,
            written: true,
        });
    }
    for (vmas, pages) in [(0, 0), (150, 0), (900, 0), (2500, 0), (900, 1000)] {
        v.push(Probe::Fork {
            vmas,
            pages,
            folio: PAGE,
        });
    }
    for (pages, folio) in [
        (100, PAGE),
        (1000, PAGE),
        (3000, PAGE),
        (640, K16),
        (2560, K16),
        (640, K64),
        (2560, K64),
        (1024, PMD),
        (2560, PMD),
        (12000, PAGE),
        (12000, K16),
        (24000, K64),
        (24576, PMD),
        (40000, PAGE),
    ] {
        v.push(Probe::Fork {
            vmas: 0,
            pages,
            folio,
        });
    }
    // Rows: 21 + {0, 100, 200, 400, …, 6400} VMAs in all.
    for vmas in [30, 80, 300, 1200, 3000] {
        v.push(Probe::Spawn { vmas });
    }
    for (pages, folio) in [
        (50, PAGE),
        (600, PAGE),
        (3000, PAGE),
        (640, K16),
        (2560, K16),
        (160, K64),
        (2560, K64),
        (1024, PMD),
        (2560, PMD),
        (12000, PAGE),
        (12000, K16),
        (24000, K64),
        (24576, PMD),
        (40000, PAGE),
        (40000, K64),
    ] {
        v.push(Probe::Munmap { pages, folio });
    }
    for (pages, folio) in [
        (30, PAGE),
        (900, PAGE),
        (640, K64),
        (2560, K64),
        (1024, PMD),
        (2560, PMD),
        (24000, K64),
    ] {
        v.push(Probe::Dontneed { pages, folio });
    }
    // The large ones past the 32 MiB L3 of the machine this was written on, where zeroing
    // and copying run at memory bandwidth (pages_zeroed_cold); none at a row's size.
    for (pages, folio) in [
        (100, PAGE),
        (1500, PAGE),
        (12000, PAGE),
        (400, K16),
        (1600, K16),
        (320, K64),
        (1600, K64),
        (24000, K64),
        (1024, PMD),
        (2560, PMD),
        (24576, PMD),
    ] {
        v.push(Probe::Fault { pages, folio });
    }
    for pages in [200, 2500] {
        v.push(Probe::ZeroFault { pages });
    }
    for (pages, folio) in [
        (100, PAGE),
        (1200, PAGE),
        (12000, PAGE),
        (320, K64),
        (1280, K64),
    ] {
        v.push(Probe::Cow { pages, folio });
    }
    for (pages, stride) in [(400, 1), (1600, 1), (800, 32), (1600, 32)] {
        v.push(Probe::TmpfsRead { pages, stride });
    }
    for pages in [64, 1000, 3000] {
        v.push(Probe::Mlock { pages });
    }
    for (pages, folio) in [
        (64, PAGE),
        (1000, PAGE),
        (3000, PAGE),
        (1024, PMD),
        (2560, PMD),
    ] {
        v.push(Probe::Munlock { pages, folio });
    }
    for (pages, folio) in [
        (16, PAGE),
        (600, PAGE),
        (3000, PAGE),
        (640, K64),
        (2560, K64),
    ] {
        v.push(Probe::Mremap { pages, folio });
    }
    for vmas in [10, 500, 3000] {
        v.push(Probe::MmapVmas { vmas });
    }
    for (pages, folio) in [(300, PAGE), (1500, PAGE), (512, PMD), (2048, PMD)] {
        v.push(Probe::DontneedEach { pages, folio });
    }
    for (pages, folio) in [(1200, PAGE), (12000, PAGE), (1024, PMD), (12288, PMD)] {
        v.push(Probe::CowReuse { pages, folio });
    }
    for pages in [3072, 24576] {
        v.push(Probe::MprotectSplit { pages });
    }
    for (pages, folio, layout, munmap) in [
        (3000, PAGE, Layout::TmpfsPrivate, false),
        (12000, PAGE, Layout::TmpfsPrivate, false),
        (2560, K64, Layout::TmpfsShared, true),
        (24000, K64, Layout::TmpfsShared, true),
        (2560, PMD, Layout::TmpfsShared, true),
        (24576, PMD, Layout::TmpfsShared, true),
    ] {
        v.push(Probe::File {
            pages,
            folio,
            layout,
            munmap,
        });
    }
    v
}

/// The host's median time of `probe`, ns: its mTHP or shmem knob set under `session`, then
/// measured in a fresh agent process.
/// With it, the median share of the layout's folio boundaries far apart in physical memory,
/// per mille, where the probe samples one.
pub fn host_ns(session: &HostSession, probe: &Probe) -> Result<(f64, Option<u64>), String> {
    if let Probe::Spawn { vmas } = *probe {
        session.folio(PAGE)?;
        let cell = crate::host::agent::HostCell::Spawn {
            vmas,
            secs: SPAWN_SECS,
        };
        return crate::host::agent::measure(&cell).map(|(rate, _)| (1e9 / rate.max(1e-9), None));
    }
    if let Probe::File {
        pages,
        folio,
        layout,
        munmap,
    } = *probe
    {
        // One repetition per agent, as the tables' cells.
        session.shmem_folio(folio)?;
        let cell = crate::host::agent::HostCell::ForkOrMunmap {
            size: pages * PAGE,
            folio,
            layout,
            munmap,
        };
        let runs: Vec<(f64, Option<u64>)> = (0..HOST_REPS)
            .map(|_| {
                crate::host::agent::measure(&cell)
                    .map(|(secs, c)| (secs * 1e9, c.get(HOST_FAR).copied()))
            })
            .collect::<Result<_, _>>()?;
        let ns = usermm_model::prices::median(runs.iter().map(|r| r.0)).ok_or("no time")?;
        let far = usermm_model::prices::median(runs.iter().filter_map(|r| r.1.map(|f| f as f64)));
        return Ok((ns, far.map(|f| f.round() as u64)));
    }
    match probe {
        Probe::TmpfsRead { .. } => session.shmem_folio(PAGE)?,
        Probe::Munlock { folio, .. } => session.thp(*folio == PMD)?,
        _ => session.folio(probe.anon_folio())?,
    }
    crate::host::agent::measure(&crate::host::agent::HostCell::Probe(*probe))
        .map(|(secs, c)| (secs * 1e9, c.get(HOST_FAR).copied()))
}

/// Measures `probe` in this process ([`HOST_REPS`] repetitions, 5 past 32 MiB, each on a
/// fresh setup): the median time in seconds.
pub fn host_run(probe: &Probe) -> Result<(f64, Option<f64>), String> {
    // Memory the hypervisor backs: the probes' pages, a COW's copies, with room to spare
    // (`crate::host::prime`: first touches of reported pages cost 4-8 times a fault).
    crate::host::prime(PRIME);
    // The probes past the cache take 20-50 ms each with their setup: fewer repetitions keep
    // a calibration within its 90 s on 2 busy cores.
    let reps = if probe_bytes(probe) > 32 << 20 {
        5
    } else {
        HOST_REPS
    };
    let runs: Vec<(f64, Option<f64>)> = (0..reps)
        .map(|_| host_once(probe))
        .collect::<Result<_, _>>()?;
    let median = |v: Vec<f64>| usermm_model::prices::median(v.into_iter());
    let secs = median(runs.iter().map(|r| r.0).collect()).ok_or("no repetition")?;
    Ok((secs, median(runs.iter().filter_map(|r| r.1).collect())))
}

/// The share of `r`'s folio boundaries (folios of `folio` bytes) whose two frames are far
/// apart in physical memory, sampled from `pagemap` before the timed call: the scatter
/// the allocator gave this repetition's layout ([`usermm_model::profile::FOLIOS_FAR`]).
fn far_share(r: &Region, folio: u64) -> Option<f64> {
    crate::costmodel::folio_steps(
        r.addr,
        r.len / PAGE,
        folio / PAGE,
        0,
        crate::costmodel::Samples::Spread,
    )
    .map(|s| s.far)
}

/// One host repetition: its time, seconds, and the scatter of its layout where it has one
/// of written anonymous folios that the timed call walks.
fn host_once(probe: &Probe) -> Result<(f64, Option<f64>), String> {
    let far = std::cell::Cell::new(None);
    let secs = host_timed(probe, &|r: &Region, folio: u64| far.set(far_share(r, folio)))?;
    Ok((secs, far.get()))
}

/// The time of one host repetition, seconds; `scatter` samples a walked layout.
fn host_timed(probe: &Probe, scatter: &dyn Fn(&Region, u64)) -> Result<f64, String> {
    use oracle::sys;
    let populated = |pages: u64| -> Result<Region, String> {
        let r = Region::anon(pages * PAGE)?;
        r.populate()?;
        Ok(r)
    };
    let small = |pages: u64, written: bool| -> Result<Region, String> {
        let r = Region::anon_small_pages(pages * PAGE)?;
        if written {
            r.write_each_page()?;
        } else {
            r.read_each_page()?;
        }
        Ok(r)
    };
    let time = |f: &mut dyn FnMut() -> Result<(), String>| -> Result<f64, String> {
        let t = crate::host::measure::Stamp::now();
        f()?;
        Ok(t.secs())
    };
    match *probe {
        Probe::Mprotect {
            pages,
            folio,
            written,
        } => {
            let r = if written && folio > PAGE {
                populated(pages)?
            } else {
                small(pages, written)?
            };
            time(&mut || {
                sys::mprotect(r.addr, r.len, RO_HOST).map_err(|e| errno_text("mprotect", e))
            })
        }
        Probe::Fork { vmas, pages, folio } => {
            let _sparse = SparseVmas::new(vmas)?;
            let r = (pages > 0).then(|| populated(pages)).transpose()?;
            if folio == PMD {
                r.as_ref().map(Region::remap_ptes).transpose()?;
            }
            if let Some(r) = &r {
                scatter(r, folio);
            }
            crate::host::measure::fork_time()
        }
        Probe::Spawn { vmas } => {
            let _sparse = SparseVmas::new(vmas)?;
            time(&mut || {
                let pid = sys::fork().map_err(|e| errno_text("fork", e))?;
                if pid == 0 {
                    sys::exit_now(0);
                }
                sys::wait_child(pid)
                    .map(|_| ())
                    .map_err(|e| errno_text("waitpid", e))
            })
        }
        Probe::Munmap { pages, folio } => {
            let r = populated(pages)?;
            if folio == PMD {
                r.remap_ptes()?;
            }
            scatter(&r, folio);
            r.unmap_timed()
        }
        Probe::Dontneed { pages, folio } => {
            let r = populated(pages)?;
            if folio == PMD {
                r.remap_ptes()?;
            }
            scatter(&r, folio);
            time(&mut || {
                sys::madvise(r.addr, r.len, MADV_DONTNEED).map_err(|e| errno_text("madvise", e))
            })
        }
        Probe::Fault { pages, .. } => {
            let r = Region::anon(pages * PAGE)?;
            time(&mut || r.write_each_page())
        }
        Probe::ZeroFault { pages } => {
            let r = Region::anon_small_pages(pages * PAGE)?;
            time(&mut || r.read_each_page())
        }
        Probe::Cow { pages, .. } => {
            let r = populated(pages)?;
            let child = LiveChild::fork()?;
            let secs = time(&mut || r.write_each_page());
            drop(child);
            secs
        }
        Probe::TmpfsRead { pages, stride } => {
            let f = HostTmpfs::new(pages * PAGE)?;
            f.fill(pages * PAGE, 0x5a)?;
            let r = Region::file(pages * PAGE, f.fd(), true, 0)?;
            time(&mut || {
                (0..pages).step_by(stride as usize).try_for_each(|i| {
                    sys::touch(r.addr + i * PAGE, 1, false)
                        .map_err(|s| format!("signal {s} reading"))
                })
            })
        }
        Probe::Mlock { pages } => {
            let r = small(pages, true)?;
            let secs =
                time(&mut || sys::mlock2(r.addr, r.len, 0).map_err(|e| errno_text("mlock", e)));
            let _ = sys::munlock(r.addr, r.len);
            secs
        }
        Probe::Munlock { pages, .. } => {
            let r = Region::locked(pages * PAGE)?;
            sys::drain_lru_batches();
            time(&mut || sys::munlock(r.addr, r.len).map_err(|e| errno_text("munlock", e)))
        }
        Probe::Mremap { pages, folio } => {
            let r = if folio > PAGE {
                populated(pages)?
            } else {
                small(pages, true)?
            };
            let dst = Region::anon(pages * PAGE)?;
            const MAYMOVE_FIXED: i32 = 1 | 2;
            let secs = time(&mut || {
                sys::mremap(r.addr, r.len, r.len, MAYMOVE_FIXED, dst.addr)
                    .map(|_| ())
                    .map_err(|e| errno_text("mremap", e))
            });
            // The pages moved to `dst`'s range, which its drop unmaps; `r`'s is empty.
            secs
        }
        Probe::DontneedEach { pages, folio } => {
            let r = populated(pages)?;
            if folio == PMD {
                r.remap_ptes()?;
            }
            time(&mut || {
                (0..pages).try_for_each(|i| {
                    sys::madvise(r.addr + i * PAGE, PAGE, MADV_DONTNEED)
                        .map_err(|e| errno_text("madvise", e))
                })
            })
        }
        Probe::CowReuse { pages, folio } => {
            let r = populated(pages)?;
            if folio == PMD {
                r.remap_ptes()?;
            }
            // The child exits (its socket closed) and is waited for before the writes.
            drop(LiveChild::fork()?);
            time(&mut || r.write_each_page())
        }
        Probe::MprotectSplit { pages } => {
            let r = populated(pages)?;
            time(&mut || r.protect_subpages(RO_HOST))
        }
        Probe::File { .. } => Err("file probes run as the tables' host cells".into()),
        Probe::MmapVmas { vmas } => {
            let _sparse = SparseVmas::new(vmas)?;
            time(&mut || {
                const PRIVATE_ANON: i32 = 0x02 | 0x20;
                let a =
                    sys::mmap(0, PAGE, RW_HOST, PRIVATE_ANON).map_err(|e| errno_text("mmap", e))?;
                sys::munmap(a, PAGE).map_err(|e| errno_text("munmap", e))
            })
        }
    }
}

const RO_HOST: i32 = crate::host::region::RO;
const RW_HOST: i32 = crate::host::region::RW;

/// The engine's exact counters of `probe`'s timed operation.
pub fn engine_counters(probe: &Probe) -> anyhow::Result<BTreeMap<String, u64>> {
    let m = probe_machine(probe);
    let cpu = m.enter_cpu(0)?;
    let p = cpu.spawn(Privilege::Privileged, u64::MAX)?;
    let before = std::cell::Cell::new(None);
    let mark = || before.set(Some(m.counters()));
    match *probe {
        Probe::Mprotect {
            pages,
            folio,
            written,
        } => {
            let a = if written && folio > PAGE {
                populated(&cpu, p, pages, folio)?
            } else {
                small(&cpu, p, pages, written)?
            };
            mark();
            cpu.mprotect(p, a, pages * PAGE, RO)?;
        }
        Probe::Fork { vmas, pages, folio } => {
            sparse(&cpu, p, vmas)?;
            if pages > 0 {
                populated(&cpu, p, pages, folio)?;
            }
            mark();
            cpu.fork(p)?;
        }
        Probe::Spawn { vmas } => {
            // As the spawn table's engine process: 21 written single-page VMAs, the rest
            // read-only and empty.
            for i in 0..vmas {
                let a = 0x1000_0000 + i * 0x2000;
                let args = MmapArgs {
                    placement: Placement::Fixed(a),
                    ..MmapArgs::anon(PAGE, if i < 21 { RW } else { RO })
                };
                cpu.mmap(p, args)?;
                if i < 21 {
                    cpu.touch(p, a, PAGE, Access::Write).map_err(sig)?;
                }
            }
            mark();
            let c = cpu.fork(p)?;
            cpu.exit(c)?;
        }
        Probe::Munmap { pages, folio } => {
            let a = populated(&cpu, p, pages, folio)?;
            mark();
            cpu.munmap(p, a, pages * PAGE)?;
        }
        Probe::Dontneed { pages, folio } => {
            let a = populated(&cpu, p, pages, folio)?;
            mark();
            cpu.madvise(p, a, pages * PAGE, Advice::DontNeed)?;
        }
        Probe::Fault { pages, .. } => {
            let a = aligned(&cpu, p, pages * PAGE, MmapArgs::anon(pages * PAGE, RW))?;
            mark();
            cpu.touch(p, a, pages * PAGE, Access::Write).map_err(sig)?;
        }
        Probe::ZeroFault { pages } => {
            let a = aligned(&cpu, p, pages * PAGE, MmapArgs::anon(pages * PAGE, RW))?;
            mark();
            cpu.touch(p, a, pages * PAGE, Access::Read).map_err(sig)?;
        }
        Probe::Cow { pages, folio } => {
            let a = populated(&cpu, p, pages, folio)?;
            cpu.fork(p)?;
            mark();
            cpu.touch(p, a, pages * PAGE, Access::Write).map_err(sig)?;
        }
        Probe::TmpfsRead { pages, stride } => {
            let f = cpu.file_create(pages * PAGE, InodeKind::Tmpfs, Some(0x5a))?;
            let args = MmapArgs {
                sharing: Sharing::Shared,
                file: Some((f, 0)),
                ..MmapArgs::anon(pages * PAGE, RW)
            };
            let a = aligned(&cpu, p, pages * PAGE, args)?;
            mark();
            // One access per page as the host makes them: the engine's `touch` takes the
            // mmap lock per call, the host's loads none, so the whole range is one call
            // where every page is read.
            if stride == 1 {
                cpu.touch(p, a, pages * PAGE, Access::Read).map_err(sig)?;
            } else {
                for i in (0..pages).step_by(stride as usize) {
                    cpu.touch(p, a + i * PAGE, 1, Access::Read).map_err(sig)?;
                }
            }
        }
        Probe::Mlock { pages } => {
            let a = small(&cpu, p, pages, true)?;
            mark();
            cpu.mlock(p, a, pages * PAGE)?;
        }
        Probe::Munlock { pages, .. } => {
            let args = MmapArgs {
                locked: true,
                populate: true,
                ..MmapArgs::anon(pages * PAGE, RW)
            };
            let a = aligned(&cpu, p, pages * PAGE, args)?;
            cpu.lru_add_drain();
            mark();
            cpu.munlock(p, a, pages * PAGE)?;
        }
        Probe::Mremap { pages, folio } => {
            let len = pages * PAGE;
            let a = if folio > PAGE {
                populated(&cpu, p, pages, folio)?
            } else {
                small(&cpu, p, pages, true)?
            };
            let dst = aligned(&cpu, p, len, MmapArgs::anon(len, RW))?;
            let flags = MremapFlags {
                maymove: true,
                fixed: Some(dst),
                dontunmap: false,
            };
            mark();
            cpu.mremap(p, a, len, len, flags)?;
        }
        Probe::DontneedEach { pages, folio } => {
            let a = populated(&cpu, p, pages, folio)?;
            mark();
            for i in 0..pages {
                cpu.madvise(p, a + i * PAGE, PAGE, Advice::DontNeed)?;
            }
        }
        Probe::MprotectSplit { pages } => {
            let len = pages * PAGE;
            let a = aligned(&cpu, p, len, MmapArgs::anon(len, RW))?;
            cpu.touch(p, a, len, Access::Write).map_err(sig)?;
            mark();
            for blk in (a..a + len).step_by(PMD as usize) {
                cpu.mprotect(p, blk, PAGE, RO)?;
            }
        }
        Probe::CowReuse { pages, folio } => {
            let a = populated(&cpu, p, pages, folio)?;
            let c = cpu.fork(p)?;
            cpu.exit(c)?;
            mark();
            cpu.touch(p, a, pages * PAGE, Access::Write).map_err(sig)?;
        }
        Probe::File {
            pages,
            folio,
            layout,
            munmap,
        } => {
            let op = if munmap { Op::Munmap } else { Op::Fork };
            // The host's algorithm: the default tunables.
            let host = crate::columns::EngineColumn::new("host", "default tunables", &[]);
            let (_, delta) = crate::fork::engine_once(pages * PAGE, folio, layout, &host, op)?;
            return Ok(crate::engine::counters(&delta));
        }
        Probe::MmapVmas { vmas } => {
            sparse(&cpu, p, vmas)?;
            mark();
            let a = cpu.mmap(p, MmapArgs::anon(PAGE, RW))?;
            cpu.munmap(p, a, PAGE)?;
        }
    }
    let before = before
        .take()
        .ok_or_else(|| anyhow::anyhow!("no timed operation"))?;
    Ok(crate::engine::counters(&m.counters().delta(&before)))
}

/// A machine for `probe`: anonymous faults allocate its folio size (PMD THP for 2 MiB),
/// shmem 4 KiB folios, fault-around at Linux's default.
fn probe_machine(probe: &Probe) -> Machine {
    let folio = probe.anon_folio();
    let m = machine(probe_bytes(probe).max(16 << 20), folio);
    m.update_tunables(|t| {
        t.thp.top = if folio == PMD {
            ThpPolicy::Always
        } else {
            ThpPolicy::Never
        };
        t.shmem
            .per_order
            .iter_mut()
            .for_each(|s| *s = ShmemHuge::Never);
    });
    m
}

/// The bytes a probe maps (its pages; 0 for VMA probes).
fn probe_bytes(probe: &Probe) -> u64 {
    match *probe {
        Probe::Mprotect { pages, .. }
        | Probe::Fork { pages, .. }
        | Probe::Munmap { pages, .. }
        | Probe::Dontneed { pages, .. }
        | Probe::Fault { pages, .. }
        | Probe::ZeroFault { pages }
        | Probe::Cow { pages, .. }
        | Probe::TmpfsRead { pages, .. }
        | Probe::Mlock { pages }
        | Probe::Munlock { pages, .. }
        | Probe::Mremap { pages, .. }
        | Probe::DontneedEach { pages, .. }
        | Probe::MprotectSplit { pages }
        | Probe::CowReuse { pages, .. }
        | Probe::File { pages, .. } => pages * PAGE,
        Probe::Spawn { .. } | Probe::MmapVmas { .. } => 0,
    }
}

/// Maps `args` at a 2 MiB-aligned address (as the host's [`Region`]s are).
fn aligned(cpu: &Cpu<'_>, p: Pid, len: u64, args: MmapArgs) -> anyhow::Result<u64> {
    let a = crate::fork::reserve_aligned(cpu, p, len, 0)?;
    Ok(cpu.mmap(
        p,
        MmapArgs {
            placement: Placement::Fixed(a),
            ..args
        },
    )?)
}

/// `pages` written pages in folios of `folio` bytes (2 MiB ones PTE-mapped).
fn populated(cpu: &Cpu<'_>, p: Pid, pages: u64, folio: u64) -> anyhow::Result<u64> {
    let len = pages * PAGE;
    let a = aligned(cpu, p, len, MmapArgs::anon(len, RW))?;
    cpu.touch(p, a, len, Access::Write).map_err(sig)?;
    if folio == PMD {
        for blk in (a..a + len).step_by(PMD as usize) {
            cpu.mprotect(p, blk, PAGE, RO)?;
            cpu.mprotect(p, blk, PAGE, RW)?;
        }
    }
    Ok(a)
}

/// `pages` 4 KiB pages, written or read.
fn small(cpu: &Cpu<'_>, p: Pid, pages: u64, written: bool) -> anyhow::Result<u64> {
    let len = pages * PAGE;
    let a = aligned(cpu, p, len, MmapArgs::anon(len, RW))?;
    cpu.madvise(p, a, len, Advice::NoHugePage)?;
    let access = if written { Access::Write } else { Access::Read };
    cpu.touch(p, a, len, access).map_err(sig)?;
    Ok(a)
}

/// `n` single-page read-only VMAs, as the host's [`SparseVmas`].
fn sparse(cpu: &Cpu<'_>, p: Pid, n: u64) -> anyhow::Result<()> {
    if n == 0 {
        return Ok(());
    }
    let a = cpu.mmap(p, MmapArgs::anon(2 * n * PAGE, RO))?;
    for i in 0..n {
        cpu.munmap(p, a + (2 * i + 1) * PAGE, PAGE)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_catalogue_has_twelve_families_or_more_and_the_engine_runs_every_probe() {
        let all = catalogue();
        let families: std::collections::BTreeSet<String> = all.iter().map(Probe::family).collect();
        // Operations (the family's part before the slash).
        let ops: std::collections::BTreeSet<&str> = families
            .iter()
            .map(|f| f.split('/').next().unwrap_or(f))
            .collect();
        assert!(ops.len() >= 12, "{ops:?}");
        assert!(families.len() >= 12, "{families:?}");
        for probe in &all {
            let c = engine_counters(probe).unwrap_or_else(|e| panic!("{probe:?}: {e}"));
            assert!(!c.is_empty(), "{probe:?} counted nothing");
        }
    }

    #[test]
    fn no_probe_is_a_bench_rows_layout() {
        // Rows are whole-layout operations of 16, 64, 256 MiB or 1 GiB.
        for probe in catalogue() {
            let bytes = probe_bytes(&probe);
            assert!(
                ![16 << 20, 64 << 20, 256 << 20, 1 << 30].contains(&bytes),
                "{probe:?}"
            );
        }
    }
}
