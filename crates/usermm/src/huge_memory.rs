//! Splitting a mapped anonymous large folio into order-0 folios.
//!
//! Linux counterpart: `mm/huge_memory.c` (`split_folio` → `__folio_split`: `unmap_folio`
//! with migration entries, `__split_unmapped_folio`, `remap_page`), as MADV_FREE, MADV_COLD
//! and MADV_PAGEOUT call it for a large folio their range covers only in part and that no
//! other process maps (`madvise_free_huge_pmd`, `madvise_free_pte_range`,
//! `madvise_cold_or_pageout_pte_range`). A PMD mapping is split into PTEs first
//! (`split_huge_pmd`); then every PTE of the folio is cleared, the folio is split in place,
//! and each page that was mapped gets its entry back (same bits, its own PageAnonExclusive),
//! now mapping an order-0 folio; pages that were no longer mapped are freed. Counted as
//! `thp_split_folio`.
//!
//! Deliberate differences: the folio is unmapped by clearing its entries rather than by
//! migration entries (the mmap lock the caller holds for writing keeps every other walker
//! of this mm out, and no other mm maps the folio); only splits to order 0 are made, which is
//! all the madvise paths ask for.

use crate::machine::Cpu;
use crate::mm::Mm;
use crate::pgtable::cursor::{PmdKind, PteLock};
use crate::phys::{PageFlag, Pfn};
use crate::rmap;
use crate::tlb::FlushScope;
use crate::vaddr::VirtAddr;
use crate::vma::Vma;

impl<'m> Cpu<'m> {
    /// Splits the anonymous large folio `head`, mapped by this mm only and starting at
    /// `folio_start` in `vma`, into order-0 folios (`split_folio`); returns whether it did.
    /// Nothing happens to a folio that is mlocked, mapped elsewhere (another mm, or another
    /// address: a partial mremap), or holds references beyond its mappings (a pin).
    ///
    /// # Context
    /// The mmap lock for writing; no page-table lock.
    pub(crate) fn split_anon_folio(
        &self,
        mm: &Mm,
        vma: &Vma,
        head: Pfn,
        folio_start: VirtAddr,
    ) -> bool {
        let c = self.c();
        let phys = &self.m.phys;
        let mem = &phys.memmap;
        let order = mem.order(head);
        if order == 0 || !mem.test(head, PageFlag::Anon) || mem.test(head, PageFlag::Mlocked) {
            return false;
        }
        let nr = 1u64 << order;
        // Where the folio's pages would be mapped in this VMA (part of it may have been
        // unmapped, or fall outside the VMA after a split of the VMA).
        let (first, end) = (
            folio_start.max(vma.vm_start()),
            folio_start.add(nr * 4096).min(vma.vm_end()),
        );
        if first >= end {
            return false;
        }
        let pt = self.tables(mm);
        for step in pt.pmd_walk(first, end) {
            if let PmdKind::Huge(e) = step.kind {
                if pt.vm_normal_folio(e) != Some(head) || !step.whole() {
                    return false;
                }
                self.split_huge_pmd(mm, vma, step.table, step.idx, step.haddr());
            }
        }
        // Every mapping of the folio must be one of its own PTEs here.
        let mut maps = Vec::new();
        for step in pt.pmd_walk(first, end) {
            let PmdKind::Table(table) = step.kind else {
                continue;
            };
            let ptes = PteLock::lock(pt, c, table);
            let (i0, i1) = step.pte_indexes();
            for i in i0..i1 {
                let e = ptes.get(i);
                if !e.is_none() && pt.arch.present(e) && pt.vm_normal_folio(e) == Some(head) {
                    maps.push((table, i, e, pt.arch.pfn(e)));
                }
            }
        }
        let mapped = maps.len() as i32;
        if mem.folio_mapcount(head) != mapped || mem.refcount(head) != mapped {
            return false;
        }
        let exclusive: Vec<bool> = maps
            .iter()
            .map(|&(.., pfn)| mem.test(pfn, PageFlag::AnonExclusive))
            .collect();
        // Unmap, holding one reference so the folio survives without mappings.
        rmap::folio_ref_add(phys, c, head, 1);
        for &(table, i, _, pfn) in &maps {
            let mut ptes = PteLock::lock(pt, c, table);
            // `try_to_migrate_one`: a dirty entry dirties the folio, so every piece is dirty.
            if ptes.clear(i, 1) {
                mem.set(head, PageFlag::Dirty);
            }
            rmap::remove_ptes(phys, c, head, pfn, 1, mm.id);
        }
        rmap::folio_ref_add(phys, c, head, -mapped);
        self.flush_tlb(mm, FlushScope::Range(first, end));
        let pieces: Vec<(u64, u32)> = (0..nr).map(|i| (i, 0)).collect();
        // Each piece starts with one reference: the one held above, now per page.
        phys.split_unmapped_folio(c, head, &pieces);
        for p in head.range(nr) {
            mem.set(p, PageFlag::Anon);
        }
        for (&(table, i, e, pfn), &excl) in maps.iter().zip(&exclusive) {
            let mut ptes = PteLock::lock(pt, c, table);
            ptes.set_ptes(i, e, 1);
            rmap::add_ptes(phys, c, pfn, pfn, 1, mm.id);
            rmap::folio_ref_add(phys, c, pfn, 1);
            if excl {
                mem.set(pfn, PageFlag::AnonExclusive);
            }
        }
        // Dropping the held references frees the pages nothing maps any more.
        for p in head.range(nr) {
            phys.put_folio(c, p, 1);
        }
        true
    }
}
