//! The host side of the calibration probes: each probe timed in a fresh agent process,
//! its mTHP or shmem knob set, and the scatter of its layout sampled.

use super::{probe_bytes, Probe, HOST_REPS, PAGE, PMD, PRIME, SPAWN_SECS};
use crate::host::measure::LiveChild;
use crate::host::region::{HostTmpfs, Region, SparseVmas, MADV_DONTNEED};
use crate::host::{errno_text, HostSession};
use usermm_model::profile::HOST_FAR;

/// The host's median time of `probe`, ns: its mTHP or shmem knob set under `session`, then
/// measured in a fresh agent process; with it, the median share of the layout's folio boundaries far apart in physical memory,
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
