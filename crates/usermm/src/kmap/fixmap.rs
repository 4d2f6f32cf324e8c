//! The fixmap slots page-table construction uses to reach tables that are not (yet) in the
//! linear map.
//!
//! Linux counterparts: `arch/arm64/include/asm/fixmap.h` (`FIX_PTE`, `FIX_PMD`, `FIX_PUD`,
//! `__set_fixmap`, `pte_set_fixmap`, `pte_clear_fixmap`, ...), `early_fixmap_init` and
//! `__set_fixmap` in `arch/arm64/mm/fixmap.c`. The fixmap's own tables (`bm_pud`, `bm_pmd`,
//! `bm_pte`) are part of the kernel image and written directly; a slot is one PTE in `bm_pte`.
//! Setting a slot writes that PTE (with `set_pte`'s DSB+ISB); the table behind it is then
//! reached by translating the slot's VA through the `Mmu`. Clearing a slot
//! writes zero and runs `flush_tlb_kernel_range` for its page: DSB, one `TLBI VAALE1IS`, DSB,
//! ISB — the TLBI the seed counts.

use super::desc::{mk_page, mk_table, Pgprot, TableExec};
use super::geom::{FixSlot, Granule, FIXADDR_TOP};
use super::pool::TablePool;
use super::walk::View;
use super::{KernelSpace, KmapError};

/// What a slot currently maps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SlotUse {
    /// Physical address of the mapped table.
    pub(crate) pa: u64,
    /// Level of the mapped table (for TLBI accounting).
    pub(crate) level: u32,
}

/// Zeroes a table by physical address (image tables and `swapper_pg_dir`, not via the MMU).
pub(crate) fn zero_direct(pool: &TablePool, pa: u64, granule: Granule) -> Result<(), KmapError> {
    for f in 0..granule.page_size() / 4096 {
        pool.zero_frame(pa + f * 4096)?;
    }
    Ok(())
}

/// `early_fixmap_init`: allocates and links the image tables from the PGD down to `bm_pte`.
///
/// # Returns
/// The physical address of `bm_pte` and the number of tables allocated.
pub(crate) fn early_fixmap_init(
    pool: &TablePool,
    pgd: u64,
    granule: Granule,
) -> Result<(u64, u64), KmapError> {
    let va = FIXADDR_TOP - 1;
    let mut table = pgd;
    let mut made = 0;
    for level in granule.top_level()..3 {
        let next = pool.alloc()?;
        zero_direct(pool, next, granule)?;
        made += 1;
        let entry = table + granule.index(va, level) * 8;
        pool.store(entry, mk_table(next, TableExec::NoExec, granule))?;
        table = next;
    }
    Ok((table, made))
}

impl KernelSpace {
    /// `*_set_fixmap`: maps the table at `pa` (of `level`) at `slot`.
    pub(crate) fn set_fixmap(
        &mut self,
        slot: FixSlot,
        pa: u64,
        level: u32,
    ) -> Result<View, KmapError> {
        if self.slots[slot.pos()].is_some() {
            return Err(KmapError::SlotBusy(slot));
        }
        let va = slot.va(self.granule);
        let pte_pa = self.bm_pte + self.granule.index(va, 3) * 8;
        self.pool
            .store(pte_pa, mk_page(pa, Pgprot::KERNEL, self.granule))?;
        self.mmu.dsb(&mut self.stats);
        self.mmu.isb(&mut self.stats);
        self.stats.fixmap_maps += 1;
        self.slots[slot.pos()] = Some(SlotUse { pa, level });
        Ok(View::Fixmap { slot, va, pa })
    }

    /// `*_clear_fixmap`: unmaps `slot` and invalidates its translation (one TLBI).
    pub(crate) fn clear_fixmap(&mut self, slot: FixSlot) -> Result<(), KmapError> {
        let Some(used) = self.slots[slot.pos()].take() else {
            return Ok(());
        };
        let va = slot.va(self.granule);
        let pte_pa = self.bm_pte + self.granule.index(va, 3) * 8;
        self.pool.store(pte_pa, 0)?;
        self.mmu.dsb(&mut self.stats);
        self.mmu.tlbi_va(va, used.level, &mut self.stats);
        self.mmu.dsb(&mut self.stats);
        self.mmu.isb(&mut self.stats);
        self.stats.fixmap_unmaps += 1;
        Ok(())
    }

    /// Clears every slot still set (after a failed mapping call).
    pub(crate) fn release_fixmap(&mut self) {
        for slot in FixSlot::ALL {
            let _ = self.clear_fixmap(slot);
        }
    }

    /// Slots whose PTE in `bm_pte` is not zero (read from the table itself).
    pub fn fixmap_slots_in_use(&self) -> Vec<FixSlot> {
        FixSlot::ALL
            .into_iter()
            .filter(|s| {
                let va = s.va(self.granule);
                let pte_pa = self.bm_pte + self.granule.index(va, 3) * 8;
                !matches!(self.pool.load(pte_pa), Ok(0))
            })
            .collect()
    }

    /// TLB entries still caching a fixmap slot.
    pub fn fixmap_tlb_entries(&self) -> usize {
        let low = FixSlot::Pud.va(self.granule);
        self.mmu.cached_in(low, FIXADDR_TOP)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kmap::{KmapConfig, LinearGranularity, RamLayout, TlbCheck};

    fn space(check: TlbCheck) -> KernelSpace {
        let l = RamLayout::single(1 << 30);
        let mut cfg = KmapConfig::for_layout(&l, Granule::K4, LinearGranularity::Blocks);
        cfg.tlb_check = check;
        KernelSpace::new(&l, &cfg).unwrap()
    }

    /// Two tables whose word 3 holds 0xa and 0xb.
    fn two_tables(ks: &KernelSpace) -> (u64, u64) {
        let a = ks.pool.alloc().unwrap();
        let b = ks.pool.alloc().unwrap();
        ks.pool.store(a + 24, 0xa).unwrap();
        ks.pool.store(b + 24, 0xb).unwrap();
        (a, b)
    }

    #[test]
    fn a_slot_reaches_its_table_through_the_mmu_and_clearing_costs_one_tlbi() {
        let mut ks = space(TlbCheck::Verify);
        let (a, _) = two_tables(&ks);
        let va = FixSlot::Pte.va(Granule::K4);
        assert!(ks.read_u64(va).is_err(), "nothing mapped yet");
        ks.set_fixmap(FixSlot::Pte, a, 3).unwrap();
        assert_eq!(ks.read_u64(va + 24).unwrap(), 0xa);
        assert_eq!(ks.stats.tlb_misses, 1);
        assert_eq!(ks.read_u64(va + 24).unwrap(), 0xa);
        assert_eq!(ks.stats.tlb_hits, 1);
        assert_eq!(
            ks.set_fixmap(FixSlot::Pte, a, 3),
            Err(KmapError::SlotBusy(FixSlot::Pte))
        );
        ks.clear_fixmap(FixSlot::Pte).unwrap();
        assert_eq!(ks.stats.tlbi_page, 1);
        assert_eq!(ks.stats.tlbi_page_by_level, [0, 0, 0, 1]);
        assert!(ks.fixmap_slots_in_use().is_empty());
        assert_eq!(ks.fixmap_tlb_entries(), 0);
        assert!(matches!(
            ks.read_u64(va + 24),
            Err(KmapError::TranslationFault { .. })
        ));
    }

    #[test]
    fn rewriting_a_slot_without_tlbi_leaves_a_stale_translation() {
        for check in [TlbCheck::Trust, TlbCheck::Verify] {
            let mut ks = space(check);
            let (a, b) = two_tables(&ks);
            let va = FixSlot::Pmd.va(Granule::K4);
            ks.set_fixmap(FixSlot::Pmd, a, 2).unwrap();
            assert_eq!(ks.read_u64(va + 24).unwrap(), 0xa);
            // Point the slot at `b` by hand, skipping the clear and its TLBI.
            let pte = ks.bm_pte + Granule::K4.index(va, 3) * 8;
            ks.pool
                .store(pte, mk_page(b, Pgprot::KERNEL, Granule::K4))
                .unwrap();
            match check {
                TlbCheck::Trust => assert_eq!(ks.read_u64(va + 24).unwrap(), 0xa, "old table"),
                TlbCheck::Verify => assert!(matches!(
                    ks.read_u64(va + 24),
                    Err(KmapError::StaleTlb { .. })
                )),
            }
            ks.clear_fixmap(FixSlot::Pmd).unwrap();
            ks.set_fixmap(FixSlot::Pmd, b, 2).unwrap();
            assert_eq!(ks.read_u64(va + 24).unwrap(), 0xb, "after the TLBI");
            ks.release_fixmap();
            assert!(ks.fixmap_slots_in_use().is_empty());
        }
    }
}
