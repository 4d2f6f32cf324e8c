//! Reading, writing and faulting through the page cache.
//!
//! Linux counterparts: `mm/filemap.c` (`filemap_read`, `filemap_get_pages`, `filemap_fault`),
//! `mm/shmem.c` (`shmem_file_write_iter`, `shmem_fault`) and `generic_perform_write`. These
//! are the paths that may start readahead or reclaim; the page-cache primitives they build on
//! (allocating and adding a folio, reading it from the device, deleting it) are in
//! [`super::cache`].

use super::{CacheLookup, Inode, InodeKind, PAGE_SIZE};
use crate::errno::{Errno, SysResult};
use crate::filemap::cache::{cache_alloc, cache_alloc_order, folio_mark_accessed, read_blocks};
use crate::machine::Cpu;
use crate::phys::{PageFlag, Pfn};
use crate::readahead::{
    mmap_async_readahead, mmap_sync_readahead, page_cache_async_ra, page_cache_sync_ra,
};
use crate::shmem::{shmem_fault_order, shmem_force, shmem_nofault_order};
use crate::stats::Ev;
use crate::vaddr::VirtAddr;
use crate::vma::Vma;
use crate::vmscan::{enough_free, reclaim_for};

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

/// What `filemap_fault` found for one attempt of a fault.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FaultPage {
    /// The page, with a reference for the caller.
    pub(crate) pfn: Pfn,
    /// Whether it was in the page cache.
    pub(crate) lookup: CacheLookup,
    /// The attempt dropped the mmap lock for I/O (`VM_FAULT_RETRY`): Linux takes the fault
    /// again ([`crate::vm_fault::FaultAttempt::retry`], with `VM_FAULT_MAJOR` for a miss).
    pub(crate) retry: bool,
}

/// Finds (or creates / reads) the page-cache page of `pgoff` for attempt `at` of a fault.
/// SIGBUS past the end of file; `None` when out of memory.
///
/// A disk file's hit runs `do_async_mmap_readahead` unless the attempt is a retry with
/// `FAULT_FLAG_TRIED` ([`mmap_async_readahead`]: one `mmap_miss` hit, and the next window
/// when the page carries the readahead mark, which drops the lock); a miss runs
/// `do_sync_mmap_readahead` ([`mmap_sync_readahead`]) and drops the lock to wait for the
/// read whenever the attempt may.
///
/// # Context
/// mmap lock held for reading; no PTE lock.
pub(crate) fn filemap_fault<'m>(
    cpu: &Cpu<'m>,
    inode: &Inode,
    vma: &Vma,
    addr: VirtAddr,
    pgoff: u64,
    at: crate::vm_fault::FaultAttempt,
) -> Result<FaultPage, crate::vm_fault::FaultOutcome> {
    if pgoff >= inode.size_pages() {
        cpu.c().add(Ev::FaultSigbus, 1);
        return Err(crate::vm_fault::FaultOutcome::Sigbus);
    }
    let mem = &cpu.m.phys.memmap;
    let hit = |p: Pfn, retry: bool| {
        let head = mem.folio_of(p);
        crate::rmap::folio_ref_add(cpu.c(), cpu.m.phys.memmap.folio(head), 1);
        if !mem.test(head, PageFlag::Uptodate) {
            // A fallocated tmpfs page: cleared on first use.
            cpu.m.phys.arena.zero_frame(p);
            mem.set(head, PageFlag::Uptodate);
        }
        Ok(FaultPage {
            pfn: p,
            lookup: CacheLookup::Hit,
            retry,
        })
    };
    // One lookup for a hit; the lock is dropped only to read ahead or reclaim (both take
    // cache locks of their own).
    let mut cache = inode.pages.lock();
    if let Some(p) = cache.get(pgoff) {
        if inode.kind != InodeKind::Disk || at.tried {
            return hit(p, false);
        }
        let head = mem.folio_of(p);
        if !mem.test(head, PageFlag::Readahead) {
            // The hit is counted after the cache lock is dropped (`ra` is taken before
            // `pages`, never under it).
            let r = hit(p, false);
            drop(cache);
            mmap_async_readahead(cpu, inode, vma, pgoff, head);
            return r;
        }
        drop(cache);
        let read = mmap_async_readahead(cpu, inode, vma, pgoff, head);
        cache = inode.pages.lock();
        if let Some(p) = cache.get(pgoff) {
            return hit(p, read && at.may_drop_lock());
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
                return Err(crate::vm_fault::FaultOutcome::Oom);
            };
            head.add(pgoff - first)
        }
        None => {
            let Some(p) = cache_alloc(cpu, inode, &mut cache, pgoff) else {
                return Err(crate::vm_fault::FaultOutcome::Oom);
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
    crate::rmap::folio_ref_add(cpu.c(), cpu.m.phys.memmap.folio(head), 1);
    drop(cache);
    // A disk miss waits for its read with the lock dropped when it may (in
    // `do_sync_mmap_readahead`, or `filemap_read_folio` when readahead read nothing).
    Ok(FaultPage {
        pfn: p,
        lookup: CacheLookup::Miss,
        retry: inode.kind == InodeKind::Disk && at.may_drop_lock(),
    })
}
