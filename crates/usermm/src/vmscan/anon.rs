//! Reclaim of anonymous memory: ageing the anonymous LRU, swapping folios out, discarding
//! lazily freed ones.
//!
//! Linux counterparts: `mm/vmscan.c` (`shrink_active_list` and `shrink_inactive_list` for
//! the anonymous lists, `inactive_is_low`, `folio_check_references`, the anonymous half of
//! `shrink_folio_list`: `add_to_swap`, `try_to_unmap`, `pageout`, `__remove_mapping`, the
//! lazy-free discard, the split of a large folio no run of slots fits, and
//! `reclaim_pages` for `MADV_PAGEOUT`).
//!
//! Without a swap area the anonymous lists are not scanned by reclaim at all
//! (`can_reclaim_anon_pages`), except for lazily freed folios MADV_PAGEOUT hands over,
//! as in Linux. With one, a folio is judged by its references: young in one mapping the
//! first time it is seen, it is marked referenced and kept; young again, or young in
//! several mappings, it is activated; otherwise it gets slots (a large folio a run of
//! slots its size, or it is split where the caller can split it), is unmapped from every
//! process (each entry becomes a swap entry that keeps PageAnonExclusive), written, and
//! freed.
//!
//! Deliberate differences: the `reclaim` statement and direct reclaim shrink the file
//! lists before the anonymous ones instead of balancing them by `swappiness` and the
//! lists' recent cost (`get_scan_count`); a large folio that needs splitting outside
//! MADV_PAGEOUT (which holds the mm it splits in) is activated instead.

use crate::huge_memory::split_isolated_anon_folio;
use crate::machine::Cpu;
use crate::phys::lru::LruList;
use crate::phys::{PageFlag, Pfn};
use crate::rmap_walk::{folio_referenced, try_to_unmap, with_sole_mapping, Held, Unmap};
use crate::stats::Ev;
use crate::swap_state::{add_to_swap, delete_from_swap_cache};

/// What reclaim did with one isolated anonymous folio.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Swapped out or discarded: freed once the caller drops its reference.
    Freed,
    /// Back to the inactive list.
    Keep,
    /// Onto the active list.
    Activate,
    /// A large folio no run of slots fits: split it and reclaim the pieces
    /// (`THP_SWPOUT_FALLBACK`), or activate it where it cannot be split.
    Split,
}

/// `shrink_folio_list` for one anonymous folio the caller isolated and holds a reference
/// on. `check_references` is false for MADV_PAGEOUT (`ignore_references`).
pub(crate) fn reclaim_anon_folio<'m>(
    cpu: &Cpu<'m>,
    held: Option<Held<'_>>,
    head: Pfn,
    check_references: bool,
) -> Outcome {
    // MADV_PAGEOUT is the caller that skips the references; it also returns before the
    // writes complete.
    reclaim_anon(cpu, held, head, check_references, false, !check_references)
}

/// [`reclaim_anon_folio`]; `whole` swaps a large folio out whole even where the device
/// would want it split (the engine cannot split a folio several processes map);
/// `keep_written` leaves a folio it wrote in the swap cache (a write still in flight).
fn reclaim_anon<'m>(
    cpu: &Cpu<'m>,
    held: Option<Held<'_>>,
    head: Pfn,
    check_references: bool,
    whole: bool,
    keep_written: bool,
) -> Outcome {
    let (phys, c) = (&cpu.m.phys, cpu.c());
    let mem = &phys.memmap;
    let nr = 1u64 << mem.order(head);
    if mem.test(head, PageFlag::Mlocked) {
        return Outcome::Activate;
    }
    if check_references {
        match folio_referenced(cpu, held, mem.folio(head)) {
            Err(_) => return Outcome::Keep,
            Ok((_, true)) => return Outcome::Activate,
            Ok((young, false)) => {
                let was = mem.test_and_clear(head, PageFlag::Referenced);
                if young > 0 {
                    mem.set(head, PageFlag::Referenced);
                    return if was || young > 1 {
                        Outcome::Activate
                    } else {
                        Outcome::Keep
                    };
                }
            }
        }
    }
    let lazy = !mem.test(head, PageFlag::SwapBacked);
    if !lazy && !mem.test(head, PageFlag::SwapCache) {
        // A page that may be pinned for DMA is not given swap (measured on 6.18: a pinned
        // page stays, not in the swap cache, not activated).
        if crate::rmap::folio_maybe_dma_pinned(phys.memmap.folio(head)) {
            return Outcome::Keep;
        }
        if !add_to_swap(cpu, head, whole) {
            if nr > 1 {
                if cpu.m.swap.is_some() {
                    c.add(Ev::ThpSwpOutFallback, 1);
                }
                return Outcome::Split;
            }
            return Outcome::Activate;
        }
        if nr > 1 {
            c.add(Ev::ThpSwpOut, 1);
        }
    }
    let mapped = mem.folio_mapcount(head) > 0 || mem.entire_mapcount(head) > 0;
    if mapped {
        let mode = if lazy { Unmap::Discard } else { Unmap::ToSwap };
        match try_to_unmap(cpu, held, mem.folio(head), mode) {
            Err(_) => return Outcome::Keep,
            Ok(false) => return Outcome::Activate,
            Ok(true) => {}
        }
    }
    if lazy {
        // Only the caller's reference left, and not written since: drop it.
        if mem.refcount(head) == 1 && !mem.test(head, PageFlag::Dirty) {
            c.add(Ev::PgLazyFreed, nr);
            c.add(Ev::PgStealAnon, nr);
            return Outcome::Freed;
        }
        mem.set(head, PageFlag::SwapBacked);
        return Outcome::Keep;
    }
    let Some(swap) = cpu.m.swap.as_ref() else {
        return Outcome::Activate;
    };
    if mem.test_and_clear(head, PageFlag::Dirty) {
        // `pageout`: the write completes at once.
        let first = mem.swap_entry(head);
        for i in 0..nr {
            swap.write(first.add(i), phys, head.add(i));
        }
        c.add(Ev::PswpOut, nr);
        if keep_written {
            // MADV_PAGEOUT returns with the write still in flight on Linux, so the folio
            // stays in the swap cache until a later reclaim finds it clean (measured on
            // 6.18: reading the range back right after costs no swap-in, `pswpin` 0).
            return Outcome::Keep;
        }
    }
    // `__remove_mapping`: only the cache and the caller may hold it.
    if mem.refcount(head) != 1 + nr as i32 {
        return Outcome::Keep;
    }
    delete_from_swap_cache(cpu, head);
    c.add(Ev::PgStealAnon, nr);
    Outcome::Freed
}

/// Takes a folio off its LRU list for reclaim (`isolate_lru_folios`), with a reference;
/// false when it is not on one.
pub(crate) fn isolate<'m>(cpu: &Cpu<'m>, head: Pfn) -> bool {
    let phys = &cpu.m.phys;
    let f = phys.memmap.folio(head);
    cpu.c().add(Ev::LockLru, 1);
    let mut l = phys.lruvec_of(head).lock();
    if !f.test(PageFlag::Lru) || f.test(PageFlag::Unevictable) {
        return false;
    }
    l.del(f, f.nr_pages());
    f.clear(PageFlag::Lru);
    drop(l);
    crate::rmap::folio_ref_add(cpu.c(), phys.memmap.folio(head), 1);
    true
}

/// Puts an isolated folio back (`folio_putback_lru`) as `outcome` says, and drops the
/// isolation reference (which frees a folio reclaim freed).
pub(crate) fn putback<'m>(cpu: &Cpu<'m>, head: Pfn, outcome: Outcome) {
    let (phys, c) = (&cpu.m.phys, cpu.c());
    let f = phys.memmap.folio(head);
    if outcome != Outcome::Freed {
        if outcome == Outcome::Activate || outcome == Outcome::Split {
            if !f.test(PageFlag::Active) {
                c.add(Ev::PgActivate, f.nr_pages());
            }
            f.set(PageFlag::Active);
        }
        c.add(Ev::LockLru, 1);
        let mut l = phys.lruvec_of(head).lock();
        f.set(PageFlag::Lru);
        l.add(f, f.nr_pages());
    }
    phys.put_folio(c, head, 1);
}

/// Reclaim of the anonymous lists of every node (`shrink_list` for the anonymous LRUs):
/// the inactive list is refilled from the active one when it is low (`inactive_is_low`:
/// the active folios lose their young bits and go inactive), then folios from its tail
/// are reclaimed until `want` pages are freed or the scan budget is spent. Returns the
/// pages freed. Nothing happens without a swap area.
///
/// # Context
/// No page-table or LRU lock; the mmap lock of `held`'s mm, if any.
pub(crate) fn shrink_anon_lru<'m>(
    cpu: &Cpu<'m>,
    held: Option<Held<'_>>,
    want: u64,
    priority: u32,
) -> u64 {
    if cpu.m.swap.as_ref().is_none_or(|s| s.inuse() >= s.pages()) {
        return 0;
    }
    cpu.lru_add_drain_all();
    let phys = &cpu.m.phys;
    let mem = &phys.memmap;
    let mut freed = 0;
    for node in 0..phys.nr_nodes().max(1) {
        let lruvec = phys.lruvec_of_node(node);
        let (inactive, active) = {
            let l = lruvec.lock();
            (l.pages(LruList::InactiveAnon), l.pages(LruList::ActiveAnon))
        };
        let total = inactive + active;
        let limit = if priority == 0 {
            2 * total
        } else {
            (want + 128 + (total >> priority)).min(2 * total)
        };
        let mut scanned = 0;
        while freed < want && scanned < limit {
            let next = {
                let l = lruvec.lock();
                let low = l.pages(LruList::InactiveAnon) * inactive_ratio(phys.nr_frames())
                    < l.pages(LruList::ActiveAnon);
                match (
                    low,
                    l.tail(LruList::ActiveAnon),
                    l.tail(LruList::InactiveAnon),
                ) {
                    (true, Some(a), _) | (false, Some(a), None) => Err(a),
                    (_, _, Some(i)) => Ok(i),
                    (_, None, None) => break,
                }
            };
            match next {
                Err(active) => {
                    // `shrink_active_list`: age it and move it to the inactive list.
                    if !isolate(cpu, active) {
                        break;
                    }
                    let nr = 1u64 << mem.order(active);
                    scanned += nr;
                    let _ = folio_referenced(cpu, held, mem.folio(active));
                    mem.clear(active, PageFlag::Active);
                    mem.set(active, PageFlag::Workingset);
                    cpu.c().add(Ev::PgDeactivate, nr);
                    putback(cpu, active, Outcome::Keep);
                }
                Ok(folio) => {
                    if !isolate(cpu, folio) {
                        break;
                    }
                    let nr = 1u64 << mem.order(folio);
                    scanned += nr;
                    cpu.c().add(Ev::PgScanAnon, nr);
                    let outcome = if mem.test(folio, PageFlag::Anon) {
                        reclaim_anon_folio(cpu, held, folio, true)
                    } else {
                        // Shmem: swap-backed, so on these lists too.
                        super::reclaim_shmem_folio(cpu, folio)
                    };
                    if outcome != Outcome::Split {
                        if outcome == Outcome::Freed {
                            freed += nr;
                        }
                        putback(cpu, folio, outcome);
                        continue;
                    }
                    // No run of slots fits it: split it and reclaim the pieces now.
                    let pieces = with_sole_mapping(cpu, held, mem.folio(folio), |mm, vma| {
                        split_isolated_anon_folio(cpu, mm, vma, folio)
                    });
                    let Some(pieces) = pieces else {
                        // Deliberate difference: Linux splits a folio several processes
                        // map too (through migration entries in every one of them); the
                        // engine splits only under the page-table locks of one mm, so such
                        // a folio is swapped out whole instead (its references were just
                        // checked).
                        let outcome = match reclaim_anon(cpu, held, folio, false, true, false) {
                            Outcome::Split => Outcome::Activate,
                            o => o,
                        };
                        if outcome == Outcome::Freed {
                            freed += nr;
                        }
                        putback(cpu, folio, outcome);
                        continue;
                    };
                    for p in pieces {
                        if mem.folio_mapcount(p) == 0 {
                            // Part of the folio nothing mapped any more: freed.
                            cpu.m.phys.put_folio(cpu.c(), p, 1);
                            continue;
                        }
                        let outcome = match reclaim_anon_folio(cpu, held, p, true) {
                            Outcome::Split => Outcome::Activate,
                            o => o,
                        };
                        if outcome == Outcome::Freed {
                            freed += 1;
                        }
                        putback(cpu, p, outcome);
                    }
                }
            }
        }
    }
    freed
}

/// `inactive_is_low`'s ratio: the inactive list is low when it is smaller than the active
/// one over this ratio (`int_sqrt(10 * GiB)`, at least 1).
fn inactive_ratio(frames: u64) -> u64 {
    let gb = frames >> (30 - 12);
    if gb == 0 {
        1
    } else {
        (10 * gb).isqrt().max(1)
    }
}
