//! Translation granules and the shape of the kernel's stage-1 tables.
//!
//! Linux counterparts: `arch/arm64/include/asm/pgtable-hwdef.h` (`PMD_SHIFT`, `PUD_SHIFT`,
//! `CONT_PTES`, `CONT_PMDS`), `arch/arm64/include/asm/memory.h` (`PAGE_OFFSET`, `VA_BITS`)
//! and `pud_sect_supported()`. The kernel half of a 48-bit address space is modelled with
//! hardware level numbers 0 (top, 4 KiB and 16 KiB granules) or 1 (top, 64 KiB granule) to 3
//! (pages). A table is one granule-sized page of 8-byte descriptors. The fixmap's place in
//! that space (`FIXADDR_TOP` and the slots below it, `asm/fixmap.h`) is here too: the
//! errors name a slot, and the slots are used by [`super::fixmap`] and [`super::walk`].

/// Virtual address bits (`CONFIG_ARM64_VA_BITS_48`).
pub(crate) const VA_BITS: u32 = 48;

/// Start of the linear map (`PAGE_OFFSET` for 48-bit VAs): the bottom of the kernel half.
pub const PAGE_OFFSET: u64 = !((1u64 << VA_BITS) - 1);

/// Size of the linear region (`PAGE_OFFSET .. PAGE_END`): half of the kernel half.
pub const LINEAR_SIZE: u64 = 1 << (VA_BITS - 1);

/// Output addresses are limited to 48 bits (no 52-bit PA support modelled).
pub(crate) const PA_BITS: u32 = 48;

/// A stage-1 translation granule (`CONFIG_ARM64_{4K,16K,64K}_PAGES`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Granule {
    /// 4 KiB pages: 4 levels, 1 GiB and 2 MiB blocks, 16-entry contiguous runs.
    K4,
    /// 16 KiB pages: 4 levels (the top has 2 entries), 32 MiB blocks, 128 × 16 KiB and
    /// 32 × 32 MiB contiguous runs.
    K16,
    /// 64 KiB pages: 3 levels, 512 MiB blocks, 32 × 64 KiB and 32 × 512 MiB runs.
    K64,
}

impl Granule {
    /// Every granule.
    pub const ALL: [Granule; 3] = [Granule::K4, Granule::K16, Granule::K64];

    /// Parses `4K`, `16K` or `64K` (case-insensitive).
    pub fn parse(s: &str) -> Option<Granule> {
        match s.to_ascii_uppercase().as_str() {
            "4K" | "4096" => Some(Granule::K4),
            "16K" | "16384" => Some(Granule::K16),
            "64K" | "65536" => Some(Granule::K64),
            _ => None,
        }
    }

    /// `4K`, `16K` or `64K`.
    pub fn name(self) -> &'static str {
        match self {
            Granule::K4 => "4K",
            Granule::K16 => "16K",
            Granule::K64 => "64K",
        }
    }

    /// `PAGE_SHIFT`.
    pub(crate) fn page_shift(self) -> u32 {
        match self {
            Granule::K4 => 12,
            Granule::K16 => 14,
            Granule::K64 => 16,
        }
    }

    /// `PAGE_SIZE`.
    pub fn page_size(self) -> u64 {
        1 << self.page_shift()
    }

    /// Hardware level of the top table (the PGD): 0, or 1 for the 3-level 64 KiB layout.
    pub fn top_level(self) -> u32 {
        match self {
            Granule::K4 | Granule::K16 => 0,
            Granule::K64 => 1,
        }
    }

    /// Bytes mapped by one entry at `level` (0..=3).
    pub fn entry_size(self, level: u32) -> u64 {
        1 << self.shift(level)
    }

    /// log2 of [`Granule::entry_size`].
    pub(crate) fn shift(self, level: u32) -> u32 {
        let ps = self.page_shift();
        ps + (3 - level.min(3)) * (ps - 3)
    }

    /// Entries in a table at `level` (the top table only spans the 48-bit VA).
    pub(crate) fn entries(self, level: u32) -> u64 {
        if level == self.top_level() {
            1 << (VA_BITS - self.shift(level))
        } else {
            1 << (self.page_shift() - 3)
        }
    }

    /// Index of `va` in the table at `level`.
    #[inline]
    pub(crate) fn index(self, va: u64, level: u32) -> u64 {
        (va >> self.shift(level)) & (self.entries(level) - 1)
    }

    /// Entries in one contiguous run at `level` (`CONT_PTES` / `CONT_PMDS`; 1 elsewhere).
    pub fn cont_entries(self, level: u32) -> u64 {
        match (self, level) {
            (Granule::K4, 3 | 2) => 16,
            (Granule::K16, 3) => 128,
            (Granule::K16, 2) | (Granule::K64, 3 | 2) => 32,
            _ => 1,
        }
    }

    /// Bytes covered by one contiguous run at `level`.
    pub(crate) fn cont_size(self, level: u32) -> u64 {
        self.cont_entries(level) * self.entry_size(level)
    }

    /// Whether a block (section) descriptor may sit at `level`: level 2 always, level 1 only
    /// with 4 KiB pages (`pud_sect_supported()`).
    pub(crate) fn block_allowed(self, level: u32) -> bool {
        match level {
            2 => true,
            1 => self == Granule::K4,
            _ => false,
        }
    }

    /// Whether the layout has a PUD level distinct from the PGD (false for 64 KiB: folded).
    pub(crate) fn has_pud(self) -> bool {
        self.top_level() == 0
    }

    /// Output-address mask of a descriptor (bits `[47:PAGE_SHIFT]`).
    pub(crate) fn oa_mask(self) -> u64 {
        ((1u64 << PA_BITS) - 1) & !(self.page_size() - 1)
    }

    /// Buddy order of one table page (4 KiB frames per granule page).
    pub(crate) fn table_order(self) -> u32 {
        self.page_shift() - 12
    }

    /// `ARM64_MEMSTART_ALIGN`: `PHYS_OFFSET` is the start of RAM rounded down to this, so
    /// that VA and PA agree modulo the largest efficient leaf (1 GiB block with 4 KiB pages,
    /// a 1 GiB contiguous PMD run with 16 KiB, a 512 MiB block with 64 KiB).
    pub(crate) fn memstart_align(self) -> u64 {
        match self {
            Granule::K4 => self.entry_size(1),
            Granule::K16 => self.cont_size(2),
            Granule::K64 => self.entry_size(2),
        }
    }

    /// Conventional name of the table at `level` for this granule.
    pub fn level_name(self, level: u32) -> &'static str {
        if level == self.top_level() {
            return "pgd";
        }
        match level {
            1 => "pud",
            2 => "pmd",
            _ => "pte",
        }
    }
}

/// End of the chunk that starts at `addr` and ends at the next `size` boundary or `end`,
/// whichever comes first (`pgd_addr_end` and friends; safe at the top of the address space).
#[inline]
pub(crate) fn addr_end(addr: u64, end: u64, size: u64) -> u64 {
    let boundary = (addr.wrapping_add(size)) & !(size - 1);
    if boundary.wrapping_sub(1) < end.wrapping_sub(1) {
        boundary
    } else {
        end
    }
}

/// Top of the fixmap region (slots grow down from here); far from the linear map.
pub(crate) const FIXADDR_TOP: u64 = 0xffff_ffff_c000_0000;

/// The fixmap slots used to reach page-table pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FixSlot {
    /// `FIX_PTE`: level-3 tables (and, in the old allocator, any table being zeroed).
    Pte,
    /// `FIX_PMD`: level-2 tables.
    Pmd,
    /// `FIX_PUD`: level-1 tables (4 KiB and 16 KiB granules).
    Pud,
}

impl FixSlot {
    /// Every slot.
    pub(crate) const ALL: [FixSlot; 3] = [FixSlot::Pte, FixSlot::Pmd, FixSlot::Pud];

    /// The slot used for a table at hardware `level` (none for the PGD, which is in the image).
    pub(crate) fn for_level(level: u32) -> Option<FixSlot> {
        match level {
            3 => Some(FixSlot::Pte),
            2 => Some(FixSlot::Pmd),
            1 => Some(FixSlot::Pud),
            _ => None,
        }
    }

    /// Position in the slot array.
    pub(crate) fn pos(self) -> usize {
        match self {
            FixSlot::Pte => 0,
            FixSlot::Pmd => 1,
            FixSlot::Pud => 2,
        }
    }

    /// `fix_to_virt`: the VA of the slot.
    pub(crate) fn va(self, granule: Granule) -> u64 {
        FIXADDR_TOP - ((self.pos() as u64 + 1) << granule.page_shift())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes() {
        let g = Granule::K4;
        assert_eq!(
            (g.shift(0), g.shift(1), g.shift(2), g.shift(3)),
            (39, 30, 21, 12)
        );
        assert_eq!(g.entries(0), 512);
        assert_eq!(g.cont_size(3), 64 << 10);
        assert_eq!(g.cont_size(2), 32 << 20);
        let g = Granule::K16;
        assert_eq!((g.shift(0), g.shift(2), g.shift(3)), (47, 25, 14));
        assert_eq!(g.entries(0), 2);
        assert_eq!(g.cont_size(3), 2 << 20);
        assert_eq!(g.cont_size(2), 1 << 30);
        let g = Granule::K64;
        assert_eq!((g.shift(1), g.shift(2), g.shift(3)), (42, 29, 16));
        assert_eq!(g.entries(1), 64);
        assert_eq!(g.entries(3), 8192);
        assert_eq!(g.cont_size(3), 2 << 20);
        assert_eq!(g.cont_size(2), 16 << 30);
    }

    #[test]
    fn addr_end_clamps_and_wraps() {
        assert_eq!(addr_end(0, 10 << 20, 2 << 20), 2 << 20);
        assert_eq!(addr_end(1 << 20, 3 << 19, 2 << 20), 3 << 19);
        let top = u64::MAX - (1 << 30) + 1;
        assert_eq!(addr_end(top, 0, 1 << 30), 0);
    }
}
