//! The calibration probes as the host agent runs them (`crate::probes` has the catalogue and
//! what the fit calls each probe): the request ([`Probe`]) and its repetitions timed in the
//! agent's process ([`host_run`]), each on a fresh setup, with the scatter of its layout.

use super::errno_text;
use super::measure::LiveChild;
use super::region::{HostTmpfs, Region, SparseVmas, MADV_DONTNEED};
use super::Layout;
use serde::{Deserialize, Serialize};

/// Host repetitions per probe point in one agent process; the median is kept.
pub const HOST_REPS: usize = 7;

/// Bytes an agent primes past what one repetition maps ([`prime_bytes`]): the page tables,
/// a forked child's, the agent's own heap, and more than the last-level cache.
const PRIME_MARGIN: u64 = 32 << 20;

const PAGE: u64 = 4096;
const PMD: u64 = 2 << 20;

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
    /// where the build has it, the rate over [`SPAWN_SECS`](crate::probes::SPAWN_SECS)), at VMA counts no row has.
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
    /// A read of every page of a fresh `MAP_SHARED` mapping of a sparse tmpfs file of
    /// `pages` pages: every read fault allocates, zeroes and caches a page (`shmem_fault`),
    /// and fault-around has nothing cached to map.
    TmpfsSparseRead {
        /// File pages.
        pages: u64,
    },
    /// `mlock()` of `pages` written pages in folios of `folio` bytes (PTE-mapped).
    Mlock {
        /// Pages.
        pages: u64,
        /// Folio size, bytes.
        folio: u64,
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
    /// One `munmap()` of the span of `vmas` empty single-page VMAs with a hole between each
    /// two: a VMA's removal apart from the pages' work and from fork's copy of it.
    MunmapVmas {
        /// VMAs unmapped.
        vmas: u64,
        /// Each VMA's page read first (the zero page mapped: a PTE to clear and a page-table
        /// page to free per 256 VMAs, no folio), else none.
        read: bool,
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

/// Repetitions of a probe that maps `bytes`: [`HOST_REPS`], 5 past 32 MiB. The probes past
/// the cache take 20-50 ms each with their setup: fewer repetitions keep a calibration
/// within its 90 s on 2 busy cores.
pub fn reps_for(bytes: u64) -> usize {
    if bytes > 32 << 20 {
        5
    } else {
        HOST_REPS
    }
}

/// Bytes the agent primes for `probe`: one repetition's pages (twice for a copy-on-write
/// probe's copies) and [`PRIME_MARGIN`]. Not one size for all: priming 192 MiB took 0.16 s of
/// an agent's 0.17 s for an 8-page probe (0.03 s at 32 MiB); sized so, a calibration went
/// from 128 to 96 s.
fn prime_bytes(probe: &Probe) -> u64 {
    let copies = match probe {
        Probe::Cow { .. } | Probe::CowReuse { .. } => 2,
        _ => 1,
    };
    probe_bytes(probe) * copies + PRIME_MARGIN
}

/// The bytes a probe maps (its pages; 0 for VMA probes).
pub(crate) fn probe_bytes(probe: &Probe) -> u64 {
    match *probe {
        Probe::Mprotect { pages, .. }
        | Probe::Fork { pages, .. }
        | Probe::Munmap { pages, .. }
        | Probe::Dontneed { pages, .. }
        | Probe::Fault { pages, .. }
        | Probe::ZeroFault { pages }
        | Probe::Cow { pages, .. }
        | Probe::TmpfsRead { pages, .. }
        | Probe::TmpfsSparseRead { pages }
        | Probe::Mlock { pages, .. }
        | Probe::Munlock { pages, .. }
        | Probe::Mremap { pages, .. }
        | Probe::DontneedEach { pages, .. }
        | Probe::MprotectSplit { pages }
        | Probe::CowReuse { pages, .. }
        | Probe::File { pages, .. } => pages * PAGE,
        Probe::Spawn { .. } | Probe::MmapVmas { .. } | Probe::MunmapVmas { .. } => 0,
    }
}

/// Measures `probe` in this process ([`HOST_REPS`] repetitions, 5 past 32 MiB, each on a
/// fresh setup): the median time in seconds.
pub fn host_run(probe: &Probe) -> Result<(f64, Option<f64>), String> {
    // Memory the hypervisor backs: the probes' pages, a COW's copies, with room to spare
    // (`crate::host::prime`: first touches of reported pages cost 4-8 times a fault).
    super::prime(prime_bytes(probe));
    let reps = reps_for(probe_bytes(probe));
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
    crate::costmodel::primitives::folio_steps(
        r.addr,
        r.len / PAGE,
        folio / PAGE,
        0,
        crate::costmodel::primitives::Samples::Spread,
    )
    .map(|s| s.far)
}

/// One host repetition: its time, seconds, and the scatter of its layout where it has one
/// of written anonymous folios that the timed call walks.
fn host_once(probe: &Probe) -> Result<(f64, Option<f64>), String> {
    let far = std::cell::Cell::new(None);
    let secs = host_timed(probe, &|r: &Region, folio: u64| {
        far.set(far_share(r, folio))
    })?;
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
        let t = super::measure::Stamp::now();
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
            super::measure::fork_time()
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
            // One guarded call for all the reads: a call per read added a system call per
            // read (the guard saves the signal mask), which the engine's count has no
            // event for: tmpfs-read/every read 925 ns a page at 156 MiB where the fault
            // table's cached tmpfs rows, one call for the whole mapping, read 450 to 590.
            time(&mut || {
                sys::touch_every(r.addr, pages * PAGE, stride, false)
                    .map_err(|s| format!("signal {s} reading"))
            })
        }
        Probe::TmpfsSparseRead { pages } => {
            let f = HostTmpfs::new(pages * PAGE)?;
            let r = Region::file(pages * PAGE, f.fd(), true, 0)?;
            time(&mut || {
                sys::touch_every(r.addr, pages * PAGE, 1, false)
                    .map_err(|s| format!("signal {s} reading"))
            })
        }
        Probe::Mlock { pages, folio } => {
            let r = if folio > PAGE {
                populated(pages)?
            } else {
                small(pages, true)?
            };
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
            let mut map_unmap = || {
                let a = sys::mmap(0, PAGE, RW_HOST, super::region::PRIVATE_ANON)
                    .map_err(|e| errno_text("mmap", e))?;
                sys::munmap(a, PAGE).map_err(|e| errno_text("munmap", e))
            };
            // The first calls after the setup's thousands of munmaps pay for them (on this
            // AMD guest the first mmap and munmap of a page took 7.3 µs beside 10 VMAs and
            // 17 µs beside 3 000, the fourth 4.5 and 7.3 µs): what the engine counts is
            // the call's own work, so three untimed calls go first.
            for _ in 0..3 {
                map_unmap()?;
            }
            time(&mut map_unmap)
        }
        Probe::MunmapVmas { vmas, read } => {
            let mut sparse = SparseVmas::new(vmas)?;
            if read {
                sparse.read_each()?;
            }
            time(&mut || sparse.unmap_span())
        }
    }
}

const RO_HOST: i32 = super::region::RO;
const RW_HOST: i32 = super::region::RW;
