//! The engine side of the calibration probes: each probe run once on a fresh machine,
//! its timed operation's exact counters.

use super::{Probe, PAGE};
use crate::engine::{machine, sig, PMD, RO, RW};
use crate::fork::Op;
use crate::host::probe::probe_bytes;
use std::collections::BTreeMap;
use usermm::{
    Access, Advice, Cpu, InodeKind, Machine, MmapArgs, MremapFlags, Pid, Placement, Privilege,
    Sharing, ShmemHuge, ThpPolicy,
};

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
            let a = tmpfs_shared(&cpu, p, pages, Some(0x5a))?;
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
        Probe::TmpfsSparseRead { pages } => {
            let a = tmpfs_shared(&cpu, p, pages, None)?;
            mark();
            cpu.touch(p, a, pages * PAGE, Access::Read).map_err(sig)?;
        }
        Probe::Mlock { pages, folio } => {
            let a = if folio > PAGE {
                populated(&cpu, p, pages, folio)?
            } else {
                small(&cpu, p, pages, true)?
            };
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
        Probe::MunmapVmas { vmas, read } => {
            let a = sparse(&cpu, p, vmas)?;
            if read {
                for i in 0..vmas {
                    cpu.touch(p, a + 2 * i * PAGE, PAGE, Access::Read)
                        .map_err(sig)?;
                }
            }
            mark();
            cpu.munmap(p, a, (2 * vmas).saturating_sub(1) * PAGE)?;
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

/// A `MAP_SHARED` mapping of a new tmpfs file of `pages` pages, written with `fill` or
/// sparse.
fn tmpfs_shared(cpu: &Cpu<'_>, p: Pid, pages: u64, fill: Option<u8>) -> anyhow::Result<u64> {
    let f = cpu.file_create(pages * PAGE, InodeKind::Tmpfs, fill)?;
    let args = MmapArgs {
        sharing: Sharing::Shared,
        file: Some((f, 0)),
        ..MmapArgs::anon(pages * PAGE, RW)
    };
    aligned(cpu, p, pages * PAGE, args)
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
fn sparse(cpu: &Cpu<'_>, p: Pid, n: u64) -> anyhow::Result<u64> {
    if n == 0 {
        return Ok(0);
    }
    let a = cpu.mmap(p, MmapArgs::anon(2 * n * PAGE, RO))?;
    for i in 0..n {
        cpu.munmap(p, a + (2 * i + 1) * PAGE, PAGE)?;
    }
    Ok(a)
}
