//! Files: creating them, `pread`/`pwrite` through the page cache, `ftruncate`, `fallocate`,
//! `fsync`, `msync`, `fincore`, readahead and writeback.
//!
//! Linux counterparts: `mm/filemap.c` (`filemap_read`, `filemap_get_pages`,
//! `generic_perform_write`, `filemap_fault`'s readahead helpers), `mm/shmem.c`
//! (`shmem_file_read_iter`, `shmem_write_begin/end`, `shmem_fallocate`, `shmem_setattr`,
//! `shmem_undo_range`), `mm/truncate.c` (`truncate_pagecache`, `truncate_pagecache_range`),
//! `mm/memory.c` (`unmap_mapping_range`), `mm/readahead.c` (`page_cache_sync_ra`,
//! `page_cache_async_ra`, `force_page_cache_ra`, `page_cache_ra_unbounded`),
//! `mm/page-writeback.c` (`write_cache_pages`, `folio_clear_dirty_for_io`), `mm/rmap.c`
//! (`folio_mkclean`), `mm/msync.c`, `mm/swap.c` (`folio_mark_accessed`), `mm/mincore.c`.
//!
//! The state lives in [`crate::filemap`]; see there for what is deliberately simpler than
//! Linux (order-0 cache folios, synchronous writeback). Every entry point takes the
//! machine's [`FileId`]: the scenario's files are opened read-write by every process, and the
//! open file (with its readahead state) is shared, as one descriptor passed around would be.

use crate::errno::{Errno, SysResult};
use crate::filemap::xarray::XArray;
use crate::filemap::{Inode, InodeKind, RaState, PAGE_SIZE};
use crate::machine::{Cpu, FileId};
use crate::mm::{Mm, Pid};
use crate::pgtable::cursor::{PmdKind, PteLock};
use crate::phys::{FolioKind, PageFlag, Pfn, Zeroing};
use crate::stats::Ev;
use crate::tlb::FlushScope;
use crate::vaddr::VirtAddr;
use crate::vma::{VmFlags, Vma};
use crate::zap::{GatherScope, MmuGather, ZapDetails};
use std::sync::Arc;

/// `MAX_LFS_FILESIZE` (tmpfs `s_maxbytes`).
const MAX_LFS_FILESIZE: u64 = i64::MAX as u64;

/// `rw_verify_area` for a regular file's positioned read or write: a negative position, a
/// negative count (as `ssize_t`) and a range ending past `LLONG_MAX` are `EINVAL`. It sees
/// the count as the caller gave it: `MAX_RW_COUNT` clamps only afterwards, so `pread` of
/// 4 KiB at `LLONG_MAX - 1` is refused rather than read short.
fn rw_verify_area(offset: u64, count: u64) -> SysResult<()> {
    let limit = i64::MAX as u64;
    if offset > limit || count > limit || count > limit - offset {
        return Err(Errno::EINVAL);
    }
    Ok(())
}
/// ext4's `s_maxbytes` with 4 KiB blocks and extents: 2^32 - 1 blocks.
const EXT4_MAX_BYTES: u64 = ((1u64 << 32) - 1) * PAGE_SIZE;
/// `MAX_RW_COUNT`: the most one read or write transfers.
const MAX_RW_COUNT: u64 = (i32::MAX as u64) & !(PAGE_SIZE - 1);
/// Free pages under which an allocation reclaims page cache first (a low watermark).
const LOW_WATERMARK: u64 = 256;
/// The least reclaim gathers at once (`SWAP_CLUSTER_MAX`).
const SWAP_CLUSTER_MAX: u64 = 32;
/// Reclaim passes one allocation may make.
const RECLAIM_PASSES: u32 = 4;
/// Pages one reclaim pass may look at beyond what it frees.
const MAX_SCAN: u64 = 4 * SWAP_CLUSTER_MAX;

/// What reclaim does with a folio it judged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    /// Back on the inactive list.
    Keep,
    /// Onto the active list.
    Activate,
}

/// `force_page_cache_ra` reads in chunks of 2 MiB.
const FORCE_RA_CHUNK: u64 = (2 << 20) / PAGE_SIZE;

/// `msync` flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MsyncFlags {
    /// `MS_ASYNC`.
    Async,
    /// `MS_INVALIDATE`.
    Invalidate,
    /// `MS_SYNC`.
    Sync,
}

/// Whether a fault found its page in the cache or had to create or read it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CacheLookup {
    /// Found (a minor fault).
    Hit,
    /// Created or read from the device (a major fault for disk files).
    Miss,
}

impl Inode {
    fn max_bytes(&self) -> u64 {
        match self.kind {
            InodeKind::Disk => EXT4_MAX_BYTES,
            _ => MAX_LFS_FILESIZE,
        }
    }
}

impl<'m> Cpu<'m> {
    /// Creates a file of `size` bytes: zero-filled (sparse), or filled with `fill` (written
    /// through the cache on tmpfs, as `write(2)` would; allocated blocks on disk, nothing
    /// cached, as the oracle leaves a disk file after `fsync` and dropping its cache).
    pub fn file_create(&self, size: u64, kind: InodeKind, fill: Option<u8>) -> SysResult<FileId> {
        self.c().add(crate::stats::Ev::Syscall, 1);
        if kind == InodeKind::ShmemAnon {
            return Err(Errno::EINVAL);
        }
        let mut inode = Inode::new(self.m.alloc_shmem_id(), kind, size);
        if size > inode.max_bytes() {
            return Err(Errno::EFBIG);
        }
        if let (InodeKind::Disk, Some(b)) = (kind, fill) {
            inode = inode.with_disk_fill(b, size);
        }
        let inode = Arc::new(inode);
        if let (InodeKind::Tmpfs, Some(b)) = (kind, fill) {
            if size.div_ceil(PAGE_SIZE) > self.m.phys.free_frames() {
                return Err(Errno::ENOSPC);
            }
            let mut off = 0;
            while off < size {
                let n = (size - off).min(MAX_RW_COUNT);
                if let Err(e) = self.write_iter(&inode, off, n, b) {
                    self.release_cache(&inode, 0);
                    return Err(e);
                }
                off += n;
            }
        }
        Ok(self.m.add_file(inode))
    }

    /// `pwrite(2)` of `len` bytes of `byte` at `offset`; returns the bytes written.
    pub fn pwrite(&self, f: FileId, offset: u64, len: u64, byte: u8) -> SysResult<u64> {
        self.c().add(crate::stats::Ev::Syscall, 1);
        let inode = self.m.file(f)?;
        rw_verify_area(offset, len)?;
        let len = len.min(MAX_RW_COUNT);
        if len == 0 {
            return Ok(0);
        }
        if offset >= inode.max_bytes() {
            return Err(Errno::EFBIG);
        }
        let len = len.min(inode.max_bytes() - offset);
        self.write_iter(&inode, offset, len, byte)
    }

    /// `generic_perform_write` / `shmem_file_write_iter`: page by page through the cache.
    fn write_iter(&self, inode: &Inode, offset: u64, len: u64, byte: u8) -> SysResult<u64> {
        let phys = &self.m.phys;
        let mem = &phys.memmap;
        let mut done = 0;
        let shmem_force = self.shmem_force();
        while done < len {
            let pos = offset + done;
            let idx = pos / PAGE_SIZE;
            let in_page = pos % PAGE_SIZE;
            let n = (PAGE_SIZE - in_page).min(len - done);
            let old_size = inode.size();
            self.reclaim_for(1);
            let pfn = {
                let mut cache = inode.pages.lock();
                match cache.get(idx) {
                    Some(p) => {
                        // shmem_get_folio(SGP_WRITE) marks a found folio accessed; the
                        // generic write path (FGP_WRITEBEGIN) does not.
                        if inode.kind.is_shmem() {
                            drop(cache);
                            self.folio_mark_accessed(mem.folio_of(p));
                        }
                        p
                    }
                    None => {
                        let order = self.shmem_nofault_order(inode, idx, &cache, shmem_force);
                        let first = idx & !((1u64 << order) - 1);
                        let Some(head) = self.cache_alloc_order(inode, &mut cache, first, order)
                        else {
                            break;
                        };
                        let p = head.add(idx - first);
                        if inode.kind.is_shmem() {
                            mem.set(head, PageFlag::Referenced);
                        } else if n < PAGE_SIZE && idx * PAGE_SIZE < old_size {
                            // A partial write of a page that exists on disk reads it first
                            // (`block_write_begin`).
                            self.read_blocks(inode, idx, &[p]);
                        } else if n < PAGE_SIZE {
                            // New past the end of file: the rest of the page is zeroes.
                            self.m.phys.arena.zero_frame(p);
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
        self.c().add(Ev::FileWriteBytes, done);
        if done == 0 {
            // A folio could not be allocated (`shmem_get_folio`, `write_begin`).
            return Err(Errno::ENOMEM);
        }
        Ok(done)
    }

    /// `pread(2)` of up to `len` bytes at `offset`: the bytes read (fewer at the end of file).
    pub fn pread(&self, f: FileId, offset: u64, len: u64) -> SysResult<Vec<u8>> {
        // Sized by what the file holds, not by what was asked (`len` may be huge).
        let avail = self.m.file(f)?.size().saturating_sub(offset);
        rw_verify_area(offset, len)?;
        let mut out = vec![0u8; len.min(MAX_RW_COUNT).min(avail) as usize];
        let n = self.pread_into(f, offset, &mut out)?;
        out.truncate(n);
        Ok(out)
    }

    /// `pread(2)` into `buf` (as much of it as the file has, at most `MAX_RW_COUNT`): the
    /// number of bytes read. The caller's buffer is reused, as a program's is.
    pub fn pread_into(&self, f: FileId, offset: u64, buf: &mut [u8]) -> SysResult<usize> {
        self.c().add(crate::stats::Ev::Syscall, 1);
        let inode = self.m.file(f)?;
        rw_verify_area(offset, buf.len() as u64)?;
        let size = inode.size();
        let len = (buf.len() as u64).min(MAX_RW_COUNT);
        if offset >= size || len == 0 {
            return Ok(0);
        }
        let end = size.min(offset + len);
        let out = &mut buf[..(end - offset) as usize];
        match inode.kind {
            InodeKind::Disk => self.filemap_read(&inode, offset, end, out),
            _ => self.shmem_read(&inode, offset, end, out),
        }
        self.c().add(Ev::FileReadBytes, out.len() as u64);
        Ok(out.len())
    }

    /// `shmem_file_read_iter`: holes (and fallocated pages never written) read as zeroes
    /// without creating pages; a page is marked accessed when the read starts at its
    /// beginning.
    fn shmem_read(&self, inode: &Inode, offset: u64, end: u64, out: &mut [u8]) {
        let mut pos = offset;
        while pos < end {
            let idx = pos / PAGE_SIZE;
            let in_page = pos % PAGE_SIZE;
            let n = (PAGE_SIZE - in_page).min(end - pos);
            let dst = &mut out[(pos - offset) as usize..(pos - offset + n) as usize];
            let mem = &self.m.phys.memmap;
            // SGP_READ: a fallocated page not yet written (not uptodate) reads as a hole and
            // is not touched.
            let page = inode
                .pages
                .lock()
                .get(idx)
                .filter(|&p| mem.test(mem.folio_of(p), PageFlag::Uptodate));
            match page {
                Some(p) => {
                    self.m.phys.arena.read(p, in_page as usize, dst);
                    if in_page == 0 {
                        self.folio_mark_accessed(mem.folio_of(p));
                    }
                }
                None => dst.fill(0),
            }
            pos += n;
        }
    }

    /// `filemap_read`: misses start synchronous readahead, a `PG_readahead` page the next
    /// asynchronous window; every page copied is marked accessed except a first page the
    /// previous read already ended in.
    fn filemap_read(&self, inode: &Inode, offset: u64, end: u64, out: &mut [u8]) {
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
                    self.page_cache_sync_ra(inode, idx, req);
                    // Bound first: a guard in the `match` scrutinee would live through the arms.
                    let after_ra = inode.pages.lock().get(idx);
                    match after_ra {
                        Some(p) => p,
                        None => {
                            // No memory for readahead: read this page alone.
                            let mut cache = inode.pages.lock();
                            let Some(p) = self.cache_alloc(inode, &mut cache, idx) else {
                                break;
                            };
                            drop(cache);
                            self.read_blocks(inode, idx, &[p]);
                            p
                        }
                    }
                }
            };
            let mem = &self.m.phys.memmap;
            let head = mem.folio_of(pfn);
            if mem.test(head, PageFlag::Readahead) {
                // filemap_readahead: the window is asked for at the marked folio's index.
                self.page_cache_async_ra(inode, mem.index(head), head, req);
            }
            let same_as_prev = idx == first
                && prev_pos != u64::MAX
                && prev_pos > 0
                && (prev_pos - 1) / PAGE_SIZE == idx;
            if !same_as_prev {
                self.folio_mark_accessed(pfn);
            }
            let in_page = pos % PAGE_SIZE;
            let n = (PAGE_SIZE - in_page).min(end - pos);
            let dst = &mut out[(pos - offset) as usize..(pos - offset + n) as usize];
            self.m.phys.arena.read(pfn, in_page as usize, dst);
            pos += n;
        }
        inode.ra.lock().prev_pos = pos;
    }

    /// A new page-cache folio of `inode` at `idx`, inserted (`filemap_add_folio`): the cache
    /// holds the allocation's reference; the folio goes to this CPU's LRU batch.
    ///
    /// # Context
    /// The cache lock (`cache`) is held.
    pub(crate) fn cache_alloc(&self, inode: &Inode, cache: &mut XArray, idx: u64) -> Option<Pfn> {
        self.cache_alloc_order(inode, cache, idx, 0)
    }

    /// [`Cpu::cache_alloc`] of a folio of `order` covering the aligned indexes from `idx`
    /// (which must all be free): the cache holds one reference per page, as Linux's holds
    /// `folio_nr_pages`. Returns the head frame.
    ///
    /// # Context
    /// The cache lock (`cache`) is held.
    fn cache_alloc_order(
        &self,
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
        let node = self.id % self.m.phys.nr_nodes().max(1);
        // A disk page is filled by its read (or its write); a shmem page starts as zeroes.
        let zeroing = if inode.kind == InodeKind::Disk {
            Zeroing::NoZero
        } else {
            Zeroing::Zero
        };
        let p = self
            .m
            .phys
            .alloc_folio(self.c(), order, node, kind, zeroing)?;
        let nr = 1u64 << order;
        if nr > 1 {
            crate::rmap::folio_ref_add(&self.m.phys, self.c(), p, nr as i32 - 1);
        }
        let mem = &self.m.phys.memmap;
        mem.set_mapping(p, inode.id);
        mem.set_index(p, idx);
        if inode.kind == InodeKind::Disk {
            // Not uptodate until read (or written) in full.
            mem.clear(p, PageFlag::Uptodate);
        }
        for i in 0..nr {
            cache.insert(idx + i, p.add(i));
        }
        self.c().add(Ev::PageCacheAdd, 1);
        self.folio_add_lru(p);
        Some(p)
    }

    /// The free frames under which reclaim starts.
    fn low_watermark(&self) -> u64 {
        LOW_WATERMARK.min(self.m.phys.nr_frames() / 64)
    }

    /// Whether `pages` can be allocated without reclaim ([`Cpu::reclaim_for`] would do
    /// nothing).
    fn enough_free(&self, pages: u64) -> bool {
        self.m.phys.free_frames() >= pages + self.low_watermark()
    }

    /// Direct reclaim before an allocation of `pages` (`__alloc_pages_direct_reclaim`): when
    /// free memory would drop under a low watermark, reclaim page cache first. Called with no
    /// cache, PTE or LRU lock held (an mmap lock for reading may be held).
    pub(crate) fn reclaim_for(&self, pages: u64) {
        let phys = &self.m.phys;
        let low = self.low_watermark();
        // A few passes, as reclaim raises its priority: a mapped folio is only marked
        // referenced by the first look and reclaimed by the next.
        for priority in (0..RECLAIM_PASSES).rev() {
            let free = phys.free_frames();
            if free >= pages + low {
                return;
            }
            self.shrink_file_lru((pages + low - free).max(SWAP_CLUSTER_MAX), priority);
        }
    }

    /// Reclaim of the file LRU (`shrink_inactive_list` and `shrink_active_list` for file
    /// folios, on every node): folios from the tail of the inactive file list, refilled from
    /// the active one, are judged as `folio_check_references` does for file folios:
    /// - mapped and young in a page table (the young bits are cleared on the way): kept on
    ///   the inactive list and marked referenced the first time, activated when it was
    ///   already referenced or is young in several mappings;
    /// - otherwise reclaimed: unmapped from every mapping, written back when dirty (what the
    ///   flushers would have done), dropped from the cache and freed.
    ///
    /// Folios held by anything but the cache and their mappings (pins, batches) stay. Returns
    /// the pages freed; scans each list at most once.
    ///
    /// # Context
    /// No cache, PTE or LRU lock held; takes each mm's mmap lock for reading (recursively).
    pub(crate) fn shrink_file_lru(&self, want: u64, priority: u32) -> u64 {
        use crate::phys::lru::LruList;
        self.lru_add_drain_all();
        let phys = &self.m.phys;
        let mem = &phys.memmap;
        let files = self.m.files();
        let mut freed = 0;
        for node in 0..phys.nr_nodes().max(1) {
            let lruvec = phys.lruvec_of_node(node);
            let budget = {
                let l = lruvec.lock();
                l.pages(LruList::InactiveFile) + l.pages(LruList::ActiveFile)
            };
            // A pass looks at `want` plus a share of the lists that doubles as the priority
            // drops (`nr_to_scan = lru_size >> priority`), the last one at everything twice,
            // so an allocation usually costs a short scan, and a full one only when nothing
            // easier is left.
            let limit = if priority == 0 {
                2 * budget
            } else {
                (want + MAX_SCAN + (budget >> (2 * priority))).min(2 * budget)
            };
            let mut scanned = 0;
            while freed < want && scanned < limit {
                let folio = {
                    self.c().add(Ev::LockLru, 1);
                    let mut l = lruvec.lock();
                    let Some(folio) = l.tail(LruList::InactiveFile) else {
                        // Refill the inactive list from the active one.
                        let Some(f) = l.tail(LruList::ActiveFile) else {
                            break;
                        };
                        let f = mem.folio(f);
                        let nr = f.nr_pages();
                        l.del(f, nr);
                        f.clear(PageFlag::Active);
                        l.add(f, nr);
                        scanned += nr;
                        self.c().add(Ev::PgDeactivate, nr);
                        continue;
                    };
                    let f = mem.folio(folio);
                    let nr = f.nr_pages();
                    scanned += nr;
                    self.c().add(Ev::PgScan, nr);
                    // Isolate it: off the list while it is judged.
                    l.del(f, nr);
                    f.clear(PageFlag::Lru);
                    folio
                };
                let nr = 1u64 << mem.order(folio);
                let inode = files.iter().find(|f| f.id == mem.mapping(folio));
                let verdict = match inode {
                    None => Verdict::Keep,
                    Some(inode) => {
                        let idx = mem.index(folio);
                        let young = self.folio_referenced(inode, idx, nr);
                        let referenced = mem.test_and_clear(folio, PageFlag::Referenced);
                        if young > 0 && (referenced || young > 1) {
                            Verdict::Activate
                        } else if young > 0 {
                            mem.set(folio, PageFlag::Referenced);
                            Verdict::Keep
                        } else if self.reclaim_folio(inode, folio) {
                            freed += nr;
                            continue;
                        } else {
                            Verdict::Keep
                        }
                    }
                };
                // Put back (`folio_putback_lru`), on the active list if it earned it.
                if verdict == Verdict::Activate {
                    mem.set(folio, PageFlag::Active);
                }
                self.c().add(Ev::LockLru, 1);
                let mut l = lruvec.lock();
                mem.set(folio, PageFlag::Lru);
                l.add(mem.folio(folio), nr);
            }
        }
        freed
    }

    /// `folio_referenced` for a page-cache folio: how many mappings found it young, clearing
    /// the young bits (with a TLB flush) on the way.
    fn folio_referenced(&self, inode: &Inode, idx: u64, nr: u64) -> u32 {
        let mut young = 0;
        for task in self.m.tasks() {
            let mm = &task.mm;
            let st = mm.lock.read_recursive();
            for id in st.vmas.all() {
                let vma = st.vmas.get(id);
                let Some((start, end)) = file_range_in(vma, inode, idx, idx + nr) else {
                    continue;
                };
                let pt = self.tables(mm);
                let arch = pt.arch;
                let mut hit = false;
                for step in pt.pmd_walk(start, end) {
                    match step.kind {
                        PmdKind::Table(table) => {
                            let mut ptes = PteLock::lock(pt, self.c(), table);
                            let (i0, i1) = step.pte_indexes();
                            for i in i0..i1 {
                                let e = ptes.get(i);
                                if !e.is_none() && arch.present(e) && arch.young(e) {
                                    ptes.replace(i, arch.mkold(e));
                                    hit = true;
                                }
                            }
                        }
                        PmdKind::Huge(e) => hit |= arch.young(e),
                    }
                }
                if hit {
                    young += 1;
                    self.flush_tlb(mm, FlushScope::Range(start, end));
                }
            }
        }
        young
    }

    /// Reclaims one isolated page-cache folio (`shrink_folio_list`'s unmap, pageout and
    /// `__remove_mapping`): true if it was freed. A folio something else holds stays.
    fn reclaim_folio(&self, inode: &Inode, folio: Pfn) -> bool {
        let mem = &self.m.phys.memmap;
        let idx = mem.index(folio);
        let nr = 1u64 << mem.order(folio);
        if inode.kind.is_shmem() {
            return false; // no swap
        }
        if crate::rmap::page_mapcount(&self.m.phys, folio) > 0 || mem.entire_mapcount(folio) > 0 {
            self.unmap_mapping_range(inode, idx, idx + nr, ZapDetails::FilePagesOnly);
        }
        if mem.refcount(folio) != nr as i32 {
            return false;
        }
        if mem.test(folio, PageFlag::Dirty) {
            self.writeback_range(inode, idx, idx + nr);
        }
        let removed: Vec<Pfn> = {
            let mut cache = inode.pages.lock();
            (idx..idx + nr).filter_map(|i| cache.remove(i)).collect()
        };
        self.c().add(Ev::PgSteal, nr);
        self.c().add(Ev::PageCacheEvict, 1);
        self.drop_cache_pages(removed);
        true
    }

    /// The folio order `write(2)` and `fallocate` allocate at page `idx` of a shmem file
    /// (`shmem_allowable_huge_orders` without a VMA): a tmpfs mounted `huge=never` gets huge
    /// folios only when the top level is `force`, then PMD-sized where no page of the aligned
    /// range is cached yet. Measured on 6.18: a 4K pwrite under `force` caches 2 MiB.
    ///
    /// `force` is [`Cpu::shmem_force`], read once by the caller's loop.
    fn shmem_nofault_order(&self, inode: &Inode, idx: u64, cache: &XArray, force: bool) -> u32 {
        if inode.kind != InodeKind::Tmpfs || !force {
            return 0;
        }
        let order = crate::phys::HPAGE_PMD_ORDER;
        let first = idx & !((1u64 << order) - 1);
        if cache.range(first..first + (1 << order)).next().is_some() {
            return 0;
        }
        order
    }

    /// Whether the top-level `shmem_enabled` is `force` (a snapshot for page-by-page loops).
    fn shmem_force(&self) -> bool {
        self.m.tunables().shmem.top == crate::tunables::ShmemHuge::Force
    }

    /// The largest folio order a shmem fault at `addr` (page `pgoff`) may allocate: allowed
    /// by `shmem_enabled` ([`crate::tunables::ShmemSettings::fault_orders`]), naturally
    /// aligned inside the VMA with file and address congruent (`thp_vma_suitable_order`), and
    /// with no page of the aligned range cached yet (`shmem_suitable_orders`).
    fn shmem_fault_order(
        &self,
        inode: &Inode,
        vma: &Vma,
        addr: VirtAddr,
        pgoff: u64,
        cache: &XArray,
    ) -> u32 {
        if vma.flags.has(VmFlags::NOHUGEPAGE) {
            return 0;
        }
        let mask = self.m.tunables().shmem.fault_orders(
            inode.kind == InodeKind::ShmemAnon,
            vma.flags.has(VmFlags::HUGEPAGE),
            pgoff,
            inode.size_pages(),
        );
        for order in (2..=crate::phys::HPAGE_PMD_ORDER).rev() {
            if mask & (1 << order) == 0 {
                continue;
            }
            let nr = 1u64 << order;
            let size = nr * PAGE_SIZE;
            let haddr = addr.align_down(size);
            let first = pgoff & !(nr - 1);
            let congruent = ((vma.start >> 12).wrapping_sub(vma.pgoff)).is_multiple_of(nr);
            if congruent
                && haddr >= vma.vm_start()
                && haddr.add(size) <= vma.vm_end()
                && cache.range(first..first + nr).next().is_none()
            {
                return order;
            }
        }
        0
    }

    /// Reads the device blocks behind `pages` (consecutive indexes from `first`) into them:
    /// one I/O per run of allocated blocks, split where it reaches the device's largest
    /// request (`max_sectors_kb`, as the block layer splits a bio); holes read as zeroes
    /// without I/O. Sets uptodate and, for allocated blocks, `PG_mappedtodisk`.
    fn read_blocks(&self, inode: &Inode, first: u64, pages: &[Pfn]) {
        use crate::filemap::BlockContents;
        let mem = &self.m.phys.memmap;
        let arena = &self.m.phys.arena;
        let size = inode.size();
        let max_io = (self.m.tunables().max_sectors_kb / 4).max(1);
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
                self.c().add(Ev::DiskReadBytes, PAGE_SIZE);
                if run.is_multiple_of(max_io) {
                    self.c().add(Ev::DiskReads, 1);
                }
                run += 1;
            } else {
                run = 0;
            }
        }
    }

    /// `page_cache_ra_unbounded` (via `do_page_cache_ra`): reads the missing pages of
    /// `start..start+nr` (clipped at the end of file), marking the page `lookahead` before the
    /// end `PG_readahead`.
    fn do_page_cache_ra(&self, inode: &Inode, start: u64, nr: u64, lookahead: u64) {
        let size = inode.size();
        if size == 0 {
            return;
        }
        let end_index = (size - 1) / PAGE_SIZE;
        if start > end_index {
            return;
        }
        let nr = nr.min(end_index - start + 1);
        self.reclaim_for(nr);
        let mark = (lookahead > 0 && lookahead <= nr).then(|| start + nr - lookahead);
        let mut run: Vec<Pfn> = Vec::new();
        let mut run_start = start;
        let mut cache = inode.pages.lock();
        for idx in start..start + nr {
            if cache.contains(idx) {
                if !run.is_empty() {
                    self.read_blocks(inode, run_start, &run);
                    run.clear();
                }
                continue;
            }
            let Some(p) = self.cache_alloc(inode, &mut cache, idx) else {
                break;
            };
            if run.is_empty() {
                run_start = idx;
            }
            run.push(p);
            if Some(idx) == mark {
                self.m.phys.memmap.set(p, PageFlag::Readahead);
            }
        }
        drop(cache);
        if !run.is_empty() {
            self.read_blocks(inode, run_start, &run);
        }
        self.c().add(Ev::Readahead, 1);
    }

    fn ra_pages(&self) -> u64 {
        self.m.tunables().read_ahead_kb / 4
    }

    /// `ractl_max_pages`: the window, or a larger request up to the device's I/O size.
    fn ra_max_pages(&self, req: u64) -> u64 {
        let t = self.m.tunables();
        let (ra, io) = (t.read_ahead_kb / 4, t.max_sectors_kb / 4);
        if req > ra && io > ra {
            req.min(io)
        } else {
            ra
        }
    }

    /// `page_cache_sync_ra`: a miss at `index` for a read of `req` pages.
    pub(crate) fn page_cache_sync_ra(&self, inode: &Inode, index: u64, req: u64) {
        if self.ra_pages() == 0 {
            self.do_page_cache_ra(inode, index, req, 0);
            return;
        }
        let max = self.ra_max_pages(req);
        let mut ra = inode.ra.lock();
        let prev_index = if ra.prev_pos == u64::MAX {
            u64::MAX
        } else {
            ra.prev_pos / PAGE_SIZE
        };
        if index == 0 || req > max || index.wrapping_sub(prev_index) <= 1 {
            ra.start = index;
            ra.size = init_ra_size(req, max);
            ra.async_size = if ra.size > req {
                ra.size - req
            } else {
                ra.size >> 1
            };
        } else {
            // Look back for the traces a sequential stream leaves in the cache.
            let miss = {
                let cache = inode.pages.lock();
                (1..=max)
                    .map(|d| index.checked_sub(d))
                    .find(|i| i.is_none_or(|i| !cache.contains(i)))
                    .flatten()
            };
            let contig = match miss {
                Some(m) => index - m - 1,
                None => index.min(max),
            };
            if contig <= req {
                drop(ra);
                self.do_page_cache_ra(inode, index, req, 0);
                return;
            }
            let contig = if miss.is_none() && index <= max {
                contig * 2
            } else {
                contig
            };
            ra.start = index;
            ra.size = (contig + req).min(max);
            ra.async_size = 1;
        }
        // Every synchronous window is read in order-0 folios (6.17+: `ra->order = 0`).
        ra.order = 0;
        self.submit_window(inode, ra);
    }

    /// `page_cache_ra_order`: reads the window `ra` now describes in folios of `ra.order`,
    /// clamped to the largest page-cache order and to the window's size (the clamped order is
    /// kept for the next window). From the window's start, each folio takes that order unless
    /// its index is less aligned (then the alignment's order) or it would cross the window's
    /// end or the end of file (then one order less, until it fits); `PG_readahead` goes on the
    /// folio holding `start + size - async_size`. A page already cached stops the walk, and the
    /// rest of the window is read in order-0 folios around what is cached (`do_page_cache_ra`).
    fn submit_window(&self, inode: &Inode, mut ra: parking_lot::MutexGuard<'_, RaState>) {
        let RaState {
            start,
            size,
            async_size,
            ..
        } = *ra;
        let order = ra
            .order
            .min(crate::phys::HPAGE_PMD_ORDER)
            .min(size.max(1).ilog2());
        ra.order = order;
        drop(ra);
        let isize = inode.size();
        if isize == 0 || size == 0 {
            return;
        }
        // ext4 supports large folios, so even an order-0 window takes this walk, whose mark
        // comes from the whole window: a window cut by EOF before its mark has none (where
        // `do_page_cache_ra` would count the mark back from EOF).
        if inode.kind != InodeKind::Disk {
            self.do_page_cache_ra(inode, start, size, async_size);
            return;
        }
        let limit = ((isize - 1) / PAGE_SIZE).min(start + size - 1);
        if start > limit {
            return;
        }
        self.reclaim_for(limit + 1 - start);
        let mark = start + size - async_size;
        let mem = &self.m.phys.memmap;
        let mut run: Vec<Pfn> = Vec::new();
        let mut index = start;
        let mut cache = inode.pages.lock();
        while index <= limit {
            let mut o = order.min(index.trailing_zeros());
            while o > 0 && index + (1 << o) - 1 > limit {
                o -= 1;
            }
            let nr = 1u64 << o;
            if cache.range(index..index + nr).next().is_some() {
                break; // filemap_add_folio's EEXIST
            }
            let Some(head) = self.cache_alloc_order(inode, &mut cache, index, o) else {
                break;
            };
            if async_size > 0 && (index..index + nr).contains(&mark) {
                mem.set(head, PageFlag::Readahead);
            }
            run.extend(head.range(nr));
            index += nr;
        }
        drop(cache);
        if !run.is_empty() {
            self.read_blocks(inode, start, &run);
        }
        self.c().add(Ev::Readahead, 1);
        if index <= limit {
            let done = index - start;
            self.do_page_cache_ra(inode, index, size - done, async_size.min(size - done));
        }
    }

    /// `page_cache_async_ra`: the reader reached the `PG_readahead` page `folio` at `index`.
    pub(crate) fn page_cache_async_ra(&self, inode: &Inode, index: u64, folio: Pfn, req: u64) {
        let mem = &self.m.phys.memmap;
        if mem.test(folio, PageFlag::Writeback) {
            return;
        }
        mem.clear(folio, PageFlag::Readahead);
        if self.ra_pages() == 0 {
            return;
        }
        let max = self.ra_max_pages(req);
        let nr = 1u64 << mem.order(folio);
        let mut ra = inode.ra.lock();
        let expected = (ra.start + ra.size - ra.async_size) & !(nr - 1);
        if index == expected {
            ra.start += ra.size;
            ra.size = ra.size.max(next_ra_size(ra.size, max));
        } else {
            let start = {
                let cache = inode.pages.lock();
                (index + 1..=index + max).find(|&i| !cache.contains(i))
            };
            let Some(start) = start else { return };
            ra.start = start;
            ra.size = next_ra_size(start - index + req, max);
        }
        // 6.17+: each asynchronous window asks for folios two orders larger, and ends on a
        // boundary of that size (or of the largest power of two dividing the window limit).
        ra.order += 2;
        let align = 1u64 << ra.order.min(max.trailing_zeros());
        let end = (ra.start + ra.size) & !(align - 1);
        if end > ra.start {
            ra.size = end - ra.start;
        }
        ra.async_size = ra.size;
        self.submit_window(inode, ra);
    }

    /// The readahead of a fault miss (`do_sync_mmap_readahead`, 6.18), first rule that applies:
    /// - `MADV_HUGEPAGE`: two PMD-sized folios from the PMD-aligned index (one with
    ///   `MADV_RANDOM`), the second marked;
    /// - `MADV_RANDOM`: nothing (the fault reads its page alone);
    /// - `MADV_SEQUENTIAL`: a synchronous window of the full size from the fault;
    /// - an executable mapping: `ra_pages` order-0 pages from the fault, clipped to the VMA,
    ///   unmarked (`exec_folio_order` is 0 on x86-64);
    /// - otherwise read-around: `ra_pages` order-0 pages centred on the fault, the last
    ///   quarter's first page marked.
    pub(crate) fn mmap_sync_readahead(&self, inode: &Inode, vma: &Vma, pgoff: u64) {
        let ra_pages = self.ra_pages();
        let pmd_pages = 1u64 << crate::phys::HPAGE_PMD_ORDER;
        let rand = vma.flags.has(VmFlags::RAND_READ);
        let mut ra = inode.ra.lock();
        if vma.flags.has(VmFlags::HUGEPAGE) {
            ra.start = pgoff & !(pmd_pages - 1);
            ra.size = if rand { pmd_pages } else { 2 * pmd_pages };
            ra.async_size = pmd_pages;
            ra.order = crate::phys::HPAGE_PMD_ORDER;
            self.submit_window(inode, ra);
            return;
        }
        if (rand && !vma.flags.has(VmFlags::EXEC)) || ra_pages == 0 {
            return;
        }
        if vma.flags.has(VmFlags::SEQ_READ) {
            drop(ra);
            self.page_cache_sync_ra(inode, pgoff, ra_pages);
            return;
        }
        if vma.flags.has(VmFlags::EXEC) {
            let vma_end = vma.pgoff + (vma.len() >> 12);
            ra.start = pgoff.max(vma.pgoff);
            ra.size = (ra.start + ra_pages).min(vma_end).saturating_sub(ra.start);
            ra.async_size = 0;
        } else {
            ra.start = pgoff.saturating_sub(ra_pages / 2);
            ra.size = ra_pages;
            ra.async_size = ra_pages / 4;
        }
        ra.order = 0;
        self.submit_window(inode, ra);
    }

    /// `force_page_cache_ra` for `MADV_WILLNEED` / `POSIX_FADV_WILLNEED`: at most the larger of
    /// the window and the device's I/O size, in 2 MiB chunks.
    fn force_page_cache_ra(&self, inode: &Inode, first: u64, nr: u64) {
        let t = self.m.tunables();
        let max = (t.max_sectors_kb / 4).max(t.read_ahead_kb / 4);
        drop(t);
        let mut left = nr.min(max);
        let mut idx = first;
        while left > 0 {
            let chunk = left.min(FORCE_RA_CHUNK);
            self.do_page_cache_ra(inode, idx, chunk, 0);
            idx += chunk;
            left -= chunk;
        }
    }

    /// Finds (or creates / reads) the page-cache page of `pgoff` for a fault, with a
    /// reference for the caller. SIGBUS past the end of file; `None` when out of memory.
    ///
    /// # Context
    /// mmap lock held for reading; no PTE lock.
    pub(crate) fn filemap_fault(
        &self,
        inode: &Inode,
        vma: &Vma,
        addr: VirtAddr,
        pgoff: u64,
    ) -> Result<(Pfn, CacheLookup), crate::fault::FaultOutcome> {
        if pgoff >= inode.size_pages() {
            self.c().add(Ev::FaultSigbus, 1);
            return Err(crate::fault::FaultOutcome::Sigbus);
        }
        let mem = &self.m.phys.memmap;
        let hit = |p: Pfn| {
            let head = mem.folio_of(p);
            crate::rmap::folio_ref_add(&self.m.phys, self.c(), head, 1);
            if !mem.test(head, PageFlag::Uptodate) {
                // A fallocated tmpfs page: cleared on first use.
                self.m.phys.arena.zero_frame(p);
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
            self.page_cache_async_ra(inode, pgoff, head, self.ra_pages());
            cache = inode.pages.lock();
            if let Some(p) = cache.get(pgoff) {
                return hit(p);
            }
        }
        // A miss allocates: reclaim first if memory is short (as the allocator would), and a
        // disk file reads ahead.
        let want = 1 << crate::phys::HPAGE_PMD_ORDER;
        if inode.kind == InodeKind::Disk || !self.enough_free(want) {
            drop(cache);
            self.reclaim_for(want);
            if inode.kind == InodeKind::Disk {
                self.mmap_sync_readahead(inode, vma, pgoff);
            }
            cache = inode.pages.lock();
        }
        let p = match cache.get(pgoff) {
            Some(p) => p,
            None if inode.kind.is_shmem() => {
                let order = self.shmem_fault_order(inode, vma, addr, pgoff, &cache);
                let first = pgoff & !((1u64 << order) - 1);
                let Some(head) = self.cache_alloc_order(inode, &mut cache, first, order) else {
                    return Err(crate::fault::FaultOutcome::Oom);
                };
                head.add(pgoff - first)
            }
            None => {
                let Some(p) = self.cache_alloc(inode, &mut cache, pgoff) else {
                    return Err(crate::fault::FaultOutcome::Oom);
                };
                if inode.kind == InodeKind::Disk {
                    drop(cache);
                    self.read_blocks(inode, pgoff, &[p]);
                    cache = inode.pages.lock();
                }
                p
            }
        };
        let head = self.m.phys.memmap.folio_of(p);
        crate::rmap::folio_ref_add(&self.m.phys, self.c(), head, 1);
        drop(cache);
        Ok((p, CacheLookup::Miss))
    }

    /// `folio_mark_accessed`: referenced on the first access, active (and no longer
    /// referenced) on the second. Activation goes through a per-CPU batch in Linux; its
    /// effect is applied at once here (flags are compared after the batches drain).
    pub(crate) fn folio_mark_accessed(&self, head: Pfn) {
        let mem = &self.m.phys.memmap;
        if !mem.test(head, PageFlag::Referenced) {
            mem.set(head, PageFlag::Referenced);
        } else if !mem.test(head, PageFlag::Unevictable) && !mem.test(head, PageFlag::Active) {
            self.lru_relist(head, |_| {
                mem.set(head, PageFlag::Active);
                mem.clear(head, PageFlag::Referenced);
            });
        }
    }

    /// `ftruncate(2)`.
    pub fn ftruncate(&self, f: FileId, size: u64) -> SysResult<()> {
        self.c().add(crate::stats::Ev::Syscall, 1);
        let inode = self.m.file(f)?;
        if size > i64::MAX as u64 {
            return Err(Errno::EINVAL);
        }
        if size > inode.max_bytes() {
            return Err(Errno::EFBIG);
        }
        let old = inode.size();
        inode.set_size(size);
        if size > old && inode.kind == InodeKind::Disk && !old.is_multiple_of(PAGE_SIZE) {
            self.block_truncate_page(&inode, old);
        }
        if size < old {
            // truncate_pagecache: unmap (COW copies too) from the first whole page past the
            // new end, drop those pages, zero the tail of a partial last page.
            self.split_partial_folios(&inode, size, u64::MAX);
            let hole = size.div_ceil(PAGE_SIZE);
            self.unmap_mapping_range(&inode, hole, u64::MAX, ZapDetails::All);
            // A large folio across the new end that could not be split (pinned) stays whole
            // in the cache, zeroed past the end (`truncate_inode_partial_folio` fails and
            // `shmem_undo_range`/`truncate_inode_pages_range` move past it; measured on 6.18:
            // fincore still counts the whole 2M folio, and a fault maps it again).
            let mem = &self.m.phys.memmap;
            let straddling = inode
                .pages
                .lock()
                .get(hole)
                .map(|p| mem.folio_of(p))
                .filter(|&head| mem.index(head) < hole);
            let kept_to = match straddling {
                Some(head) => {
                    let first = mem.index(head);
                    let end = first + (1u64 << mem.order(head));
                    for idx in hole..end {
                        self.m.phys.arena.zero_frame(head.add(idx - first));
                    }
                    end
                }
                None => hole,
            };
            self.release_cache(&inode, kept_to);
            self.zero_partial(&inode, size, PAGE_SIZE - size % PAGE_SIZE, false);
            inode.disk.lock().truncate(size);
        }
        Ok(())
    }

    /// `ext4_block_truncate_page` when a disk file grows from `old`: the rest of the old last
    /// page is zeroed through the cache (read in first if its block exists) and dirtied, so
    /// bytes stored past the old end through a mapping do not become file data.
    fn block_truncate_page(&self, inode: &Inode, old: u64) {
        let idx = old / PAGE_SIZE;
        let cached = inode.pages.lock().get(idx);
        let on_disk = inode.disk.lock().mapped(idx);
        let page = match cached {
            Some(p) => Some(p),
            None if on_disk => {
                let mut cache = inode.pages.lock();
                let p = self.cache_alloc(inode, &mut cache, idx);
                drop(cache);
                if let Some(p) = p {
                    self.read_blocks(inode, idx, &[p]);
                }
                p
            }
            None => None,
        };
        if let Some(p) = page {
            let tail = old % PAGE_SIZE;
            self.m
                .phys
                .arena
                .fill(p, tail as usize, (PAGE_SIZE - tail) as usize, 0);
            self.m.phys.memmap.set(p, PageFlag::Dirty);
            self.folio_mark_accessed(p);
        }
    }

    /// Zeroes `len` bytes from `pos` inside one cached page (a partial page of a truncate or a
    /// punched hole); `dirty` marks it dirty (ext4 zeroes through the page cache).
    fn zero_partial(&self, inode: &Inode, pos: u64, len: u64, dirty: bool) {
        let in_page = pos % PAGE_SIZE;
        if in_page == 0 && len >= PAGE_SIZE {
            return;
        }
        let len = len.min(PAGE_SIZE - in_page);
        if let Some(p) = inode.pages.lock().get(pos / PAGE_SIZE) {
            self.m.phys.arena.fill(p, in_page as usize, len as usize, 0);
            if dirty {
                self.m.phys.memmap.set(p, PageFlag::Dirty);
            }
        }
    }

    /// `truncate_inode_partial_folio` for the large folios that straddle an edge of the hole
    /// `[start, end)` (bytes): each is unmapped from every mapping, dirtied (shmem), and split
    /// non-uniformly (`try_folio_split`) at the page holding the hole's start and at the page
    /// holding its end, so the pages inside the hole become folios of their own that the
    /// caller drops, and the rest stay as the largest aligned folios around them. Measured on
    /// 6.18: punching [16K, 32K) of a 64K folio leaves orders 2 | hole | 0, 0, 1, 2.
    fn split_partial_folios(&self, inode: &Inode, start: u64, end: u64) {
        for edge in [start, end] {
            let idx = edge / PAGE_SIZE;
            let page = inode.pages.lock().get(idx);
            let Some(page) = page else { continue };
            let mem = &self.m.phys.memmap;
            let head = mem.folio_of(page);
            let order = mem.order(head);
            let (first, nr) = (mem.index(head), 1u64 << order);
            let (fs, fe) = (first * PAGE_SIZE, (first + nr) * PAGE_SIZE);
            let straddles = (fs < start && start < fe) || (fs < end && end < fe);
            if order == 0 || !straddles {
                continue;
            }
            self.unmap_mapping_range(inode, first, first + nr, ZapDetails::FilePagesOnly);
            self.lru_add_drain_all();
            if mem.refcount(head) != nr as i32 || mem.test(head, PageFlag::Mlocked) {
                continue; // held elsewhere: Linux's split fails too, the range is only zeroed
            }
            if inode.kind.is_shmem() {
                mem.set(head, PageFlag::Dirty);
            }
            let mut pieces = vec![(0u64, order)];
            for cut in [start, end] {
                let at = cut / PAGE_SIZE;
                if at < first || at >= first + nr {
                    continue;
                }
                pieces = split_pieces(&pieces, at - first);
            }
            self.m.phys.split_unmapped_folio(self.c(), head, &pieces);
        }
    }

    /// `split_folio` of a page-cache folio: unmapped from every mapping and split into order-0
    /// pages that stay in the cache (a split file folio is not remapped). Nothing happens when
    /// something else holds it.
    pub(crate) fn split_folio_to_order0(&self, inode: &Inode, head: Pfn) {
        let mem = &self.m.phys.memmap;
        let (first, order) = (mem.index(head), mem.order(head));
        let nr = 1u64 << order;
        let cached = inode.pages.lock().get(first);
        if order == 0 || cached != Some(head) {
            return; // gone or changed since it was chosen
        }
        self.unmap_mapping_range(inode, first, first + nr, ZapDetails::FilePagesOnly);
        self.lru_add_drain_all();
        if mem.refcount(head) != nr as i32 || mem.test(head, PageFlag::Mlocked) {
            return;
        }
        let pieces: Vec<(u64, u32)> = (0..nr).map(|i| (i, 0)).collect();
        self.m.phys.split_unmapped_folio(self.c(), head, &pieces);
    }

    /// Drops every cached page at index `from` or beyond (`truncate_inode_pages`).
    fn release_cache(&self, inode: &Inode, from: u64) {
        let gone: Vec<Pfn> = inode
            .pages
            .lock()
            .split_off(from)
            .iter()
            .map(|(_, p)| p)
            .collect();
        self.drop_cache_pages(gone);
    }

    /// Drops pages just taken out of a cache index (one reference each, on their folio).
    pub(crate) fn drop_cache_pages(&self, pages: Vec<Pfn>) {
        for p in pages {
            self.delete_from_page_cache(p);
        }
    }

    /// `filemap_remove_folio` + the cache's `folio_put` for a page already out of the index.
    pub(crate) fn delete_from_page_cache(&self, p: Pfn) {
        let mem = &self.m.phys.memmap;
        let head = mem.folio_of(p);
        if head == p {
            mem.clear(p, PageFlag::Dirty);
            mem.clear(p, PageFlag::Readahead);
        }
        self.c().add(Ev::PageCacheDelete, 1);
        self.m.phys.put_folio(self.c(), head, 1);
    }

    /// `fallocate(2)`: mode 0 allocates (tmpfs: zeroed, dirty, not yet uptodate pages; disk:
    /// unwritten extents, nothing cached) and may grow the file; `punch` frees the whole
    /// pages of the range (unmapping them from every mapping, keeping private COW copies) and
    /// zeroes the partial ones, keeping the size.
    pub fn fallocate(&self, f: FileId, offset: u64, len: u64, punch: bool) -> SysResult<()> {
        self.c().add(crate::stats::Ev::Syscall, 1);
        let inode = self.m.file(f)?;
        if offset > i64::MAX as u64 || len == 0 || len > i64::MAX as u64 {
            return Err(Errno::EINVAL);
        }
        let end = offset.checked_add(len).ok_or(Errno::EFBIG)?;
        if end > inode.max_bytes() {
            return Err(Errno::EFBIG);
        }
        if punch {
            self.punch_hole(&inode, offset, end);
            return Ok(());
        }
        if inode.kind.is_shmem() {
            let (first, last) = (offset / PAGE_SIZE, end.div_ceil(PAGE_SIZE));
            self.reclaim_for(last - first);
            let mut cache = inode.pages.lock();
            let mut added = Vec::new();
            let shmem_force = self.shmem_force();
            for idx in first..last {
                if cache.contains(idx) {
                    continue;
                }
                let order = self.shmem_nofault_order(&inode, idx, &cache, shmem_force);
                let aligned = idx & !((1u64 << order) - 1);
                match self.cache_alloc_order(&inode, &mut cache, aligned, order) {
                    Some(p) => {
                        self.m.phys.memmap.clear(p, PageFlag::Uptodate);
                        self.m.phys.memmap.set(p, PageFlag::Dirty);
                        added.extend(aligned..aligned + (1u64 << order));
                    }
                    None => {
                        // shmem_fallocate undoes what it allocated before failing.
                        let pages: Vec<Pfn> =
                            added.iter().filter_map(|&i| cache.remove(i)).collect();
                        drop(cache);
                        self.drop_cache_pages(pages);
                        return Err(Errno::ENOMEM);
                    }
                }
            }
        }
        if end > inode.size() {
            inode.set_size(end);
        }
        Ok(())
    }

    /// Punches the hole `offset..end` (`FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE`, also
    /// `MADV_REMOVE`): whole pages are unmapped from every mapping (private COW copies stay),
    /// dropped from the cache and their blocks freed; partial pages at the edges are zeroed
    /// (through the cache, dirtying them, on disk). Nothing past the end of file changes.
    pub(crate) fn punch_hole(&self, inode: &Inode, offset: u64, end: u64) {
        let size = inode.size();
        if offset >= size {
            return;
        }
        let end = end.min(size.next_multiple_of(PAGE_SIZE));
        self.split_partial_folios(inode, offset, end);
        let first_whole = offset.div_ceil(PAGE_SIZE);
        let last_whole = end / PAGE_SIZE;
        if last_whole == 0 {
            // A hole that ends inside the first page: `shmem_fallocate` and
            // `truncate_pagecache_range` compute the last byte to unmap as -1, which as an
            // unsigned compare passes and as a length wraps to "to the end of the file". So
            // every page from `first_whole` on is unmapped (not freed). Measured on 6.18:
            // punching 1K..3K of a mapped 128K tmpfs file leaves Rss at 4K.
            self.unmap_mapping_range(inode, first_whole, u64::MAX, ZapDetails::FilePagesOnly);
        }
        if last_whole > first_whole {
            self.unmap_mapping_range(inode, first_whole, last_whole, ZapDetails::FilePagesOnly);
            let gone: Vec<Pfn> = {
                let mut cache = inode.pages.lock();
                let gone: Vec<(u64, Pfn)> = cache.range(first_whole..last_whole).collect();
                gone.into_iter()
                    .filter_map(|(i, _)| cache.remove(i))
                    .collect()
            };
            self.drop_cache_pages(gone);
        }
        let disk = inode.kind == InodeKind::Disk;
        if offset / PAGE_SIZE == (end - 1) / PAGE_SIZE {
            self.zero_partial(inode, offset, end - offset, disk);
        } else {
            self.zero_partial(inode, offset, PAGE_SIZE - offset % PAGE_SIZE, disk);
            if !end.is_multiple_of(PAGE_SIZE) {
                self.zero_partial(inode, end - end % PAGE_SIZE, end % PAGE_SIZE, disk);
            }
        }
        if last_whole > first_whole {
            inode.disk.lock().punch(first_whole, last_whole);
        }
    }

    /// `unmap_mapping_range`: zaps the pages of file pages `first..last` from every VMA of
    /// every process that maps `inode` (`details` decides whether private COW copies go too).
    ///
    /// # Context
    /// Takes each mm's mmap lock for reading in turn (Linux walks `i_mmap` under its lock).
    pub(crate) fn unmap_mapping_range(
        &self,
        inode: &Inode,
        first: u64,
        last: u64,
        details: ZapDetails,
    ) {
        for task in self.m.tasks() {
            let mm = &task.mm;
            self.c().add(Ev::LockMmap, 1);
            let st = mm.lock.read_recursive();
            let mut tlb = MmuGather::new(self, mm, GatherScope::Range);
            for id in st.vmas.all() {
                let vma = st.vmas.get(id);
                let Some(range) = file_range_in(vma, inode, first, last) else {
                    continue;
                };
                self.zap_vma_range_details(&mut tlb, mm, vma, range.0, range.1, details);
            }
            tlb.finish();
        }
    }

    /// `fsync(2)`: writes back every dirty page of a disk file; tmpfs has nothing to do.
    pub fn fsync(&self, f: FileId) -> SysResult<()> {
        self.c().add(crate::stats::Ev::Syscall, 1);
        let inode = self.m.file(f)?;
        self.writeback_range(&inode, 0, u64::MAX);
        Ok(())
    }

    /// `write_cache_pages` over pages `first..last` of a disk file: each dirty page is cleaned
    /// in every mapping (`folio_clear_dirty_for_io` → `folio_mkclean`: write-protected and
    /// clean, so the next write faults and dirties it again), written to the device and left
    /// clean and mapped to disk. One write I/O per run of consecutive pages.
    fn writeback_range(&self, inode: &Inode, first: u64, last: u64) {
        if inode.kind != InodeKind::Disk {
            return;
        }
        let mem = &self.m.phys.memmap;
        let dirty: Vec<(u64, Pfn)> = inode
            .pages
            .lock()
            .range(first..last)
            .filter(|&(_, p)| mem.test(p, PageFlag::Dirty))
            .collect();
        if dirty.is_empty() {
            return;
        }
        for &(idx, _) in &dirty {
            self.folio_mkclean(inode, idx);
        }
        let mut buf = vec![0u8; PAGE_SIZE as usize];
        let size = inode.size();
        let mut disk = inode.disk.lock();
        let mut prev = None;
        for &(idx, p) in &dirty {
            mem.set(p, PageFlag::Writeback);
            mem.clear(p, PageFlag::Dirty);
            if idx == size / PAGE_SIZE && !size.is_multiple_of(PAGE_SIZE) {
                // ext4 zeroes the part of the page past i_size in the cache at every
                // writeback (`ext4_bio_write_folio`): stores there through a mapping vanish.
                let tail = size % PAGE_SIZE;
                self.m
                    .phys
                    .arena
                    .fill(p, tail as usize, (PAGE_SIZE - tail) as usize, 0);
            }
            self.m.phys.arena.read(p, 0, &mut buf);
            disk.write(idx, &buf);
            if prev.is_none_or(|q: u64| q + 1 != idx) {
                self.c().add(Ev::DiskWrites, 1);
            }
            prev = Some(idx);
            self.c().add(Ev::DiskWriteBytes, PAGE_SIZE);
            mem.set(p, PageFlag::MappedToDisk);
            mem.clear(p, PageFlag::Writeback);
        }
    }

    /// `folio_mkclean`: write-protects and cleans every shared mapping of file page `idx`,
    /// folding the PTE's dirty bit into the folio first (the caller then clears it for I/O).
    fn folio_mkclean(&self, inode: &Inode, idx: u64) {
        for task in self.m.tasks() {
            let mm = &task.mm;
            let st = mm.lock.read_recursive();
            for id in st.vmas.all() {
                let vma = st.vmas.get(id);
                if !vma.flags.has(VmFlags::SHARED) {
                    continue;
                }
                let Some((addr, _)) = file_range_in(vma, inode, idx, idx + 1) else {
                    continue;
                };
                self.mkclean_one(mm, addr);
            }
        }
    }

    fn mkclean_one(&self, mm: &Mm, addr: VirtAddr) {
        let pt = self.tables(mm);
        let arch = pt.arch;
        for step in pt.pmd_walk(addr, addr.add(PAGE_SIZE)) {
            let PmdKind::Table(table) = step.kind else {
                continue;
            };
            let mut ptes = PteLock::lock(pt, self.c(), table);
            let (i0, _) = step.pte_indexes();
            let e = ptes.get(i0);
            if e.is_none() || !arch.present(e) || !(arch.write(e) || arch.dirty(e)) {
                continue;
            }
            ptes.replace(i0, arch.mkclean(arch.wrprotect(e)));
            drop(ptes);
            self.flush_tlb(mm, FlushScope::Page(addr));
        }
    }

    /// `msync(2)`.
    pub fn msync(&self, pid: Pid, start: u64, len: u64, flags: &[MsyncFlags]) -> SysResult<()> {
        self.c().add(crate::stats::Ev::Syscall, 1);
        let task = self.m.task(pid)?;
        let sync = flags.contains(&MsyncFlags::Sync);
        let is_async = flags.contains(&MsyncFlags::Async);
        let invalidate = flags.contains(&MsyncFlags::Invalidate);
        if !start.is_multiple_of(PAGE_SIZE) || (sync && is_async) {
            return Err(Errno::EINVAL);
        }
        let len = super::page_align(len).ok_or(Errno::ENOMEM)?;
        let end = start.checked_add(len).ok_or(Errno::ENOMEM)?;
        if end == start {
            return Ok(());
        }
        let only_async = is_async && !invalidate;
        let mut unmapped = false;
        let mut start = start;
        let mut todo: Vec<(Arc<Inode>, u64, u64)> = Vec::new();
        {
            self.c().add(Ev::LockMmap, 1);
            let st = task.mm.lock.read();
            // Every way out of this loop but the last VMA reaching `end` is ENOMEM: a hole
            // at the end of the range too (`sys_msync` sets the error before each lookup).
            loop {
                let Some(id) = st.vmas.find_after(start) else {
                    return Err(Errno::ENOMEM);
                };
                let vma = st.vmas.get(id);
                if start < vma.start {
                    if only_async {
                        return Err(Errno::ENOMEM);
                    }
                    start = vma.start;
                    if start >= end {
                        return Err(Errno::ENOMEM);
                    }
                    unmapped = true;
                }
                if invalidate && vma.flags.has(VmFlags::LOCKED) {
                    return Err(Errno::EBUSY);
                }
                let fstart = vma.pgoff_at(VirtAddr::new(start));
                let fend = vma.pgoff_at(VirtAddr::new(end.min(vma.end) - 1)) + 1;
                if let (true, Some(file), true) = (sync, &vma.file, vma.flags.has(VmFlags::SHARED))
                {
                    todo.push((file.clone(), fstart, fend));
                }
                start = vma.end;
                if start >= end {
                    break;
                }
            }
        }
        for (inode, first, last) in todo {
            self.writeback_range(&inode, first, last);
        }
        if unmapped {
            Err(Errno::ENOMEM)
        } else {
            Ok(())
        }
    }

    /// Bytes of file range `offset..offset+len` in the page cache (`cachestat`/`mincore`).
    pub fn fincore(&self, f: FileId, offset: u64, len: u64) -> SysResult<u64> {
        self.c().add(crate::stats::Ev::Syscall, 1);
        let inode = self.m.file(f)?;
        let first = offset / PAGE_SIZE;
        let last = offset.saturating_add(len).div_ceil(PAGE_SIZE);
        if last <= first {
            return Ok(0);
        }
        let cached = inode.pages.lock().range(first..last).count() as u64;
        Ok(cached * PAGE_SIZE)
    }

    /// How many folios of each order (index: order) the file's page cache holds, as
    /// `/proc/kpageflags` of its cached pages would tell.
    pub fn file_folios_by_order(&self, f: FileId) -> SysResult<Vec<u64>> {
        let inode = self.m.file(f)?;
        let mem = &self.m.phys.memmap;
        let mut out = vec![0u64; crate::phys::HPAGE_PMD_ORDER as usize + 1];
        for (_, pfn) in inode.pages.lock().iter() {
            if mem.folio_of(pfn) == pfn {
                let order = mem.order(pfn) as usize;
                if let Some(n) = out.get_mut(order) {
                    *n += 1;
                }
            }
        }
        Ok(out)
    }

    /// `MADV_WILLNEED` on a file mapping: readahead of the range (disk files; tmpfs has
    /// nothing to read without swap).
    pub(crate) fn madvise_willneed_file(&self, vma: &Vma, start: VirtAddr, end: VirtAddr) {
        let Some(inode) = &vma.file else { return };
        if inode.kind != InodeKind::Disk {
            return;
        }
        let first = vma.pgoff_at(start);
        let last = vma.pgoff_at(end.sub(1));
        self.force_page_cache_ra(inode, first, last - first + 1);
    }

    /// `MADV_PAGEOUT` of a page-cache folio mapped only here (`shrink_folio_list`): unmapped
    /// first, then dropped from the cache when it is a clean disk page; a dirty one (only
    /// kswapd writes back file pages) or a shmem one (no swap) stays and is activated.
    pub(crate) fn pageout_file_folio(&self, mm: &Mm, vma: &Vma, addr: VirtAddr, head: Pfn) {
        let Some(inode) = &vma.file else { return };
        let mem = &self.m.phys.memmap;
        let nr = 1u64 << mem.order(head);
        let mut tlb = MmuGather::new(self, mm, GatherScope::Range);
        self.zap_vma_range_details(
            &mut tlb,
            mm,
            vma,
            addr,
            addr.add(nr * PAGE_SIZE),
            ZapDetails::FilePagesOnly,
        );
        tlb.finish();
        self.lru_add_drain();
        if inode.kind.is_shmem() || mem.test(head, PageFlag::Dirty) {
            // Without swap a shmem folio cannot be written out, and only kswapd writes
            // back dirty file folios: either way reclaim has already unmapped it and now
            // puts it back on the active list.
            self.lru_relist(head, |_| mem.set(head, PageFlag::Active));
            return;
        }
        // Only the page cache holds it now (one reference per page): drop it.
        let idx = mem.index(head);
        let removed: Vec<Pfn> = {
            let mut cache = inode.pages.lock();
            if cache.get(idx) == Some(head) && mem.refcount(head) == nr as i32 {
                (idx..idx + nr).filter_map(|i| cache.remove(i)).collect()
            } else {
                Vec::new()
            }
        };
        if !removed.is_empty() {
            self.c().add(Ev::PageCacheEvict, 1);
        }
        for p in removed {
            self.delete_from_page_cache(p);
        }
    }
}

/// The pieces after a non-uniform split of the piece of `pieces` holding page `at` (offsets
/// from the folio's head): halves away from `at` stay whole, down to `at` alone at order 0.
fn split_pieces(pieces: &[(u64, u32)], at: u64) -> Vec<(u64, u32)> {
    let mut out = Vec::new();
    for &(off, order) in pieces {
        if order == 0 || at < off || at >= off + (1 << order) {
            out.push((off, order));
            continue;
        }
        let (mut o, mut base) = (order, off);
        while o > 0 {
            let half = 1u64 << (o - 1);
            if at < base + half {
                out.push((base + half, o - 1));
            } else {
                out.push((base, o - 1));
                base += half;
            }
            o -= 1;
        }
        out.push((base, 0));
    }
    out.sort_unstable();
    out
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

/// `get_init_ra_size`: the first window for a read of `size` pages.
fn init_ra_size(size: u64, max: u64) -> u64 {
    let new = size.max(1).next_power_of_two();
    let new = if new <= max / 32 {
        new * 4
    } else if new <= max / 4 {
        new * 2
    } else {
        max
    };
    new.min(max)
}

/// `get_next_ra_size`: ramp up the window.
fn next_ra_size(cur: u64, max: u64) -> u64 {
    if cur < max / 16 {
        4 * cur
    } else if cur <= max / 2 {
        2 * cur
    } else {
        max
    }
}
