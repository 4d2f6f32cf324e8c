//! The physical frames page tables live in: a [`PhysMem`] placed at a physical address.
//!
//! Linux counterpart: the memblock allocations of `early_pgtable_alloc` and the page-allocator
//! pages of `__pgd_pgtable_alloc`. The RAM being *described* by the linear map (up to hundreds
//! of GiB) has no backing; only this pool does. It sits at the top of the last RAM range (where
//! memblock allocates top-down), so the linear map covers it and late code can reach tables
//! through `__va()`. One table is one granule page: a buddy block of 1, 4 or 16 frames.

use super::geom::Granule;
use super::KmapError;
use crate::phys::{FolioKind, Pfn, PhysMem, Zeroing, PAGE_SHIFT};
use crate::stats::CpuCounters;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Pool sizes are whole buddy blocks (4 MiB).
pub(crate) const POOL_ALIGN: u64 = 4 << 20;

/// Frames for page tables, at physical addresses `[base, base + bytes)`.
pub(crate) struct TablePool {
    phys: PhysMem,
    base: u64,
    bytes: u64,
    order: u32,
    counters: CpuCounters,
}

impl std::fmt::Debug for TablePool {
    /// A summary (the arena itself can be a GiB of words).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TablePool")
            .field("base", &format_args!("{:#x}", self.base))
            .field("bytes", &self.bytes)
            .field("tables_in_use", &self.tables_in_use())
            .finish()
    }
}

impl TablePool {
    /// Creates a pool of `bytes` (a multiple of [`POOL_ALIGN`]) at physical address `base`.
    pub(crate) fn new(base: u64, bytes: u64, granule: Granule) -> TablePool {
        let phys = PhysMem::new(bytes, 1);
        let bytes = phys.nr_frames() << PAGE_SHIFT;
        TablePool {
            phys,
            base,
            bytes,
            order: granule.table_order(),
            counters: CpuCounters::default(),
        }
    }

    /// Writes every frame once so the host backs the arena before anything is timed.
    pub(crate) fn prefault(&self) {
        for pfn in Pfn::new(0).range(self.phys.nr_frames()) {
            self.phys.arena.zero_frame(pfn);
        }
    }

    /// Allocates one table page (contents undefined, as memblock and `~__GFP_ZERO` give).
    pub(crate) fn alloc(&self) -> Result<u64, KmapError> {
        let pfn = self
            .phys
            .alloc_folio(
                &self.counters,
                self.order,
                0,
                FolioKind::Pgtable,
                Zeroing::NoZero,
            )
            .ok_or(KmapError::OutOfTables { bytes: self.bytes })?;
        Ok(self.base + (pfn.val() << PAGE_SHIFT))
    }

    /// Table pages currently allocated.
    pub(crate) fn tables_in_use(&self) -> u64 {
        self.phys.allocated_frames() >> self.order
    }

    /// First physical address of the pool.
    pub(crate) fn base(&self) -> u64 {
        self.base
    }

    /// Size of the pool in bytes.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    #[inline]
    fn locate(&self, pa: u64) -> Result<(Pfn, usize), KmapError> {
        let off = pa.wrapping_sub(self.base);
        if off >= self.bytes {
            return Err(KmapError::Unbacked(pa));
        }
        Ok((Pfn::new(off >> PAGE_SHIFT), ((off & 0xfff) >> 3) as usize))
    }

    /// Reads the 64-bit word at `pa` (what the table walker and the CPU see).
    #[inline]
    pub(crate) fn load(&self, pa: u64) -> Result<u64, KmapError> {
        let (pfn, idx) = self.locate(pa)?;
        Ok(self.phys.arena.word(pfn, idx).load(Relaxed))
    }

    /// Writes the 64-bit word at `pa`.
    #[inline]
    pub(crate) fn store(&self, pa: u64, v: u64) -> Result<(), KmapError> {
        let (pfn, idx) = self.locate(pa)?;
        self.phys.arena.word(pfn, idx).store(v, Relaxed);
        Ok(())
    }

    /// The `n` words from `pa` on, which must lie in one 4 KiB frame.
    #[inline]
    pub(crate) fn words(&self, pa: u64, n: u64) -> Result<&[AtomicU64], KmapError> {
        let (pfn, idx) = self.locate(pa)?;
        let end = idx + n as usize;
        self.phys
            .arena
            .frame(pfn)
            .get(idx..end)
            .ok_or(KmapError::Unbacked(pa + n * 8))
    }

    /// Zeroes the 4 KiB frame containing `pa`.
    pub(crate) fn zero_frame(&self, pa: u64) -> Result<(), KmapError> {
        let (pfn, _) = self.locate(pa)?;
        self.phys.arena.zero_frame(pfn);
        Ok(())
    }
}
