//! The four ways of reaching a page-table page while building kernel mappings, as one
//! run-time switch (the `linear_map` tunable).
//!
//! Linux counterparts: `arch/arm64/mm/mmu.c` before and after Ryan Roberts' 2024 series
//! "Speed up boot with faster linear map creation" (seed 002):
//!
//! | variant | what it restates | TLBIs per fully populated table, early / late |
//! |---|---|---|
//! | `remap_per_cont` | before the series: `early_pgtable_alloc` zeroes the new table through the `FIX_PTE` slot, then `init_pte`/`init_pmd` fixmap the table once per contiguous chunk, and every PTE write carries its own DSB+ISB | 33 / 32 |
//! | `remap_alloc_populate` | after "Don't remap pgtables per-cont(pte\|pmd) block" and "Batch dsb and isb when populating pgtables": one fixmap per table per call, but still a separate one in the allocator to zero it | 2 / 1 |
//! | `single_map` | the merged "Don't remap pgtables for allocate vs populate": the allocator returns only a physical address, the walker maps the table once, zeroes it (`init_clear_pgtable`), fills it and unmaps it | 1 / 1 |
//! | `va_late` | the v1 proposal (`pgtable_ops`): early tables as `single_map`, but once the linear map exists tables are reached through `__va()` | 1 / 0 |
//!
//! "Early" is `early_pgtable_alloc` (memblock, before the linear map covers the table);
//! "late" is `__pgd_pgtable_alloc` (the page allocator: memory hot-plug, `update_mapping_prot`).
//! The counts are not computed anywhere: they fall out of the walker following a [`Strategy`].

/// How kernel page tables are reached while they are created (the `linear_map` tunable).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum LinearMapVariant {
    /// Before the series: a fixmap remap per contiguous chunk, plus one to zero (33 TLBIs).
    RemapPerCont,
    /// After the first patches: one remap to zero in the allocator, one to populate (2 TLBIs).
    RemapAllocPopulate,
    /// Merged upstream: one remap per table for zeroing and populating (1 TLBI). The default.
    #[default]
    SingleMap,
    /// The v1 idea: as `single_map` early, no fixmap at all once the linear map exists.
    VaLate,
}

impl LinearMapVariant {
    /// Every variant, oldest first.
    pub const ALL: [LinearMapVariant; 4] = [
        LinearMapVariant::RemapPerCont,
        LinearMapVariant::RemapAllocPopulate,
        LinearMapVariant::SingleMap,
        LinearMapVariant::VaLate,
    ];

    /// Parses the tunable spelling (`remap_per_cont`, `remap_alloc_populate`, `single_map`,
    /// `va_late`; dashes are accepted for underscores).
    pub fn parse(s: &str) -> Option<LinearMapVariant> {
        Some(match s.replace('-', "_").as_str() {
            "remap_per_cont" => LinearMapVariant::RemapPerCont,
            "remap_alloc_populate" => LinearMapVariant::RemapAllocPopulate,
            "single_map" => LinearMapVariant::SingleMap,
            "va_late" => LinearMapVariant::VaLate,
            _ => return None,
        })
    }

    /// The tunable spelling.
    pub fn name(self) -> &'static str {
        match self {
            LinearMapVariant::RemapPerCont => "remap_per_cont",
            LinearMapVariant::RemapAllocPopulate => "remap_alloc_populate",
            LinearMapVariant::SingleMap => "single_map",
            LinearMapVariant::VaLate => "va_late",
        }
    }

    /// Accepted values, for help texts.
    pub const VALUES: &'static str = "remap_per_cont|remap_alloc_populate|single_map|va_late";

    /// The strategy this variant follows in `phase`.
    pub(crate) fn strategy(self, phase: Phase) -> Strategy {
        use LinearMapVariant as V;
        let remap = match self {
            V::RemapPerCont => RemapScope::PerContChunk,
            _ => RemapScope::PerTable,
        };
        let zero = match (self, phase) {
            (V::RemapPerCont | V::RemapAllocPopulate, Phase::Early) => AllocZero::FixmapScratch,
            (V::RemapPerCont | V::RemapAllocPopulate, Phase::Late) => AllocZero::LinearMap,
            (V::SingleMap | V::VaLate, _) => AllocZero::InWalker,
        };
        let access = match (self, phase) {
            (V::VaLate, Phase::Late) => TableAccess::LinearMap,
            _ => TableAccess::Fixmap,
        };
        let leaf_barriers = match self {
            V::RemapPerCont => LeafBarriers::PerEntry,
            _ => LeafBarriers::Deferred,
        };
        Strategy {
            remap,
            zero,
            access,
            leaf_barriers,
        }
    }
}

/// When a mapping is created, which decides how new tables can be reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Boot, before the linear map exists (`early_pgtable_alloc`: memblock).
    Early,
    /// After the linear map exists (`__pgd_pgtable_alloc`: the page allocator).
    Late,
}

/// How often a PMD/PTE table is mapped while it is populated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RemapScope {
    /// Once per contiguous chunk (`init_pte`/`init_pmd` each map and unmap the table).
    PerContChunk,
    /// Once per table per call (`alloc_init_cont_pte`/`alloc_init_cont_pmd` map it).
    PerTable,
}

/// Who zeroes a new table, and through which mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AllocZero {
    /// The early allocator maps it at `FIX_PTE`, clears it and unmaps it (one TLBI).
    FixmapScratch,
    /// The page allocator clears it through the linear map (`__GFP_ZERO`).
    LinearMap,
    /// The allocator returns it dirty; the walker clears it once mapped (`init_clear_pgtable`).
    InWalker,
}

/// How a table is reached for reading and writing its entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TableAccess {
    /// Through the fixmap slot of its level (set the slot PTE; clearing costs a TLBI).
    Fixmap,
    /// Through its linear-map address (`__va`): no slot, no TLBI.
    LinearMap,
}

/// Barriers around level-3 entry writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LeafBarriers {
    /// `set_pte`: DSB ISHST + ISB after every valid entry.
    PerEntry,
    /// `__set_pte_nosync`: the fixmap clear (or the final barrier) publishes the batch.
    Deferred,
}

/// What a variant does in one phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Strategy {
    /// Remap granularity while populating PMD/PTE tables.
    pub(crate) remap: RemapScope,
    /// Zeroing of new tables.
    pub(crate) zero: AllocZero,
    /// Access path to tables.
    pub(crate) access: TableAccess,
    /// Barriers on page writes.
    pub(crate) leaf_barriers: LeafBarriers,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for v in LinearMapVariant::ALL {
            assert_eq!(LinearMapVariant::parse(v.name()), Some(v));
        }
        assert_eq!(
            LinearMapVariant::parse("single-map"),
            Some(LinearMapVariant::SingleMap)
        );
        assert_eq!(LinearMapVariant::parse("nope"), None);
        assert_eq!(LinearMapVariant::default(), LinearMapVariant::SingleMap);
    }

    #[test]
    fn only_va_late_skips_the_fixmap_late() {
        for v in LinearMapVariant::ALL {
            assert_eq!(v.strategy(Phase::Early).access, TableAccess::Fixmap);
            let late = v.strategy(Phase::Late).access;
            assert_eq!(
                late == TableAccess::LinearMap,
                v == LinearMapVariant::VaLate
            );
        }
    }
}
