//! The page cache's primitives: allocating a cache folio and adding it to the cache, reading
//! a folio from the device, marking a folio accessed, deleting a folio from the cache.
//!
//! Linux counterparts: `mm/filemap.c` (`filemap_alloc_folio`, `__filemap_add_folio`,
//! `filemap_read_folio`, `delete_from_page_cache`), `mm/swap.c` (`folio_mark_accessed`) and
//! the `vma_address` arithmetic of `mm/internal.h` for file pages ([`file_range_in`]). The
//! state (the [`Inode`] and its cache) is [`super`]'s; reads, writes and faults through the
//! cache are [`super::io`]'s. Nothing here reclaims or reads ahead: callers do.

use super::xarray::XArray;
use super::{Inode, InodeKind, PAGE_SIZE};
use crate::machine::Cpu;
use crate::mlock::{folio_add_lru, lru_relist};
use crate::phys::{FolioKind, PageFlag, Pfn, Zeroing};
use crate::stats::Ev;
use crate::vaddr::VirtAddr;
use crate::vma::Vma;
use std::sync::Arc;

/// A new page-cache folio of `inode` at `idx`, inserted (`filemap_add_folio`): the cache
/// holds the allocation's reference; the folio goes to this CPU's LRU batch.
///
/// # Context
/// The cache lock (`cache`) is held.
pub(crate) fn cache_alloc<'m>(
    cpu: &Cpu<'m>,
    inode: &Inode,
    cache: &mut XArray,
    idx: u64,
) -> Option<Pfn> {
    cache_alloc_order(cpu, inode, cache, idx, 0)
}

/// [`cache_alloc`] of a folio of `order` covering the aligned indexes from `idx`
/// (which must all be free): the cache holds one reference per page, as Linux's holds
/// `folio_nr_pages`. Returns the head frame.
///
/// # Context
/// The cache lock (`cache`) is held.
pub(crate) fn cache_alloc_order<'m>(
    cpu: &Cpu<'m>,
    inode: &Inode,
    cache: &mut XArray,
    idx: u64,
    order: u32,
) -> Option<Pfn> {
    let kind = if inode.kind.is_shmem() {
        FolioKind::Shmem
    } else {
        FolioKind::File
    };
    let node = cpu.id % cpu.m.phys.nr_nodes().max(1);
    // A disk page is filled by its read (or its write); a shmem page starts as zeroes.
    let zeroing = if inode.kind == InodeKind::Disk {
        Zeroing::NoZero
    } else {
        Zeroing::Zero
    };
    let p = cpu
        .m
        .phys
        .alloc_folio(cpu.c(), order, node, kind, zeroing)?;
    let nr = 1u64 << order;
    if nr > 1 {
        crate::rmap::folio_ref_add(cpu.c(), cpu.m.phys.memmap.folio(p), nr as i32 - 1);
    }
    let mem = &cpu.m.phys.memmap;
    mem.set_mapping(p, inode.id);
    mem.set_index(p, idx);
    if inode.kind == InodeKind::Disk {
        // Not uptodate until read (or written) in full.
        mem.clear(p, PageFlag::Uptodate);
    }
    for i in 0..nr {
        cache.insert(idx + i, p.add(i));
    }
    cpu.c().add(Ev::PageCacheAdd, 1);
    if inode.kind.is_shmem() {
        crate::swap_state::shmem_swapin(cpu, inode, idx, p);
    }
    crate::workingset::workingset_refault(cpu, inode, idx, p);
    folio_add_lru(cpu, cpu.m.phys.memmap.folio(p));
    Some(p)
}

/// Reads the device blocks behind `pages` (consecutive indexes from `first`) into them:
/// one I/O per run of allocated blocks, split where it reaches the device's largest
/// request (`max_sectors_kb`, as the block layer splits a bio); holes read as zeroes
/// without I/O. Sets uptodate and, for allocated blocks, `PG_mappedtodisk`.
pub(crate) fn read_blocks<'m>(cpu: &Cpu<'m>, inode: &Inode, first: u64, pages: &[Pfn]) {
    use crate::filemap::BlockContents;
    let mem = &cpu.m.phys.memmap;
    let arena = &cpu.m.phys.arena;
    let size = inode.size();
    let max_io = (cpu.m.tunables().max_sectors_kb / 4).max(1);
    let disk = inode.disk.lock();
    let mut run = 0u64;
    for (i, &p) in pages.iter().enumerate() {
        // Straight into the frame, which was not zeroed when allocated.
        let (mapped, valid) = match disk.contents(first + i as u64, size) {
            BlockContents::Fill { byte, len } => {
                arena.fill(p, 0, len, byte);
                (true, len)
            }
            BlockContents::Data(d) => {
                arena.write(p, 0, d);
                (true, d.len())
            }
            BlockContents::Hole => (false, 0),
        };
        arena.fill(p, valid, PAGE_SIZE as usize - valid, 0);
        mem.set(p, PageFlag::Uptodate);
        if mapped {
            mem.set(p, PageFlag::MappedToDisk);
            cpu.c().add(Ev::DiskReadBytes, PAGE_SIZE);
            if run.is_multiple_of(max_io) {
                cpu.c().add(Ev::DiskReads, 1);
            }
            run += 1;
        } else {
            run = 0;
        }
    }
}

/// `folio_mark_accessed`: referenced on the first access, active (and no longer
/// referenced) on the second. Activation goes through a per-CPU batch in Linux; its
/// effect is applied at once here (flags are compared after the batches drain).
pub(crate) fn folio_mark_accessed<'m>(cpu: &Cpu<'m>, head: Pfn) {
    let mem = &cpu.m.phys.memmap;
    if !mem.test(head, PageFlag::Referenced) {
        mem.set(head, PageFlag::Referenced);
    } else if !mem.test(head, PageFlag::Unevictable) && !mem.test(head, PageFlag::Active) {
        lru_relist(cpu, cpu.m.phys.memmap.folio(head), |_| {
            mem.set(head, PageFlag::Active);
            mem.clear(head, PageFlag::Referenced);
        });
    }
}

/// `filemap_remove_folio` + the cache's `folio_put` for a page already out of the index.
pub(crate) fn delete_from_page_cache<'m>(cpu: &Cpu<'m>, p: Pfn) {
    let mem = &cpu.m.phys.memmap;
    let head = mem.folio_of(p);
    if head == p {
        mem.clear(p, PageFlag::Dirty);
        mem.clear(p, PageFlag::Readahead);
    }
    cpu.c().add(Ev::PageCacheDelete, 1);
    cpu.m.phys.put_folio(cpu.c(), head, 1);
}

/// The address range of `vma` that maps file pages `first..last` of `inode`, if any.
pub(crate) fn file_range_in(
    vma: &Vma,
    inode: &Inode,
    first: u64,
    last: u64,
) -> Option<(VirtAddr, VirtAddr)> {
    let file = vma.file.as_ref()?;
    if !std::ptr::eq(Arc::as_ptr(file), inode) {
        return None;
    }
    let vfirst = vma.pgoff;
    let vlast = vma.pgoff + (vma.end - vma.start) / PAGE_SIZE;
    let (a, b) = (first.max(vfirst), last.min(vlast));
    (a < b).then(|| {
        (
            vma.vm_start().add((a - vfirst) * PAGE_SIZE),
            vma.vm_start().add((b - vfirst) * PAGE_SIZE),
        )
    })
}
