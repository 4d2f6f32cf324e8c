//! The swap cache seen from folios: adding a folio to swap, taking it out, reading a slot in.
//!
//! Linux counterparts: `mm/swap_state.c` (`folio_alloc_swap` + the swap-cache insertion that
//! `add_to_swap` made, `__read_swap_cache_async`, `swap_vma_readahead`,
//! `free_swap_cache`) and the folio side of `mm/swapfile.c` (`folio_free_swap`,
//! `free_swap_and_cache_nr`). The slot counts and the bytes are [`crate::swapfile`]'s.
//!
//! A folio in the swap cache has `PG_swapcache`, its first slot in `folio->swap`, and one
//! reference per page held by the cache. It is dirty while its memory is newer than its
//! slots (reclaim writes it, `folio_free_swap` dirties it since the slots are given up).
//!
//! Deliberate difference: swap readahead reads the aligned window of `2^page-cluster`
//! slots around the faulting PTE that are named by the neighbouring PTEs of the same table
//! (`swap_vma_readahead`'s window, at its largest: Linux shrinks it when readahead pages
//! go unused, which the engine does not track).

use crate::filemap::Inode;
use crate::machine::Cpu;
use crate::mlock::folio_add_lru;
use crate::phys::{FolioKind, PageFlag, Pfn, SwpEntry, Zeroing};
use crate::stats::Ev;
use crate::swapfile::SwapInfo;

/// `vm.page-cluster` (3: eight pages), the size of the swap readahead window.
pub(crate) const PAGE_CLUSTER: u32 = 3;

/// `add_to_swap`: gives the anonymous folio `head` slots, one per page, and enters it in
/// the swap cache (dirty: its data is not on the device yet). False when the machine has no
/// swap or no free run of slots the folio's size (on a rotational device a large folio gets
/// none unless `whole`: see [`crate::swapfile`]).
pub(crate) fn add_to_swap<'m>(cpu: &Cpu<'m>, head: Pfn, whole: bool) -> bool {
    let Some(swap) = cpu.m.swap.as_ref() else {
        return false;
    };
    let folio = cpu.m.phys.memmap.folio(head);
    let nr = folio.nr_pages();
    let entry = if whole {
        swap.alloc_run(folio.order())
    } else {
        swap.alloc(folio.order())
    };
    let Some(entry) = entry else {
        return false;
    };
    swap.cache_add(entry, head, nr);
    crate::rmap::folio_ref_add(cpu.c(), cpu.m.phys.memmap.folio(head), nr as i32);
    cpu.m.phys.memmap.set_swap_entry(head, entry);
    folio.set(PageFlag::SwapCache);
    folio.set(PageFlag::Dirty);
    true
}

/// Takes the folio out of the swap cache (`swap_cache_del_folio` + `put_swap_folio`): the
/// slots no swap PTE names are freed; the cache's references are dropped (which may free
/// the folio, when nothing else holds it).
pub(crate) fn delete_from_swap_cache<'m>(cpu: &Cpu<'m>, head: Pfn) {
    let (phys, c) = (&cpu.m.phys, cpu.c());
    let folio = cpu.m.phys.memmap.folio(head);
    let nr = folio.nr_pages();
    let entry = phys.memmap.swap_entry(head);
    if let Some(swap) = cpu.m.swap.as_ref() {
        swap.cache_del(entry, nr);
    }
    folio.clear(PageFlag::SwapCache);
    phys.memmap.set_swap_entry(head, SwpEntry::new(0));
    phys.put_folio(c, head, nr as i32);
}

/// `folio_free_swap`: gives up the slots of a folio in the swap cache when no swap PTE
/// names any of them any more; its memory is then the only copy, so it becomes dirty.
/// Returns whether it did.
pub(crate) fn folio_free_swap<'m>(cpu: &Cpu<'m>, head: Pfn) -> bool {
    let folio = cpu.m.phys.memmap.folio(head);
    if !folio.test(PageFlag::SwapCache) || folio.test(PageFlag::Writeback) {
        return false;
    }
    let Some(swap) = cpu.m.swap.as_ref() else {
        return false;
    };
    if swap.any_swapped(cpu.m.phys.memmap.swap_entry(head), folio.nr_pages()) {
        return false;
    }
    folio.set(PageFlag::Dirty);
    delete_from_swap_cache(cpu, head);
    true
}

/// `free_swap_and_cache_nr`: `nr` swap PTEs from `entry` on were removed (zap, MADV_FREE);
/// a page in the swap cache that nothing maps and no PTE names any more is dropped from it.
pub(crate) fn free_swap_and_cache<'m>(cpu: &Cpu<'m>, swap: &SwapInfo, entry: SwpEntry, nr: u64) {
    swap.free_nr(entry, nr);
    cpu.c().add(Ev::SwapEntriesFreed, nr);
    let mem = &cpu.m.phys.memmap;
    let mut last = None;
    for i in 0..nr {
        let Some(page) = swap.cache_lookup(entry.add(i)) else {
            continue;
        };
        let head = mem.folio_of(page);
        if last == Some(head) {
            continue;
        }
        last = Some(head);
        // `__try_to_reclaim_swap(TTRS_UNMAPPED | TTRS_FULL)`: only a folio nobody maps.
        free_swap_cache(cpu, head);
    }
}

/// `free_swap_cache` of a folio whose last mapping a zap removed: a swap-cache folio
/// nothing maps gives its slots up (when no swap PTE names them), so it can be freed.
pub(crate) fn free_swap_cache<'m>(cpu: &Cpu<'m>, head: Pfn) {
    let mem = &cpu.m.phys.memmap;
    if mem.test(head, PageFlag::SwapCache)
        && mem.folio_mapcount(head) == 0
        && mem.entire_mapcount(head) == 0
    {
        folio_free_swap(cpu, head);
    }
}

/// `__read_swap_cache_async`: the page holding `entry`'s data, read into a new order-0
/// folio of the swap cache (on the LRU) when it is not cached, with a reference for the
/// caller; `None` when no memory is left or the slot went away (freed by a racing zap).
/// The bool says whether it came from the cache (a minor fault). The caller reclaims first
/// if memory is short.
pub(crate) fn read_swap_cache<'m>(
    cpu: &Cpu<'m>,
    swap: &SwapInfo,
    entry: SwpEntry,
    node: usize,
) -> Option<(Pfn, bool)> {
    let (phys, c) = (&cpu.m.phys, cpu.c());
    if let Some(page) = swap.cache_lookup(entry) {
        crate::rmap::folio_ref_add(c, phys.memmap.page_folio(page), 1);
        return Some((page, true));
    }
    let new = phys.alloc_folio(c, 0, node, FolioKind::Anon, Zeroing::NoZero)?;
    if !swap.claim_cache(entry) {
        phys.put_folio(c, new, 1);
        // Cached meanwhile by someone else, or freed.
        let page = swap.cache_lookup(entry)?;
        crate::rmap::folio_ref_add(c, phys.memmap.page_folio(page), 1);
        return Some((page, true));
    }
    swap.read(entry, phys, new);
    c.add(Ev::PswpIn, 1);
    let mem = &phys.memmap;
    // A page read from swap is anonymous and swap-backed, but not yet any VMA's: its
    // mapping and index are set when a fault maps it (`folio_add_new_anon_rmap`).
    mem.set_swap_entry(new, entry);
    mem.set(new, PageFlag::SwapCache);
    swap.cache_add(entry, new, 1);
    // The cache's reference, then the caller's.
    crate::rmap::folio_ref_add(c, phys.memmap.folio(new), 1);
    folio_add_lru(cpu, cpu.m.phys.memmap.folio(new));
    Some((new, false))
}

/// `swap_vma_readahead`'s extra reads: the slots named by the swap PTEs `neighbours` (the
/// rest of the window around a swap fault) are read into the swap cache, unmapped. The
/// caller checked that memory for them is free: readahead never reclaims.
pub(crate) fn swap_readahead<'m>(
    cpu: &Cpu<'m>,
    swap: &SwapInfo,
    neighbours: &[SwpEntry],
    node: usize,
) {
    let (phys, c) = (&cpu.m.phys, cpu.c());
    for &e in neighbours {
        if swap.cache_lookup(e).is_some() || swap.swapcount(e) == 0 {
            continue;
        }
        if let Some((page, false)) = read_swap_cache(cpu, swap, e, node) {
            c.add(Ev::SwapRa, 1);
            // Found later by a fault, it counts as a readahead hit.
            phys.memmap.set(page, PageFlag::Readahead);
            phys.put_folio(c, page, 1);
        }
    }
}

/// `shmem_writeout`: a shmem folio reclaim has unmapped from every mapping, held by the page
/// cache alone (and `extra` references of the caller's), goes out to swap: slots for its pages (one run its size), its data written,
/// the cache's entries replaced by swap entries ([`Inode::swapped`]), the folio freed. False
/// (nothing changed) when there is no swap, no run of slots, or something else holds it.
///
/// Deliberate difference: a large shmem folio no run fits is kept rather than split.
pub(crate) fn shmem_writeout<'m>(cpu: &Cpu<'m>, inode: &Inode, head: Pfn, extra: i32) -> bool {
    let Some(swap) = cpu.m.swap.as_ref() else {
        return false;
    };
    let (phys, c) = (&cpu.m.phys, cpu.c());
    let mem = &phys.memmap;
    let nr = 1u64 << mem.order(head);
    let idx = mem.index(head);
    if mem.refcount(head) != nr as i32 + extra || mem.folio_mapcount(head) != 0 {
        return false;
    }
    let Some(entry) = swap.alloc(mem.order(head)) else {
        return false;
    };
    for i in 0..nr {
        swap.write(entry.add(i), phys, head.add(i));
        // The page cache's reference on the slot, then the cache bit goes: the data is out.
        swap.duplicate(entry.add(i));
    }
    swap.cache_del(entry, nr);
    c.add(Ev::PswpOut, nr);
    c.add(Ev::PgSteal, nr);
    let removed: Vec<Pfn> = {
        let mut cache = inode.pages.lock();
        let mut swapped = inode.swapped.lock();
        (0..nr)
            .filter_map(|i| {
                swapped.insert(idx + i, entry.add(i));
                cache.remove(idx + i)
            })
            .collect()
    };
    for p in removed {
        crate::filemap::cache::delete_from_page_cache(cpu, p);
    }
    true
}

/// `shmem_swapin_folio` into the new cache folio `head` at `idx` (all its pages just
/// inserted, zeroed): the pages of the range that were out on swap get their data back and
/// give their slots up; the folio is then dirty (memory holds the only copy).
pub(crate) fn shmem_swapin<'m>(cpu: &Cpu<'m>, inode: &Inode, idx: u64, head: Pfn) {
    let phys = &cpu.m.phys;
    let nr = 1u64 << phys.memmap.order(head);
    let back: Vec<(u64, SwpEntry)> = {
        let mut swapped = inode.swapped.lock();
        if swapped.is_empty() {
            return;
        }
        (0..nr)
            .filter_map(|i| swapped.remove(&(idx + i)).map(|e| (i, e)))
            .collect()
    };
    let Some(swap) = cpu.m.swap.as_ref() else {
        return;
    };
    for &(i, e) in &back {
        swap.read(e, phys, head.add(i));
        swap.free_nr(e, 1);
    }
    if !back.is_empty() {
        cpu.c().add(Ev::PswpIn, back.len() as u64);
        phys.memmap.set(head, PageFlag::Dirty);
    }
}

/// `shmem_free_swap` for the pages `first..last` of a shmem object (truncation, hole
/// punching, the object's end): their slots are given up.
pub(crate) fn shmem_free_swap<'m>(cpu: &Cpu<'m>, inode: &Inode, first: u64, last: u64) {
    let gone: Vec<SwpEntry> = {
        let mut swapped = inode.swapped.lock();
        if swapped.is_empty() {
            return;
        }
        let keys: Vec<u64> = swapped.range(first..last).map(|(&i, _)| i).collect();
        keys.into_iter()
            .filter_map(|i| swapped.remove(&i))
            .collect()
    };
    if let Some(swap) = cpu.m.swap.as_ref() {
        for e in &gone {
            swap.free_nr(*e, 1);
        }
        cpu.c().add(Ev::SwapEntriesFreed, gone.len() as u64);
    }
}
