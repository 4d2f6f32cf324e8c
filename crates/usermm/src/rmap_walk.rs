//! The reverse-map walk of an anonymous folio: finding, ageing and unmapping every entry that
//! maps it, in every process.
//!
//! Linux counterparts: `mm/rmap.c` (`rmap_walk_anon`, `folio_referenced` /
//! `folio_referenced_one`, `try_to_unmap` / `try_to_unmap_one` for anonymous folios, with
//! `folio_try_share_anon_rmap_pte` and the lazy-free discard).
//!
//! Deliberate difference: Linux finds the VMAs through the folio's anon_vma tree; the engine
//! keeps anon_vma identities only for merging, so the walk visits every private anonymous
//! VMA of every process and computes where the folio would sit from its index
//! (`vma_address`: the index is the linear page index, kept across fork and mremap), then
//! checks that the entry there maps the folio. Linux takes no mmap lock in the walk; the
//! engine reads another process's VMAs under its mmap lock, taken with a try-lock, and a
//! walk that cannot take one gives up as a contended anon_vma lock does (`try_lock` in
//! reclaim's walks). The mm whose lock the caller holds is passed in as [`Held`].

use crate::machine::Cpu;
use crate::mm::{Mm, MmState, RssKind};
use crate::pgtable::cursor::{PmdKind, PmdLock, PteLock};
use crate::phys::{Folio, PageFlag, Pfn};
use crate::rmap;
use crate::stats::Ev;
use crate::tlb::{FlushScope, TlbFlushPending};
use crate::vaddr::VirtAddr;
use crate::vma::{VmFlags, Vma};

/// The mms whose mmap locks the caller already holds, with their states: the walk reads
/// their VMAs through these, and visits them even before they are in the task list (a
/// child being forked).
#[derive(Clone, Copy)]
pub(crate) struct Held<'a> {
    /// The mm.
    pub(crate) mm: &'a Mm,
    /// Its VMAs, under the caller's lock.
    pub(crate) st: &'a MmState,
    /// A second one (fork holds the child's too).
    pub(crate) also: Option<(&'a Mm, &'a MmState)>,
}

impl<'a> Held<'a> {
    /// One held mm.
    pub(crate) fn one(mm: &'a Mm, st: &'a MmState) -> Held<'a> {
        Held { mm, st, also: None }
    }

    fn get(&self, id: u32) -> Option<&'a MmState> {
        if self.mm.id == id {
            return Some(self.st);
        }
        self.also.filter(|(m, _)| m.id == id).map(|(_, st)| st)
    }
}

/// A walk that met a lock it could not take (`rwc->contended`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Contended;

/// Calls `f(mm, vma, start, end)` for every private anonymous VMA whose range may hold
/// the anonymous `folio`, with the part of the folio's span inside it.
fn rmap_walk_anon<'m>(
    cpu: &Cpu<'m>,
    held: Option<Held<'_>>,
    folio: Folio<'_>,
    mut f: impl FnMut(&Mm, &Vma, VirtAddr, VirtAddr),
) -> Result<(), Contended> {
    let head = folio.pfn();
    let mem = &cpu.m.phys.memmap;
    let index = mem.index(head);
    let nr = 1u64 << mem.order(head);
    let mut visit = |mm: &Mm, st: &MmState| {
        for id in st.vmas.all() {
            let vma = st.vmas.get(id);
            if vma.file.is_some() || vma.anon_vma().is_none() {
                continue;
            }
            let (first, last) = (vma.pgoff, vma.pgoff + (vma.len() >> 12));
            if index + nr <= first || index >= last {
                continue;
            }
            let lo = index.max(first);
            let hi = (index + nr).min(last);
            let start = vma.vm_start().add((lo - first) << 12);
            let end = vma.vm_start().add((hi - first) << 12);
            f(mm, vma, start, end);
        }
    };
    let tasks = cpu.m.tasks();
    for task in &tasks {
        let mm = &task.mm;
        match held.and_then(|h| h.get(mm.id)) {
            Some(st) => visit(mm, st),
            None => {
                let Some(st) = mm.lock.try_read_recursive() else {
                    return Err(Contended);
                };
                visit(mm, &st);
            }
        }
    }
    // A held mm not yet in the task list (the child of a fork in progress).
    if let Some(h) = held {
        for (mm, st) in std::iter::once((h.mm, h.st)).chain(h.also) {
            if !tasks.iter().any(|t| t.mm.id == mm.id) {
                visit(mm, st);
            }
        }
    }
    Ok(())
}

/// `folio_referenced`: how many VMAs map the folio through a young entry (the young bits
/// are cleared on the way, with a TLB flush), and whether a VMA that maps it is locked.
pub(crate) fn folio_referenced<'m>(
    cpu: &Cpu<'m>,
    held: Option<Held<'_>>,
    folio: Folio<'_>,
) -> Result<(u32, bool), Contended> {
    let head = folio.pfn();
    let (mut young, mut locked) = (0, false);
    let nr = 1u64 << cpu.m.phys.memmap.order(head);
    rmap_walk_anon(cpu, held, folio, |mm, vma, start, end| {
        let pt = cpu.tables(mm);
        let arch = pt.arch;
        let mut hit = TlbFlushPending::none();
        let mut mapped = false;
        let ours = |p: Pfn| p >= head && p < head.add(nr);
        for step in pt.pmd_walk(start, end) {
            match step.kind {
                PmdKind::Huge(e) => {
                    if pt.vm_normal_folio(e) == Some(head) {
                        mapped = true;
                        if arch.young(e) {
                            let mut pmdl = PmdLock::lock(pt, cpu.c(), step.table);
                            hit.merge(pmdl.replace(step.idx, arch.mkold(e)));
                        }
                    }
                }
                PmdKind::Table(table) => {
                    let mut ptes = PteLock::lock(pt, cpu.c(), table);
                    let (i0, i1) = step.pte_indexes();
                    for i in i0..i1 {
                        let e = ptes.get(i);
                        if e.is_none() || !arch.present(e) || !ours(arch.pfn(e)) {
                            continue;
                        }
                        mapped = true;
                        if arch.young(e) {
                            hit.merge(ptes.replace(i, arch.mkold(e)));
                        }
                    }
                }
            }
        }
        if mapped && vma.flags.has(VmFlags::LOCKED) {
            locked = true;
        }
        if hit.is_owed() {
            young += 1;
            hit.flushed(cpu.flush_tlb(mm, FlushScope::Range(start, end)));
        }
    })?;
    Ok((young, locked))
}

/// How [`try_to_unmap`] treats the folio's entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unmap {
    /// Replace each entry by a swap entry naming the page's slot (the folio is in the swap
    /// cache).
    ToSwap,
    /// A lazily freed folio: drop each clean entry; a written one (dirty entry or folio)
    /// stops the walk and makes the folio swap-backed again.
    Discard,
}

/// `try_to_unmap` of an anonymous folio that reclaim isolated (holding one reference):
/// every entry that maps it goes (a PMD mapping is split first). Returns whether the folio
/// is mapped nowhere afterwards; an entry in a locked VMA, a pinned exclusive page, a swap
/// slot whose count is full, or a redirtied lazy-free folio leaves the rest mapped.
pub(crate) fn try_to_unmap<'m>(
    cpu: &Cpu<'m>,
    held: Option<Held<'_>>,
    folio: Folio<'_>,
    mode: Unmap,
) -> Result<bool, Contended> {
    let head = folio.pfn();
    let (phys, c) = (&cpu.m.phys, cpu.c());
    let mem = &phys.memmap;
    let nr = 1u64 << mem.order(head);
    let swap = cpu.m.swap.as_ref();
    let mut abort = false;
    rmap_walk_anon(cpu, held, folio, |mm, vma, start, end| {
        if abort {
            return;
        }
        let pt = cpu.tables(mm);
        let arch = pt.arch;
        // TTU_SPLIT_HUGE_PMD.
        for step in pt.pmd_walk(start.pmd_align_down(), end) {
            if let PmdKind::Huge(e) = step.kind {
                if pt.vm_normal_folio(e) == Some(head) {
                    crate::huge_memory::split_huge_pmd(
                        cpu,
                        mm,
                        vma,
                        step.table,
                        step.idx,
                        step.haddr(),
                    );
                }
            }
        }
        if mode == Unmap::Discard && maps_dirty(cpu, mm, folio, nr, start, end) {
            // Written since MADV_FREE (`try_to_unmap_one` looks at the folio's whole batch
            // of entries first): it must be kept, and swapped if anything.
            mem.set(head, PageFlag::Dirty);
            mem.set(head, PageFlag::SwapBacked);
            abort = true;
            return;
        }
        let mut unmapped = TlbFlushPending::none();
        'walk: for step in pt.pmd_walk(start, end) {
            let PmdKind::Table(table) = step.kind else {
                continue;
            };
            let mut ptes = PteLock::lock(pt, c, table);
            let (i0, i1) = step.pte_indexes();
            for i in i0..i1 {
                let e = ptes.get(i);
                if e.is_none() || !arch.present(e) {
                    continue;
                }
                let page = arch.pfn(e);
                if page < head || page >= head.add(nr) {
                    continue;
                }
                if vma.flags.has(VmFlags::LOCKED) {
                    abort = true;
                    break 'walk;
                }
                if arch.dirty(e) {
                    mem.set(head, PageFlag::Dirty);
                }
                match mode {
                    Unmap::Discard => {
                        if mem.test(head, PageFlag::Dirty) {
                            mem.set(head, PageFlag::SwapBacked);
                            abort = true;
                            break 'walk;
                        }
                        // Nothing but the mappings and reclaim's isolation holds it.
                        if mem.refcount(head) != 1 + mem.folio_mapcount(head) {
                            abort = true;
                            break 'walk;
                        }
                        unmapped.merge(ptes.clear(i, 1).1);
                    }
                    Unmap::ToSwap => {
                        let exclusive = mem.test(page, PageFlag::AnonExclusive);
                        // `folio_try_share_anon_rmap_pte`: a pinned exclusive page stays.
                        if exclusive && rmap::folio_maybe_dma_pinned(phys.memmap.folio(head)) {
                            abort = true;
                            break 'walk;
                        }
                        let Some(swap) = swap else {
                            abort = true;
                            break 'walk;
                        };
                        let slot = mem.swap_entry(head).add(page.offset_from(head));
                        if !swap.duplicate(slot) {
                            abort = true;
                            break 'walk;
                        }
                        if exclusive {
                            mem.clear(page, PageFlag::AnonExclusive);
                        }
                        unmapped.merge(ptes.replace(i, arch.mk_swap_pte(slot, exclusive)));
                        mm.rss_add(RssKind::Swap, 1);
                    }
                }
                mm.rss_add(RssKind::Anon, -1);
                rmap::remove_ptes(phys, c, phys.memmap.folio(head), page, 1, mm.id);
                phys.put_folio(c, head, 1);
                c.add(Ev::ZapPtes, 1);
            }
        }
        // Entries cleared before an abort are flushed too: Linux flushes each one it clears
        // (`ptep_clear_flush`, or reclaim's batched flush, `set_tlb_ubc_flush_pending`, which
        // runs whether or not the folio is then freed), so no CPU keeps writing through a
        // translation the page tables no longer hold.
        if unmapped.is_owed() {
            unmapped.flushed(cpu.flush_tlb(mm, FlushScope::Range(start, end)));
        }
    })?;
    Ok(!abort && mem.folio_mapcount(head) == 0 && mem.entire_mapcount(head) == 0)
}

/// Whether an entry of `mm` in `[start, end)` mapping the folio is dirty.
fn maps_dirty<'m>(
    cpu: &Cpu<'m>,
    mm: &Mm,
    folio: Folio<'_>,
    nr: u64,
    start: VirtAddr,
    end: VirtAddr,
) -> bool {
    let head = folio.pfn();
    let pt = cpu.tables(mm);
    let arch = pt.arch;
    pt.pmd_walk(start, end).any(|step| match step.kind {
        PmdKind::Huge(e) => pt.vm_normal_folio(e) == Some(head) && arch.dirty(e),
        PmdKind::Table(table) => {
            let (i0, i1) = step.pte_indexes();
            (i0..i1).any(|i| {
                let e = pt.ptep_get_raw(table, i);
                !e.is_none()
                    && arch.present(e)
                    && (head..head.add(nr)).contains(&arch.pfn(e))
                    && arch.dirty(e)
            })
        }
    })
}

/// The one mm and VMA that map the anonymous `folio`, when no other mm does (for a split
/// reclaim makes), found by the walk; `f` is called with them. `None` when the folio is
/// (maybe) mapped by several mms, or a lock could not be taken.
pub(crate) fn with_sole_mapping<'m, R>(
    cpu: &Cpu<'m>,
    held: Option<Held<'_>>,
    folio: Folio<'_>,
    mut f: impl FnMut(&Mm, &Vma) -> Option<R>,
) -> Option<R> {
    let head = folio.pfn();
    let mem = &cpu.m.phys.memmap;
    if mem.folio_mapcount(head) == 0 {
        return None;
    }
    let nr = 1u64 << mem.order(head);
    let mut found: Vec<u32> = Vec::new();
    let mut out = None;
    rmap_walk_anon(cpu, held, folio, |mm, vma, start, end| {
        let pt = cpu.tables(mm);
        let maps = pt.pmd_walk(start, end).any(|step| match step.kind {
            PmdKind::Huge(e) => pt.vm_normal_folio(e) == Some(head),
            PmdKind::Table(table) => {
                let (i0, i1) = step.pte_indexes();
                (i0..i1).any(|i| {
                    let e = pt.ptep_get_raw(table, i);
                    !e.is_none()
                        && pt.arch.present(e)
                        && (head..head.add(nr)).contains(&pt.arch.pfn(e))
                })
            }
        });
        if maps {
            found.push(mm.id);
            if found.len() == 1 {
                out = f(mm, vma);
            }
        }
    })
    .ok()?;
    (found.len() == 1).then_some(out).flatten()
}
