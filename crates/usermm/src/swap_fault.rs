//! The swap fault: a process touches a page whose PTE holds a swap entry.
//!
//! Linux counterpart: `do_swap_page` in `mm/memory.c` (with `should_try_to_free_swap` and
//! the swap-cache path `swapin_readahead`; a swap file is not `SWP_SYNCHRONOUS_IO`, so every
//! page comes in through the swap cache as an order-0 folio, as on this host).
//!
//! The page is found in the swap cache or read into it (with readahead of the neighbouring
//! swap PTEs' slots), the PTE's reference on its slot is dropped, and the page is mapped:
//! writable when the swap PTE said the page was exclusive (PageAnonExclusive survives
//! swap-out in the entry) or nothing else holds the folio, read-only otherwise, so that a
//! later write goes through `do_wp_page` and copies. The slots are given up
//! (`folio_free_swap`) when the area is more than half full, the VMA or folio is locked, or
//! a write fault maps the only user of the folio; otherwise the folio stays in the swap
//! cache, so that reclaiming it again needs no write while it stays clean.

use crate::machine::Cpu;
use crate::mlock::mlock_vma_folio;
use crate::mm::RssKind;
use crate::pgtable::cursor::PteLock;
use crate::pgtable::{Access, Pte};
use crate::phys::{PageFlag, SwpEntry};
use crate::rmap::{self, Level};
use crate::stats::Ev;
use crate::swap_state::{folio_free_swap, read_swap_cache, swap_readahead, PAGE_CLUSTER};
use crate::vm_fault::{anon_vma_prepare, folio_node, FaultCtx, FaultOutcome};
use crate::vma::VmFlags;
use crate::vmscan::{enough_free, reclaim_for};
use std::sync::atomic::Ordering::Relaxed;

/// `do_swap_page` for the swap PTE `orig` at `vmf.addr`.
///
/// # Context
/// The mmap lock for reading; no page-table lock (the PTE is re-checked under it).
pub(crate) fn do_swap_page<'m>(cpu: &Cpu<'m>, vmf: &FaultCtx<'_, 'm>, orig: Pte) -> FaultOutcome {
    let (c, phys) = (cpu.c(), &cpu.m.phys);
    let (mm, vma, pt) = (vmf.mm, vmf.vma, vmf.pt);
    let arch = pt.arch;
    c.add(Ev::FaultSwap, 1);
    let Some(swap) = cpu.m.swap.as_ref() else {
        // A swap entry with no swap area cannot be made; treat it as Linux treats a bad
        // entry.
        c.add(Ev::FaultSigbus, 1);
        return FaultOutcome::Sigbus;
    };
    let entry = arch.swp_entry(orig);
    let anon_vma = anon_vma_prepare(cpu, mm, vma);
    let node = folio_node(cpu, vmf.addr, 0);
    if swap.cache_lookup(entry).is_none() {
        reclaim_for(cpu, 1);
        let window = readahead_window(vmf);
        if window.len() > 1 && enough_free(cpu, window.len() as u64) {
            // `swap_vma_readahead`: the window (the faulting slot among it) is read, then
            // pushed onto the LRU (`lru_add_drain`), so no batch holds a reference of the
            // faulting folio either (measured on 6.18: a write fault after sequential
            // faults frees the swap cache, `!swapcache dirty`; after a lone fault, window
            // 1, the batch's reference keeps it, `swapcache dirty`).
            let others: Vec<SwpEntry> = window.into_iter().filter(|&e| e != entry).collect();
            swap_readahead(cpu, swap, &others, node);
            if let Some((p, false)) = read_swap_cache(cpu, swap, entry, node) {
                phys.put_folio(c, p, 1);
            }
            cpu.lru_add_drain();
        }
    }
    let Some((page, cached)) = read_swap_cache(cpu, swap, entry, node) else {
        // The slot was freed under us (a racing zap): the PTE changed, retry.
        if swap.swapcount(entry) == 0 {
            return FaultOutcome::Completed;
        }
        c.add(Ev::FaultSigbus, 1);
        return FaultOutcome::Oom;
    };
    if cached {
        c.add(Ev::SwapCacheHit, 1);
        // A page readahead brought in is a hit (`swap_update_readahead`).
        if phys.memmap.test_and_clear(page, PageFlag::Readahead) {
            vma.swap_ra.fetch_add(1, Relaxed);
        }
    }
    let mem = &phys.memmap;
    let head = mem.folio_of(page);
    let mut ptes = PteLock::lock(pt, c, vmf.table());
    let idx = vmf.idx();
    if ptes.get_raw(idx) != orig {
        drop(ptes);
        phys.put_folio(c, head, 1);
        return FaultOutcome::Completed;
    }
    let exclusive = arch.swp_exclusive(orig);
    let write = vmf.access == Access::Write;
    swap.free_nr(entry, 1);
    mm.rss_add(RssKind::Swap, -1);
    mm.rss_add(RssKind::Anon, 1);
    let nr = cpu.m.phys.memmap.folio(head).nr_pages() as i32;
    let locked = vma.flags.has(VmFlags::LOCKED) || mem.test(head, PageFlag::Mlocked);
    // `should_try_to_free_swap`: our reference and the cache's are all there is.
    if swap.full() || locked || (write && mem.refcount(head) == 1 + nr) {
        folio_free_swap(cpu, head);
    }
    let mut pte = arch.mk_pte(page, vma.page_prot());
    let sole = exclusive || (!mem.test(head, PageFlag::SwapCache) && mem.refcount(head) == 1);
    if sole && vma.flags.has(VmFlags::WRITE) {
        pte = arch.mkwrite(pte);
        if write {
            pte = arch.mkdirty(pte);
        }
    }
    if mem.mapping(head) == 0 {
        // First mapping since it was read in (`folio_add_new_anon_rmap`).
        rmap::add_new_anon(
            phys,
            c,
            phys.memmap.folio(head),
            1,
            Level::Pte,
            anon_vma,
            mm.id,
        );
        mem.set_index(head, vma.pgoff_at(vmf.addr.page_align_down()));
        if !sole {
            mem.clear(page, PageFlag::AnonExclusive);
        }
    } else {
        rmap::add_ptes(phys, c, phys.memmap.folio(head), page, 1, mm.id);
        if sole {
            mem.set(page, PageFlag::AnonExclusive);
        }
    }
    mlock_vma_folio(cpu, cpu.m.phys.memmap.folio(head), vma);
    // The swap entry is replaced: the table's count of used entries stays.
    ptes.replace_no_flush(idx, pte);
    // A write mapped read-only here is a write-protect fault now (`do_wp_page`), which the
    // access takes on its retry.
    FaultOutcome::Completed
}

/// `swap_vma_ra_win` and `swap_vma_readahead`'s window: the swap entries of the pages to
/// read around the fault, the faulting one among them. The window's size follows the VMA's
/// last fault and readahead hits (`__swapin_nr_pages`): with no hits it is two pages after
/// a fault on an adjacent page and one page (no readahead) otherwise; with hits, the next
/// power of two from four above hits + 2, at most `2^page-cluster`, and never below half the
/// previous window. It extends forward after a fault on the page before, backward after one
/// on the page after, and around the fault otherwise, clipped to the VMA and the PTE table.
fn readahead_window(vmf: &FaultCtx<'_, '_>) -> Vec<SwpEntry> {
    let (pt, vma) = (vmf.pt, vmf.vma);
    let fpn = vmf.addr.val() >> 12;
    let info = vma.swap_ra.load(Relaxed);
    let (prev, prev_win, hits) = (info >> 16, (info >> 8) & 0xff, info & 0xff);
    let max = 1u64 << PAGE_CLUSTER;
    let mut win = hits + 2;
    if win == 2 {
        if fpn != prev + 1 && fpn + 1 != prev {
            win = 1;
        }
    } else {
        win = win.next_power_of_two().max(4);
    }
    let win = win.min(max).max(prev_win / 2);
    vma.swap_ra.store(fpn << 16 | win << 8, Relaxed);
    if win == 1 {
        return Vec::new();
    }
    let (lo, hi) = if fpn == prev + 1 {
        (fpn, fpn + win)
    } else if prev == fpn + 1 {
        ((fpn + 1).saturating_sub(win), fpn + 1)
    } else {
        let left = (win - 1) / 2;
        (fpn.saturating_sub(left), fpn - left + win)
    };
    let pmd = vmf.addr.pmd_align_down().val() >> 12;
    let lo = lo.max(vma.vm_start().val() >> 12).max(pmd);
    let hi = hi.min(vma.vm_end().val() >> 12).min(pmd + 512);
    (lo..hi)
        .map(|vpn| pt.ptep_get_raw(vmf.table(), (vpn - pmd) as usize))
        .filter(|&e| pt.arch.is_swap_pte(e))
        .map(|e| pt.arch.swp_entry(e))
        .collect()
}
