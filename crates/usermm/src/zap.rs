//! Unmapping page ranges and freeing page tables, through the mmu_gather.
//!
//! Linux counterparts: `mm/memory.c` (`unmap_vmas`, `zap_pte_range`, `zap_present_ptes`,
//! `free_pgtables`), `mm/mmu_gather.c` and `include/asm-generic/tlb.h`. The protocol, written
//! once here: **clear the entries, flush the TLB, only then drop the folio references and free
//! page tables.** A [`MmuGather`] collects the folios and the flushed range; it must be
//! finished with [`MmuGather::finish`] (dropping it unfinished is a bug and is asserted).

use crate::filemap::cache::folio_mark_accessed;
use crate::huge_memory::split_huge_pmd;
use crate::machine::Cpu;
use crate::mlock::{munlock_folio, munlock_vma_folio, munlocks_at_unmap};
use crate::mm::{mm_counter_file, Mm, MmState, RssKind};
use crate::pgtable::batch::BatchFlags;
use crate::pgtable::cursor::{PmdKind, PmdLock, PmdStep, PteLock};
use crate::pgtable::{PageTables, PMD_SIZE};
use crate::phys::arena::PAGE_SIZE;
use crate::phys::{PageFlag, Pfn, HPAGE_PMD_ORDER};
use crate::rmap;
use crate::stats::Ev;
use crate::tlb::{FlushScope, TlbFlushPending};
use crate::vaddr::VirtAddr;
use crate::vma::Vma;

/// Pages gathered before a forced flush (Linux `MAX_GATHER_BATCH_COUNT` × batch size ≈ 10k).
const GATHER_LIMIT: usize = 10_000;

/// Whether the whole address space is being torn down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GatherScope {
    /// A range of a live mm: flush the gathered range.
    Range,
    /// exit: flush the whole mm once.
    FullMm,
}

/// Pending unmap work: folio references to drop and a range to flush.
#[derive(Debug)]
#[must_use = "a gather must be finished: its folios are freed only after the TLB flush"]
pub(crate) struct MmuGather<'c, 'm> {
    cpu: &'c Cpu<'m>,
    mm: &'c Mm,
    scope: GatherScope,
    folios: Vec<(Pfn, i32)>,
    tables: Vec<Pfn>,
    range: Option<(VirtAddr, VirtAddr)>,
}

impl<'c, 'm> MmuGather<'c, 'm> {
    /// Starts a gather on `mm`.
    pub(crate) fn new(cpu: &'c Cpu<'m>, mm: &'c Mm, scope: GatherScope) -> Self {
        MmuGather {
            cpu,
            mm,
            scope,
            folios: Vec::new(),
            tables: Vec::new(),
            range: None,
        }
    }

    /// Takes over the flush owed by changes in `[start, end)` (`tlb_remove_tlb_entries`): the
    /// range is flushed before anything gathered is freed.
    pub(crate) fn defer_flush(&mut self, flush: TlbFlushPending, start: VirtAddr, end: VirtAddr) {
        flush.gathered();
        self.add_range(start, end);
    }

    /// Records that translations in `[start, end)` were removed.
    pub(crate) fn add_range(&mut self, start: VirtAddr, end: VirtAddr) {
        self.range = Some(match self.range {
            None => (start, end),
            Some((s, e)) => (s.min(start), e.max(end)),
        });
    }

    /// Queues `nr` references of folio `head` to drop after the flush.
    pub(crate) fn remove_folio(&mut self, head: Pfn, nr: i32) {
        self.folios.push((head, nr));
        if self.folios.len() >= GATHER_LIMIT {
            self.flush();
        }
    }

    /// Queues a page-table page that mapped from `at` to free after the flush
    /// (`pte_free_tlb` and its kin): the flush widens by a page at `at`, so a gather that
    /// cleared no entry still flushes before the table is reused (the paging-structure
    /// caches may hold it).
    pub(crate) fn remove_table(&mut self, pfn: Pfn, at: VirtAddr) {
        self.add_range(at, at.add(PAGE_SIZE));
        self.tables.push(pfn);
    }

    /// Flushes the TLB for the gathered range, then frees what was gathered.
    pub(crate) fn flush(&mut self) {
        if let Some((s, e)) = self.range.take() {
            let scope = match self.scope {
                GatherScope::FullMm => FlushScope::Mm,
                GatherScope::Range => FlushScope::Range(s, e),
            };
            self.cpu.flush_tlb(self.mm, scope);
        }
        let c = self.cpu.c();
        if !self.folios.is_empty() || !self.tables.is_empty() {
            c.add(Ev::GatherFlush, 1);
        }
        // `free_pages_and_swap_cache`: a swap-cache folio that is mapped nowhere now gives
        // up its slots first.
        for &(head, _) in &self.folios {
            crate::swap_state::free_swap_cache(self.cpu, head);
        }
        self.cpu.m.phys.folios_put_refs(c, &self.folios);
        self.folios.clear();
        for t in self.tables.drain(..) {
            self.cpu.m.phys.put_folio(c, t, 1);
        }
    }

    /// Final flush.
    pub(crate) fn finish(mut self) {
        self.flush();
    }
}

impl Drop for MmuGather<'_, '_> {
    fn drop(&mut self) {
        debug_assert!(
            self.folios.is_empty() && self.tables.is_empty() || std::thread::panicking(),
            "mmu_gather dropped with pending folios"
        );
    }
}

/// Which pages a zap removes (`struct zap_details`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum ZapDetails {
    /// Every page (munmap, exit, MADV_DONTNEED, truncate's `even_cows`).
    #[default]
    All,
    /// Only page-cache pages: the private anonymous copies (COW) of a file mapping stay
    /// (`unmap_mapping_range(.., even_cows = 0)`, hole punching).
    FilePagesOnly,
}

/// Zaps every mapping of `[start, end)` inside `vma` (`unmap_page_range`).
pub(crate) fn zap_vma_range<'m>(
    cpu: &Cpu<'m>,
    tlb: &mut MmuGather<'_, 'm>,
    mm: &Mm,
    vma: &Vma,
    start: VirtAddr,
    end: VirtAddr,
) {
    zap_vma_range_details(cpu, tlb, mm, vma, start, end, ZapDetails::All);
}

/// [`zap_vma_range`] restricted by `details` (`zap_page_range_single` with details).
pub(crate) fn zap_vma_range_details<'m>(
    cpu: &Cpu<'m>,
    tlb: &mut MmuGather<'_, 'm>,
    mm: &Mm,
    vma: &Vma,
    start: VirtAddr,
    end: VirtAddr,
    details: ZapDetails,
) {
    let start = start.max(vma.vm_start());
    let end = end.min(vma.vm_end());
    if start >= end {
        return;
    }
    let pt = cpu.tables(mm);
    for step in pt.pmd_walk(start, end) {
        if let PmdKind::Huge(_) = step.kind {
            if step.whole() {
                zap_huge_pmd(cpu, tlb, mm, vma, &step);
                continue;
            }
            split_huge_pmd(cpu, mm, vma, step.table, step.idx, step.haddr());
        }
        if let Some(table) = pt.pte_table_at(step.table, step.idx) {
            zap_pte_range(cpu, tlb, mm, vma, table, &step, details);
        }
    }
}

fn zap_huge_pmd<'m>(
    cpu: &Cpu<'m>,
    tlb: &mut MmuGather<'_, 'm>,
    mm: &Mm,
    vma: &Vma,
    step: &PmdStep,
) {
    let c = cpu.c();
    let phys = &cpu.m.phys;
    let pt = cpu.tables(mm);
    let haddr = step.haddr();
    let mut pmdl = PmdLock::lock(pt, c, step.table);
    let (pmd, flush) = pmdl.clear(step.idx);
    tlb.defer_flush(flush, haddr, haddr.add(PMD_SIZE));
    if let Some(pfn) = pt.vm_normal_folio(pmd) {
        let anon = phys.memmap.test(pfn, PageFlag::Anon);
        if !anon && pt.arch.dirty(pmd) {
            phys.memmap.set(pfn, PageFlag::Dirty);
        }
        rmap::remove_pmd(phys, c, phys.memmap.folio(pfn), mm.id);
        munlock_vma_folio(cpu, cpu.m.phys.memmap.folio(pfn), vma);
        let kind = if anon {
            RssKind::Anon
        } else {
            mm_counter_file(vma)
        };
        mm.rss_add(kind, -(1 << HPAGE_PMD_ORDER));
        tlb.remove_folio(pfn, 1);
    }
    // `zap_deposited_table`: withdrawn under the PMD lock (Linux frees it there too; freeing
    // it just after changes no count).
    let deposit = mm.deposited.withdraw(&pmdl, haddr);
    drop(pmdl);
    if let Some(t) = deposit {
        phys.put_folio(c, t, 1);
    }
    c.add(Ev::ZapBatches, 1);
}

/// `zap_pte_range` over the part of `step` in PTE table `table`: one batch per folio run
/// (`zap_present_ptes`).
fn zap_pte_range<'m>(
    cpu: &Cpu<'m>,
    tlb: &mut MmuGather<'_, 'm>,
    mm: &Mm,
    vma: &Vma,
    table: Pfn,
    step: &PmdStep,
    details: ZapDetails,
) {
    let c = cpu.c();
    let phys = &cpu.m.phys;
    let mut ptes = PteLock::lock(cpu.tables(mm), c, table);
    let (i0, i1) = step.pte_indexes();
    let arch = cpu.m.arch;
    // One read of the tunables for the whole table, not one per folio.
    let batching = cpu.m.tunables().zap_pte_batch;
    let munlock = munlocks_at_unmap(cpu, vma);
    let mut flush = TlbFlushPending::none();
    let mut i = i0;
    while i < i1 {
        let e = ptes.get(i);
        if e.is_none() {
            i += 1;
            continue;
        }
        if arch.is_swap_pte(e) {
            // `zap_nonpresent_ptes`: the entry's reference on its slot goes (anonymous
            // memory only: a file-pages-only zap keeps the private copies).
            if details == ZapDetails::All {
                ptes.clear_nonpresent(i);
                mm.rss_add(RssKind::Swap, -1);
                if let Some(swap) = cpu.m.swap.as_ref() {
                    crate::swap_state::free_swap_and_cache(cpu, swap, arch.swp_entry(e), 1);
                }
            }
            i += 1;
            continue;
        }
        let run = ptes.run(i, e, i1 - i, batching, BatchFlags::default());
        let nr = run.nr;
        let anon = run.folio.is_some_and(|h| phys.memmap.folio(h).is_anon());
        if details == ZapDetails::FilePagesOnly && (anon || run.folio.is_none()) {
            i += nr;
            continue;
        }
        let (dirty, owed) = ptes.clear(i, nr);
        flush.merge(owed);
        c.add(Ev::ZapPtes, nr as u64);
        i += nr;
        let Some(head) = run.folio else {
            continue;
        };
        if !anon {
            // A page-cache folio keeps what its PTE knew: dirtiness (`folio_mark_dirty`)
            // and a recent access (`folio_mark_accessed`).
            if dirty {
                phys.memmap.folio(head).set(PageFlag::Dirty);
            }
            if arch.young(e) {
                folio_mark_accessed(cpu, head);
            }
        }
        rmap::remove_ptes(phys, c, phys.memmap.folio(head), run.pfn, nr as u64, mm.id);
        if munlock {
            // `munlock_vma_folio`.
            munlock_folio(cpu, cpu.m.phys.memmap.folio(head));
        }
        mm.rss_add(
            if anon {
                RssKind::Anon
            } else {
                mm_counter_file(vma)
            },
            -(nr as i64),
        );
        tlb.remove_folio(head, nr as i32);
        c.add(Ev::ZapBatches, 1);
        if run.batched {
            c.add(Ev::ZapBatchesLarge, 1);
        }
    }
    if flush.is_owed() {
        tlb.defer_flush(flush, step.start, step.end);
    }
}

/// Frees the PTE table under PMD entry `step` if it maps nothing (MADV_DONTNEED's
/// page-table reclaim, `try_get_and_clear_pmd` and `free_pte`; `retract_page_tables`
/// after a collapse), so a later fault may map a PMD there.
///
/// # Context
/// The mmap lock; no page-table lock.
pub(crate) fn free_empty_pte_table<'m>(
    cpu: &Cpu<'m>,
    tlb: &mut MmuGather<'_, 'm>,
    mm: &Mm,
    step: &PmdStep,
) {
    let PmdKind::Table(table) = step.kind else {
        return;
    };
    if cpu.m.phys.memmap.pt_entries(table) != 0 {
        return;
    }
    cpu.tables(mm)
        .unlink_table(cpu.c(), &mm.page_table_lock, step.table, step.idx);
    tlb.add_range(step.haddr(), step.haddr().add(PMD_SIZE));
    tlb.remove_table(table, step.haddr());
}

/// Frees page tables that no longer cover any VMA inside `[start, end)` (`free_pgtables`).
/// Only tables that exist are visited, lowest level first.
///
/// # Context
/// mmap lock held for writing; the range's VMAs are already gone from the tree.
pub(crate) fn free_pgtables<'m>(
    cpu: &Cpu<'m>,
    tlb: &mut MmuGather<'_, 'm>,
    mm: &Mm,
    st: &MmState,
    start: VirtAddr,
    end: VirtAddr,
) {
    let pt = cpu.tables(mm);
    let mut walk = FreeWalk {
        tlb,
        mm,
        st,
        pt,
        range: (start, end),
    };
    free_level(cpu, &mut walk, pt.pgd, 0, VirtAddr::new(0));
}

/// Visits the entries of `table` (at `level`, 0 = PGD, mapping from `base`) that overlap
/// the walk's range; frees each lower table whose span holds no VMA any more.
fn free_level<'m>(
    cpu: &Cpu<'m>,
    w: &mut FreeWalk<'_, '_, 'm>,
    table: Pfn,
    level: usize,
    base: VirtAddr,
) {
    let pt = w.pt;
    let (start, end) = w.range;
    let shift = crate::pgtable::LEVEL_SHIFTS[level];
    let size = 1u64 << shift;
    // The entries of `table` the range overlaps: from `start` (or the table's first) to
    // the range's last byte (or the table's).
    let first = start.max(base).offset_from(base) >> shift;
    let last = end.sub(1).min(base.add((size << 9) - 1)).offset_from(base) >> shift;
    for i in first..=last.min(511) {
        let Some(child) = pt.lower_table(level, table, i as usize) else {
            continue;
        };
        let cbase = base.add(i << shift);
        if level < 2 {
            free_level(cpu, w, child, level + 1, cbase);
        }
        let span_end = cbase.next_boundary(size);
        if cpu.m.phys.memmap.pt_entries(child) != 0
            || !w
                .st
                .vmas
                .overlapping(cbase.val(), span_end.val())
                .is_empty()
        {
            continue;
        }
        pt.unlink_table(cpu.c(), &w.mm.page_table_lock, table, i as usize);
        w.tlb.remove_table(child, start.max(cbase));
    }
}

/// One `free_pgtables` walk: where freed tables go, and the range whose tables may go.
struct FreeWalk<'g, 'c, 'm> {
    tlb: &'g mut MmuGather<'c, 'm>,
    mm: &'g Mm,
    st: &'g MmState,
    pt: PageTables<'m>,
    range: (VirtAddr, VirtAddr),
}
