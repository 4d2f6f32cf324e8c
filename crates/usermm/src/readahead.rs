//! Readahead: the synchronous and asynchronous windows, forced readahead.
//!
//! Linux counterparts: `mm/readahead.c` (`page_cache_sync_ra`, `page_cache_async_ra`,
//! `force_page_cache_ra`, `page_cache_ra_unbounded`, `do_page_cache_ra`, `get_init_ra_size`,
//! `get_next_ra_size`), `mm/filemap.c` (`do_sync_mmap_readahead`, `do_async_mmap_readahead`)
//! and `mm/madvise.c`'s `MADV_WILLNEED` on files (`vfs_fadvise`). The per-file state is
//! [`RaState`].
//!
//! # `mmap_miss` (6.18)
//! A file's `ra->mmap_miss` counts the page faults that missed the page cache, net of the
//! hits, and read-around stops once it passes [`MMAP_LOTSAMISS`]:
//! - a fault that misses adds one ([`mmap_sync_readahead`]), unless the mapping asked for
//!   `MADV_HUGEPAGE` readahead, `MADV_SEQUENTIAL` or `MADV_RANDOM` (without `PROT_EXEC`), or
//!   the file has no readahead window: those return before the count. The count stops at
//!   ten times the limit. Past the limit, the fault reads its page alone;
//! - a fault whose page is in the cache takes one away ([`mmap_async_readahead`]), unless
//!   the mapping is `MADV_RANDOM`, the file has no window, or the attempt is the retry of a
//!   fault that dropped the mmap lock with `FAULT_FLAG_TRIED` (the retry of a major fault
//!   taken by the CPU; [`crate::vm_fault::FaultSource`]). 6.18 (commit "mm: readahead:
//!   improve mmap_miss heuristic for concurrent faults") skips a folio that is locked, i.e.
//!   under I/O or held by a concurrent fault; the engine's reads complete in the call that
//!   starts them, so its folios are never locked there;
//! - fault-around (`filemap_map_pages`) takes away one for every page of every folio it
//!   looks at, mapped now or already, that is not `PG_workingset` (6.18 since "mm/filemap:
//!   don't decrease mmap_miss when folio has workingset flag": a refaulted working set
//!   counts as misses), at most down to zero ([`mmap_miss_hits`]). A folio it skips (not
//!   uptodate, carrying the readahead mark, past the end of the file) does not count.
//!
//! Only read-around depends on the count: `MADV_HUGEPAGE`'s PMD readahead and
//! `MADV_SEQUENTIAL`'s windows run whatever it is (Roman Gushchin's "make thp readahead
//! conditional to mmap_miss logic" is not in 6.18).

use crate::filemap::cache::{cache_alloc, cache_alloc_order, read_blocks};
use crate::filemap::{Inode, InodeKind, RaState, PAGE_SIZE};
use crate::machine::Cpu;
use crate::phys::{PageFlag, Pfn};
use crate::stats::Ev;
use crate::vaddr::VirtAddr;
use crate::vma::{VmFlags, Vma};
use crate::vmscan::reclaim_for;

/// `MMAP_LOTSAMISS`: past this many more fault misses than hits on a file, a miss of a
/// mapping without `MADV_SEQUENTIAL` or `MADV_HUGEPAGE` reads its page alone.
pub(crate) const MMAP_LOTSAMISS: u16 = 100;

/// `do_async_mmap_readahead`: a fault (not a `FAULT_FLAG_TRIED` retry) found page `pgoff`
/// of `inode`, whose folio is `head`, in the cache. Unless the mapping is `MADV_RANDOM` or
/// the file has no window, the hit takes one from `mmap_miss`, and a folio carrying the
/// readahead mark starts the next asynchronous window. Returns whether it did (Linux drops
/// the mmap lock for that I/O, so the fault is retried).
pub(crate) fn mmap_async_readahead<'m>(
    cpu: &Cpu<'m>,
    inode: &Inode,
    vma: &Vma,
    pgoff: u64,
    head: Pfn,
) -> bool {
    if vma.flags.has(VmFlags::RAND_READ) || ra_pages(cpu) == 0 {
        return false;
    }
    {
        let mut ra = inode.ra.lock();
        ra.mmap_miss = ra.mmap_miss.saturating_sub(1);
    }
    if !cpu.m.phys.memmap.test(head, PageFlag::Readahead) {
        return false;
    }
    page_cache_async_ra(cpu, inode, pgoff, head, ra_pages(cpu));
    true
}

/// The end of `filemap_map_pages`: fault-around looked at `hits` pages that count as hits
/// (see the module docs); `mmap_miss` loses as many, down to zero.
///
/// # Context
/// No cache lock held (`ra` is taken before `pages`).
pub(crate) fn mmap_miss_hits(inode: &Inode, hits: u64) {
    if hits == 0 {
        return;
    }
    let mut ra = inode.ra.lock();
    ra.mmap_miss = ra
        .mmap_miss
        .saturating_sub(u16::try_from(hits).unwrap_or(u16::MAX));
}

/// `force_page_cache_ra` reads in chunks of 2 MiB.
const FORCE_RA_CHUNK: u64 = (2 << 20) / PAGE_SIZE;

/// `page_cache_ra_unbounded` (via `do_page_cache_ra`): reads the missing pages of
/// `start..start+nr` (clipped at the end of file), marking the page `lookahead` before the
/// end `PG_readahead`.
pub(crate) fn do_page_cache_ra<'m>(
    cpu: &Cpu<'m>,
    inode: &Inode,
    start: u64,
    nr: u64,
    lookahead: u64,
) {
    let size = inode.size();
    if size == 0 {
        return;
    }
    let end_index = (size - 1) / PAGE_SIZE;
    if start > end_index {
        return;
    }
    let nr = nr.min(end_index - start + 1);
    reclaim_for(cpu, nr);
    let mark = (lookahead > 0 && lookahead <= nr).then(|| start + nr - lookahead);
    let mut run: Vec<Pfn> = Vec::new();
    let mut run_start = start;
    let mut cache = inode.pages.lock();
    for idx in start..start + nr {
        if cache.contains(idx) {
            if !run.is_empty() {
                read_blocks(cpu, inode, run_start, &run);
                run.clear();
            }
            continue;
        }
        let Some(p) = cache_alloc(cpu, inode, &mut cache, idx) else {
            break;
        };
        if run.is_empty() {
            run_start = idx;
        }
        run.push(p);
        if Some(idx) == mark {
            cpu.m.phys.memmap.set(p, PageFlag::Readahead);
        }
    }
    drop(cache);
    if !run.is_empty() {
        read_blocks(cpu, inode, run_start, &run);
    }
    cpu.c().add(Ev::Readahead, 1);
}

pub(crate) fn ra_pages<'m>(cpu: &Cpu<'m>) -> u64 {
    cpu.m.tunables().read_ahead_kb / 4
}

/// `ractl_max_pages`: the window, or a larger request up to the device's I/O size.
pub(crate) fn ra_max_pages<'m>(cpu: &Cpu<'m>, req: u64) -> u64 {
    let t = cpu.m.tunables();
    let (ra, io) = (t.read_ahead_kb / 4, t.max_sectors_kb / 4);
    if req > ra && io > ra {
        req.min(io)
    } else {
        ra
    }
}

/// `page_cache_sync_ra`: a miss at `index` for a read of `req` pages.
pub(crate) fn page_cache_sync_ra<'m>(cpu: &Cpu<'m>, inode: &Inode, index: u64, req: u64) {
    if ra_pages(cpu) == 0 {
        do_page_cache_ra(cpu, inode, index, req, 0);
        return;
    }
    let max = ra_max_pages(cpu, req);
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
            do_page_cache_ra(cpu, inode, index, req, 0);
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
    submit_window(cpu, inode, ra);
}

/// `page_cache_ra_order`: reads the window `ra` now describes in folios of `ra.order`,
/// clamped to the largest page-cache order and to the window's size (the clamped order is
/// kept for the next window). From the window's start, each folio takes that order unless
/// its index is less aligned (then the alignment's order) or it would cross the window's
/// end or the end of file (then one order less, until it fits); `PG_readahead` goes on the
/// folio holding `start + size - async_size`. A page already cached stops the walk, and the
/// rest of the window is read in order-0 folios around what is cached (`do_page_cache_ra`).
pub(crate) fn submit_window<'m>(
    cpu: &Cpu<'m>,
    inode: &Inode,
    mut ra: parking_lot::MutexGuard<'_, RaState>,
) {
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
        do_page_cache_ra(cpu, inode, start, size, async_size);
        return;
    }
    let limit = ((isize - 1) / PAGE_SIZE).min(start + size - 1);
    if start > limit {
        return;
    }
    reclaim_for(cpu, limit + 1 - start);
    let mark = start + size - async_size;
    let mem = &cpu.m.phys.memmap;
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
        let Some(head) = cache_alloc_order(cpu, inode, &mut cache, index, o) else {
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
        read_blocks(cpu, inode, start, &run);
    }
    cpu.c().add(Ev::Readahead, 1);
    if index <= limit {
        let done = index - start;
        do_page_cache_ra(cpu, inode, index, size - done, async_size.min(size - done));
    }
}

/// `page_cache_async_ra`: the reader reached the `PG_readahead` page `folio` at `index`.
pub(crate) fn page_cache_async_ra<'m>(
    cpu: &Cpu<'m>,
    inode: &Inode,
    index: u64,
    folio: Pfn,
    req: u64,
) {
    let mem = &cpu.m.phys.memmap;
    if mem.test(folio, PageFlag::Writeback) {
        return;
    }
    mem.clear(folio, PageFlag::Readahead);
    if ra_pages(cpu) == 0 {
        return;
    }
    let max = ra_max_pages(cpu, req);
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
    submit_window(cpu, inode, ra);
}

/// The readahead of a fault miss (`do_sync_mmap_readahead`, 6.18), first rule that applies:
/// - `MADV_HUGEPAGE`: two PMD-sized folios from the PMD-aligned index (one with
///   `MADV_RANDOM`), the second marked;
/// - `MADV_RANDOM`: nothing (the fault reads its page alone);
/// - `MADV_SEQUENTIAL`: a synchronous window of the full size from the fault;
/// - otherwise the miss counts in [`RaState::mmap_miss`] (up to 10 × [`MMAP_LOTSAMISS`]),
///   and past [`MMAP_LOTSAMISS`] nothing is read ahead: the fault reads its page alone;
/// - an executable mapping: `ra_pages` order-0 pages from the fault, clipped to the VMA,
///   unmarked (`exec_folio_order` is 0 on x86-64);
/// - otherwise read-around: `ra_pages` order-0 pages centred on the fault, the last
///   quarter's first page marked.
pub(crate) fn mmap_sync_readahead<'m>(cpu: &Cpu<'m>, inode: &Inode, vma: &Vma, pgoff: u64) {
    let ra_pages = ra_pages(cpu);
    let pmd_pages = 1u64 << crate::phys::HPAGE_PMD_ORDER;
    let rand = vma.flags.has(VmFlags::RAND_READ);
    let mut ra = inode.ra.lock();
    if vma.flags.has(VmFlags::HUGEPAGE) {
        ra.start = pgoff & !(pmd_pages - 1);
        ra.size = if rand { pmd_pages } else { 2 * pmd_pages };
        ra.async_size = pmd_pages;
        ra.order = crate::phys::HPAGE_PMD_ORDER;
        submit_window(cpu, inode, ra);
        return;
    }
    if (rand && !vma.flags.has(VmFlags::EXEC)) || ra_pages == 0 {
        return;
    }
    if vma.flags.has(VmFlags::SEQ_READ) {
        drop(ra);
        page_cache_sync_ra(cpu, inode, pgoff, ra_pages);
        return;
    }
    // Measured on 6.18 (files-disk-mmap-miss.scn): once more than 100 cold misses than
    // hits were counted on a file, a cold read fault reads and maps its page alone.
    if ra.mmap_miss < MMAP_LOTSAMISS * 10 {
        ra.mmap_miss += 1;
    }
    if ra.mmap_miss > MMAP_LOTSAMISS {
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
    submit_window(cpu, inode, ra);
}

/// `force_page_cache_ra` for `MADV_WILLNEED` / `POSIX_FADV_WILLNEED`: at most the larger of
/// the window and the device's I/O size, in 2 MiB chunks.
pub(crate) fn force_page_cache_ra<'m>(cpu: &Cpu<'m>, inode: &Inode, first: u64, nr: u64) {
    let t = cpu.m.tunables();
    let max = (t.max_sectors_kb / 4).max(t.read_ahead_kb / 4);
    drop(t);
    let mut left = nr.min(max);
    let mut idx = first;
    while left > 0 {
        let chunk = left.min(FORCE_RA_CHUNK);
        do_page_cache_ra(cpu, inode, idx, chunk, 0);
        idx += chunk;
        left -= chunk;
    }
}

/// `MADV_WILLNEED` on a file mapping: readahead of the range (disk files; tmpfs has
/// nothing to read without swap).
pub(crate) fn madvise_willneed_file<'m>(cpu: &Cpu<'m>, vma: &Vma, start: VirtAddr, end: VirtAddr) {
    let Some(inode) = &vma.file else { return };
    if inode.kind != InodeKind::Disk {
        return;
    }
    let first = vma.pgoff_at(start);
    let last = vma.pgoff_at(end.sub(1));
    force_page_cache_ra(cpu, inode, first, last - first + 1);
}

/// `get_init_ra_size`: the first window for a read of `size` pages.
pub(crate) fn init_ra_size(size: u64, max: u64) -> u64 {
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
pub(crate) fn next_ra_size(cur: u64, max: u64) -> u64 {
    if cur < max / 16 {
        4 * cur
    } else if cur <= max / 2 {
        2 * cur
    } else {
        max
    }
}
