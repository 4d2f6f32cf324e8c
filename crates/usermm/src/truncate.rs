//! Truncation and hole punching: taking pages out of the page cache and out of the mappings.
//!
//! Linux counterparts: `mm/truncate.c` (`truncate_inode_pages_range`,
//! `truncate_inode_partial_folio`, `truncate_pagecache`, `truncate_pagecache_range`),
//! `mm/shmem.c` (`shmem_undo_range`, `shmem_fallocate`'s punch), `mm/memory.c`
//! (`unmap_mapping_range`), `fs/buffer.c` (`block_truncate_page`) and `mm/huge_memory.c`'s
//! non-uniform split of a cache folio (`split_folio_to_order`).

use crate::filemap::cache::{
    cache_alloc, delete_from_page_cache, file_range_in, folio_mark_accessed, read_blocks,
};
use crate::filemap::{Inode, InodeKind, PAGE_SIZE};
use crate::machine::Cpu;
use crate::phys::{PageFlag, Pfn};
use crate::stats::Ev;
use crate::zap::{zap_vma_range_details, GatherScope, MmuGather, ZapDetails};

/// `ext4_block_truncate_page` when a disk file grows from `old`: the rest of the old last
/// page is zeroed through the cache (read in first if its block exists) and dirtied, so
/// bytes stored past the old end through a mapping do not become file data.
pub(crate) fn block_truncate_page<'m>(cpu: &Cpu<'m>, inode: &Inode, old: u64) {
    let idx = old / PAGE_SIZE;
    let cached = inode.pages.lock().get(idx);
    let on_disk = inode.disk.lock().mapped(idx);
    let page = match cached {
        Some(p) => Some(p),
        None if on_disk => {
            let mut cache = inode.pages.lock();
            let p = cache_alloc(cpu, inode, &mut cache, idx);
            drop(cache);
            if let Some(p) = p {
                read_blocks(cpu, inode, idx, &[p]);
            }
            p
        }
        None => None,
    };
    if let Some(p) = page {
        let tail = old % PAGE_SIZE;
        cpu.m
            .phys
            .arena
            .fill(p, tail as usize, (PAGE_SIZE - tail) as usize, 0);
        cpu.m.phys.memmap.set(p, PageFlag::Dirty);
        folio_mark_accessed(cpu, p);
    }
}

/// Zeroes `len` bytes from `pos` inside one cached page (a partial page of a truncate or a
/// punched hole); `dirty` marks it dirty (ext4 zeroes through the page cache).
pub(crate) fn zero_partial<'m>(cpu: &Cpu<'m>, inode: &Inode, pos: u64, len: u64, dirty: bool) {
    let in_page = pos % PAGE_SIZE;
    if in_page == 0 && len >= PAGE_SIZE {
        return;
    }
    let len = len.min(PAGE_SIZE - in_page);
    if let Some(p) = inode.pages.lock().get(pos / PAGE_SIZE) {
        cpu.m.phys.arena.fill(p, in_page as usize, len as usize, 0);
        if dirty {
            cpu.m.phys.memmap.set(p, PageFlag::Dirty);
        }
    }
}

/// `truncate_inode_partial_folio` for the large folios that straddle an edge of the hole
/// `[start, end)` (bytes): each is unmapped from every mapping, dirtied (shmem), and split
/// non-uniformly (`try_folio_split`) at the page holding the hole's start and at the page
/// holding its end, so the pages inside the hole become folios of their own that the
/// caller drops, and the rest stay as the largest aligned folios around them. Measured on
/// 6.18: punching [16K, 32K) of a 64K folio leaves orders 2 | hole | 0, 0, 1, 2.
pub(crate) fn split_partial_folios<'m>(cpu: &Cpu<'m>, inode: &Inode, start: u64, end: u64) {
    for edge in [start, end] {
        let idx = edge / PAGE_SIZE;
        let page = inode.pages.lock().get(idx);
        let Some(page) = page else { continue };
        let mem = &cpu.m.phys.memmap;
        let head = mem.folio_of(page);
        let order = mem.order(head);
        let (first, nr) = (mem.index(head), 1u64 << order);
        let (fs, fe) = (first * PAGE_SIZE, (first + nr) * PAGE_SIZE);
        let straddles = (fs < start && start < fe) || (fs < end && end < fe);
        if order == 0 || !straddles {
            continue;
        }
        unmap_mapping_range(cpu, inode, first, first + nr, ZapDetails::FilePagesOnly);
        cpu.lru_add_drain_all();
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
        cpu.m.phys.split_unmapped_folio(cpu.c(), head, &pieces);
    }
}

/// `split_folio` of a page-cache folio: unmapped from every mapping and split into order-0
/// pages that stay in the cache (a split file folio is not remapped). Nothing happens when
/// something else holds it.
pub(crate) fn split_folio_to_order0<'m>(cpu: &Cpu<'m>, inode: &Inode, head: Pfn) {
    let mem = &cpu.m.phys.memmap;
    let (first, order) = (mem.index(head), mem.order(head));
    let nr = 1u64 << order;
    let cached = inode.pages.lock().get(first);
    if order == 0 || cached != Some(head) {
        return; // gone or changed since it was chosen
    }
    unmap_mapping_range(cpu, inode, first, first + nr, ZapDetails::FilePagesOnly);
    cpu.lru_add_drain_all();
    if mem.refcount(head) != nr as i32 || mem.test(head, PageFlag::Mlocked) {
        return;
    }
    let pieces: Vec<(u64, u32)> = (0..nr).map(|i| (i, 0)).collect();
    cpu.m.phys.split_unmapped_folio(cpu.c(), head, &pieces);
}

/// Drops every cached page at index `from` or beyond (`truncate_inode_pages`).
pub(crate) fn release_cache<'m>(cpu: &Cpu<'m>, inode: &Inode, from: u64) {
    crate::workingset::clear_shadows(inode, from, u64::MAX);
    crate::swap_state::shmem_free_swap(cpu, inode, from, u64::MAX);
    let gone: Vec<Pfn> = inode
        .pages
        .lock()
        .split_off(from)
        .iter()
        .map(|(_, p)| p)
        .collect();
    drop_cache_pages(cpu, gone);
}

/// Drops pages just taken out of a cache index (one reference each, on their folio).
pub(crate) fn drop_cache_pages<'m>(cpu: &Cpu<'m>, pages: Vec<Pfn>) {
    for p in pages {
        delete_from_page_cache(cpu, p);
    }
}

/// Punches the hole `offset..end` (`FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE`, also
/// `MADV_REMOVE`): whole pages are unmapped from every mapping (private COW copies stay),
/// dropped from the cache and their blocks freed; partial pages at the edges are zeroed
/// (through the cache, dirtying them, on disk). Nothing past the end of file changes.
pub(crate) fn punch_hole<'m>(cpu: &Cpu<'m>, inode: &Inode, offset: u64, end: u64) {
    crate::workingset::clear_shadows(inode, offset.div_ceil(PAGE_SIZE), end / PAGE_SIZE);
    crate::swap_state::shmem_free_swap(cpu, inode, offset.div_ceil(PAGE_SIZE), end / PAGE_SIZE);
    let size = inode.size();
    if offset >= size {
        return;
    }
    let end = end.min(size.next_multiple_of(PAGE_SIZE));
    split_partial_folios(cpu, inode, offset, end);
    let first_whole = offset.div_ceil(PAGE_SIZE);
    let last_whole = end / PAGE_SIZE;
    if last_whole == 0 {
        // A hole that ends inside the first page: `shmem_fallocate` and
        // `truncate_pagecache_range` compute the last byte to unmap as -1, which as an
        // unsigned compare passes and as a length wraps to "to the end of the file". So
        // every page from `first_whole` on is unmapped (not freed). Measured on 6.18:
        // punching 1K..3K of a mapped 128K tmpfs file leaves Rss at 4K.
        unmap_mapping_range(cpu, inode, first_whole, u64::MAX, ZapDetails::FilePagesOnly);
    }
    if last_whole > first_whole {
        unmap_mapping_range(
            cpu,
            inode,
            first_whole,
            last_whole,
            ZapDetails::FilePagesOnly,
        );
        let gone: Vec<Pfn> = {
            let mut cache = inode.pages.lock();
            let gone: Vec<(u64, Pfn)> = cache.range(first_whole..last_whole).collect();
            gone.into_iter()
                .filter_map(|(i, _)| cache.remove(i))
                .collect()
        };
        drop_cache_pages(cpu, gone);
    }
    let disk = inode.kind == InodeKind::Disk;
    if offset / PAGE_SIZE == (end - 1) / PAGE_SIZE {
        zero_partial(cpu, inode, offset, end - offset, disk);
    } else {
        zero_partial(cpu, inode, offset, PAGE_SIZE - offset % PAGE_SIZE, disk);
        if !end.is_multiple_of(PAGE_SIZE) {
            zero_partial(cpu, inode, end - end % PAGE_SIZE, end % PAGE_SIZE, disk);
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
pub(crate) fn unmap_mapping_range<'m>(
    cpu: &Cpu<'m>,
    inode: &Inode,
    first: u64,
    last: u64,
    details: ZapDetails,
) {
    for task in cpu.m.tasks() {
        let mm = &task.mm;
        cpu.c().add(Ev::LockMmap, 1);
        let st = mm.lock.read_recursive();
        let mut tlb = MmuGather::new(cpu, mm, GatherScope::Range);
        for id in st.vmas.all() {
            let vma = st.vmas.get(id);
            let Some(range) = file_range_in(vma, inode, first, last) else {
                continue;
            };
            zap_vma_range_details(cpu, &mut tlb, mm, vma, range.0, range.1, details);
        }
        tlb.finish();
    }
}

/// The pieces after a non-uniform split of the piece of `pieces` holding page `at` (offsets
/// from the folio's head): halves away from `at` stay whole, down to `at` alone at order 0.
pub(crate) fn split_pieces(pieces: &[(u64, u32)], at: u64) -> Vec<(u64, u32)> {
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
