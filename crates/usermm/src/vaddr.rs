//! User virtual addresses: [`VirtAddr`].
//!
//! Linux counterpart: the `unsigned long addr` (`address`, `start`, `end`, `haddr`) that
//! `mm/` passes between the page-table walkers, zap, fork's copy, the fault handler and the
//! THP code, with the macros that do its arithmetic: `PAGE_ALIGN_DOWN` (`PAGE_ALIGN` rounds
//! the system calls' lengths, which stay `u64`), `ALIGN_DOWN`, `pmd_addr_end`, `pte_index`,
//! `pmd_index`, `pud_index`, `pgd_index` and `linear_page_index` (here [`Vma::pgoff_at`](crate::vma::Vma::pgoff_at)). The engine used a
//! bare `u64` for it, the same type as a frame number, a byte count, a page offset in a file
//! and a page-table entry; a [`VirtAddr`] cannot be mixed up with any of them. It is a
//! `#[repr(transparent)]` wrapper of the address and its methods are `#[inline]`, so it
//! compiles to the same code as the `u64`.
//!
//! Deliberate differences from Linux:
//! - the type is internal to the engine, used where an address crosses from one of its
//!   modules to another (the page-table cursor and walkers, zap, fork's copy, the fault
//!   context, the THP code, the TLB flush, the madvise/mprotect/mlock/mremap walkers). The
//!   system calls ([`Cpu::mmap`](crate::Cpu::mmap) and the others), their arguments, the views
//!   and the MMU model's accessors keep plain `u64` addresses, and so does the VMA layer: the
//!   VMA tree (the `maple` crate is keyed by `u64`), the split and merge code and the VMA
//!   bodies' `start` / `end` fields, read as addresses through
//!   [`Vma::vm_start`](crate::vma::Vma::vm_start) and [`Vma::vm_end`](crate::vma::Vma::vm_end).
//!   An address becomes a [`VirtAddr`] ([`VirtAddr::new`]) where VMA-level code hands a range
//!   to a walker;
//! - the arithmetic Linux writes inline (`addr + PAGE_SIZE`, `end - addr`,
//!   `addr & HPAGE_PMD_MASK`, `(addr >> PAGE_SHIFT) & (PTRS_PER_PTE - 1)`) is a method each
//!   ([`VirtAddr::add`], [`VirtAddr::offset_from`], [`VirtAddr::pmd_align_down`],
//!   [`VirtAddr::pte_index`]), so the raw number is taken out ([`VirtAddr::val`]) only where an
//!   address is really wanted as a number: a VMA tree lookup, the views' and validation's
//!   `u64` results, and the TLB's and the NUMA interleave's page numbers ([`VirtAddr::vpn`]).

use std::fmt;

/// Bytes in a page (`PAGE_SIZE`).
const PAGE_SIZE: u64 = 4096;

// The geometry of the 4-level address space (`asm/pgtable_64_types.h`); the page tables
// re-export it (`crate::pgtable::PMD_SIZE`), an address computes with it.

/// Entries per table.
pub(crate) const PTRS_PER_TABLE: usize = 512;
/// Bytes mapped by one PMD entry.
pub(crate) const PMD_SIZE: u64 = 1 << 21;
/// Bytes mapped by one PUD entry.
pub(crate) const PUD_SIZE: u64 = 1 << 30;
/// Bytes mapped by one PGD entry.
pub const PGD_SIZE: u64 = 1 << 39;
/// Top of the user address space (47-bit, like x86-64 4-level and arm64 48-bit VA minus a page).
pub const TASK_SIZE: u64 = (1 << 47) - 4096;

/// Shift of each level, top first.
pub(crate) const LEVEL_SHIFTS: [u32; 4] = [39, 30, 21, 12];

/// A user virtual address (Linux's `unsigned long addr` of a user mapping).
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub(crate) struct VirtAddr(u64);

impl VirtAddr {
    /// The address `v`.
    #[inline]
    pub(crate) const fn new(v: u64) -> VirtAddr {
        VirtAddr(v)
    }

    /// The address as a number.
    #[inline]
    pub(crate) const fn val(self) -> u64 {
        self.0
    }

    /// The address `bytes` further (`addr + size`).
    #[inline]
    #[must_use]
    #[allow(clippy::should_implement_trait)] // a method, not `+`: addr + addr is meaningless
    pub(crate) const fn add(self, bytes: u64) -> VirtAddr {
        VirtAddr(self.0 + bytes)
    }

    /// The address `bytes` before (`addr - size`).
    #[inline]
    #[must_use]
    #[allow(clippy::should_implement_trait)] // see `add`
    pub(crate) const fn sub(self, bytes: u64) -> VirtAddr {
        VirtAddr(self.0 - bytes)
    }

    /// How many bytes `self` lies after `base` (`end - start`, `addr - vma->vm_start`).
    /// `base` must not lie after `self`.
    #[inline]
    pub(crate) const fn offset_from(self, base: VirtAddr) -> u64 {
        self.0 - base.0
    }

    /// The start of the naturally aligned block of `size` bytes (a power of two) that holds
    /// the address (`ALIGN_DOWN(addr, size)`).
    #[inline]
    #[must_use]
    pub(crate) const fn align_down(self, size: u64) -> VirtAddr {
        VirtAddr(self.0 & !(size - 1))
    }

    /// The start of the address's page (`PAGE_ALIGN_DOWN`, `addr & PAGE_MASK`).
    #[inline]
    #[must_use]
    pub(crate) const fn page_align_down(self) -> VirtAddr {
        self.align_down(PAGE_SIZE)
    }

    /// The start of the 2 MiB a PMD entry maps that holds the address
    /// (`addr & HPAGE_PMD_MASK`: the `haddr` of the THP code).
    #[inline]
    #[must_use]
    pub(crate) const fn pmd_align_down(self) -> VirtAddr {
        self.align_down(PMD_SIZE)
    }

    /// Whether the address starts a PMD entry's 2 MiB.
    #[inline]
    pub(crate) const fn is_pmd_aligned(self) -> bool {
        self.0 & (PMD_SIZE - 1) == 0
    }

    /// The end of the PMD entry's span holding the address, clipped to `end`
    /// (`pmd_addr_end(addr, end)`): one step of a walk of `[addr, end)`.
    #[inline]
    #[must_use]
    pub(crate) fn pmd_addr_end(self, end: VirtAddr) -> VirtAddr {
        VirtAddr((self.0 & !(PMD_SIZE - 1)) + PMD_SIZE).min(end)
    }

    /// The first address past the naturally aligned block of `size` bytes that holds this
    /// one, or the top of the address space if none is (the unclipped boundary of
    /// `p?d_addr_end`, for skipping an empty upper-level entry).
    #[inline]
    #[must_use]
    pub(crate) const fn next_boundary(self, size: u64) -> VirtAddr {
        VirtAddr((self.0 & !(size - 1)).saturating_add(size))
    }

    /// The virtual page number (`addr >> PAGE_SHIFT`): the TLB's tag and the NUMA
    /// interleave's index.
    #[inline]
    pub(crate) const fn vpn(self) -> u64 {
        self.0 >> 12
    }

    /// The address's index in the table at the level whose entries map `1 << shift` bytes.
    #[inline]
    const fn table_index(self, shift: u32) -> usize {
        ((self.0 >> shift) & 511) as usize
    }

    /// The address's entry in its PTE table (`pte_index`).
    #[inline]
    pub(crate) const fn pte_index(self) -> usize {
        self.table_index(12)
    }

    /// The address's entry in its PMD table (`pmd_index`).
    #[inline]
    pub(crate) const fn pmd_index(self) -> usize {
        self.table_index(21)
    }

    /// The address's entry in its PUD table (`pud_index`).
    #[inline]
    pub(crate) const fn pud_index(self) -> usize {
        self.table_index(30)
    }

    /// The address's entry in the PGD (`pgd_index`).
    #[inline]
    pub(crate) const fn pgd_index(self) -> usize {
        self.table_index(39)
    }
}

impl fmt::Debug for VirtAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "VirtAddr({:#x})", self.0)
    }
}

/// `{:x}` / `{:#x}` print the address, as for the `u64` it replaced.
impl fmt::LowerHex for VirtAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::LowerHex::fmt(&self.0, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn virt_addr_is_a_word_with_address_arithmetic() {
        assert_eq!(std::mem::size_of::<VirtAddr>(), 8);
        let a = VirtAddr::new(0x7f12_3456_7abc);
        assert_eq!(
            format!("{a:?} {a:#x}"),
            "VirtAddr(0x7f1234567abc) 0x7f1234567abc"
        );
        assert_eq!(a.add(4).offset_from(a), 4);
        assert_eq!(a.add(4).sub(4), a);
        assert_eq!(a.vpn(), 0x0007_f123_4567);
        assert_eq!(a.page_align_down(), VirtAddr::new(0x7f12_3456_7000));
        assert_eq!(a.pmd_align_down(), VirtAddr::new(0x7f12_3440_0000));
        assert!(a.pmd_align_down().is_pmd_aligned() && !a.is_pmd_aligned());
        assert_eq!(a.align_down(1 << 16), VirtAddr::new(0x7f12_3456_0000));
        let end = VirtAddr::new(0x7f12_3470_0000);
        assert_eq!(a.pmd_addr_end(end), VirtAddr::new(0x7f12_3460_0000));
        assert_eq!(a.pmd_addr_end(a.add(8)), a.add(8));
        assert_eq!(a.next_boundary(1 << 30), VirtAddr::new(0x7f12_4000_0000));
        assert_eq!(
            VirtAddr::new(u64::MAX).next_boundary(1 << 30).val(),
            u64::MAX
        );
        assert_eq!(
            (a.pgd_index(), a.pud_index(), a.pmd_index(), a.pte_index()),
            (0xfe, 0x48, 0x1a2, 0x167)
        );
        assert!(a < a.add(1));
    }
}
