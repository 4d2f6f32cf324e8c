//! The page cache's operations: allocating cache folios, reading and writing through the
//! cache, reading a folio from the device, the file fault, deleting a folio from the cache.
//!
//! Linux counterparts: `mm/filemap.c` (`filemap_read`, `filemap_get_pages`,
//! `generic_perform_write`, `filemap_fault`, `filemap_read_folio`, `__filemap_add_folio`,
//! `filemap_alloc_folio`, `delete_from_page_cache`), `mm/swap.c` (`folio_mark_accessed`) and
//! the `vma_address` arithmetic of `mm/internal.h` for file pages ([`file_range_in`]). The
//! state (the [`Inode`] and its cache) is [`super`]'s.

use super::xarray::XArray;
use super::{CacheLookup, Inode, InodeKind, PAGE_SIZE};
use crate::errno::{Errno, SysResult};
use crate::machine::Cpu;
use crate::mlock::folio_add_lru;
use crate::ops::madvise::lru_relist;
use crate::phys::{FolioKind, PageFlag, Pfn, Zeroing};
use crate::readahead::{mmap_sync_readahead, page_cache_async_ra, page_cache_sync_ra, ra_pages};
use crate::shmem::{shmem_fault_order, shmem_force, shmem_nofault_order};
use crate::stats::Ev;
use crate::vaddr::VirtAddr;
use crate::vma::{VmFlags, Vma};
use crate::vmscan::{enough_free, reclaim_for};
use std::sync::Arc;

/// `generic_perform_write` / `shmem_file_write_iter`: page by page through the cache.
pub(crate) fn write_iter<'m>(
    cpu: &Cpu<'m>,
    inode: &Inode,
    offset: u64,
    len: u64,
    byte: u8,
) -> SysResult<u64> {
    let phys = &cpu.m.phys;
    let mem = &phys.memmap;
    let mut done = 0;
    let shmem_force = shmem_force(cpu);
    while done < len {
        let pos = offset + done;
        let idx = pos / PAGE_SIZE;
        let in_page = pos % PAGE_SIZE;
        let n = (PAGE_SIZE - in_page).min(len - done);
        let old_size = inode.size();
        reclaim_for(cpu, 1);
        let pfn = {
            let mut cache = inode.pages.lock();
            match cache.get(idx) {
                Some(p) => {
                    // shmem_get_folio(SGP_WRITE) marks a found folio accessed; the
                    // generic write path (FGP_WRITEBEGIN) does not.
                    if inode.kind.is_shmem() {
                        drop(cache);
                        folio_mark_accessed(cpu, mem.folio_of(p));
                    }
                    p
                }
                None => {
                    let order = shmem_nofault_order(inode, idx, &cache, shmem_force);
                    let first = idx & !((1u64 << order) - 1);
                    let Some(head) = cache_alloc_order(cpu, inode, &mut cache, first, order) else {
                        break;
                    };
                    let p = head.add(idx - first);
                    if inode.kind.is_shmem() {
                        mem.set(head, PageFlag::Referenced);
                    } else if n < PAGE_SIZE && idx * PAGE_SIZE < old_size {
                        // A partial write of a page that exists on disk reads it first
                        // (`block_write_begin`).
                        read_blocks(cpu, inode, idx, &[p]);
                    } else if n < PAGE_SIZE {
                        // New past the end of file: the rest of the page is zeroes.
                        cpu.m.phys.arena.zero_frame(p);
                    }
                    p
                }
            }
        };
        phys.arena.fill(pfn, in_page as usize, n as usize, byte);
        let head = mem.folio_of(pfn);
        mem.set(head, PageFlag::Uptodate);
        mem.set(head, PageFlag::Dirty);
        done += n;
        if pos + n > inode.size() {
            inode.set_size(pos + n);
        }
    }
    cpu.c().add(Ev::FileWriteBytes, done);
    if done == 0 {
        // A folio could not be allocated (`shmem_get_folio`, `write_begin`).
        return Err(Errno::ENOMEM);
    }
    Ok(done)
}

/// `filemap_read`: misses start synchronous readahead, a `PG_readahead` page the next
/// asynchronous window; every page copied is marked accessed except a first page the
/// previous read already ended in.
pub(crate) fn filemap_read<'m>(
    cpu: &Cpu<'m>,
    inode: &Inode,
    offset: u64,
    end: u64,
    out: &mut [u8],
) {
    let first = offset / PAGE_SIZE;
    let last_index = end.div_ceil(PAGE_SIZE);
    let prev_pos = inode.ra.lock().prev_pos;
    let mut pos = offset;
    while pos < end {
        let idx = pos / PAGE_SIZE;
        let req = last_index - idx;
        let cached = inode.pages.lock().get(idx);
        let pfn = match cached {
            Some(p) => p,
            None => {
                page_cache_sync_ra(cpu, inode, idx, req);
                // Bound first: a guard in the `match` scrutinee would live through the arms.
                let after_ra = inode.pages.lock().get(idx);
                match after_ra {
                    Some(p) => p,
                    None => {
                        // No memory for readahead: read this page alone.
                        let mut cache = inode.pages.lock();
                        let Some(p) = cache_alloc(cpu, inode, &mut cache, idx) else {
                            break;
                        };
                        drop(cache);
                        read_blocks(cpu, inode, idx, &[p]);
                        p
                    }
                }
            }
        };
        let mem = &cpu.m.phys.memmap;
        let head = mem.folio_of(pfn);
        if mem.test(head, PageFlag::Readahead) {
            // filemap_readahead: the window is asked for at the marked folio's index.
            page_cache_async_ra(cpu, inode, mem.index(head), head, req);
        }
        let same_as_prev = idx == first
            && prev_pos != u64::MAX
            && prev_pos > 0
            && (prev_pos - 1) / PAGE_SIZE == idx;
        if !same_as_prev {
            folio_mark_accessed(cpu, pfn);
        }
        let in_page = pos % PAGE_SIZE;
        let n = (PAGE_SIZE - in_page).min(end - pos);
        let dst = &mut out[(pos - offset) as usize..(pos - offset + n) as usize];
        cpu.m.phys.arena.read(pfn, in_page as usize, dst);
        pos += n;
    }
    inode.ra.lock().prev_pos = pos;
}

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
        crate::rmap::folio_ref_add(&cpu.m.phys, cpu.c(), p, nr as i32 - 1);
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
    folio_add_lru(cpu, p);
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

/// Finds (or creates / reads) the page-cache page of `pgoff` for a fault, with a
/// reference for the caller. SIGBUS past the end of file; `None` when out of memory.
///
/// # Context
/// mmap lock held for reading; no PTE lock.
pub(crate) fn filemap_fault<'m>(
    cpu: &Cpu<'m>,
    inode: &Inode,
    vma: &Vma,
    addr: VirtAddr,
    pgoff: u64,
) -> Result<(Pfn, CacheLookup), crate::fault::FaultOutcome> {
    if pgoff >= inode.size_pages() {
        cpu.c().add(Ev::FaultSigbus, 1);
        return Err(crate::fault::FaultOutcome::Sigbus);
    }
    let mem = &cpu.m.phys.memmap;
    let hit = |p: Pfn| {
        let head = mem.folio_of(p);
        crate::rmap::folio_ref_add(&cpu.m.phys, cpu.c(), head, 1);
        if !mem.test(head, PageFlag::Uptodate) {
            // A fallocated tmpfs page: cleared on first use.
            cpu.m.phys.arena.zero_frame(p);
            mem.set(head, PageFlag::Uptodate);
        }
        Ok((p, CacheLookup::Hit))
    };
    // One lookup for a hit; the lock is dropped only to read ahead or reclaim (both take
    // cache locks of their own).
    let mut cache = inode.pages.lock();
    if let Some(p) = cache.get(pgoff) {
        let head = mem.folio_of(p);
        let async_ra = inode.kind == InodeKind::Disk
            && mem.test(head, PageFlag::Readahead)
            && !vma.flags.has(VmFlags::RAND_READ);
        if !async_ra {
            return hit(p);
        }
        drop(cache);
        page_cache_async_ra(cpu, inode, pgoff, head, ra_pages(cpu));
        cache = inode.pages.lock();
        if let Some(p) = cache.get(pgoff) {
            return hit(p);
        }
    }
    // A miss allocates: reclaim first if memory is short (as the allocator would), and a
    // disk file reads ahead.
    let want = 1 << crate::phys::HPAGE_PMD_ORDER;
    if inode.kind == InodeKind::Disk || !enough_free(cpu, want) {
        drop(cache);
        reclaim_for(cpu, want);
        if inode.kind == InodeKind::Disk {
            mmap_sync_readahead(cpu, inode, vma, pgoff);
        }
        cache = inode.pages.lock();
    }
    let p = match cache.get(pgoff) {
        Some(p) => p,
        None if inode.kind.is_shmem() => {
            let order = shmem_fault_order(cpu, inode, vma, addr, pgoff, &cache);
            let first = pgoff & !((1u64 << order) - 1);
            let Some(head) = cache_alloc_order(cpu, inode, &mut cache, first, order) else {
                return Err(crate::fault::FaultOutcome::Oom);
            };
            head.add(pgoff - first)
        }
        None => {
            let Some(p) = cache_alloc(cpu, inode, &mut cache, pgoff) else {
                return Err(crate::fault::FaultOutcome::Oom);
            };
            if inode.kind == InodeKind::Disk {
                drop(cache);
                read_blocks(cpu, inode, pgoff, &[p]);
                cache = inode.pages.lock();
            }
            p
        }
    };
    let head = cpu.m.phys.memmap.folio_of(p);
    crate::rmap::folio_ref_add(&cpu.m.phys, cpu.c(), head, 1);
    drop(cache);
    Ok((p, CacheLookup::Miss))
}

/// `folio_mark_accessed`: referenced on the first access, active (and no longer
/// referenced) on the second. Activation goes through a per-CPU batch in Linux; its
/// effect is applied at once here (flags are compared after the batches drain).
pub(crate) fn folio_mark_accessed<'m>(cpu: &Cpu<'m>, head: Pfn) {
    let mem = &cpu.m.phys.memmap;
    if !mem.test(head, PageFlag::Referenced) {
        mem.set(head, PageFlag::Referenced);
    } else if !mem.test(head, PageFlag::Unevictable) && !mem.test(head, PageFlag::Active) {
        lru_relist(cpu, head, |_| {
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
