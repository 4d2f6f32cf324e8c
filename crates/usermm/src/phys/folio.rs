//! Folio handles: [`Folio`].
//!
//! Linux counterpart: `struct folio *` (`include/linux/mm_types.h`) and its accessors in
//! `include/linux/mm.h`, `page-flags.h` and `page_ref.h` (`folio_pfn`, `folio_nr_pages`,
//! `folio_order`, `folio_test_large`, `folio_ref_add`, `folio_ref_count`, `folio_mapcount`,
//! `folio_large_mapcount`, `folio_entire_mapcount`, `folio_test_*` / `folio_set_*` /
//! `folio_clear_*`, `folio_test_anon`, `folio->mapping`, `folio->index`); `page_folio` and
//! `pfn_folio` give one.
//!
//! Deliberate differences from Linux:
//! - the engine has no folio structure in memory: the folio-wide fields live in the head
//!   frame's memmap words (see [`Memmap`]), so a [`Folio`] is the head [`Pfn`] together with
//!   the memmap it indexes. It is `Copy`, two words, and every method forwards to one
//!   [`Memmap`] accessor on the head with that accessor's atomic ordering: it is a naming
//!   device, not a cache, and costs what the calls on the head cost;
//! - `folio_mapping()` returns an `address_space *`; here [`Folio::mapping`] is the owner
//!   identifier the memmap keeps (the anon_vma root id or the shmem object id).

use super::memmap::{Memmap, PageFlag};
use super::Pfn;
use std::fmt;

/// A folio, named by its head frame (`struct folio *`). Obtained with [`Memmap::folio`]
/// (the head is known) or [`Memmap::page_folio`] (any page of it).
#[derive(Clone, Copy)]
pub struct Folio<'a> {
    memmap: &'a Memmap,
    head: Pfn,
}

impl fmt::Debug for Folio<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Folio({:#x})", self.head)
    }
}

impl Memmap {
    /// The folio whose head frame is `head` (`pfn_folio` of a head). `head` must not be a
    /// tail page: use [`Memmap::page_folio`] for any page.
    #[inline]
    pub fn folio(&self, head: Pfn) -> Folio<'_> {
        Folio { memmap: self, head }
    }

    /// The folio containing page `pfn` (`page_folio`): one read of the page's flags, and of
    /// its head link if it is a tail.
    #[inline]
    pub fn page_folio(&self, pfn: Pfn) -> Folio<'_> {
        self.folio(self.folio_of(pfn))
    }
}

impl<'a> Folio<'a> {
    /// The memmap the folio is described in.
    #[inline]
    pub(crate) fn memmap(self) -> &'a Memmap {
        self.memmap
    }

    /// The head frame (`folio_pfn`).
    #[inline]
    pub fn pfn(self) -> Pfn {
        self.head
    }

    /// The folio's last page (`folio_pfn + folio_nr_pages - 1`). Written as that sum, in that
    /// order, which is how the batch callers computed it (the code stays the same).
    #[inline]
    pub(crate) fn last_page(self) -> Pfn {
        self.head.add(self.nr_pages()).sub(1)
    }

    /// The folio's order (`folio_order`; 0 for a small folio).
    #[inline]
    pub fn order(self) -> u32 {
        self.memmap.order(self.head)
    }

    /// The number of pages (`folio_nr_pages`): `2^order`.
    #[inline]
    pub fn nr_pages(self) -> u64 {
        1u64 << self.order()
    }

    /// Whether the folio has more than one page (`folio_test_large`: the head flag).
    #[inline]
    pub fn is_large(self) -> bool {
        self.test(PageFlag::Head)
    }

    /// Whether the folio is anonymous (`folio_test_anon`).
    #[inline]
    pub fn is_anon(self) -> bool {
        self.test(PageFlag::Anon)
    }

    /// Tests a flag of the head (`folio_test_*`).
    #[inline]
    pub fn test(self, f: PageFlag) -> bool {
        self.memmap.test(self.head, f)
    }

    /// Sets a flag of the head (`folio_set_*`).
    #[inline]
    pub fn set(self, f: PageFlag) {
        self.memmap.set(self.head, f)
    }

    /// Clears a flag of the head (`folio_clear_*`).
    #[inline]
    pub fn clear(self, f: PageFlag) {
        self.memmap.clear(self.head, f)
    }

    /// Sets a flag of the head and returns whether it was set (`folio_test_set_*`).
    #[inline]
    pub(crate) fn test_and_set(self, f: PageFlag) -> bool {
        self.memmap.test_and_set(self.head, f)
    }

    /// Clears a flag of the head and returns whether it was set (`folio_test_clear_*`).
    #[inline]
    pub(crate) fn test_and_clear(self, f: PageFlag) -> bool {
        self.memmap.test_and_clear(self.head, f)
    }

    /// The reference count (`folio_ref_count`).
    #[inline]
    pub fn refcount(self) -> i32 {
        self.memmap.refcount(self.head)
    }

    /// Adds `n` references and returns the new count (`folio_ref_add_return`).
    #[inline]
    pub(crate) fn ref_add(self, n: i32) -> i32 {
        self.memmap.ref_add(self.head, n)
    }

    /// Drops `n` references and returns the new count (`folio_ref_sub_return`).
    #[inline]
    pub(crate) fn ref_sub(self, n: i32) -> i32 {
        self.memmap.ref_add(self.head, -n)
    }

    /// `folio_mapcount`: for a large folio its maintained total or, for one allocated without
    /// (the v6.7 design), the sum over its pages' PTE mappings plus its PMD mappings (a scan
    /// of the folio's memmap).
    #[inline]
    pub fn mapcount(self) -> i32 {
        self.memmap.folio_mapcount(self.head)
    }

    /// The maintained folio-wide mapcount of a large folio (`folio_large_mapcount`).
    #[inline]
    pub fn large_mapcount(self) -> i32 {
        self.memmap.large_mapcount(self.head)
    }

    /// Adds to the folio-wide mapcount and returns the new value.
    #[inline]
    pub(crate) fn large_mapcount_add(self, n: i32) -> i32 {
        self.memmap.large_mapcount_add(self.head, n)
    }

    /// The number of PMD mappings of a large folio (`folio_entire_mapcount`).
    #[inline]
    pub fn entire_mapcount(self) -> i32 {
        self.memmap.entire_mapcount(self.head)
    }

    /// Adds to the PMD mapcount and returns the new value.
    #[inline]
    pub(crate) fn entire_mapcount_add(self, n: i32) -> i32 {
        self.memmap.entire_mapcount_add(self.head, n)
    }

    /// Long-term pins of a large folio (`folio->_pincount`).
    #[inline]
    pub(crate) fn pincount(self) -> i32 {
        self.memmap.pincount(self.head)
    }

    /// The owner identifier (see the module docs: not an `address_space`).
    #[inline]
    pub(crate) fn mapping(self) -> u32 {
        self.memmap.mapping(self.head)
    }

    /// Sets the owner identifier.
    #[inline]
    pub(crate) fn set_mapping(self, v: u32) {
        self.memmap.set_mapping(self.head, v)
    }

    /// The page offset of the folio's first page in its file (`folio->index`).
    #[inline]
    pub(crate) fn index(self) -> u64 {
        self.memmap.index(self.head)
    }

    /// Sets `folio->index`.
    #[inline]
    pub(crate) fn set_index(self, index: u64) {
        self.memmap.set_index(self.head, index)
    }

    /// The folio's mlock_count (`folio->mlock_count`).
    #[inline]
    pub(crate) fn mlock_count(self) -> u32 {
        self.memmap.mlock_count(self.head)
    }

    /// Sets the mlock_count.
    #[inline]
    pub(crate) fn set_mlock_count(self, v: u32) {
        self.memmap.set_mlock_count(self.head, v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::phys::{FolioKind, PhysMem, Zeroing};
    use crate::stats::CpuCounters;

    #[test]
    fn a_folio_forwards_to_its_head() {
        let phys = PhysMem::new(16 << 20, 1);
        let c = CpuCounters::default();
        let head = phys
            .alloc_folio(&c, 4, 0, FolioKind::Anon, Zeroing::NoZero)
            .expect("folio");
        let mem = &phys.memmap;
        let f = mem.page_folio(head.add(5));
        assert_eq!(f.pfn(), head);
        assert_eq!(f.last_page(), head.add(15));
        assert_eq!((f.order(), f.nr_pages()), (4, 16));
        assert!(f.is_large() && f.is_anon());
        assert_eq!(f.ref_add(2), 3);
        assert_eq!(f.ref_sub(1), 2);
        assert_eq!(f.refcount(), mem.refcount(head));
        f.set(PageFlag::Dirty);
        assert!(mem.test(head, PageFlag::Dirty) && !mem.test(head.add(1), PageFlag::Dirty));
        assert!(f.test_and_clear(PageFlag::Dirty) && !f.test(PageFlag::Dirty));
        assert_eq!(f.entire_mapcount_add(1), 1);
        assert_eq!(f.large_mapcount_add(1), 1);
        assert_eq!((f.entire_mapcount(), f.large_mapcount()), (1, 1));
        assert_eq!(f.mapcount(), mem.folio_mapcount(head));
        f.set_index(7);
        f.set_mapping(9);
        assert_eq!((f.index(), f.mapping()), (7, 9));
        assert_eq!(format!("{f:?}"), format!("Folio({head:#x})"));
        let small = phys
            .alloc_folio(&c, 0, 0, FolioKind::File, Zeroing::NoZero)
            .expect("folio");
        let s = mem.folio(small);
        assert!(!s.is_large() && !s.is_anon() && s.nr_pages() == 1);
    }
}
