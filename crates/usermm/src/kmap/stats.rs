//! Cost counters of kernel page-table construction.
//!
//! Linux has no counters here; these count the hardware-visible operations the seed-002
//! series was about: TLB invalidations issued by fixmap clears (`flush_tlb_kernel_range` →
//! `TLBI VAALE1IS`), fixmap slot writes, barriers, tables allocated and zeroed, and the
//! software MMU's TLB hits and walks. Owned by one [`super::KernelSpace`] (boot is
//! single-threaded), so they are plain integers and exactly reproducible.

/// Counters of one kernel address space.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KmapStats {
    /// Page-table pages allocated for kernel mappings, by hardware level (0..=3).
    pub tables_allocated: [u64; 4],
    /// Tables cleared (by the allocator or by `init_clear_pgtable`).
    pub tables_zeroed: u64,
    /// Fixmap slot PTEs written (`*_set_fixmap`).
    pub fixmap_maps: u64,
    /// Fixmap slot PTEs cleared (`*_clear_fixmap`).
    pub fixmap_unmaps: u64,
    /// Single-VA TLB invalidations (`TLBI VAALE1IS`).
    pub tlbi_page: u64,
    /// [`KmapStats::tlbi_page`] split by the level of the table the cleared slot mapped.
    pub tlbi_page_by_level: [u64; 4],
    /// Whole-TLB invalidations (`flush_tlb_all`, for large `flush_tlb_kernel_range`).
    pub tlbi_all: u64,
    /// Descriptors written in kernel tables (tables, blocks, pages; not fixmap slots).
    pub entries_written: u64,
    /// `DSB` barriers.
    pub dsb: u64,
    /// `ISB` barriers.
    pub isb: u64,
    /// Software-MMU translations served by the TLB.
    pub tlb_hits: u64,
    /// Software-MMU translations that walked the tables.
    pub tlb_misses: u64,
}

impl KmapStats {
    /// All TLB invalidations.
    pub fn tlbi(&self) -> u64 {
        self.tlbi_page + self.tlbi_all
    }

    /// Tables allocated over all levels.
    pub fn tables_total(&self) -> u64 {
        self.tables_allocated.iter().sum()
    }

    /// `self - earlier`, field by field.
    pub fn delta(&self, earlier: &KmapStats) -> KmapStats {
        let lv = |a: [u64; 4], b: [u64; 4]| std::array::from_fn(|i| a[i] - b[i]);
        KmapStats {
            tables_allocated: lv(self.tables_allocated, earlier.tables_allocated),
            tables_zeroed: self.tables_zeroed - earlier.tables_zeroed,
            fixmap_maps: self.fixmap_maps - earlier.fixmap_maps,
            fixmap_unmaps: self.fixmap_unmaps - earlier.fixmap_unmaps,
            tlbi_page: self.tlbi_page - earlier.tlbi_page,
            tlbi_page_by_level: lv(self.tlbi_page_by_level, earlier.tlbi_page_by_level),
            tlbi_all: self.tlbi_all - earlier.tlbi_all,
            entries_written: self.entries_written - earlier.entries_written,
            dsb: self.dsb - earlier.dsb,
            isb: self.isb - earlier.isb,
            tlb_hits: self.tlb_hits - earlier.tlb_hits,
            tlb_misses: self.tlb_misses - earlier.tlb_misses,
        }
    }

    /// (name, value) pairs for reports.
    pub fn pairs(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("tables_allocated", self.tables_total()),
            ("tables_zeroed", self.tables_zeroed),
            ("fixmap_maps", self.fixmap_maps),
            ("fixmap_unmaps", self.fixmap_unmaps),
            ("tlbi_page", self.tlbi_page),
            ("tlbi_all", self.tlbi_all),
            ("entries_written", self.entries_written),
            ("dsb", self.dsb),
            ("isb", self.isb),
            ("tlb_hits", self.tlb_hits),
            ("tlb_misses", self.tlb_misses),
        ]
    }
}
