//! The old guess (`estimate`): the mapcount of the folio's first page.
//!
//! Linux counterpart: `folio_estimated_sharers()` (≈ v6.3–v6.8), renamed
//! `folio_likely_mapped_shared()` and, once the folio-wide mapcount existed (≈ v6.11), given
//! two exact shortcuts. This is the v6.11 form: a total mapcount of at most one is exclusive;
//! a PMD mapping beside any other mapping, or more mappings than pages, is shared; otherwise
//! the first page decides (mapped more than once: shared). Seed 003 replaced it.
//!
//! Its error is one-sided the other way from the trackers: for anon folios it never says
//! "shared" wrongly (two mappings of one anon page are two MMs), but it says "exclusive"
//! wrongly whenever the first page is not mapped by every sharer (COWed or unmapped in one of
//! them). It is therefore unusable for COW reuse; the engine copies instead.

use crate::phys::Memmap;

/// `folio_likely_mapped_shared` for a large anon folio.
pub fn likely_mapped_shared(mem: &Memmap, head: u64) -> bool {
    let total = mem.large_mapcount(head);
    if total <= 1 {
        return false;
    }
    if mem.entire_mapcount(head) > 0 || total > 1 << mem.order(head) {
        return true;
    }
    mem.mapcount(head) > 1
}
