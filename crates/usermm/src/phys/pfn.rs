//! Page frame numbers: [`Pfn`].
//!
//! Linux counterpart: the `unsigned long pfn` that names a physical frame throughout `mm/`
//! (`page_to_pfn` / `pfn_to_page`, `folio_pfn` / `pfn_folio`, `pte_pfn`, `pmd_pfn`). The engine
//! used a bare `u64` for it, the same type as an address, a page-table entry, a byte count or a
//! page offset in a file; a [`Pfn`] cannot be mixed up with any of them. It is a
//! `#[repr(transparent)]` wrapper of the frame number and its methods are `#[inline]`, so it
//! compiles to the same code as the `u64`.
//!
//! Deliberate differences from Linux:
//! - there is no `struct page *` to convert to: the memmap is indexed by the frame number
//!   itself ([`Memmap`](super::Memmap) takes a [`Pfn`] where Linux takes a page or folio
//!   pointer), and a folio is named by its head frame (a [`Folio`](super::Folio) pairs it
//!   with the memmap);
//! - the arithmetic Linux writes inline (`pfn + i`, `pfn - folio_pfn(folio)`,
//!   `IS_ALIGNED(pfn, nr)`, `ALIGN_DOWN(pfn, nr)`) is a method each ([`Pfn::add`],
//!   [`Pfn::offset_from`], [`Pfn::is_aligned`], [`Pfn::align_down`]), so the raw number is
//!   taken out ([`Pfn::val`]) only where a frame number is really wanted as a number: in an
//!   entry's bits, in the memmap's 32-bit link words, and in dumps.

use std::fmt;

/// A page frame number: the index of a 4 KiB frame of simulated physical memory (Linux's
/// `unsigned long pfn`). Frames are numbered from 0 over all nodes.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Pfn(u64);

impl Pfn {
    /// The frame numbered `v`.
    #[inline]
    pub const fn new(v: u64) -> Pfn {
        Pfn(v)
    }

    /// The frame number.
    #[inline]
    pub const fn val(self) -> u64 {
        self.0
    }

    /// The frame number as an index into per-frame arrays (the memmap, the arena, the side
    /// tables of the sharing trackers).
    #[inline]
    pub const fn as_index(self) -> usize {
        self.0 as usize
    }

    /// The frame a 32-bit memmap word names (a tail page's head, a free-list or LRU link):
    /// the memmap keeps frame numbers in 32 bits, which covers 16 TiB of simulated RAM.
    #[inline]
    pub(crate) const fn from_u32(v: u32) -> Pfn {
        Pfn(v as u64)
    }

    /// The frame number truncated to the memmap's 32-bit words (see [`Pfn::from_u32`]).
    #[inline]
    pub(crate) const fn as_u32(self) -> u32 {
        self.0 as u32
    }

    /// The frame `n` frames further (`pfn + n`).
    #[inline]
    #[must_use]
    #[allow(clippy::should_implement_trait)] // a method, not `+`: pfn + pfn is meaningless
    pub const fn add(self, n: u64) -> Pfn {
        Pfn(self.0 + n)
    }

    /// The frame `n` frames before (`pfn - n`).
    #[inline]
    #[must_use]
    #[allow(clippy::should_implement_trait)] // see `add`
    pub const fn sub(self, n: u64) -> Pfn {
        Pfn(self.0 - n)
    }

    /// How many frames `self` lies after `base` (`pfn - folio_pfn(folio)`, the page's index in
    /// its folio). `base` must not lie after `self`.
    #[inline]
    pub const fn offset_from(self, base: Pfn) -> u64 {
        self.0 - base.0
    }

    /// Whether the frame is the first of a naturally aligned block of `2^order` frames
    /// (`IS_ALIGNED(pfn, 1 << order)`).
    #[inline]
    pub const fn is_aligned(self, order: u32) -> bool {
        self.0 & ((1u64 << order) - 1) == 0
    }

    /// The first frame of the naturally aligned block of `2^order` frames that holds this one
    /// (`ALIGN_DOWN(pfn, 1 << order)`).
    #[inline]
    #[must_use]
    pub const fn align_down(self, order: u32) -> Pfn {
        Pfn(self.0 & !((1u64 << order) - 1))
    }

    /// The frame whose number differs from this one in bit `order` only: the buddy of a
    /// free block of `2^order` frames (`__find_buddy_pfn`).
    #[inline]
    #[must_use]
    pub(crate) const fn buddy(self, order: u32) -> Pfn {
        Pfn(self.0 ^ (1u64 << order))
    }

    /// The frames `self .. self + nr`, in order (a folio's pages, a block's frames).
    #[inline]
    pub fn range(self, nr: u64) -> impl DoubleEndedIterator<Item = Pfn> + Clone {
        (self.0..self.0 + nr).map(Pfn)
    }

    /// The frames `self .. end`, in order.
    #[inline]
    pub fn range_to(self, end: Pfn) -> impl DoubleEndedIterator<Item = Pfn> + Clone {
        (self.0..end.0).map(Pfn)
    }
}

impl fmt::Debug for Pfn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Pfn({:#x})", self.0)
    }
}

/// `{:x}` / `{:#x}` print the frame number, as for the `u64` it replaced.
impl fmt::LowerHex for Pfn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::LowerHex::fmt(&self.0, f)
    }
}

/// `{}` prints the frame number in decimal, as for the `u64` it replaced.
impl fmt::Display for Pfn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// A swap entry (`swp_entry_t` of swap type 0, the one swap device a machine has): the
/// slot of the device holding a swapped-out page. Slot 0 is the device's header and never
/// names a page, so a swap PTE is never the empty entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct SwpEntry(u64);

impl SwpEntry {
    /// The entry of slot `offset` (`swp_entry(0, offset)`).
    #[inline]
    pub(crate) const fn new(offset: u64) -> SwpEntry {
        SwpEntry(offset)
    }

    /// The slot (`swp_offset`).
    #[inline]
    pub const fn offset(self) -> u64 {
        self.0
    }

    /// The entry `n` slots further on (the slot of a large folio's `n`th page).
    #[inline]
    pub(crate) const fn add(self, n: u64) -> SwpEntry {
        SwpEntry(self.0 + n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pfn_is_a_word_with_frame_arithmetic() {
        assert_eq!(std::mem::size_of::<Pfn>(), 8);
        let p = Pfn::new(0x1234);
        assert_eq!(format!("{p:?} {p:#x} {p}"), "Pfn(0x1234) 0x1234 4660");
        assert_eq!(p.add(3).offset_from(p), 3);
        assert_eq!(p.add(3).sub(3), p);
        assert_eq!(p.align_down(9), Pfn::new(0x1200));
        assert!(Pfn::new(0x1200).is_aligned(9) && !p.is_aligned(9) && p.is_aligned(2));
        assert_eq!(Pfn::new(0x1200).buddy(9), Pfn::new(0x1000));
        assert_eq!(p.range(2).collect::<Vec<_>>(), [p, p.add(1)]);
        assert_eq!(p.range_to(p.add(2)).count(), 2);
        assert_eq!(Pfn::from_u32(p.as_u32()), p);
        assert!(p < p.add(1));
    }
}
