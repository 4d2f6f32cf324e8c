//! `dump`: the VMAs, page-table entries and folios of a range, as a developer reads them
//! with drgn on a live kernel (`vma`, `follow_page`, `dump_page`).
//!
//! Linux counterpart: `dump_page()` (mm/debug.c) and `dump_vma()`; the text is the engine's
//! own, one line per VMA, per leaf entry, and per folio met in the range (each folio once),
//! with its refcount, mapcounts, pincount, order and flags. Reading takes the mmap lock for
//! reading and drains the per-CPU LRU batches first (as `kpageflags` does), so the flags are
//! those a reader after the statement sees; nothing is changed and no counter moves except
//! the drain's.

use crate::errno::{Errno, SysResult};
use crate::machine::Cpu;
use crate::mm::Pid;
use crate::pgtable::leaf_at;
use crate::pgtable::AnyLeaf;
use crate::phys::{PageFlag, Pfn};
use std::fmt::Write as _;

/// Most pages one dump walks (1 GiB of 4 KiB pages): the text stays readable and bounded.
pub const DUMP_MAX_PAGES: u64 = 1 << 18;

/// Flags shown for a folio, in this order, with the names `kpageflags` uses where it has one.
const SHOWN: [(PageFlag, &str); 19] = [
    (PageFlag::Locked, "locked"),
    (PageFlag::Anon, "anon"),
    (PageFlag::Lru, "lru"),
    (PageFlag::Active, "active"),
    (PageFlag::Referenced, "referenced"),
    (PageFlag::Mlocked, "mlocked"),
    (PageFlag::Unevictable, "unevictable"),
    (PageFlag::Dirty, "dirty"),
    (PageFlag::Writeback, "writeback"),
    (PageFlag::Uptodate, "uptodate"),
    (PageFlag::SwapBacked, "swapbacked"),
    (PageFlag::MappedToDisk, "mappedtodisk"),
    (PageFlag::Readahead, "readahead"),
    (PageFlag::Workingset, "workingset"),
    (PageFlag::Zero, "zero"),
    (PageFlag::LargeRmappable, "large_rmappable"),
    (PageFlag::TotalMapcount, "total_mapcount"),
    (PageFlag::OwnerTracked, "owner_tracked"),
    (PageFlag::SharingRecord, "sharing_record"),
];

/// The dump of `[start, start+len)` of process `pid` as text.
///
/// # Errors
/// `ESRCH` (no such process), `EINVAL` (the range wraps or is longer than
/// [`DUMP_MAX_PAGES`] pages).
pub fn dump_range(cpu: &Cpu<'_>, pid: Pid, start: u64, len: u64) -> SysResult<String> {
    let end = start.checked_add(len).ok_or(Errno::EINVAL)?;
    let first = start & !4095;
    let pages = (end.saturating_add(4095) >> 12).saturating_sub(first >> 12);
    if pages > DUMP_MAX_PAGES {
        return Err(Errno::EINVAL);
    }
    let maps = cpu.maps(pid)?;
    let task = cpu.m.task(pid)?;
    cpu.lru_add_drain_all();
    let _st = task.mm.lock.read();
    let pt = cpu.tables(&task.mm);
    let mem = &cpu.m.phys.memmap;
    let mut out = String::new();
    let _ = writeln!(out, "range {start:#x}-{end:#x} ({pages} pages)");
    for v in maps.iter().filter(|v| v.start < end && v.end > first) {
        let _ = writeln!(
            out,
            "vma {:#x}-{:#x} {} {:?} offset {:#x} flags {:#x}",
            v.start, v.end, v.perms, v.backing, v.offset, v.flags
        );
    }
    let mut folios: Vec<Pfn> = Vec::new();
    let mut a = first;
    while a < end {
        let Some(leaf) = leaf_at(pt, a) else {
            a += 4096;
            continue;
        };
        let (level, step) = match leaf.entry {
            AnyLeaf::Pte(_) => ("pte", 4096),
            // One line for the PMD, at its first page in the range.
            AnyLeaf::Pmd(_) => ("pmd", (2 << 20) - (a & ((2 << 20) - 1))),
        };
        let _ = writeln!(
            out,
            "{level} {a:#x} = {:#018x} pfn {:#x}",
            leaf.entry.val(),
            leaf.pfn.val()
        );
        let head = mem.folio_of(leaf.pfn);
        if !folios.contains(&head) {
            folios.push(head);
        }
        a = a.saturating_add(step);
    }
    for head in folios {
        let order = mem.order(head);
        let large = mem.test(head, PageFlag::Head);
        let flags: Vec<&str> = SHOWN
            .iter()
            .filter(|(f, _)| mem.test(head, *f))
            .map(|(_, n)| *n)
            .collect();
        let _ = write!(
            out,
            "folio {:#x} order {order} refcount {} mapcount {}",
            head.val(),
            mem.refcount(head),
            mem.mapcount(head)
        );
        if large {
            let _ = write!(
                out,
                " large_mapcount {} pincount {}",
                mem.large_mapcount(head),
                mem.pincount(head)
            );
        }
        let _ = writeln!(out, " flags {}", flags.join(","));
    }
    Ok(out)
}
