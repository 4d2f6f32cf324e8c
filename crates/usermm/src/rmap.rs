//! Reverse-map bookkeeping: mapcounts, PageAnonExclusive and the refcounts mappings hold.
//!
//! Linux counterpart: `mm/rmap.c` and `include/linux/rmap.h` (`folio_add_new_anon_rmap`,
//! `folio_try_dup_anon_rmap_ptes`, `folio_remove_rmap_ptes`, the `_pmd` variants). Every
//! page-table entry that maps a page holds one folio reference and one mapcount. A large folio
//! also keeps a folio-wide mapcount (`large_mapcount`, PTE and PMD mappings each count one) and
//! the number of PMD mappings (`entire_mapcount`); the per-page mapcount of a page is its own
//! PTE mappings plus the folio's PMD mappings (`folio_precise_page_mapcount`). APIs are
//! batch-first: `_ptes(nr)` with the single case being `nr = 1`.
//!
//! The rmap walk itself (anon_vma trees) is not modelled: nothing in the engine needs to find
//! the mappings of a page from the page (no reclaim or migration); anon_vma identities are kept
//! because they decide VMA merging.

use crate::phys::{Folio, PageFlag, Pfn, PhysMem};
use crate::sharing::Plain;
use crate::stats::{CpuCounters, Ev};
use std::num::NonZeroU32;

/// The identity of an anon_vma (`struct anon_vma *`): what a VMA's `anon_vma` names and
/// what an anonymous folio's mapping word records (`folio->mapping` with `PAGE_MAPPING_ANON`).
///
/// Deliberate differences from Linux: there is no anon_vma object (no interval tree, no
/// root, no refcount: see the module docs), only its number, which merge compares and the
/// folio keeps. The number is 32 bits because the memmap's mapping word is: ids are handed
/// out by `Machine::alloc_anon_vma`, which checks that they fit (a panic past `u32::MAX`,
/// where a cast would wrap to 0 or to an id in use), so [`AnonVmaId::mapping_word`] never
/// truncates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct AnonVmaId(NonZeroU32);

impl AnonVmaId {
    /// The id numbered `n`; `None` for 0, which the memmap and `Vma` use for "none".
    #[inline]
    pub(crate) fn new(n: u32) -> Option<AnonVmaId> {
        NonZeroU32::new(n).map(AnonVmaId)
    }

    /// The anon_vma an anonymous folio's mapping word names (`folio_anon_vma`); `None` for a
    /// folio that has none yet (a swap-cache folio read in but not mapped).
    #[inline]
    pub(crate) fn of_mapping_word(word: u32) -> Option<AnonVmaId> {
        AnonVmaId::new(word)
    }

    /// The value stored in an anonymous folio's mapping word (the same number: ids are 32
    /// bits from allocation on, so nothing is cut here).
    #[inline]
    pub(crate) fn mapping_word(self) -> u32 {
        self.0.get()
    }
}

/// Refcount bias of a long-term pin on a small folio (`GUP_PIN_COUNTING_BIAS`).
pub(crate) const GUP_PIN_COUNTING_BIAS: i32 = 1024;

/// MM owner tracking of large folios (`CONFIG_MM_ID`, Linux 6.15+): two slots, each an mm id
/// with that mm's number of mappings, and a "maybe mapped shared" bit that is cleared only when
/// one tracked slot provably owns every mapping. Stored in the folio's auxiliary words.
pub mod owner {
    use crate::phys::Folio;

    const ID0: usize = 0;
    const CNT0: usize = 1;
    const ID1: usize = 2;
    const CNT1: usize = 3;
    const SHARED: usize = 4;

    fn slot(folio: Folio<'_>, i: usize) -> (u32, i32) {
        let (m, head) = (folio.memmap(), folio.pfn());
        (
            m.folio_aux(head, if i == 0 { ID0 } else { ID1 }),
            m.folio_aux(head, if i == 0 { CNT0 } else { CNT1 }) as i32,
        )
    }

    fn set_slot(folio: Folio<'_>, i: usize, id: u32, cnt: i32) {
        let (m, head) = (folio.memmap(), folio.pfn());
        m.set_folio_aux(head, if i == 0 { ID0 } else { ID1 }, id);
        m.set_folio_aux(head, if i == 0 { CNT0 } else { CNT1 }, cnt as u32);
    }

    /// `folio_maybe_mapped_shared` for a large folio (a single mapping is never shared).
    pub fn maybe_mapped_shared(folio: Folio<'_>) -> bool {
        folio.memmap().folio_aux(folio.pfn(), SHARED) != 0 && folio.large_mapcount() > 1
    }

    /// The two slots (for views and validation).
    pub fn slots(folio: Folio<'_>) -> [(u32, i32); 2] {
        [slot(folio, 0), slot(folio, 1)]
    }

    /// Records `diff` new mappings by mm `mm`; `total` is the folio's mapcount after them.
    pub fn map(folio: Folio<'_>, mm: u32, diff: i32, total: i32) {
        for i in 0..2 {
            let (id, cnt) = slot(folio, i);
            if id == mm {
                set_slot(folio, i, id, cnt + diff);
                return;
            }
        }
        for i in 0..2 {
            if slot(folio, i).0 == 0 {
                set_slot(folio, i, mm, diff);
                if i == 1 || total != diff {
                    folio.memmap().set_folio_aux(folio.pfn(), SHARED, 1);
                }
                return;
            }
        }
        folio.memmap().set_folio_aux(folio.pfn(), SHARED, 1);
    }

    /// Records `diff` removed mappings of mm `mm`; `total` is the mapcount after the removal.
    pub fn unmap(folio: Folio<'_>, mm: u32, diff: i32, total: i32) {
        for i in 0..2 {
            let (id, cnt) = slot(folio, i);
            if id == mm {
                if cnt - diff >= 1 {
                    set_slot(folio, i, id, cnt - diff);
                    return;
                }
                set_slot(folio, i, 0, 0);
            }
        }
        if (0..2).any(|i| slot(folio, i).1 == total) {
            folio.memmap().set_folio_aux(folio.pfn(), SHARED, 0);
        }
    }

    /// Resets the tracking of a folio being allocated.
    pub fn reset(folio: Folio<'_>) {
        for i in 0..crate::phys::memmap::AUX_WORDS {
            folio.memmap().set_folio_aux(folio.pfn(), i, 0);
        }
    }
}

/// Updates the PTE mapcounts of `page.range(nr)` by `delta`: one atomic add each, or plain
/// load+store pairs inside an exclusively held rmap seqcount (seed 003 stage "all").
fn page_mapcounts(phys: &PhysMem, c: &CpuCounters, page: Pfn, nr: u64, delta: i32, plain: Plain) {
    let mm = &phys.memmap;
    match plain {
        Plain::Yes => {
            for p in page.range(nr) {
                mm.mapcount_add_plain(p, delta);
            }
        }
        Plain::No => {
            for p in page.range(nr) {
                mm.mapcount_add(p, delta);
            }
            count_map(c, nr);
        }
    }
}

/// One rmap operation on a folio: `delta` mappings by `mm_id` (negative: removed), with the
/// per-page updates `pages`. For a large folio this maintains the memmap counts it was
/// allocated with (total mapcount; owner slots under `folio_lock_large_mapcount`) and, for
/// anon folios, the selected side-table tracker.
fn folio_rmap(
    phys: &PhysMem,
    c: &CpuCounters,
    folio: Folio<'_>,
    mm_id: u32,
    delta: i32,
    pages: impl FnOnce(Plain),
) {
    let head = folio.pfn();
    if !folio.is_large() {
        pages(Plain::No);
        return;
    }
    if folio.test(PageFlag::OwnerTracked) {
        // `CONFIG_MM_ID`: one locked operation (the bit lock); the total and the owner slots
        // are plain reads and sets under it, and the unlock is a plain store.
        let guard = phys.memmap.lock_large_mapcount(head);
        let total = phys.memmap.large_mapcount_add_locked(&guard, head, delta);
        if delta > 0 {
            owner::map(folio, mm_id, delta, total);
        } else {
            owner::unmap(folio, mm_id, -delta, total);
        }
        drop(guard);
        c.add(Ev::FolioAtomic, 1);
    } else if folio.test(PageFlag::TotalMapcount) {
        folio.large_mapcount_add(delta);
        count_map(c, 1);
    }
    if folio.is_anon() && folio.test(PageFlag::SharingRecord) {
        let n = phys
            .sharing
            .update(head, folio.order(), mm_id, i64::from(delta), pages);
        c.add(Ev::FolioAtomic, u64::from(n));
    } else {
        pages(Plain::No);
    }
}

/// Mapping level.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Level {
    /// Mapped by PTEs.
    Pte,
    /// Mapped by one PMD.
    Pmd,
}

#[inline]
fn count_ref(c: &CpuCounters) {
    c.add(Ev::FolioAtomic, 1);
    c.add(Ev::RefcountAtomic, 1);
}

#[inline]
fn count_map(c: &CpuCounters, n: u64) {
    c.add(Ev::FolioAtomic, n);
    c.add(Ev::MapcountAtomic, n);
}

/// Debug builds: the checks Linux makes with `VM_WARN_ON_FOLIO` at the entry of its rmap
/// batch functions (`__folio_rmap_sanity_checks`): `head` is a folio's head, not a tail;
/// `[page, page + nr)` is a non-empty range of that folio; the folio holds a reference.
/// Beside `validate()`, which checks the whole state between steps, these catch a bad call
/// where it is made. Release builds compile them out.
#[inline]
fn folio_rmap_sanity_checks(folio: Folio<'_>, page: Pfn, nr: u64) {
    if !cfg!(debug_assertions) {
        return;
    }
    let head = folio.pfn();
    debug_assert_eq!(
        folio.memmap().folio_of(head),
        head,
        "rmap on tail page {head:#x}"
    );
    let size = if folio.is_large() {
        folio.nr_pages()
    } else {
        1
    };
    debug_assert!(
        nr >= 1 && page >= head && page.add(nr) <= head.add(size),
        "rmap of pages {page:#x}+{nr} outside folio {head:#x} of {size} pages"
    );
    debug_assert!(
        folio.refcount() > 0,
        "rmap on folio {head:#x} without a reference"
    );
}

/// Adds `n` folio references (one atomic).
///
/// # Context
/// Any; the caller holds a reference or the PTL of an entry that maps the folio.
#[inline]
pub(crate) fn folio_ref_add(c: &CpuCounters, folio: Folio<'_>, n: i32) {
    count_ref(c);
    folio.ref_add(n);
}

/// Maps a freshly allocated anon folio exclusively: its first `nr` pages by PTEs, or the
/// whole folio by a PMD. Sets PageAnonExclusive and the folio's anon_vma. The folio's initial
/// reference must already be adjusted by the caller to one per mapping.
///
/// # Context
/// The PTL (or, for a PMD, the PMD lock) of the table the new entries go into; the folio is
/// not yet visible to any other walker.
pub(crate) fn add_new_anon(
    phys: &PhysMem,
    c: &CpuCounters,
    folio: Folio<'_>,
    nr: u64,
    level: Level,
    anon_vma: AnonVmaId,
    mm_id: u32,
) {
    let head = folio.pfn();
    folio_rmap_sanity_checks(folio, head, nr);
    let mm = folio.memmap();
    folio.set_mapping(anon_vma.mapping_word());
    let large = folio.is_large();
    let maps = match level {
        Level::Pte => {
            for p in head.range(nr) {
                mm.new_anon_page(p);
            }
            count_map(c, nr);
            nr
        }
        Level::Pmd => {
            folio.entire_mapcount_add(1);
            folio.set(PageFlag::AnonExclusive);
            count_map(c, 1);
            1
        }
    };
    if large {
        // `folio_set_large_mapcount`: the counter of a fresh folio is zero, so adding sets it.
        if folio.test(PageFlag::TotalMapcount) {
            folio.large_mapcount_add(maps as i32);
            count_map(c, 1);
        }
        if folio.test(PageFlag::OwnerTracked) {
            owner::reset(folio);
            owner::map(folio, mm_id, maps as i32, maps as i32);
        }
        if phys.sharing.on_new(head, folio.order(), mm_id, maps) {
            folio.set(PageFlag::SharingRecord);
        }
    }
}

/// Adds PTE mappings of existing pages (shmem, or a split): mapcounts only.
///
/// # Context
/// The PTL of the table the entries are written to (a split: the PMD lock, the new table
/// still unlinked); takes the folio's owner bit lock or rmap seqcount as the tracker needs.
pub(crate) fn add_ptes(
    phys: &PhysMem,
    c: &CpuCounters,
    folio: Folio<'_>,
    page: Pfn,
    nr: u64,
    mm_id: u32,
) {
    folio_rmap_sanity_checks(folio, page, nr);
    folio_rmap(phys, c, folio, mm_id, nr as i32, |plain| {
        page_mapcounts(phys, c, page, nr, 1, plain)
    });
}

/// Whether a folio may be pinned (`folio_maybe_dma_pinned`).
///
/// # Context
/// Any; the answer is a snapshot (a pin taken afterwards needs the mmap lock for writing
/// in fork's case, which the caller holds).
pub(crate) fn folio_maybe_dma_pinned(folio: Folio<'_>) -> bool {
    if folio.is_large() {
        folio.pincount() > 0
    } else {
        folio.refcount() >= GUP_PIN_COUNTING_BIAS
    }
}

/// The duplicate could not be shared because the page may be pinned: copy it instead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MaybePinned;

/// Duplicates `nr` PTE mappings of anon pages for a fork child
/// (`folio_try_dup_anon_rmap_ptes`): fails without side effects if the folio may be pinned
/// and any page is exclusive; otherwise clears PageAnonExclusive and raises mapcounts.
///
/// # Context
/// Both mms' mmap locks for writing; the child's PTE table locked, then the parent's
/// (`PteCopy`).
pub(crate) fn try_dup_anon_ptes(
    phys: &PhysMem,
    c: &CpuCounters,
    folio: Folio<'_>,
    page: Pfn,
    nr: u64,
    needs_cow_for_dma: bool,
    dst_mm: u32,
) -> Result<(), MaybePinned> {
    folio_rmap_sanity_checks(folio, page, nr);
    let mm = folio.memmap();
    if needs_cow_for_dma
        && folio_maybe_dma_pinned(folio)
        && (page.range(nr)).any(|p| mm.test(p, PageFlag::AnonExclusive))
    {
        return Err(MaybePinned);
    }
    folio_rmap(phys, c, folio, dst_mm, nr as i32, |plain| {
        // One pass over the pages' memmap entries, as `__folio_try_dup_anon_rmap`: each page
        // loses PageAnonExclusive and gains a mapcount, in one add on one word (the memmap's
        // docs say why); the counters count Linux's two RMWs.
        let cleared: u64 = match plain {
            Plain::Yes => page
                .range(nr)
                .map(|p| u64::from(mm.dup_anon_page_plain(p)))
                .sum(),
            Plain::No => page.range(nr).map(|p| u64::from(mm.dup_anon_page(p))).sum(),
        };
        c.add(Ev::FolioAtomic, cleared);
        if plain == Plain::No {
            count_map(c, nr);
        }
    });
    Ok(())
}

/// Duplicates a PMD mapping for a fork child (`folio_try_dup_anon_rmap_pmd`).
///
/// # Context
/// Both mms' mmap locks for writing; the child's PMD lock, then the parent's.
pub(crate) fn try_dup_anon_pmd(
    phys: &PhysMem,
    c: &CpuCounters,
    folio: Folio<'_>,
    needs_cow_for_dma: bool,
    dst_mm: u32,
) -> Result<(), MaybePinned> {
    folio_rmap_sanity_checks(folio, folio.pfn(), 1);
    if needs_cow_for_dma && folio_maybe_dma_pinned(folio) && folio.test(PageFlag::AnonExclusive) {
        return Err(MaybePinned);
    }
    folio.clear(PageFlag::AnonExclusive);
    folio.entire_mapcount_add(1);
    count_map(c, 1);
    folio_rmap(phys, c, folio, dst_mm, 1, |_| {});
    Ok(())
}

/// Removes `nr` PTE mappings (`folio_remove_rmap_ptes`). References are dropped separately,
/// after the TLB flush, by the mmu_gather.
///
/// # Context
/// The PTL of the table the entries were cleared from.
pub(crate) fn remove_ptes(
    phys: &PhysMem,
    c: &CpuCounters,
    folio: Folio<'_>,
    page: Pfn,
    nr: u64,
    mm_id: u32,
) {
    folio_rmap_sanity_checks(folio, page, nr);
    folio_rmap(phys, c, folio, mm_id, -(nr as i32), |plain| {
        page_mapcounts(phys, c, page, nr, -1, plain)
    });
}

/// Adds a PMD mapping of an existing page-cache folio (`folio_add_file_rmap_pmd`).
///
/// # Context
/// The PMD lock of the table the leaf is written to.
pub(crate) fn add_file_pmd(phys: &PhysMem, c: &CpuCounters, folio: Folio<'_>, mm_id: u32) {
    folio.entire_mapcount_add(1);
    count_map(c, 1);
    folio_rmap(phys, c, folio, mm_id, 1, |_| {});
}

/// Removes a PMD mapping (`folio_remove_rmap_pmd`).
///
/// # Context
/// The PMD lock of the table the leaf was cleared from.
pub(crate) fn remove_pmd(phys: &PhysMem, c: &CpuCounters, folio: Folio<'_>, mm_id: u32) {
    folio.entire_mapcount_add(-1);
    count_map(c, 1);
    folio_rmap(phys, c, folio, mm_id, -1, |_| {});
}

/// The precise mapcount of one page: its PTE mappings plus the folio's PMD mappings.
///
/// # Context
/// Any; exact only when no CPU is changing the folio's mappings.
pub(crate) fn page_mapcount(phys: &PhysMem, page: Pfn) -> i32 {
    let mm = &phys.memmap;
    let folio = mm.page_folio(page);
    let entire = if folio.is_large() {
        folio.entire_mapcount()
    } else {
        0
    };
    mm.mapcount(page) + entire
}
