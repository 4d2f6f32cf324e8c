//! munlock as Linux 3.11 did it, with the seven patches of the 2013 series as stages.
//!
//! Linux counterpart: `mm/mlock.c` of 3.11–3.12 (`munlock_vma_pages_range`,
//! `munlock_vma_page`, `__munlock_pagevec_fill`, `__munlock_pagevec`,
//! `__munlock_isolated_page`, `try_to_munlock`), `mm/vmscan.c` (`putback_lru_page`,
//! `isolate_lru_page`). In this design munlock is a pass over the range that runs before the
//! range is unmapped (munlock, munmap and exit of `VM_LOCKED` VMAs): each page is looked up,
//! its `PG_mlocked` cleared, the page isolated from the unevictable list and put back on an
//! evictable one, unless another locked mapping still maps it (an rmap walk, for pages mapped
//! more than once). The stages, cumulative (`munlock=stageN`):
//!
//! | stage | adds |
//! |---|---|
//! | 0 | 3.11: per page follow_page + lru_lock + isolate + putback via the per-CPU pagevec + `lru_add_drain` |
//! | 1 | `putback_lru_page` no longer computes the LRU base type it does not need |
//! | 2 | no `lru_add_drain` after each page |
//! | 3 | isolate up to a pagevec (14 pages) of one node under one lru_lock |
//! | 4 | `NR_MLOCK` updated once per pagevec |
//! | 5 | put back the pagevec with one `__pagevec_lru_add`, bypassing the per-CPU pagevec |
//! | 6 | no extra get_page/put_page pair on the fast path (reuse the lookup's reference) |
//! | 7 | fill the pagevec by walking PTEs under one PTL instead of a full lookup per page |
//!
//! The rmap walk (`try_to_munlock`) has no anon_vma chains to follow here; it visits every
//! VMA of every process that may map the page (by `folio->index`) and checks its page table.

use crate::machine::Cpu;
use crate::mlock::folio_add_lru;
use crate::mm::{Mm, MmState};
use crate::pgtable::cursor::{PmdLock, PteLock};
use crate::pgtable::{PageTables, Walk, PMD_SIZE};
use crate::phys::{PageFlag, Pfn};
use crate::stats::Ev;
use crate::tunables::MunlockDesign;
use crate::vaddr::VirtAddr;
use crate::vma::{VmFlags, Vma};

/// Pages per pagevec in 3.12.
const PAGEVEC_SIZE: usize = 14;

/// An on-stack `struct pagevec` (inline storage: filling one allocates nothing).
type Pagevec = smallvec::SmallVec<[Pfn; PAGEVEC_SIZE]>;

/// A page found by a lookup, holding a reference.
#[derive(Clone, Copy, Debug)]
struct Found {
    head: Pfn,
    thp: bool,
}

/// Munlocks every page of `[start, end)` of `vma` the 2013 way (`munlock_vma_pages_range`).
///
/// # Context
/// mmap lock held for writing; `st` is the mm's state.
pub(crate) fn munlock_vma_pages_range_2013<'m>(
    cpu: &Cpu<'m>,
    mm: &Mm,
    st: &MmState,
    vma: &Vma,
    start: VirtAddr,
    end: VirtAddr,
    design: MunlockDesign,
) {
    let pt = cpu.tables(mm);
    let mut addr = start;
    // A page the pagevec fill looked up but could not take (another node) starts the next
    // pagevec, as the 3.12 loop does, instead of being looked up twice.
    let mut carried: Option<Found> = None;
    while addr < end {
        let Some(found) = carried.take().or_else(|| follow_page(cpu, pt, addr)) else {
            addr = addr.add(4096);
            continue;
        };
        if found.thp {
            munlock_vma_page(cpu, mm, st, found.head, design);
            cpu.m.phys.put_folio(cpu.c(), found.head, 1);
            addr = addr.pmd_align_down().add(PMD_SIZE);
            continue;
        }
        if !design.has_patch(3) {
            munlock_vma_page(cpu, mm, st, found.head, design);
            cpu.m.phys.put_folio(cpu.c(), found.head, 1);
            addr = addr.add(4096);
            continue;
        }
        let mut pvec = Pagevec::new();
        pvec.push(found.head);
        (addr, carried) =
            munlock_pagevec_fill(cpu, pt, vma, &mut pvec, addr.add(4096), end, design);
        munlock_pagevec(cpu, mm, st, pvec, design);
    }
    if !design.has_patch(2) {
        cpu.lru_add_drain();
    }
}

/// `follow_page_mask(FOLL_GET | FOLL_DUMP)`: a full walk from the top, under the PTL, and
/// a reference on the page. The zero page and empty entries yield nothing.
fn follow_page<'m>(cpu: &Cpu<'m>, pt: PageTables<'m>, addr: VirtAddr) -> Option<Found> {
    let c = cpu.c();
    let phys = &cpu.m.phys;
    c.add(Ev::PteRead, 4);
    match pt.walk(addr) {
        Walk::Pte { table, idx, .. } => {
            let ptes = PteLock::lock(pt, c, table);
            let e = ptes.peek_raw(idx);
            if e.is_none() || !pt.arch.present(e) {
                return None;
            }
            let head = pt.vm_normal_folio(e)?;
            crate::rmap::folio_ref_add(c, phys.memmap.folio(head), 1);
            Some(Found { head, thp: false })
        }
        Walk::PmdLeaf { table, idx, .. } => {
            let pmdl = PmdLock::lock(pt, c, table);
            let pfn = pt.arch.pfn(pmdl.get(idx));
            if phys.is_zero_pfn(pfn) {
                return None;
            }
            crate::rmap::folio_ref_add(c, phys.memmap.folio(pfn), 1);
            Some(Found {
                head: pfn,
                thp: true,
            })
        }
        Walk::NoPmd | Walk::PmdNone { .. } => None,
    }
}

/// Adds following pages of the same node to `pvec` (patch 3), by per-page lookups or
/// (patch 7) by walking the PTE table under one lock. Returns the next address and, with
/// per-page lookups, a page of another node already looked up (it starts the next pagevec).
fn munlock_pagevec_fill<'m>(
    cpu: &Cpu<'m>,
    pt: PageTables<'m>,
    vma: &Vma,
    pvec: &mut Pagevec,
    mut addr: VirtAddr,
    end: VirtAddr,
    design: MunlockDesign,
) -> (VirtAddr, Option<Found>) {
    let phys = &cpu.m.phys;
    let node = phys.node_of(pvec[0]);
    // The fill stays inside the PMD (and the VMA) of the page before `addr`, the one the
    // pagevec was started with.
    let end = addr.sub(4096).pmd_addr_end(end).min(vma.vm_end());
    if design.has_patch(7) {
        let Some(table) = pt.pte_table(addr.sub(4096)) else {
            return (addr, None);
        };
        let ptes = PteLock::lock(pt, cpu.c(), table);
        while addr < end && pvec.len() < PAGEVEC_SIZE {
            let e = ptes.get_raw(addr.pte_index());
            let pfn = pt.arch.pfn(e);
            if e.is_none() || !pt.arch.present(e) || pt.arch.special(e) {
                break;
            }
            let head = phys.memmap.folio_of(pfn);
            if phys.memmap.test(head, PageFlag::Head) {
                break;
            }
            if phys.node_of(head) != node {
                // Already found under this PTL: it starts the next pagevec.
                crate::rmap::folio_ref_add(cpu.c(), phys.memmap.folio(head), 1);
                return (addr, Some(Found { head, thp: false }));
            }
            crate::rmap::folio_ref_add(cpu.c(), phys.memmap.folio(head), 1);
            pvec.push(head);
            addr = addr.add(4096);
        }
        return (addr, None);
    }
    while addr < end && pvec.len() < PAGEVEC_SIZE {
        let Some(f) = follow_page(cpu, pt, addr) else {
            break;
        };
        if f.thp || phys.node_of(f.head) != node {
            return (addr, Some(f));
        }
        pvec.push(f.head);
        addr = addr.add(4096);
    }
    (addr, None)
}

/// `munlock_vma_page` (stages 0–2, and THPs at every stage): one page at a time.
fn munlock_vma_page<'m>(cpu: &Cpu<'m>, mm: &Mm, st: &MmState, head: Pfn, design: MunlockDesign) {
    let phys = &cpu.m.phys;
    let folio = phys.memmap.folio(head);
    let nr = folio.nr_pages();
    cpu.c().add(Ev::LockLru, 1);
    let mut lists = phys.lruvec_of(head).lock();
    if !folio.test_and_clear(PageFlag::Mlocked) {
        return;
    }
    phys.mod_nr_mlock(cpu.c(), head, -(nr as i64));
    cpu.c().add(Ev::NrMlockUpdate, 1);
    // That kernel counted a page or a THP once.
    cpu.c().add(Ev::Munlocked, 1);
    cpu.c().add(Ev::FolioMunlocked, 1);
    if !folio.test_and_clear(PageFlag::Lru) {
        return;
    }
    lists.del(folio, nr);
    crate::rmap::folio_ref_add(cpu.c(), phys.memmap.folio(head), 1);
    cpu.c().add(Ev::Isolated, 1);
    drop(lists);
    munlock_isolated_page(cpu, mm, st, head, design);
}

/// `__munlock_isolated_page`: re-mlock if another locked VMA maps it, then put it back.
fn munlock_isolated_page<'m>(
    cpu: &Cpu<'m>,
    mm: &Mm,
    st: &MmState,
    head: Pfn,
    design: MunlockDesign,
) {
    if crate::rmap::page_mapcount(&cpu.m.phys, head) > 1 {
        try_to_munlock(cpu, mm, st, head);
    }
    putback_lru_page(cpu, head, design);
}

/// `putback_lru_page`: back on the list its flags select; evictable pages go through the
/// per-CPU pagevec (and, before patch 2, a drain follows every page).
fn putback_lru_page<'m>(cpu: &Cpu<'m>, head: Pfn, design: MunlockDesign) {
    let phys = &cpu.m.phys;
    let folio = phys.memmap.folio(head);
    let nr = folio.nr_pages();
    if !design.has_patch(1) {
        // The LRU base type was computed even when unused.
        let _ = crate::phys::lru::folio_lru_list(folio);
        cpu.c().add(Ev::FolioAtomic, 1);
    }
    if folio.test(PageFlag::Mlocked) {
        cpu.c().add(Ev::LockLru, 1);
        let mut lists = phys.lruvec_of(head).lock();
        folio.set(PageFlag::Unevictable);
        // Re-mlocked by the rmap walk: at least one other locking mapping (the current
        // design's count may under-count, never over-count).
        folio.set_mlock_count(1);
        lists.add(folio, nr);
        folio.set(PageFlag::Lru);
        drop(lists);
        phys.put_folio(cpu.c(), head, 1);
        return;
    }
    if folio.test_and_clear(PageFlag::Unevictable) {
        cpu.c().add(Ev::Rescued, 1);
    }
    folio.set_mlock_count(0);
    // lru_cache_add: the per-CPU pagevec takes its own reference; ours is dropped.
    folio_add_lru(cpu, cpu.m.phys.memmap.folio(head));
    phys.put_folio(cpu.c(), head, 1);
    if !design.has_patch(2) {
        cpu.lru_add_drain();
    }
}

/// `__munlock_pagevec` (stages 3+).
fn munlock_pagevec<'m>(cpu: &Cpu<'m>, mm: &Mm, st: &MmState, pvec: Pagevec, design: MunlockDesign) {
    let phys = &cpu.m.phys;
    let mem = &phys.memmap;
    let mut isolated = Pagevec::new();
    let mut putback = Pagevec::new();
    let mut delta = 0i64;
    cpu.c().add(Ev::LockLru, 1);
    {
        let mut lists = phys.lruvec_of(pvec[0]).lock();
        for &p in &pvec {
            let nr = 1i64 << mem.order(p);
            if mem.test_and_clear(p, PageFlag::Mlocked) {
                cpu.c().add(Ev::Munlocked, 1);
                cpu.c().add(Ev::FolioMunlocked, 1);
                if design.has_patch(4) {
                    delta += nr;
                } else {
                    phys.mod_nr_mlock(cpu.c(), p, -nr);
                    cpu.c().add(Ev::NrMlockUpdate, 1);
                }
                if mem.test_and_clear(p, PageFlag::Lru) {
                    lists.del(mem.folio(p), nr as u64);
                    cpu.c().add(Ev::Isolated, 1);
                    if !design.has_patch(6) {
                        crate::rmap::folio_ref_add(cpu.c(), phys.memmap.folio(p), 1);
                    }
                    isolated.push(p);
                    continue;
                }
            }
            putback.push(p);
        }
    }
    if design.has_patch(4) && delta != 0 {
        phys.mod_nr_mlock(cpu.c(), pvec[0], -delta);
        cpu.c().add(Ev::NrMlockUpdate, 1);
    }
    for p in putback {
        phys.put_folio(cpu.c(), p, 1);
    }
    let mut fast = Pagevec::new();
    for p in isolated {
        let evictable = !mem.test(p, PageFlag::Mlocked);
        if design.has_patch(5) && crate::rmap::page_mapcount(phys, p) <= 1 && evictable {
            if mem.test_and_clear(p, PageFlag::Unevictable) {
                cpu.c().add(Ev::Rescued, 1);
            }
            mem.set_mlock_count(p, 0);
            fast.push(p);
            continue;
        }
        munlock_isolated_page(cpu, mm, st, p, design);
        if !design.has_patch(6) {
            // The lookup's reference, kept separately before patch 6.
            phys.put_folio(cpu.c(), p, 1);
        }
    }
    pagevec_lru_add(cpu, fast, design);
}

/// `__pagevec_lru_add` (patch 5): evictable pages back on their list under one lock,
/// dropping the references the pagevec held.
fn pagevec_lru_add<'m>(cpu: &Cpu<'m>, pages: Pagevec, design: MunlockDesign) {
    if pages.is_empty() {
        return;
    }
    let phys = &cpu.m.phys;
    let mem = &phys.memmap;
    cpu.c().add(Ev::LockLru, 1);
    {
        let mut lists = phys.lruvec_of(pages[0]).lock();
        for &p in &pages {
            let folio = mem.folio(p);
            lists.add(folio, folio.nr_pages());
            folio.set(PageFlag::Lru);
        }
    }
    for p in pages {
        phys.put_folio(cpu.c(), p, 1);
        if !design.has_patch(6) {
            phys.put_folio(cpu.c(), p, 1);
        }
    }
}

/// `try_to_munlock`: if any other `VM_LOCKED` VMA maps the page, mark it mlocked again.
fn try_to_munlock<'m>(cpu: &Cpu<'m>, mm: &Mm, st: &MmState, head: Pfn) {
    cpu.c().add(Ev::RmapWalk, 1);
    let index = cpu.m.phys.memmap.index(head);
    let mut found = locked_mapping_in(cpu, mm, st, head, index);
    for task in cpu.m.tasks() {
        if found {
            break;
        }
        if std::ptr::eq(task.mm.as_ref(), mm) {
            continue;
        }
        if let Some(other) = task.mm.lock.try_read() {
            found = locked_mapping_in(cpu, &task.mm, &other, head, index);
        }
    }
    if found {
        let mem = &cpu.m.phys.memmap;
        if !mem.test_and_set(head, PageFlag::Mlocked) {
            cpu.m
                .phys
                .mod_nr_mlock(cpu.c(), head, 1i64 << mem.order(head));
            cpu.c().add(Ev::NrMlockUpdate, 1);
        }
    }
}

fn locked_mapping_in<'m>(cpu: &Cpu<'m>, mm: &Mm, st: &MmState, head: Pfn, index: u64) -> bool {
    let pt = cpu.tables(mm);
    st.vmas
        .all()
        .into_iter()
        .map(|id| st.vmas.get(id))
        .any(|v| {
            if !v.flags.has(VmFlags::LOCKED) || index < v.pgoff {
                return false;
            }
            let addr = v.start + (index - v.pgoff) * 4096;
            addr < v.end
                && crate::pgtable::leaf_at(pt, addr)
                    .is_some_and(|l| cpu.m.phys.memmap.folio_of(l.pfn) == head)
        })
}
