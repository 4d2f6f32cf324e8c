//! The rule for changing a live kernel descriptor without break-before-make.
//!
//! Linux counterpart: `pgattr_change_is_safe()` in `arch/arm64/mm/mmu.c`, which every
//! `init_pte` / `init_pmd` / `alloc_init_pud` write is checked against (a `BUG_ON` there; an
//! [`super::KmapError::UnsafeChange`] here, raised *before* the entry is written). Restated:
//!
//! * installing a mapping over an invalid entry, or invalidating one, is always safe;
//! * a live entry must keep its output address;
//! * a live contiguous entry may not be altered at all;
//! * a global entry may become non-global but never the reverse;
//! * besides that, only PXN, RDONLY, WRITE (DBM), nG and the software bits may differ, plus
//!   the memory type when both sides are Normal or Normal-Tagged (tags are a permission).
//!
//! Replacing a table descriptor by a block always fails: the output address differs (or, by
//! coincidence equal, the table bit does).

use super::desc::{MemType, ATTRINDX_MASK, CONT, NG, PXN, RDONLY, SWBITS_MASK, VALID, WRITE};

/// Output-address bits compared by the rule (`pte_pfn`, 48-bit PA).
const OA_BITS: u64 = ((1u64 << 48) - 1) & !0xfff;

fn normal_or_tagged(desc: u64) -> bool {
    matches!(
        MemType::of(desc),
        Some(MemType::Normal | MemType::NormalTagged)
    )
}

/// Whether `old` may be replaced by `new` in a live kernel table.
pub(crate) fn pgattr_change_is_safe(old: u64, new: u64) -> bool {
    if old & VALID == 0 || new & VALID == 0 {
        return true;
    }
    if old == new {
        return true;
    }
    if (old ^ new) & OA_BITS != 0 {
        return false;
    }
    if (old | new) & CONT != 0 {
        return false;
    }
    if old & !new & NG != 0 {
        return false;
    }
    let mut may_differ = PXN | RDONLY | WRITE | NG | SWBITS_MASK;
    if normal_or_tagged(old) && normal_or_tagged(new) {
        may_differ |= ATTRINDX_MASK;
    }
    (old ^ new) & !may_differ == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kmap::desc::{mk_block, mk_page, mk_table, Pgprot, TableExec, UXN};
    use crate::kmap::geom::Granule;

    const G: Granule = Granule::K4;

    #[test]
    fn create_and_remove_are_safe() {
        let p = mk_page(0x4000_0000, Pgprot::KERNEL, G);
        assert!(pgattr_change_is_safe(0, p));
        assert!(pgattr_change_is_safe(p, 0));
        assert!(pgattr_change_is_safe(p, p));
    }

    #[test]
    fn permission_changes_are_safe() {
        let rw = mk_page(0x4000_0000, Pgprot::KERNEL, G);
        let ro = mk_page(0x4000_0000, Pgprot::KERNEL_RO, G);
        assert!(pgattr_change_is_safe(rw, ro));
        assert!(pgattr_change_is_safe(ro, rw));
        assert!(pgattr_change_is_safe(rw, rw & !PXN));
        assert!(pgattr_change_is_safe(rw, rw | NG), "G -> nG is fine");
        assert!(pgattr_change_is_safe(rw, rw | (1 << 55)), "software bit");
        let tagged = mk_page(0x4000_0000, Pgprot::KERNEL.tagged(), G);
        assert!(pgattr_change_is_safe(tagged, rw), "tagged -> normal");
        assert!(pgattr_change_is_safe(rw, tagged), "normal -> tagged");
    }

    #[test]
    fn unsafe_changes() {
        let rw = mk_page(0x4000_0000, Pgprot::KERNEL, G);
        assert!(!pgattr_change_is_safe(
            rw,
            mk_page(0x4000_1000, Pgprot::KERNEL, G)
        ));
        assert!(!pgattr_change_is_safe(rw | NG, rw), "nG -> G");
        assert!(!pgattr_change_is_safe(rw, rw & !UXN), "UXN may not change");
        assert!(!pgattr_change_is_safe(rw, rw | CONT), "CONT may not change");
        assert!(!pgattr_change_is_safe(rw | CONT, (rw | CONT) & !WRITE));
        let dev = (rw & !ATTRINDX_MASK) | MemType::DeviceNgnre.attrindx();
        assert!(!pgattr_change_is_safe(rw, dev), "normal -> device");
    }

    #[test]
    fn table_never_replaced_by_block() {
        let t = mk_table(0x4020_0000, TableExec::NoExec, G);
        let b = mk_block(0x4020_0000, Pgprot::KERNEL, G);
        assert!(
            !pgattr_change_is_safe(t, b),
            "same address, table bit differs"
        );
        let b2 = mk_block(0x8000_0000, Pgprot::KERNEL, G);
        assert!(!pgattr_change_is_safe(t, b2));
    }
}
