//! The arm64 kernel address space and the creation of its linear map (seed 002).
//!
//! Linux counterparts: `arch/arm64/mm/mmu.c` — `paging_init`, `map_mem`, `__map_memblock`,
//! `__create_pgd_mapping` and the `alloc_init_*`/`init_*` walk (`walk`), `early_pgtable_alloc`
//! and `__pgd_pgtable_alloc`, `pgattr_change_is_safe` (`safe`), `mark_linear_text_alias_ro`
//! (`update_mapping_prot`), `arch_add_memory`; `arch/arm64/include/asm/fixmap.h` and
//! `arch/arm64/mm/fixmap.c` (`fixmap`).
//!
//! A [`KernelSpace`] is `swapper_pg_dir` plus everything needed to build kernel mappings the
//! way an arm64 kernel does at boot: page-table pages are real frames of a [`crate::phys::PhysMem`]
//! placed at a physical address inside RAM (`pool`); the RAM the linear map *describes* has no
//! backing. Tables that are not reachable through the linear map are reached only through a
//! fixmap slot, translated by the software MMU (`mmu`) whose TLB must be invalidated when a
//! slot is cleared. How often that happens is the [`LinearMapVariant`]; the cost counters are
//! [`KmapStats`].
//!
//! ```
//! use usermm::kmap::*;
//! let layout = RamLayout::single(256 << 20);
//! let cfg = KmapConfig::for_layout(&layout, Granule::K4, LinearGranularity::ForcePages);
//! let mut ks = KernelSpace::new(&layout, &cfg).unwrap();
//! ks.map_mem(LinearGranularity::ForcePages, LinearMapVariant::SingleMap).unwrap();
//! let va = ks.phys_to_virt(0x4800_0000);
//! assert_eq!(ks.translate(va).unwrap().pa, 0x4800_0000);
//! assert!(ks.fixmap_slots_in_use().is_empty());
//! ```

pub mod desc;
pub mod dump;
pub(crate) mod error;
pub(crate) mod fixmap;
pub(crate) mod geom;
pub(crate) mod mmu;
pub(crate) mod pool;
pub(crate) mod safe;
pub(crate) mod stats;
pub(crate) mod variant;
pub(crate) mod walk;

pub use desc::{MapFlags, MemType, Pgprot};
pub use dump::{KmapSummary, LeafKind, LeafRun};
pub use error::KmapError;
pub use geom::{Granule, LINEAR_SIZE, PAGE_OFFSET};
pub use mmu::{TlbCheck, Translation, SEED_TLBI_NS};
pub use stats::KmapStats;
pub use variant::{LinearMapVariant, Phase};
pub use walk::{MapRequest, TableAlloc};

use fixmap::SlotUse;
use mmu::Mmu;
use pool::{TablePool, POOL_ALIGN};
use std::time::Duration;

/// A physical address range `[start, end)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PhysRange {
    /// First byte.
    pub start: u64,
    /// One past the last byte.
    pub end: u64,
}

impl PhysRange {
    /// `[start, end)`.
    pub const fn new(start: u64, end: u64) -> PhysRange {
        PhysRange { start, end }
    }

    /// Bytes in the range.
    pub const fn size(&self) -> u64 {
        self.end - self.start
    }

    /// Whether the two ranges share a byte.
    pub(crate) fn overlaps(&self, o: &PhysRange) -> bool {
        self.start < o.end && o.start < self.end
    }
}

/// Where RAM starts by default (as on QEMU `virt` and many arm64 SoCs).
pub(crate) const RAM_BASE: u64 = 0x4000_0000;
/// Offset of the kernel image from the start of its RAM range (2 MiB aligned).
pub(crate) const KERNEL_IMAGE_OFFSET: u64 = 2 << 20;
/// Size of `[_stext, __init_begin)` in the model (~23 MiB, 64 KiB aligned: a defconfig kernel).
pub const KERNEL_IMAGE_SIZE: u64 = 0x175_0000;

/// The memory map `map_mem` walks: memblock ranges and the kernel image marked NOMAP.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RamLayout {
    /// RAM ranges, sorted, disjoint.
    pub ranges: Vec<PhysRange>,
    /// `[_stext, __init_begin)`: NOMAP while memory is mapped, then mapped as an alias.
    pub kernel_image: PhysRange,
}

impl RamLayout {
    /// One range of `bytes` at `RAM_BASE`, kernel image at its start.
    pub fn single(bytes: u64) -> RamLayout {
        RamLayout::with_ranges(vec![PhysRange::new(RAM_BASE, RAM_BASE + bytes)])
    }

    /// The given ranges, with the kernel image at `KERNEL_IMAGE_OFFSET` into the first.
    pub fn with_ranges(ranges: Vec<PhysRange>) -> RamLayout {
        let start = ranges.first().map_or(RAM_BASE, |r| r.start) + KERNEL_IMAGE_OFFSET;
        RamLayout {
            ranges,
            kernel_image: PhysRange::new(start, start + KERNEL_IMAGE_SIZE),
        }
    }

    /// Total RAM.
    pub fn total(&self) -> u64 {
        self.ranges.iter().map(PhysRange::size).sum()
    }

    /// Checks sorting, alignment to the granule and that the image lies inside one range.
    pub(crate) fn validate(&self, granule: Granule) -> Result<(), KmapError> {
        let bad = |s: String| Err(KmapError::BadLayout(s));
        let ps = granule.page_size();
        if self.ranges.is_empty() {
            return bad("no RAM ranges".into());
        }
        for (i, r) in self.ranges.iter().enumerate() {
            if r.start >= r.end || (r.start | r.end) & (ps - 1) != 0 {
                return bad(format!(
                    "range {:#x}-{:#x} is empty or not {}-aligned",
                    r.start,
                    r.end,
                    granule.name()
                ));
            }
            if i > 0 && self.ranges[i - 1].end > r.start {
                return bad(format!(
                    "range {:#x}-{:#x} overlaps or is unsorted",
                    r.start, r.end
                ));
            }
        }
        let k = self.kernel_image;
        if (k.start | k.end) & (ps - 1) != 0 || k.start >= k.end {
            return bad("kernel image empty or not page aligned".into());
        }
        if !self
            .ranges
            .iter()
            .any(|r| r.start <= k.start && k.end <= r.end)
        {
            return bad(format!(
                "kernel image {:#x}-{:#x} is not inside one RAM range",
                k.start, k.end
            ));
        }
        Ok(())
    }
}

/// Block/contiguous mappings or the forced page granularity of `rodata=full`,
/// `debug_pagealloc`, KFENCE and Realm guests (`can_set_direct_map` / `force_pte_mapping`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LinearGranularity {
    /// 1 GiB/2 MiB blocks and contiguous runs where aligned.
    Blocks,
    /// Every leaf a page (`NO_BLOCK_MAPPINGS | NO_CONT_MAPPINGS`).
    ForcePages,
}

impl LinearGranularity {
    /// `blocks` or `pages`.
    pub fn name(self) -> &'static str {
        match self {
            LinearGranularity::Blocks => "blocks",
            LinearGranularity::ForcePages => "pages",
        }
    }

    /// The `map_mem` flags for the memory ranges.
    pub fn flags(self) -> MapFlags {
        match self {
            LinearGranularity::Blocks => MapFlags::NO_EXEC_MAPPINGS,
            LinearGranularity::ForcePages => {
                MapFlags::NO_EXEC_MAPPINGS
                    | MapFlags::NO_BLOCK_MAPPINGS
                    | MapFlags::NO_CONT_MAPPINGS
            }
        }
    }
}

/// Whether the host backs the table pool before anything runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Prefault {
    /// Frames are backed on first touch (cheap to create, first use pays host page faults).
    #[default]
    Lazy,
    /// Touch every frame at creation (for timing).
    Touch,
}

/// How a [`KernelSpace`] is built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KmapConfig {
    /// Translation granule.
    pub(crate) granule: Granule,
    /// Bytes of page-table pool (rounded up to 4 MiB; see `pool_bytes_for`).
    pub pool_bytes: u64,
    /// Hardware latency charged per TLBI, in ns (0: engine time only; [`SEED_TLBI_NS`]).
    pub tlbi_latency_ns: u64,
    /// Whether TLB hits are verified against the tables.
    pub tlb_check: TlbCheck,
    /// Whether the pool is touched up front.
    pub prefault: Prefault,
}

impl KmapConfig {
    /// A configuration whose pool fits `map_mem` of `layout` at `granularity`.
    pub fn for_layout(
        layout: &RamLayout,
        granule: Granule,
        granularity: LinearGranularity,
    ) -> KmapConfig {
        KmapConfig {
            granule,
            pool_bytes: pool_bytes_for(layout, granule, granularity, 0),
            tlbi_latency_ns: 0,
            tlb_check: TlbCheck::Trust,
            prefault: Prefault::Lazy,
        }
    }
}

/// Number of windows of `size` bytes that `[start, end)` touches.
fn windows(start: u64, end: u64, size: u64) -> u64 {
    if start >= end {
        return 0;
    }
    (end - 1) / size - start / size + 1
}

/// An upper bound on the table pages `map_mem` needs, plus `extra_tables`, as pool bytes.
///
/// A 512 GiB page-granular map needs 262 144 PTE tables (1 GiB) plus 512 PMD tables; with
/// blocks only the unaligned edges of each range need PTE tables.
pub(crate) fn pool_bytes_for(
    layout: &RamLayout,
    granule: Granule,
    granularity: LinearGranularity,
    extra_tables: u64,
) -> u64 {
    let pieces = layout.ranges.len() as u64 * 2 + 1;
    let mut tables = 1 + 3 + 16 + extra_tables;
    for level in granule.top_level() + 1..=3 {
        let parent = granule.entry_size(level - 1);
        let full: u64 = layout
            .ranges
            .iter()
            .map(|r| windows(r.start, r.end, parent) + 2)
            .sum();
        tables += match (granularity, level) {
            (LinearGranularity::Blocks, 3) => full.min(4 * pieces),
            _ => full,
        };
    }
    let bytes = tables * granule.page_size() + POOL_ALIGN;
    bytes.div_ceil(POOL_ALIGN) * POOL_ALIGN
}

/// The kernel address space: `swapper_pg_dir`, the fixmap, the boot CPU's MMU, the table pool
/// and the cost counters.
#[derive(Debug)]
pub struct KernelSpace {
    granule: Granule,
    layout: RamLayout,
    hotplugged: Vec<PhysRange>,
    phys_offset: u64,
    pool: TablePool,
    mmu: Mmu,
    pgd: u64,
    bm_pte: u64,
    image_tables: u64,
    slots: [Option<SlotUse>; 3],
    tlb_check: TlbCheck,
    stats: KmapStats,
}

impl KernelSpace {
    /// Creates an empty kernel address space for `layout` (only the fixmap is mapped).
    ///
    /// The table pool is placed at the top of the last RAM range.
    pub fn new(layout: &RamLayout, cfg: &KmapConfig) -> Result<KernelSpace, KmapError> {
        let g = cfg.granule;
        layout.validate(g)?;
        let pool_bytes = cfg.pool_bytes.max(POOL_ALIGN).div_ceil(POOL_ALIGN) * POOL_ALIGN;
        let first = layout.ranges[0];
        let last = layout.ranges[layout.ranges.len() - 1];
        let phys_offset = first.start & !(g.memstart_align() - 1);
        if last.end - phys_offset > LINEAR_SIZE {
            return Err(KmapError::BadLayout(
                "RAM does not fit the linear map".into(),
            ));
        }
        let base = last.end.saturating_sub(pool_bytes) & !(POOL_ALIGN - 1);
        let pool_range = PhysRange::new(base, base + pool_bytes);
        if base < last.start || pool_range.overlaps(&layout.kernel_image) {
            return Err(KmapError::BadLayout(format!(
                "no room for a {pool_bytes}-byte table pool at the top of {:#x}-{:#x}",
                last.start, last.end
            )));
        }
        let pool = TablePool::new(base, pool_bytes, g);
        if cfg.prefault == Prefault::Touch {
            pool.prefault();
        }
        let pgd = pool.alloc()?;
        fixmap::zero_direct(&pool, pgd, g)?;
        let (bm_pte, made) = fixmap::early_fixmap_init(&pool, pgd, g)?;
        let mmu = Mmu::new(
            g,
            pgd,
            cfg.tlb_check,
            Duration::from_nanos(cfg.tlbi_latency_ns),
        );
        Ok(KernelSpace {
            granule: g,
            layout: layout.clone(),
            hotplugged: Vec::new(),
            phys_offset,
            pool,
            mmu,
            pgd,
            bm_pte,
            image_tables: 1 + made,
            slots: [None; 3],
            tlb_check: cfg.tlb_check,
            stats: KmapStats::default(),
        })
    }

    /// The granule.
    pub fn granule(&self) -> Granule {
        self.granule
    }

    /// The boot memory map.
    pub fn layout(&self) -> &RamLayout {
        &self.layout
    }

    /// Cost counters since creation.
    pub fn stats(&self) -> &KmapStats {
        &self.stats
    }

    /// `PHYS_OFFSET` (`memstart_addr`): the physical address at `PAGE_OFFSET`.
    pub fn phys_offset(&self) -> u64 {
        self.phys_offset
    }

    /// `__phys_to_virt`: the linear-map address of `pa`.
    pub fn phys_to_virt(&self, pa: u64) -> u64 {
        PAGE_OFFSET + (pa - self.phys_offset)
    }

    /// Physical address of `swapper_pg_dir`.
    pub fn pgd_pa(&self) -> u64 {
        self.pgd
    }

    /// Physical range of the table pool.
    pub fn pool_range(&self) -> PhysRange {
        PhysRange::new(self.pool.base(), self.pool.base() + self.pool.bytes())
    }

    /// Tables that stand for kernel-image memory (`swapper_pg_dir`, `bm_*`).
    pub fn image_tables(&self) -> u64 {
        self.image_tables
    }

    /// Walks the tables for `va` (no TLB, no counters): what the hardware would translate.
    pub fn translate(&self, va: u64) -> Result<Translation, KmapError> {
        mmu::walk(&self.pool, self.pgd, self.granule, va)
    }

    /// Reads a 64-bit kernel word at `va` through the MMU (TLB, walk on miss).
    pub fn read_u64(&mut self, va: u64) -> Result<u64, KmapError> {
        let pa = self.mmu.translate(&self.pool, va, &mut self.stats)?;
        self.pool.load(pa)
    }

    /// `map_mem`: maps every RAM range except the kernel image with `pgprot_tagged(PAGE_KERNEL)`
    /// (`NO_EXEC_MAPPINGS`, plus `NO_BLOCK|NO_CONT` when `granularity` forces pages), then the
    /// image's linear alias with `PAGE_KERNEL` and `NO_CONT_MAPPINGS`.
    pub fn map_mem(
        &mut self,
        granularity: LinearGranularity,
        variant: LinearMapVariant,
    ) -> Result<(), KmapError> {
        let flags = granularity.flags();
        let image = self.layout.kernel_image;
        let ranges = self.layout.ranges.clone();
        for r in &ranges {
            for piece in subtract(*r, image) {
                self.map_memblock(piece, Pgprot::KERNEL.tagged(), flags, variant)?;
            }
        }
        self.map_memblock(image, Pgprot::KERNEL, MapFlags::NO_CONT_MAPPINGS, variant)
    }

    /// `__map_memblock`: an early linear mapping of one physical range.
    fn map_memblock(
        &mut self,
        r: PhysRange,
        prot: Pgprot,
        flags: MapFlags,
        variant: LinearMapVariant,
    ) -> Result<(), KmapError> {
        let req = MapRequest {
            phys: r.start,
            virt: self.phys_to_virt(r.start),
            size: r.size(),
            prot,
            flags,
            phase: Phase::Early,
            alloc: TableAlloc::Allocate,
        };
        self.create_pgd_mapping(&req, variant)
    }

    /// `mark_linear_text_alias_ro`: makes the image alias read-only in place (a late
    /// permission-only update that may not allocate), then flushes the kernel TLB.
    pub fn mark_linear_text_alias_ro(
        &mut self,
        variant: LinearMapVariant,
    ) -> Result<(), KmapError> {
        let image = self.layout.kernel_image;
        let req = MapRequest {
            phys: image.start,
            virt: self.phys_to_virt(image.start),
            size: image.size(),
            prot: Pgprot::KERNEL_RO,
            flags: MapFlags::NO_CONT_MAPPINGS,
            phase: Phase::Late,
            alloc: TableAlloc::Forbid,
        };
        self.create_pgd_mapping(&req, variant)?;
        self.mmu.dsb(&mut self.stats);
        self.mmu.tlbi_all(&mut self.stats);
        self.mmu.dsb(&mut self.stats);
        self.mmu.isb(&mut self.stats);
        Ok(())
    }

    /// `arch_add_memory`: maps hot-plugged RAM late, with tables from the page allocator.
    ///
    /// # Errors
    /// [`KmapError::BadLayout`] if the range overlaps RAM already present or is misaligned.
    pub fn add_memory(
        &mut self,
        r: PhysRange,
        granularity: LinearGranularity,
        variant: LinearMapVariant,
    ) -> Result<(), KmapError> {
        let ps = self.granule.page_size();
        let present = self.layout.ranges.iter().chain(&self.hotplugged);
        if r.start >= r.end
            || (r.start | r.end) & (ps - 1) != 0
            || r.start < self.phys_offset
            || r.end - self.phys_offset > LINEAR_SIZE
            || present.clone().any(|p| p.overlaps(&r))
        {
            return Err(KmapError::BadLayout(format!(
                "cannot hot-add {:#x}-{:#x}",
                r.start, r.end
            )));
        }
        let req = MapRequest {
            phys: r.start,
            virt: self.phys_to_virt(r.start),
            size: r.size(),
            prot: Pgprot::KERNEL,
            flags: granularity.flags(),
            phase: Phase::Late,
            alloc: TableAlloc::Allocate,
        };
        self.create_pgd_mapping(&req, variant)?;
        self.hotplugged.push(r);
        Ok(())
    }
}

/// `r` minus `hole`: zero, one or two pieces.
fn subtract(r: PhysRange, hole: PhysRange) -> Vec<PhysRange> {
    if !r.overlaps(&hole) {
        return vec![r];
    }
    let mut out = Vec::with_capacity(2);
    if r.start < hole.start {
        out.push(PhysRange::new(r.start, hole.start));
    }
    if hole.end < r.end {
        out.push(PhysRange::new(hole.end, r.end));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subtract_pieces() {
        let r = PhysRange::new(0, 100);
        assert_eq!(subtract(r, PhysRange::new(200, 300)), vec![r]);
        assert_eq!(
            subtract(r, PhysRange::new(10, 20)),
            vec![PhysRange::new(0, 10), PhysRange::new(20, 100)]
        );
        assert_eq!(subtract(r, PhysRange::new(0, 100)), vec![]);
    }

    #[test]
    fn pool_estimate_covers_512g_pages() {
        let l = RamLayout::single(512 << 30);
        let b = pool_bytes_for(&l, Granule::K4, LinearGranularity::ForcePages, 0);
        assert!(b >= (262_144 + 512) * 4096, "{b}");
        assert!(b < (1 << 30) + (16 << 20), "{b}");
        let b = pool_bytes_for(&l, Granule::K4, LinearGranularity::Blocks, 0);
        assert!(b <= 8 << 20, "{b}");
    }
}
