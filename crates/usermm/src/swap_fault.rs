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
    let owner = anon_vma_prepare(cpu, mm, vma) as u32;
    let node = folio_node(cpu, vmf.addr, 0);
    if swap.cache_lookup(entry).is_none() {
        reclaim_for(cpu, 1);
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
    } else {
        let window = readahead_window(vmf, entry);
        if enough_free(cpu, window.len() as u64) {
            swap_readahead(cpu, swap, &window, node);
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
        rmap::add_new_anon(phys, c, head, 1, Level::Pte, owner, mm.id);
        mem.set_index(head, vma.pgoff_at(vmf.addr.page_align_down()));
        if !sole {
            mem.clear(page, PageFlag::AnonExclusive);
        }
    } else {
        rmap::add_ptes(phys, c, head, page, 1, mm.id);
        if sole {
            mem.set(page, PageFlag::AnonExclusive);
        }
    }
    mlock_vma_folio(cpu, head, vma);
    // The swap entry is replaced: the table's count of used entries stays.
    ptes.replace(idx, pte);
    // A write mapped read-only here is a write-protect fault now (`do_wp_page`), which the
    // access takes on its retry.
    FaultOutcome::Completed
}

/// The other slots of the readahead window around the fault: the aligned
/// `2^PAGE_CLUSTER`-page block of the PTE table around the faulting entry, those of its
/// PTEs (inside the VMA) that are swap entries.
fn readahead_window(vmf: &FaultCtx<'_, '_>, fault: SwpEntry) -> Vec<SwpEntry> {
    let (pt, vma) = (vmf.pt, vmf.vma);
    let win = 1u64 << PAGE_CLUSTER;
    let start = vmf
        .addr
        .align_down(win * 4096)
        .max(vma.vm_start().page_align_down());
    let end = vmf
        .addr
        .align_down(win * 4096)
        .add(win * 4096)
        .min(vma.vm_end());
    let mut out = Vec::new();
    let mut a = start;
    while a < end {
        let e = pt.ptep_get_raw(vmf.table(), a.pte_index());
        if pt.arch.is_swap_pte(e) && pt.arch.swp_entry(e) != fault {
            out.push(pt.arch.swp_entry(e));
        }
        a = a.add(4096);
    }
    out
}
