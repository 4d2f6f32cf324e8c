//! The file system calls: creating a file, `pread`/`pwrite` through the page cache,
//! `ftruncate`, `fallocate`, `fsync`, `msync`, `fincore`.
//!
//! Linux counterparts: `fs/read_write.c` (`ksys_pread64`, `ksys_pwrite64`,
//! `rw_verify_area`), `fs/open.c` (`do_truncate`, `vfs_fallocate`), `fs/sync.c` (`vfs_fsync`),
//! `mm/msync.c`, `mm/mincore.c` (`fincore` reads the same state). Below them, in the files of
//! Linux's map: [`crate::filemap::io`] (`filemap_read`, `generic_perform_write`),
//! [`crate::readahead`], [`crate::truncate`] (`truncate_pagecache`, `shmem_undo_range`,
//! hole punching), [`crate::page_writeback`] (`write_cache_pages`, `folio_mkclean`).
//!
//! The state lives in [`crate::filemap`]; see there for what is deliberately simpler than
//! Linux (order-0 cache folios, synchronous writeback). Every entry point takes the
//! machine's [`FileId`]: the scenario's files are opened read-write by every process, and the
//! open file (with its readahead state) is shared, as one descriptor passed around would be.

use crate::errno::{Errno, SysResult};
use crate::filemap::cache::cache_alloc_order;
use crate::filemap::io::{filemap_read, write_iter};
use crate::filemap::{Inode, InodeKind, PAGE_SIZE};
use crate::machine::{Cpu, FileId};
use crate::mm::Pid;
use crate::page_writeback::writeback_range;
use crate::phys::{PageFlag, Pfn};
use crate::shmem::{shmem_force, shmem_nofault_order, shmem_read};
use crate::stats::Ev;
use crate::truncate::{
    block_truncate_page, drop_cache_pages, punch_hole, release_cache, split_partial_folios,
    unmap_mapping_range, zero_partial,
};
use crate::vaddr::VirtAddr;
use crate::vma::VmFlags;
use crate::vmscan::reclaim_for;
use crate::zap::ZapDetails;
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
                if let Err(e) = write_iter(self, &inode, off, n, b) {
                    release_cache(self, &inode, 0);
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
        write_iter(self, &inode, offset, len, byte)
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
            InodeKind::Disk => filemap_read(self, &inode, offset, end, out),
            _ => shmem_read(self, &inode, offset, end, out),
        }
        self.c().add(Ev::FileReadBytes, out.len() as u64);
        Ok(out.len())
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
            block_truncate_page(self, &inode, old);
        }
        if size < old {
            // truncate_pagecache: unmap (COW copies too) from the first whole page past the
            // new end, drop those pages, zero the tail of a partial last page.
            split_partial_folios(self, &inode, size, u64::MAX);
            let hole = size.div_ceil(PAGE_SIZE);
            unmap_mapping_range(self, &inode, hole, u64::MAX, ZapDetails::All);
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
            release_cache(self, &inode, kept_to);
            zero_partial(self, &inode, size, PAGE_SIZE - size % PAGE_SIZE, false);
            inode.disk.lock().truncate(size);
        }
        Ok(())
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
            punch_hole(self, &inode, offset, end);
            return Ok(());
        }
        if inode.kind.is_shmem() {
            let (first, last) = (offset / PAGE_SIZE, end.div_ceil(PAGE_SIZE));
            reclaim_for(self, last - first);
            let mut cache = inode.pages.lock();
            let mut added = Vec::new();
            let shmem_force = shmem_force(self);
            for idx in first..last {
                if cache.contains(idx) {
                    continue;
                }
                let order = shmem_nofault_order(&inode, idx, &cache, shmem_force);
                let aligned = idx & !((1u64 << order) - 1);
                match cache_alloc_order(self, &inode, &mut cache, aligned, order) {
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
                        drop_cache_pages(self, pages);
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

    /// `fsync(2)`: writes back every dirty page of a disk file; tmpfs has nothing to do.
    pub fn fsync(&self, f: FileId) -> SysResult<()> {
        self.c().add(crate::stats::Ev::Syscall, 1);
        let inode = self.m.file(f)?;
        writeback_range(self, &inode, 0, u64::MAX);
        Ok(())
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
            writeback_range(self, &inode, first, last);
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

    /// Puts a folio of `order` at page `index` of disk file `f` into the page cache: read,
    /// uptodate, on the LRU, marked `PG_readahead` when `readahead`. This is the page cache
    /// a program finds when it starts, not work it does: `usermm replay` seeds each file
    /// with the folios the host had cached when the recording first saw the file mapped,
    /// because a warm cache makes fault-around map more and readahead read less than a
    /// cold one. No system call is counted.
    ///
    /// Returns the pages it added: none where a page of the folio is cached already or the
    /// folio starts past the end of the file, and a folio crossing the end is added as
    /// order-0 pages up to it (Linux's readahead never makes a folio cross it). `EBADF`
    /// without the file, `EINVAL` for a file that is not on disk, an order above the PMD's
    /// or an index not aligned to the order, `ENOMEM` when no frame is free after reclaim.
    pub fn page_cache_seed(
        &self,
        f: FileId,
        index: u64,
        order: u32,
        readahead: bool,
    ) -> SysResult<u64> {
        let inode = self.m.file(f)?;
        if inode.kind != InodeKind::Disk
            || order > crate::phys::HPAGE_PMD_ORDER
            || !index.is_multiple_of(1 << order)
        {
            return Err(Errno::EINVAL);
        }
        let pages = inode.size_pages();
        if index >= pages {
            return Ok(0);
        }
        let (order, nr) = if index + (1 << order) > pages {
            (0, pages - index)
        } else {
            (order, 1)
        };
        let len = nr << order;
        reclaim_for(self, len);
        let mut cache = inode.pages.lock();
        if cache.range(index..index + len).next().is_some() {
            return Ok(0);
        }
        let mut heads = Vec::new();
        for i in 0..nr {
            let Some(p) = cache_alloc_order(self, &inode, &mut cache, index + i, order) else {
                break;
            };
            heads.push(p);
        }
        drop(cache);
        let frames: Vec<Pfn> = heads.iter().flat_map(|h| h.range(1 << order)).collect();
        crate::filemap::cache::read_blocks(self, &inode, index, &frames);
        if heads.len() as u64 != nr {
            return Err(Errno::ENOMEM);
        }
        if readahead {
            self.m.phys.memmap.set(heads[0], PageFlag::Readahead);
        }
        Ok(len)
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
}
