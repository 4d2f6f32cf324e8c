//! PMD-mapped THP: the PMD faults, the deposited page table, splitting a huge PMD, and
//! splitting a mapped anonymous large folio into order-0 folios.
//!
//! Linux counterpart: `mm/huge_memory.c`: `do_huge_pmd_anonymous_page` (with the huge zero
//! page, `set_huge_zero_folio`), `do_huge_pmd_wp_page` (reuse, or fall back to PTEs),
//! `do_set_pmd` and the shmem PMD fault (`finish_fault` of a PMD-sized shmem folio),
//! `thp_vma_allowable_order` ([`thp_pmd_eligible`]), `__split_huge_pmd_locked` and `vma_adjust_trans_huge`. They are called from
//! [`crate::fault`]'s `handle_mm_fault` when the PMD is empty or a huge leaf. The deposited
//! table (`pgtable_trans_huge_deposit` / `_withdraw`) is `pgtable::deposit`'s.
//!
//! Splitting a folio (`split_folio` → `__folio_split`: `unmap_folio` with migration entries, `__split_unmapped_folio`, `remap_page`), as MADV_FREE, MADV_COLD
//! and MADV_PAGEOUT call it for a large folio their range covers only in part and that no
//! other process maps (`madvise_free_huge_pmd`, `madvise_free_pte_range`,
//! `madvise_cold_or_pageout_pte_range`). A PMD mapping is split into PTEs first
//! (`split_huge_pmd`); then every PTE of the folio is cleared, the folio is split in place,
//! and each page that was mapped gets its entry back (same bits, its own PageAnonExclusive),
//! now mapping an order-0 folio; pages that were no longer mapped are freed. Counted as
//! `thp_split_folio`.
//!
//! Reclaim splits an isolated folio the same way when no run of swap slots fits it
//! (`split_folio_to_list` in `shrink_folio_list`).
//!
//! Deliberate differences: the folio is unmapped by clearing its entries rather than by
//! migration entries (the locks of the page tables that map it are held from unmapping to
//! remapping, which keeps every other walker of those entries out, and no other mm maps the
//! folio: a folio several processes map is not split); only splits to order 0 are made,
//! which is all the madvise and reclaim paths ask for.

use crate::machine::Cpu;
use crate::mlock::{folio_add_lru_vma, mlock_vma_file_folio, munlock_vma_folio};
use crate::mm::{mm_counter_file, Mm, MmState};
use crate::pgtable::cursor::{PmdKind, PmdLock, PteLock, UnlinkedPtes};
use crate::pgtable::{Access, Pmd, PMD_SIZE};
use crate::phys::{FolioKind, PageFlag, Pfn, Zeroing, HPAGE_PMD_ORDER};
use crate::rmap::{self, AnonVmaId, Level};
use crate::stats::Ev;
use crate::tlb::{FlushScope, TlbFlushPending};
use crate::tunables::{PteBatching, ThpSettings};
use crate::vaddr::VirtAddr;
use crate::vma::{VmFlags, Vma};

pub(crate) mod fault;

/// Splits the anonymous large folio `head`, mapped by this mm only and starting at
/// `folio_start` in `vma`, into order-0 folios (`split_folio`); returns whether it did.
/// Nothing happens to a folio that is mlocked, mapped elsewhere (another mm, or another
/// address: a partial mremap), or holds references beyond its mappings (a pin).
///
/// # Context
/// The mmap lock for writing; no page-table lock.
pub(crate) fn split_anon_folio<'m>(
    cpu: &Cpu<'m>,
    mm: &Mm,
    vma: &Vma,
    head: Pfn,
    folio_start: VirtAddr,
) -> bool {
    split_mapped_anon_folio(cpu, mm, vma, head, folio_start, false).is_some()
}

/// Reclaim's split of an isolated anonymous large folio that no run of swap slots fits
/// (`shrink_folio_list`'s `split_folio_to_list`, `THP_SWPOUT_FALLBACK`), the caller holding
/// one reference and maybe only the mm's lock for reading: the folio must be mapped by this
/// mm only. Returns the order-0 pieces, each with one reference for the caller and off the
/// LRU (those no entry maps are then the caller's to free), or `None` with nothing changed.
pub(crate) fn split_isolated_anon_folio<'m>(
    cpu: &Cpu<'m>,
    mm: &Mm,
    vma: &Vma,
    head: Pfn,
) -> Option<Vec<Pfn>> {
    let index = cpu.m.phys.memmap.index(head);
    let folio_start = vma.vm_start().add(index.checked_sub(vma.pgoff)? << 12);
    split_mapped_anon_folio(cpu, mm, vma, head, folio_start, true)
}

/// The split both callers make. A PMD mapping is split into PTEs first; then, with the
/// lock of every page table that maps the folio held from start to end (which keeps every
/// other walker of those entries out, as Linux's migration entries do, so the mm's lock
/// for reading is enough), its entries are cleared, the folio is split in place, and each
/// page that was mapped gets its entry back (same bits, its own PageAnonExclusive), now
/// mapping an order-0 folio. `isolated`: the caller holds one reference, which each piece
/// then holds (returned); otherwise pages no entry maps are freed (an empty list).
fn split_mapped_anon_folio<'m>(
    cpu: &Cpu<'m>,
    mm: &Mm,
    vma: &Vma,
    head: Pfn,
    folio_start: VirtAddr,
    isolated: bool,
) -> Option<Vec<Pfn>> {
    let c = cpu.c();
    let phys = &cpu.m.phys;
    let mem = &phys.memmap;
    let order = mem.order(head);
    if order == 0 || !mem.test(head, PageFlag::Anon) || mem.test(head, PageFlag::Mlocked) {
        return None;
    }
    let nr = 1u64 << order;
    // Where the folio's pages would be mapped in this VMA (part of it may have been
    // unmapped, or fall outside the VMA after a split of the VMA).
    let (first, end) = (
        folio_start.max(vma.vm_start()),
        folio_start.add(nr * 4096).min(vma.vm_end()),
    );
    if first >= end {
        return None;
    }
    let pt = cpu.tables(mm);
    for step in pt.pmd_walk(first, end) {
        if let PmdKind::Huge(e) = step.kind {
            if pt.vm_normal_folio(e) != Some(head) || !step.whole() {
                return None;
            }
            split_huge_pmd(cpu, mm, vma, step.table, step.idx, step.haddr());
        }
    }
    // Every mapping of the folio must be one of its own PTEs here (a folio of at most 2 MiB
    // spans at most two tables; they are locked in address order).
    let steps: Vec<_> = pt.pmd_walk(first, end).collect();
    let mut locks = Vec::with_capacity(steps.len());
    let mut maps = Vec::new();
    for (t, step) in steps.iter().enumerate() {
        let PmdKind::Table(table) = step.kind else {
            return None;
        };
        let ptes = PteLock::lock(pt, c, table);
        let (i0, i1) = step.pte_indexes();
        for i in i0..i1 {
            let e = ptes.get(i);
            if !e.is_none() && pt.arch.present(e) && pt.vm_normal_folio(e) == Some(head) {
                maps.push((t, i, e, pt.arch.pfn(e)));
            }
        }
        locks.push(ptes);
    }
    let mapped = maps.len() as i32;
    let extra = i32::from(isolated);
    if mem.folio_mapcount(head) != mapped || mem.refcount(head) != mapped + extra {
        return None;
    }
    let exclusive: Vec<bool> = maps
        .iter()
        .map(|&(.., pfn)| mem.test(pfn, PageFlag::AnonExclusive))
        .collect();
    // Unmap, holding one reference so the folio survives without mappings.
    if !isolated {
        rmap::folio_ref_add(c, phys.memmap.folio(head), 1);
    }
    let mut flush = TlbFlushPending::none();
    for &(t, i, _, pfn) in &maps {
        // `try_to_migrate_one`: a dirty entry dirties the folio, so every piece is dirty.
        let (dirty, owed) = locks[t].clear(i, 1);
        flush.merge(owed);
        if dirty {
            mem.set(head, PageFlag::Dirty);
        }
        rmap::remove_ptes(phys, c, phys.memmap.folio(head), pfn, 1, mm.id);
    }
    rmap::folio_ref_add(c, phys.memmap.folio(head), -mapped);
    flush.flushed(cpu.flush_tlb(mm, FlushScope::Range(first, end)));
    let pieces: Vec<(u64, u32)> = (0..nr).map(|i| (i, 0)).collect();
    // Each piece starts with one reference: the one held above, now per page.
    phys.split_unmapped_folio(c, head, &pieces);
    for p in head.range(nr) {
        mem.set(p, PageFlag::Anon);
    }
    for (&(t, i, e, pfn), &excl) in maps.iter().zip(&exclusive) {
        locks[t].set_ptes(i, e, 1);
        rmap::add_ptes(phys, c, phys.memmap.folio(pfn), pfn, 1, mm.id);
        rmap::folio_ref_add(c, phys.memmap.folio(pfn), 1);
        if excl {
            mem.set(pfn, PageFlag::AnonExclusive);
        }
    }
    drop(locks);
    if isolated {
        return Some(head.range(nr).collect());
    }
    // Dropping the held references frees the pages nothing maps any more.
    for p in head.range(nr) {
        phys.put_folio(c, p, 1);
    }
    Some(Vec::new())
}

/// Splits PMD-mapped THPs that would straddle a VMA boundary placed at `start` or `end`
/// (`vma_adjust_trans_huge`, called when a VMA is split).
pub(crate) fn split_huge_pmd_boundaries<'m>(
    cpu: &Cpu<'m>,
    mm: &Mm,
    st: &MmState,
    start: u64,
    end: u64,
) {
    for addr in [start, end] {
        let addr = VirtAddr::new(addr);
        if addr.is_pmd_aligned() {
            continue;
        }
        let pt = cpu.tables(mm);
        if let crate::pgtable::Walk::PmdLeaf { table, idx, .. } = pt.walk(addr) {
            let haddr = addr.pmd_align_down();
            if let Some(id) = st.vmas.find(haddr.val()) {
                split_huge_pmd(cpu, mm, st.vmas.get(id), table, idx, haddr);
            }
        }
    }
}

/// Whether a PMD-sized THP may back `addr` in `vma` under the THP policies `thp`.
pub(crate) fn thp_pmd_eligible(thp: &ThpSettings, vma: &Vma, addr: VirtAddr) -> bool {
    if vma.file.is_some() || vma.flags.has(VmFlags::NOHUGEPAGE) {
        return false;
    }
    let haddr = addr.pmd_align_down();
    haddr >= vma.vm_start()
        && haddr.add(PMD_SIZE) <= vma.vm_end()
        && thp.order_allowed(HPAGE_PMD_ORDER, vma.flags.has(VmFlags::HUGEPAGE))
}

/// `do_set_pmd`: maps the PMD-sized page-cache folio `head` at the empty entry `pmd_idx`
/// of PMD table `pmd_table` (the mapping keeps a reference the caller took), writable and
/// dirty for a write; false, with nothing done, when the entry is no longer empty.
pub(crate) fn do_set_pmd<'m>(
    cpu: &Cpu<'m>,
    mm: &Mm,
    vma: &Vma,
    pmd_table: Pfn,
    pmd_idx: usize,
    head: Pfn,
    access: Access,
) -> bool {
    let (c, phys) = (cpu.c(), &cpu.m.phys);
    let pt = cpu.tables(mm);
    let arch = pt.arch;
    let mut pmdl = PmdLock::lock(pt, c, pmd_table);
    if !pmdl.get(pmd_idx).is_none() {
        return false;
    }
    rmap::add_file_pmd(phys, c, phys.memmap.folio(head), mm.id);
    mlock_vma_file_folio(
        cpu,
        cpu.m.phys.memmap.folio(head),
        vma,
        1 << HPAGE_PMD_ORDER,
    );
    let mut entry = arch.mk_pmd_leaf(head, vma.page_prot());
    if access == Access::Write {
        entry = arch.mkwrite(arch.mkdirty(entry));
        phys.memmap.set(head, PageFlag::Dirty);
    }
    pmdl.install(pmd_idx, entry);
    drop(pmdl);
    mm.rss_add(mm_counter_file(vma), 1 << HPAGE_PMD_ORDER);
    true
}

/// A page table to deposit with a new PMD mapping (allocated before taking the PMD lock).
pub(crate) fn alloc_deposit<'m>(cpu: &Cpu<'m>) -> Option<Pfn> {
    cpu.m
        .phys
        .alloc_folio(cpu.c(), 0, 0, FolioKind::Pgtable, Zeroing::Zero)
}

/// rmap, index and LRU of a freshly allocated PMD-sized folio mapped at `haddr`.
pub(crate) fn add_new_pmd_folio<'m>(
    cpu: &Cpu<'m>,
    mm: &Mm,
    vma: &Vma,
    head: Pfn,
    haddr: VirtAddr,
    anon_vma: AnonVmaId,
) {
    let phys = &cpu.m.phys;
    rmap::add_new_anon(
        phys,
        cpu.c(),
        phys.memmap.folio(head),
        1 << HPAGE_PMD_ORDER,
        Level::Pmd,
        anon_vma,
        mm.id,
    );
    phys.memmap.set_index(head, vma.pgoff_at(haddr));
    folio_add_lru_vma(cpu, cpu.m.phys.memmap.folio(head), vma);
}

/// Replaces a huge PMD leaf by a PTE table mapping the same pages (`__split_huge_pmd`).
/// The folio stays large; each PTE takes a reference and a mapcount; PageAnonExclusive of
/// the head spreads to every page.
///
/// # Context
/// mmap lock held (read or write); takes the PMD table's lock.
pub(crate) fn split_huge_pmd<'m>(
    cpu: &Cpu<'m>,
    mm: &Mm,
    vma: &Vma,
    pmd_table: Pfn,
    pmd_idx: usize,
    haddr: VirtAddr,
) {
    let c = cpu.c();
    let phys = &cpu.m.phys;
    let arch = cpu.m.arch;
    let pt = cpu.tables(mm);
    let mut pmdl = PmdLock::lock(pt, c, pmd_table);
    let pmd = pmdl.get(pmd_idx);
    if !arch.is_pmd_leaf(pmd) {
        return;
    }
    if let Some(head) = pt
        .vm_normal_folio(pmd)
        .filter(|&h| !phys.memmap.test(h, PageFlag::Anon))
    {
        // A page-cache folio: the PMD is simply cleared and the pages refault as PTEs
        // (`__split_huge_pmd_locked` for file VMAs); dirtiness and access go to the folio.
        let (_, flush) = pmdl.clear(pmd_idx);
        flush.flushed(cpu.flush_tlb(mm, FlushScope::Range(haddr, haddr.add(PMD_SIZE))));
        drop(pmdl);
        let mem = &phys.memmap;
        if arch.dirty(pmd) {
            mem.set(head, PageFlag::Dirty);
        }
        if arch.young(pmd) {
            mem.set(head, PageFlag::Referenced);
        }
        rmap::remove_pmd(phys, c, phys.memmap.folio(head), mm.id);
        munlock_vma_folio(cpu, cpu.m.phys.memmap.folio(head), vma);
        phys.put_folio(c, head, 1);
        mm.rss_add(mm_counter_file(vma), -(1 << HPAGE_PMD_ORDER));
        c.add(Ev::ThpSplitPmd, 1);
        return;
    }
    let Some(table) = mm.deposited.withdraw(&pmdl, haddr) else {
        return;
    };
    let pfn = arch.pfn(pmd);
    let nr = 1u64 << HPAGE_PMD_ORDER;
    // Each PTE is the PMD's entry for its page, as a level-3 entry.
    let mut base = arch.mk_pte(pfn, pmd_prot(arch, pmd));
    if arch.special(pmd) {
        base = arch.mkspecial(arch.mk_pte(phys.zero_pfn(), pmd_prot(arch, pmd)));
    }
    if arch.dirty(pmd) {
        base = arch.mkdirty(base);
        if !arch.soft_dirty(pmd) {
            base = arch.clear_soft_dirty(base);
        }
    }
    if !arch.young(pmd) {
        base = arch.mkold(base);
    }
    if arch.write(pmd) {
        base = arch.mkwrite(base);
    }
    let zero = arch.special(pmd);
    let batch = cpu.m.tunables().remap_rmap_batch;
    // The withdrawn table is not linked yet: no walker can reach it until the PMD points
    // at it, so it is filled without its lock (Linux fills it before `pmd_populate`).
    let mut ptes = UnlinkedPtes::new(pt, c, table);
    if zero {
        ptes.fill_same(0, base, nr as usize);
    } else if batch == PteBatching::PerPte {
        // v6.7: one rmap call and one PTE store per page.
        for i in 0..nr {
            rmap::add_ptes(phys, c, phys.memmap.folio(pfn), pfn.add(i), 1, mm.id);
            ptes.set_ptes(i as usize, arch.advance_pfn(base, i), 1);
        }
    } else {
        ptes.set_ptes(0, base, nr as usize);
        rmap::add_ptes(phys, c, phys.memmap.folio(pfn), pfn, nr, mm.id);
    }
    drop(ptes);
    if !zero {
        let mem = &phys.memmap;
        if arch.dirty(pmd) {
            // `__split_huge_pmd_locked` moves a dirty PMD's state to the folio too.
            mem.set(pfn, PageFlag::Dirty);
        }
        let exclusive = mem.test(pfn, PageFlag::AnonExclusive);
        rmap::remove_pmd(phys, c, phys.memmap.folio(pfn), mm.id);
        rmap::folio_ref_add(c, phys.memmap.folio(pfn), nr as i32 - 1);
        munlock_vma_folio(cpu, cpu.m.phys.memmap.folio(pfn), vma);
        if exclusive {
            // `folio_add_anon_rmap_ptes(.., RMAP_EXCLUSIVE)` sets the flag page by page,
            // each with a locked bit operation (`SetPageAnonExclusive` is a `set_bit`).
            for p in pfn.range(nr) {
                mem.set(p, PageFlag::AnonExclusive);
            }
            c.add(Ev::FolioAtomic, nr);
        }
    }
    let flush = pmdl.replace(pmd_idx, arch.mk_table(table));
    flush.flushed(cpu.flush_tlb(mm, FlushScope::Range(haddr, haddr.add(PMD_SIZE))));
    drop(pmdl);
    c.add(Ev::ThpSplitPmd, 1);
}

/// The protection encoded in a PMD leaf.
pub(crate) fn pmd_prot(arch: crate::pgtable::Arch, e: Pmd) -> crate::pgtable::Prot {
    let accessible = arch.accessible(e);
    crate::pgtable::Prot {
        read: accessible,
        write: false,
        exec: accessible && arch.exec(e),
    }
}
