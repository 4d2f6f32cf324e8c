//! Kernel stage-1 descriptors: table descriptors with their hierarchical attributes, block and
//! page leaves, and the `pgprot` values the linear map is built with.
//!
//! Linux counterparts: `arch/arm64/include/asm/pgtable-hwdef.h` (`PMD_TYPE_TABLE`,
//! `PMD_TABLE_PXN`/`PMD_TABLE_UXN`, `PMD_TABLE_AF`, `PTE_CONT`, `PTE_ATTRINDX`),
//! `pgtable-prot.h` (`PROT_NORMAL`, `PAGE_KERNEL`, `PAGE_KERNEL_RO`, `pgprot_tagged`),
//! `asm/memory.h` (`MT_NORMAL`, `MT_NORMAL_TAGGED`, ...), and `mk_pmd_sect_prot` /
//! `mk_pud_sect_prot` (a block is the page prot with the table bit cleared). Leaf bit positions
//! are shared with the user-PTE codec in `crate::pgtable::arch::arm64`.

use super::geom::Granule;
use crate::pgtable::arch::arm64 as hw;

/// Descriptor valid bit.
pub(crate) const VALID: u64 = hw::VALID;
/// Bit 1: table (levels 0..=2) or page (level 3); clear with VALID set = block.
pub(crate) const TABLE_BIT: u64 = hw::TYPE;
/// `PTE_TYPE_PAGE` / `PMD_TYPE_TABLE`.
pub(crate) const TYPE_TABLE_OR_PAGE: u64 = VALID | TABLE_BIT;
/// `PTE_ATTRINDX_MASK` (bits 2..=4): index into MAIR_EL1.
pub(crate) const ATTRINDX_MASK: u64 = hw::ATTRINDX_MASK;
/// `PTE_USER` (AP\[1\]).
pub const USER: u64 = hw::USER;
/// `PTE_RDONLY` (AP\[2\]).
pub const RDONLY: u64 = hw::RDONLY;
/// `PTE_SHARED`: inner shareable.
pub(crate) const SH_INNER: u64 = hw::SH_INNER;
/// `PTE_AF`: access flag.
pub(crate) const AF: u64 = hw::AF;
/// `PTE_NG`: not global.
pub(crate) const NG: u64 = hw::NG;
/// `PTE_WRITE` (DBM).
pub const WRITE: u64 = hw::WRITE;
/// `PTE_CONT`: contiguous hint.
pub(crate) const CONT: u64 = hw::CONT;
/// `PTE_PXN`.
pub const PXN: u64 = hw::PXN;
/// `PTE_UXN`.
pub const UXN: u64 = hw::UXN;
/// `PTE_SWBITS_MASK`: software bits 55..=58 and 63.
pub(crate) const SWBITS_MASK: u64 = (0xf << 55) | (1 << 63);
/// `PMD_TABLE_AF`: access flag on table descriptors (ignored unless FEAT_HAFT).
pub(crate) const TABLE_AF: u64 = 1 << 10;
/// `PMD_TABLE_PXN`: hierarchical privileged execute-never.
pub(crate) const PXN_TABLE: u64 = 1 << 59;
/// `PMD_TABLE_UXN`: hierarchical unprivileged execute-never.
pub(crate) const UXN_TABLE: u64 = 1 << 60;

/// Memory types, as indices into MAIR_EL1 (`MT_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemType {
    /// `MT_NORMAL`: write-back cacheable.
    Normal = 0,
    /// `MT_NORMAL_TAGGED`: normal, MTE tags enabled.
    NormalTagged = 1,
    /// `MT_NORMAL_NC`: non-cacheable.
    NormalNc = 2,
    /// `MT_DEVICE_nGnRnE`.
    DeviceNgnrne = 3,
    /// `MT_DEVICE_nGnRE`.
    DeviceNgnre = 4,
}

impl MemType {
    /// The `PTE_ATTRINDX` bits of this type.
    pub(crate) const fn attrindx(self) -> u64 {
        (self as u64) << 2
    }

    /// Decodes the `AttrIndx` field of a descriptor.
    pub fn of(desc: u64) -> Option<MemType> {
        Some(match (desc & ATTRINDX_MASK) >> 2 {
            0 => MemType::Normal,
            1 => MemType::NormalTagged,
            2 => MemType::NormalNc,
            3 => MemType::DeviceNgnrne,
            4 => MemType::DeviceNgnre,
            _ => return None,
        })
    }

    /// Short name for reports.
    pub fn name(self) -> &'static str {
        match self {
            MemType::Normal => "normal",
            MemType::NormalTagged => "tagged",
            MemType::NormalNc => "nc",
            MemType::DeviceNgnrne => "dev-nGnRnE",
            MemType::DeviceNgnre => "dev-nGnRE",
        }
    }
}

/// A kernel page protection (`pgprot_t`): the attribute bits of a level-3 page descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Pgprot(pub u64);

impl Pgprot {
    /// `PAGE_KERNEL` (`PROT_NORMAL`): valid page, AF, inner shareable, global, PXN, UXN,
    /// writable (DBM), `MT_NORMAL`.
    pub const KERNEL: Pgprot =
        Pgprot(TYPE_TABLE_OR_PAGE | AF | SH_INNER | PXN | UXN | WRITE | MemType::Normal.attrindx());
    /// `PAGE_KERNEL_RO`: `PAGE_KERNEL` without write permission.
    pub(crate) const KERNEL_RO: Pgprot = Pgprot((Pgprot::KERNEL.0 & !WRITE) | RDONLY);

    /// `pgprot_tagged`: the same protection with the `MT_NORMAL_TAGGED` memory type.
    pub const fn tagged(self) -> Pgprot {
        Pgprot((self.0 & !ATTRINDX_MASK) | MemType::NormalTagged.attrindx())
    }

    /// The same protection with the contiguous hint set.
    pub(crate) const fn cont(self) -> Pgprot {
        Pgprot(self.0 | CONT)
    }

    /// The same protection without the contiguous hint.
    pub(crate) const fn without_cont(self) -> Pgprot {
        Pgprot(self.0 & !CONT)
    }

    /// The same protection, non-global (`PTE_MAYBE_NG` when KPTI is on).
    pub const fn non_global(self) -> Pgprot {
        Pgprot(self.0 | NG)
    }
}

/// Flags of `__create_pgd_mapping` (a small bit set, as in `arch/arm64/mm/mmu.c`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Hash)]
pub struct MapFlags(u8);

impl MapFlags {
    /// No flag.
    pub const NONE: MapFlags = MapFlags(0);
    /// `NO_BLOCK_MAPPINGS`: never use block descriptors.
    pub(crate) const NO_BLOCK_MAPPINGS: MapFlags = MapFlags(1);
    /// `NO_CONT_MAPPINGS`: never set the contiguous hint.
    pub(crate) const NO_CONT_MAPPINGS: MapFlags = MapFlags(2);
    /// `NO_EXEC_MAPPINGS`: set PXNTable in every table descriptor created.
    pub(crate) const NO_EXEC_MAPPINGS: MapFlags = MapFlags(4);

    /// Union of two sets.
    pub(crate) const fn with(self, other: MapFlags) -> MapFlags {
        MapFlags(self.0 | other.0)
    }

    /// Whether every flag of `other` is set.
    pub(crate) const fn contains(self, other: MapFlags) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for MapFlags {
    type Output = MapFlags;
    fn bitor(self, rhs: MapFlags) -> MapFlags {
        self.with(rhs)
    }
}

/// What a descriptor is, given the level of the table holding it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DescKind {
    /// Not valid (`*_none` when zero).
    Invalid,
    /// Points at a next-level table.
    Table,
    /// A block (section) leaf at level 1 or 2.
    Block,
    /// A page leaf at level 3.
    Page,
    /// A valid encoding the walker faults on (level-3 "block", level-0 block).
    Reserved,
}

/// Classifies a descriptor found at `level`.
#[inline]
pub(crate) fn classify(desc: u64, level: u32, granule: Granule) -> DescKind {
    if desc & VALID == 0 {
        return DescKind::Invalid;
    }
    let table_bit = desc & TABLE_BIT != 0;
    match (level, table_bit) {
        (3, true) => DescKind::Page,
        (3, false) => DescKind::Reserved,
        (_, true) => DescKind::Table,
        (l, false) if granule.block_allowed(l) => DescKind::Block,
        _ => DescKind::Reserved,
    }
}

/// Hierarchical attributes of a new table descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TableExec {
    /// UXNTable only (the default for kernel tables).
    UxnOnly,
    /// UXNTable and PXNTable (`NO_EXEC_MAPPINGS`).
    NoExec,
}

/// A table descriptor for the table at physical address `table_pa`:
/// `PMD_TYPE_TABLE | PMD_TABLE_AF | PMD_TABLE_UXN` and optionally `PMD_TABLE_PXN`.
#[inline]
pub(crate) fn mk_table(table_pa: u64, exec: TableExec, granule: Granule) -> u64 {
    let pxn = match exec {
        TableExec::UxnOnly => 0,
        TableExec::NoExec => PXN_TABLE,
    };
    (table_pa & granule.oa_mask()) | TYPE_TABLE_OR_PAGE | TABLE_AF | UXN_TABLE | pxn
}

/// A level-3 page descriptor (`pfn_pte(pfn, prot)`).
#[inline]
pub(crate) fn mk_page(pa: u64, prot: Pgprot, granule: Granule) -> u64 {
    (pa & granule.oa_mask()) | prot.0 | TYPE_TABLE_OR_PAGE
}

/// A block descriptor (`pmd_set_huge` / `pud_set_huge`: the prot with the table bit cleared).
#[inline]
pub(crate) fn mk_block(pa: u64, prot: Pgprot, granule: Granule) -> u64 {
    (pa & granule.oa_mask()) | (prot.0 & !TABLE_BIT) | VALID
}

/// The output (or next-table) address of a descriptor.
#[inline]
pub(crate) fn desc_pa(desc: u64, granule: Granule) -> u64 {
    desc & granule.oa_mask()
}

/// The attribute bits of a leaf, as a [`Pgprot`] comparable with the one it was built from
/// (output address removed, table bit and valid bit normalised to a page, CONT removed).
#[inline]
pub fn leaf_prot(desc: u64, granule: Granule) -> Pgprot {
    Pgprot((desc & !granule.oa_mask() & !CONT) | TYPE_TABLE_OR_PAGE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_kernel_bits() {
        let p = Pgprot::KERNEL;
        assert_eq!(p.0 & 3, 3);
        assert_ne!(p.0 & PXN, 0);
        assert_ne!(p.0 & UXN, 0);
        assert_ne!(p.0 & WRITE, 0);
        assert_eq!(p.0 & RDONLY, 0);
        assert_eq!(MemType::of(p.tagged().0), Some(MemType::NormalTagged));
        assert_eq!(p.tagged().0 & !ATTRINDX_MASK, p.0 & !ATTRINDX_MASK);
    }

    #[test]
    fn descriptor_shapes() {
        let g = Granule::K4;
        let t = mk_table(0x8000_1000, TableExec::NoExec, g);
        assert_eq!(classify(t, 2, g), DescKind::Table);
        assert_ne!(t & PXN_TABLE, 0);
        assert_ne!(t & UXN_TABLE, 0);
        let b = mk_block(0x4020_0000, Pgprot::KERNEL, g);
        assert_eq!(classify(b, 2, g), DescKind::Block);
        assert_eq!(classify(b, 1, g), DescKind::Block);
        assert_eq!(classify(b, 1, Granule::K16), DescKind::Reserved);
        assert_eq!(classify(b, 3, g), DescKind::Reserved);
        let pg = mk_page(0x4000_3000, Pgprot::KERNEL, g);
        assert_eq!(classify(pg, 3, g), DescKind::Page);
        assert_eq!(desc_pa(pg, g), 0x4000_3000);
        assert_eq!(leaf_prot(b, g), Pgprot::KERNEL);
        assert_eq!(leaf_prot(pg | CONT, g), Pgprot::KERNEL);
    }
}
