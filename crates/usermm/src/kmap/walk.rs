//! Creating kernel mappings: the `__create_pgd_mapping` walk.
//!
//! Linux counterparts (`arch/arm64/mm/mmu.c`): `__create_pgd_mapping_locked`,
//! `alloc_init_pud`, `alloc_init_cont_pmd`, `init_pmd`, `alloc_init_cont_pte`, `init_pte`,
//! `init_clear_pgtable`, `early_pgtable_alloc` and `__pgd_pgtable_alloc`. The structure and the
//! leaf decisions follow Linux; how a table is reached (fixmap slot per chunk or per table, or
//! the linear map) and who zeroes it follow the [`Strategy`] of the selected
//! [`LinearMapVariant`]. Errors replace Linux's `BUG_ON`s and are raised before the offending
//! write; any fixmap slot still set is cleared before the error is returned.

use super::desc::{
    classify, desc_pa, mk_block, mk_page, mk_table, DescKind, MapFlags, Pgprot, TableExec, CONT,
    VALID,
};
use super::fixmap::zero_direct;
use super::geom::addr_end;
use super::geom::FixSlot;
use super::safe::pgattr_change_is_safe;
use super::variant::{
    AllocZero, LeafBarriers, LinearMapVariant, Phase, RemapScope, Strategy, TableAccess,
};
use super::{KernelSpace, KmapError, TlbCheck};
use std::sync::atomic::Ordering::Relaxed;

/// Whether a mapping call may allocate tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TableAlloc {
    /// Allocate missing tables (memblock early, the page allocator late).
    Allocate,
    /// Permission updates of existing mappings (`update_mapping_prot`: no allocator).
    Forbid,
}

/// One `__create_pgd_mapping` call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapRequest {
    /// First physical address.
    pub phys: u64,
    /// First virtual address (same offset within a page as `phys`).
    pub virt: u64,
    /// Bytes to map (rounded out to whole pages).
    pub size: u64,
    /// Leaf protection.
    pub prot: Pgprot,
    /// `NO_BLOCK_MAPPINGS`, `NO_CONT_MAPPINGS`, `NO_EXEC_MAPPINGS`.
    pub flags: MapFlags,
    /// Boot (before the linear map) or later.
    pub phase: Phase,
    /// Whether tables may be allocated.
    pub alloc: TableAlloc,
}

/// How a table is being accessed right now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum View {
    /// Kernel-image memory (`swapper_pg_dir`): written by physical address.
    Image {
        /// Table address.
        pa: u64,
    },
    /// Mapped at a fixmap slot.
    Fixmap {
        /// The slot.
        slot: FixSlot,
        /// Its VA.
        va: u64,
        /// Table address.
        pa: u64,
    },
    /// Reached through the linear map (`__va`).
    Linear {
        /// Linear-map VA of the table.
        va: u64,
        /// Table address.
        pa: u64,
    },
}

/// The state one walk carries down.
#[derive(Clone, Copy, Debug)]
struct Ctx {
    strategy: Strategy,
    flags: MapFlags,
    prot: Pgprot,
    alloc: TableAlloc,
    exec: TableExec,
}

/// What a parent entry led to.
#[derive(Clone, Copy, Debug)]
enum Child {
    /// A table allocated just now (not yet installed in the parent).
    New(u64),
    /// The table the parent already points at.
    Existing(u64),
}

/// How a PMD/PTE table is held while its chunks are populated.
#[derive(Clone, Copy, Debug)]
enum Held {
    /// Mapped once for the whole call.
    Mapped(View),
    /// Mapped and unmapped around each contiguous chunk.
    PerChunk(u64),
}

impl KernelSpace {
    /// `__create_pgd_mapping`: maps `[virt, virt + size)` to `phys` with `prot`.
    ///
    /// # Errors
    /// [`KmapError::OffsetMismatch`] if `phys` and `virt` differ within a page; a table
    /// shortage, a block in the way, or an unsafe change of a live entry (`BUG_ON` in Linux).
    pub fn create_pgd_mapping(
        &mut self,
        req: &MapRequest,
        variant: LinearMapVariant,
    ) -> Result<(), KmapError> {
        let ps = self.granule.page_size();
        if (req.phys ^ req.virt) & (ps - 1) != 0 {
            return Err(KmapError::OffsetMismatch {
                phys: req.phys,
                virt: req.virt,
            });
        }
        let phys = req.phys & !(ps - 1);
        let addr = req.virt & !(ps - 1);
        let end = req.virt.wrapping_add(req.size).wrapping_add(ps - 1) & !(ps - 1);
        if addr == end {
            return Ok(());
        }
        let ctx = Ctx {
            strategy: variant.strategy(req.phase),
            flags: req.flags,
            prot: req.prot,
            alloc: req.alloc,
            exec: if req.flags.contains(MapFlags::NO_EXEC_MAPPINGS) {
                TableExec::NoExec
            } else {
                TableExec::UxnOnly
            },
        };
        let res = self.map_pgd(&ctx, addr, end, phys);
        if res.is_err() {
            self.release_fixmap();
        }
        res
    }

    fn map_pgd(
        &mut self,
        ctx: &Ctx,
        mut addr: u64,
        end: u64,
        mut phys: u64,
    ) -> Result<(), KmapError> {
        let g = self.granule;
        let top = g.top_level();
        let pgd = View::Image { pa: self.pgd };
        loop {
            let next = addr_end(addr, end, g.entry_size(top));
            let idx = g.index(addr, top);
            if g.has_pud() {
                self.alloc_init_pud(ctx, pgd, idx, addr, next, phys)?;
            } else {
                self.alloc_init_cont_pmd(ctx, pgd, idx, addr, next, phys)?;
            }
            phys += next - addr;
            addr = next;
            if addr == end {
                return Ok(());
            }
        }
    }

    /// `alloc_init_pud`: one PUD table, mapped once per call in every variant.
    fn alloc_init_pud(
        &mut self,
        ctx: &Ctx,
        parent: View,
        pidx: u64,
        mut addr: u64,
        end: u64,
        mut phys: u64,
    ) -> Result<(), KmapError> {
        let g = self.granule;
        let view = self.open_table(ctx, parent, pidx, 1, addr)?;
        loop {
            let size = g.entry_size(1);
            let next = addr_end(addr, end, size);
            let idx = g.index(addr, 1);
            if g.block_allowed(1)
                && (addr | next | phys) & (size - 1) == 0
                && !ctx.flags.contains(MapFlags::NO_BLOCK_MAPPINGS)
            {
                self.set_block(view, idx, addr, phys, ctx.prot, 1)?;
            } else {
                self.alloc_init_cont_pmd(ctx, view, idx, addr, next, phys)?;
            }
            phys += next - addr;
            addr = next;
            if addr == end {
                break;
            }
        }
        self.unmap_table(view)
    }

    /// `alloc_init_cont_pmd`: one PMD table, populated in contiguous chunks.
    fn alloc_init_cont_pmd(
        &mut self,
        ctx: &Ctx,
        parent: View,
        pidx: u64,
        addr: u64,
        end: u64,
        phys: u64,
    ) -> Result<(), KmapError> {
        self.cont_table(ctx, (parent, pidx, 2), addr, end, phys)
    }

    /// `alloc_init_cont_pte`: one PTE table, populated in contiguous chunks.
    fn alloc_init_cont_pte(
        &mut self,
        ctx: &Ctx,
        parent: View,
        pidx: u64,
        addr: u64,
        end: u64,
        phys: u64,
    ) -> Result<(), KmapError> {
        self.cont_table(ctx, (parent, pidx, 3), addr, end, phys)
    }

    /// The shared body of `alloc_init_cont_pmd` / `alloc_init_cont_pte`.
    ///
    /// `slot`: the parent table, the index of the entry that will point at the new table, and
    /// the new table's level.
    fn cont_table(
        &mut self,
        ctx: &Ctx,
        slot: (View, u64, u32),
        addr: u64,
        end: u64,
        phys: u64,
    ) -> Result<(), KmapError> {
        let (parent, pidx, level) = slot;
        match ctx.strategy.remap {
            RemapScope::PerTable => {
                let view = self.open_table(ctx, parent, pidx, level, addr)?;
                self.cont_chunks(ctx, Held::Mapped(view), level, addr, end, phys)?;
                self.unmap_table(view)
            }
            RemapScope::PerContChunk => {
                let pa = self.install_unmapped(ctx, parent, pidx, level, addr)?;
                self.cont_chunks(ctx, Held::PerChunk(pa), level, addr, end, phys)
            }
        }
    }

    /// The `pte_cont_addr_end` / `pmd_cont_addr_end` loop: decides CONT per chunk.
    fn cont_chunks(
        &mut self,
        ctx: &Ctx,
        held: Held,
        level: u32,
        mut addr: u64,
        end: u64,
        mut phys: u64,
    ) -> Result<(), KmapError> {
        let g = self.granule;
        let csize = g.cont_size(level);
        loop {
            let next = addr_end(addr, end, csize);
            let view = match held {
                Held::Mapped(v) => v,
                Held::PerChunk(pa) => self.map_table(ctx, level, pa)?,
            };
            let mut prot = ctx.prot.without_cont();
            if (addr | next | phys) & (csize - 1) == 0
                && !ctx.flags.contains(MapFlags::NO_CONT_MAPPINGS)
                && self.group_takes_cont(view, level, addr)?
            {
                prot = prot.cont();
            }
            if level == 3 {
                self.init_pte(ctx, view, addr, next, phys, prot)?;
            } else {
                self.init_pmd(ctx, view, addr, next, phys, prot)?;
            }
            if let Held::PerChunk(_) = held {
                self.unmap_table(view)?;
            }
            phys += next - addr;
            addr = next;
            if addr == end {
                return Ok(());
            }
        }
    }

    /// A group may get CONT only if none of its entries is a valid non-contiguous leaf.
    fn group_takes_cont(&mut self, view: View, level: u32, addr: u64) -> Result<bool, KmapError> {
        let g = self.granule;
        let first = g.index(addr, level);
        for i in first..first + g.cont_entries(level) {
            let pa = self.entry_pa(view, i)?;
            let d = self.pool.load(pa)?;
            if d & VALID != 0 && d & CONT == 0 {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// `init_pmd`: blocks where aligned, else a PTE table.
    fn init_pmd(
        &mut self,
        ctx: &Ctx,
        view: View,
        mut addr: u64,
        end: u64,
        mut phys: u64,
        prot: Pgprot,
    ) -> Result<(), KmapError> {
        let g = self.granule;
        let size = g.entry_size(2);
        loop {
            let next = addr_end(addr, end, size);
            let idx = g.index(addr, 2);
            if (addr | next | phys) & (size - 1) == 0
                && !ctx.flags.contains(MapFlags::NO_BLOCK_MAPPINGS)
            {
                self.set_block(view, idx, addr, phys, prot, 2)?;
            } else {
                self.alloc_init_cont_pte(ctx, view, idx, addr, next, phys)?;
            }
            phys += next - addr;
            addr = next;
            if addr == end {
                return Ok(());
            }
        }
    }

    /// `init_pte`: writes page descriptors (barriers per entry only in the old code).
    ///
    /// Stores go through the MMU one TLB translation per run of entries within a 4 KiB frame
    /// (each further store of the run is a counted TLB hit: nothing can invalidate the entry
    /// in between, and with [`super::TlbCheck::Verify`] every store is translated anew).
    fn init_pte(
        &mut self,
        ctx: &Ctx,
        view: View,
        addr: u64,
        end: u64,
        phys: u64,
        prot: Pgprot,
    ) -> Result<(), KmapError> {
        let g = self.granule;
        let ps = g.page_size();
        let first = g.index(addr, 3);
        let n = (end - addr) / ps;
        let mut i = 0;
        while i < n {
            let (pa, run) = self.access_run(view, first + i, n - i)?;
            let words = self.pool.words(pa, run)?;
            for (k, w) in (i..).zip(words) {
                let old = w.load(Relaxed);
                let new = mk_page(phys + k * ps, prot, g);
                if !pgattr_change_is_safe(old, new) {
                    return Err(KmapError::UnsafeChange {
                        va: addr + k * ps,
                        level: 3,
                        old,
                        new,
                    });
                }
                w.store(new, Relaxed);
                if ctx.strategy.leaf_barriers == LeafBarriers::PerEntry {
                    self.mmu.dsb(&mut self.stats);
                    self.mmu.isb(&mut self.stats);
                }
            }
            self.stats.entries_written += run;
            i += run;
        }
        Ok(())
    }

    /// `pmd_set_huge` / `pud_set_huge`, checked by `pgattr_change_is_safe`.
    fn set_block(
        &mut self,
        view: View,
        idx: u64,
        addr: u64,
        phys: u64,
        prot: Pgprot,
        level: u32,
    ) -> Result<(), KmapError> {
        let pa = self.entry_pa(view, idx)?;
        let old = self.pool.load(pa)?;
        let new = mk_block(phys, prot, self.granule);
        if !pgattr_change_is_safe(old, new) {
            return Err(KmapError::UnsafeChange {
                va: addr,
                level,
                old,
                new,
            });
        }
        self.write_upper(pa, new)
    }

    /// `set_pmd` & co: a valid upper-level write is followed by DSB ISHST + ISB.
    fn write_upper(&mut self, pa: u64, desc: u64) -> Result<(), KmapError> {
        self.pool.store(pa, desc)?;
        self.stats.entries_written += 1;
        self.mmu.dsb(&mut self.stats);
        self.mmu.isb(&mut self.stats);
        Ok(())
    }

    /// Reads the parent entry for a table at `level`, allocating the table if it is empty.
    ///
    /// # Returns
    /// The child and the physical address of the parent entry.
    fn child_table(
        &mut self,
        ctx: &Ctx,
        parent: View,
        pidx: u64,
        level: u32,
        addr: u64,
    ) -> Result<(Child, u64), KmapError> {
        let g = self.granule;
        let entry = self.entry_pa(parent, pidx)?;
        let desc = self.pool.load(entry)?;
        match classify(desc, level - 1, g) {
            DescKind::Invalid if desc == 0 => {
                let pa = self.pgtable_alloc(ctx, level, addr)?;
                Ok((Child::New(pa), entry))
            }
            DescKind::Table => Ok((Child::Existing(desc_pa(desc, g)), entry)),
            DescKind::Block => Err(KmapError::BlockInTheWay {
                va: addr,
                level: level - 1,
            }),
            _ => Err(KmapError::BadDescriptor {
                va: addr,
                level: level - 1,
                desc,
            }),
        }
    }

    /// Gets the table under a parent entry and maps it for the whole call: a new table is
    /// mapped, zeroed if the walker owns zeroing, and then installed in the parent.
    fn open_table(
        &mut self,
        ctx: &Ctx,
        parent: View,
        pidx: u64,
        level: u32,
        addr: u64,
    ) -> Result<View, KmapError> {
        let (child, entry) = self.child_table(ctx, parent, pidx, level, addr)?;
        match child {
            Child::Existing(pa) => self.map_table(ctx, level, pa),
            Child::New(pa) => {
                let view = self.map_table(ctx, level, pa)?;
                if ctx.strategy.zero == AllocZero::InWalker {
                    self.init_clear_pgtable(view)?;
                }
                self.write_upper(entry, mk_table(pa, ctx.exec, self.granule))?;
                Ok(view)
            }
        }
    }

    /// Gets the table under a parent entry without keeping it mapped (the old per-chunk code).
    fn install_unmapped(
        &mut self,
        ctx: &Ctx,
        parent: View,
        pidx: u64,
        level: u32,
        addr: u64,
    ) -> Result<u64, KmapError> {
        let (child, entry) = self.child_table(ctx, parent, pidx, level, addr)?;
        match child {
            Child::Existing(pa) => Ok(pa),
            Child::New(pa) => {
                if ctx.strategy.zero == AllocZero::InWalker {
                    let view = self.map_table(ctx, level, pa)?;
                    self.init_clear_pgtable(view)?;
                    self.unmap_table(view)?;
                }
                self.write_upper(entry, mk_table(pa, ctx.exec, self.granule))?;
                Ok(pa)
            }
        }
    }

    /// `early_pgtable_alloc` / `__pgd_pgtable_alloc`: a table page, zeroed here only by the
    /// older variants (through `FIX_PTE` early, through the linear map late).
    fn pgtable_alloc(&mut self, ctx: &Ctx, level: u32, addr: u64) -> Result<u64, KmapError> {
        if ctx.alloc == TableAlloc::Forbid {
            return Err(KmapError::NoAllocator { va: addr, level });
        }
        let pa = self.pool.alloc()?;
        self.stats.tables_allocated[level as usize] += 1;
        match ctx.strategy.zero {
            AllocZero::FixmapScratch => {
                let view = self.set_fixmap(FixSlot::Pte, pa, level)?;
                self.clear_table(view)?;
                self.clear_fixmap(FixSlot::Pte)?;
            }
            AllocZero::LinearMap => {
                let view = self.linear_view(pa);
                self.clear_table(view)?;
            }
            AllocZero::InWalker => {}
        }
        Ok(pa)
    }

    /// `init_clear_pgtable`: clear the page, then DSB ISHST so the walker sees zeroes.
    fn init_clear_pgtable(&mut self, view: View) -> Result<(), KmapError> {
        self.clear_table(view)?;
        self.mmu.dsb(&mut self.stats);
        Ok(())
    }

    /// Clears a table through its current mapping (one translation per 4 KiB of stores).
    fn clear_table(&mut self, view: View) -> Result<(), KmapError> {
        match view {
            View::Image { pa } => zero_direct(&self.pool, pa, self.granule)?,
            View::Fixmap { va, .. } | View::Linear { va, .. } => {
                for f in 0..self.granule.page_size() / 4096 {
                    let pa = self
                        .mmu
                        .translate(&self.pool, va + f * 4096, &mut self.stats)?;
                    self.pool.zero_frame(pa)?;
                }
            }
        }
        self.stats.tables_zeroed += 1;
        Ok(())
    }

    /// Maps a table of `level` the way the strategy reaches tables.
    fn map_table(&mut self, ctx: &Ctx, level: u32, pa: u64) -> Result<View, KmapError> {
        match ctx.strategy.access {
            TableAccess::Fixmap => {
                let slot = FixSlot::for_level(level).ok_or_else(|| {
                    KmapError::Invariant(format!("no fixmap slot for a level-{level} table"))
                })?;
                self.set_fixmap(slot, pa, level)
            }
            TableAccess::LinearMap => Ok(self.linear_view(pa)),
        }
    }

    /// Ends access to a table: clears its fixmap slot (TLBI), or for a linear-map access
    /// publishes the writes with a DSB.
    fn unmap_table(&mut self, view: View) -> Result<(), KmapError> {
        match view {
            View::Fixmap { slot, .. } => self.clear_fixmap(slot),
            View::Linear { .. } => {
                self.mmu.dsb(&mut self.stats);
                Ok(())
            }
            View::Image { .. } => Ok(()),
        }
    }

    /// A table reached through `__va(pa)`.
    fn linear_view(&self, pa: u64) -> View {
        View::Linear {
            va: self.phys_to_virt(pa),
            pa,
        }
    }

    /// Translates entry `idx` and says how many of the following entries (at most `max`) share
    /// its 4 KiB frame; the extra accesses are counted as TLB hits.
    fn access_run(&mut self, view: View, idx: u64, max: u64) -> Result<(u64, u64), KmapError> {
        let pa = self.entry_pa(view, idx)?;
        let in_frame = (4096 - (pa & 0xfff)) / 8;
        let run = match (view, self.tlb_check) {
            (View::Image { .. }, _) | (_, TlbCheck::Trust) => max.min(in_frame),
            (_, TlbCheck::Verify) => 1,
        };
        if !matches!(view, View::Image { .. }) {
            self.stats.tlb_hits += run - 1;
        }
        Ok((pa, run))
    }

    /// Physical address of entry `idx` of a table, through the MMU unless it is image memory.
    #[inline]
    fn entry_pa(&mut self, view: View, idx: u64) -> Result<u64, KmapError> {
        match view {
            View::Image { pa } => Ok(pa + idx * 8),
            View::Fixmap { va, .. } | View::Linear { va, .. } => {
                self.mmu
                    .translate(&self.pool, va + idx * 8, &mut self.stats)
            }
        }
    }
}
