//! The old guesses: `estimate` (the first page's mapcount) and `mapcount` (the same, improved
//! by a folio-wide total mapcount).
//!
//! Linux counterparts: `folio_estimated_sharers()` (≈ v6.3–v6.8: the first page's mapcount
//! alone, the seed's baseline) and `folio_likely_mapped_shared()` (≈ v6.9–v6.14, seed 003
//! patches 1-3), which the total mapcount gives two exact shortcuts: a total of at most one is
//! exclusive; a PMD mapping beside any other mapping, or more mappings than pages, is shared;
//! otherwise the first page still decides.
//!
//! Their error is one-sided the other way from the trackers: for anon folios they never say
//! "shared" wrongly (two mappings of one anon page are two MMs), but they say "exclusive"
//! wrongly whenever the first page is not mapped by every sharer (COWed or unmapped in one of
//! them). They are therefore unusable for COW reuse; the engine copies instead.

use crate::phys::Folio;

/// `folio_estimated_sharers() > 1` (v6.7) for a large anon folio: the first page is mapped
/// more than once (by PTE or by PMD).
pub fn estimated_shared(folio: Folio<'_>) -> bool {
    let (mem, head) = (folio.memmap(), folio.pfn());
    mem.mapcount(head) + mem.entire_mapcount(head) > 1
}

/// `folio_likely_mapped_shared` (v6.9–v6.14) for a large anon folio.
pub fn likely_mapped_shared(folio: Folio<'_>) -> bool {
    let (mem, head) = (folio.memmap(), folio.pfn());
    let total = mem.folio_mapcount(head);
    if total <= 1 {
        return false;
    }
    if mem.entire_mapcount(head) > 0 || total > 1 << mem.order(head) {
        return true;
    }
    mem.mapcount(head) > 1
}
