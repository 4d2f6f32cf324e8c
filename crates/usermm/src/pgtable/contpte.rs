//! Contiguous PTEs on arm64 (contpte), and the PTE batch primitives that hide them.
//!
//! Linux counterparts: `arch/arm64/mm/contpte.c` (`contpte_set_ptes`, `contpte_try_fold`,
//! `contpte_try_unfold`, `contpte_convert`, `contpte_clear_full_ptes`,
//! `contpte_wrprotect_ptes`), `arch/arm64/include/asm/pgtable.h` (`set_ptes`, `ptep_get`,
//! `pte_batch_hint`) and the generic `include/linux/pgtable.h` versions, which x86-64 uses.
//!
//! On arm64, 16 consecutive entries (64 KiB) that map 16 consecutive, 64 KiB-aligned pages of
//! one folio with identical attributes may carry the CONT bit, letting the TLB cache them as
//! one entry. `set_ptes` of a run writes aligned blocks with CONT directly; a single `set_pte`
//! of the last entry of a block tries to fold the block; changing one entry of a folded block
//! unfolds it first (a break-before-make: one range TLBI). Batched clears and write-protects
//! work on whole blocks in place and unfold only the partially covered blocks at the ends.
//! Folds and unfolds are counted.

use super::{arch::arm64, Arch, PageTables, Pte};
use crate::phys::Pfn;
use crate::stats::{CpuCounters, Ev};

/// Entries per contiguous block (4 KiB granule).
pub(crate) const CONT_PTES: usize = 16;
/// log2 of [`CONT_PTES`]: a block maps a naturally aligned run of `2^CONT_PTE_ORDER` frames.
const CONT_PTE_ORDER: u32 = CONT_PTES.trailing_zeros();

/// Whether an entry is part of a folded block.
#[inline]
pub(crate) fn pte_cont(arch: Arch, e: Pte) -> bool {
    arch == Arch::Arm64 && e.val() & arm64::CONT != 0 && e.val() & arm64::VALID != 0
}

impl<'a> PageTables<'a> {
    /// `ptep_get`: the entry; for a folded block, with accessed/dirty gathered from all 16.
    pub(crate) fn ptep_get(&self, table: Pfn, idx: usize) -> Pte {
        let e = self.ptep_get_raw(table, idx);
        if !pte_cont(self.arch, e) {
            return e;
        }
        let base = idx & !(CONT_PTES - 1);
        let mut v = e;
        for i in base..base + CONT_PTES {
            let s = self.ptep_get_raw(table, i);
            if self.arch.young(s) {
                v = self.arch.mkyoung(v);
            }
            if self.arch.dirty(s) {
                v = self.arch.mkdirty(v);
            }
        }
        v
    }

    /// `pte_batch_hint`: how many entries from `idx` are known to be uniform (the rest of a
    /// folded block), 1 otherwise.
    #[inline]
    #[allow(dead_code)] // No caller left since the public surface was narrowed (h14).
    pub(crate) fn pte_batch_hint(&self, idx: usize, e: Pte) -> usize {
        if pte_cont(self.arch, e) {
            CONT_PTES - (idx & (CONT_PTES - 1))
        } else {
            1
        }
    }

    /// `set_ptes`: writes `nr` entries mapping consecutive pages, `e` first; on arm64 every
    /// fully covered, 64 KiB-aligned block is written folded.
    ///
    /// # Context
    /// PTL held; for `nr > 1` the targets are empty.
    pub(super) fn set_ptes(&self, c: &CpuCounters, table: Pfn, idx: usize, e: Pte, nr: usize) {
        if nr == 1 {
            self.set_pte(c, table, idx, e);
            return;
        }
        // The entry may come from a folded block (`ptep_get`): the CONT bit is re-derived here.
        let e = pte_mknoncont(self.arch, e);
        let arm = self.arch == Arch::Arm64 && !self.arch.special(e);
        let mut i = 0;
        while i < nr {
            let v = self.arch.advance_pfn(e, i as u64);
            let aligned = (idx + i).is_multiple_of(CONT_PTES)
                && self.arch.pfn(v).is_aligned(CONT_PTE_ORDER)
                && nr - i >= CONT_PTES;
            if arm && aligned && self.arch.accessible(v) {
                for j in 0..CONT_PTES {
                    self.set(
                        table,
                        idx + i + j,
                        self.arch.advance_pfn(v, j as u64).val() | arm64::CONT,
                    );
                }
                i += CONT_PTES;
            } else {
                self.set(table, idx + i, v.val());
                i += 1;
            }
        }
        c.add(Ev::PteWrite, nr as u64);
    }

    /// Sets one entry (`set_pte_at`): unfolds its block first if folded, then tries to fold
    /// when this is the last entry of a block.
    pub(super) fn set_pte(&self, c: &CpuCounters, table: Pfn, idx: usize, e: Pte) {
        self.unfold_if_cont(c, table, idx);
        self.set(table, idx, pte_mknoncont(self.arch, e).val());
        c.add(Ev::PteWrite, 1);
        if self.arch == Arch::Arm64 && idx % CONT_PTES == CONT_PTES - 1 {
            self.try_fold(c, table, idx);
        }
    }

    /// Clears `nr` entries (`get_and_clear_full_ptes`); returns whether any was dirty.
    pub(super) fn clear_ptes(&self, c: &CpuCounters, table: Pfn, idx: usize, nr: usize) -> bool {
        self.unfold_partial(c, table, idx, nr);
        let mut dirty = false;
        for j in idx..idx + nr {
            dirty |= self.arch.dirty(self.ptep_get_raw(table, j));
            self.set(table, j, Pte::NONE.val());
        }
        c.add(Ev::PteWrite, nr as u64);
        if self.arch == Arch::X86_64 {
            c.add(Ev::PteAtomic, nr as u64);
        }
        dirty
    }

    /// Write-protects `nr` present entries (`wrprotect_ptes`); whole folded blocks stay folded.
    pub(super) fn wrprotect_ptes(&self, c: &CpuCounters, table: Pfn, idx: usize, nr: usize) {
        self.unfold_partial(c, table, idx, nr);
        for j in idx..idx + nr {
            let e = self.ptep_get_raw(table, j);
            if self.arch.write(e) {
                self.set(table, j, self.arch.wrprotect(e).val());
                c.add(Ev::PteWrite, 1);
                if self.arch == Arch::X86_64 {
                    c.add(Ev::PteAtomic, 1);
                }
            }
        }
    }

    /// Unfolds the blocks at the two ends of `[idx, idx+nr)` that the range covers only partly.
    fn unfold_partial(&self, c: &CpuCounters, table: Pfn, idx: usize, nr: usize) {
        if self.arch != Arch::Arm64 || nr == 0 {
            return;
        }
        if !idx.is_multiple_of(CONT_PTES) || nr < CONT_PTES {
            self.unfold_if_cont(c, table, idx);
        }
        let end = idx + nr;
        if !end.is_multiple_of(CONT_PTES) {
            self.unfold_if_cont(c, table, end - 1);
        }
    }

    /// `contpte_try_unfold`.
    pub(crate) fn unfold_if_cont(&self, c: &CpuCounters, table: Pfn, idx: usize) {
        if !pte_cont(self.arch, self.ptep_get_raw(table, idx)) {
            return;
        }
        let base = idx & !(CONT_PTES - 1);
        let merged = self.ptep_get(table, base);
        for i in 0..CONT_PTES {
            let raw = self.ptep_get_raw(table, base + i);
            if raw.is_none() {
                continue;
            }
            let mut v = Pte::from_val(raw.val() & !arm64::CONT);
            if self.arch.young(merged) {
                v = self.arch.mkyoung(v);
            }
            if self.arch.dirty(merged) {
                v = self.arch.mkdirty(v);
            }
            self.set(table, base + i, v.val());
        }
        c.add(Ev::PteWrite, 2 * CONT_PTES as u64);
        c.add(Ev::ContUnfold, 1);
        c.add(Ev::TlbFlushRange, 1);
    }

    /// `contpte_try_fold`: folds the block ending at `idx` if its 16 entries map 16 aligned,
    /// consecutive pages of one folio with identical attributes.
    fn try_fold(&self, c: &CpuCounters, table: Pfn, idx: usize) {
        let arch = self.arch;
        let base = idx & !(CONT_PTES - 1);
        let first = self.ptep_get_raw(table, base);
        if !arch.accessible(first) || arch.special(first) || pte_cont(arch, first) {
            return;
        }
        let pfn0 = arch.pfn(first);
        if !pfn0.is_aligned(CONT_PTE_ORDER) {
            return;
        }
        let mem = &self.phys.memmap;
        let head = mem.folio_of(pfn0);
        let folio_end = head.add(1u64 << mem.order(head));
        if head > pfn0 || folio_end < pfn0.add(CONT_PTES as u64) {
            return;
        }
        let norm = |e: Pte| arch.mkclean(arch.mkold(e));
        let template = norm(first);
        let (mut young, mut dirty) = (false, false);
        for i in 0..CONT_PTES {
            let e = self.ptep_get_raw(table, base + i);
            if norm(e) != arch.advance_pfn(template, i as u64) {
                return;
            }
            young |= arch.young(e);
            dirty |= arch.dirty(e);
        }
        for i in 0..CONT_PTES {
            let mut v = Pte::from_val(self.get(table, base + i) | arm64::CONT);
            if young {
                v = arch.mkyoung(v);
            }
            if dirty {
                v = arch.mkdirty(v);
            }
            self.set(table, base + i, v.val());
        }
        c.add(Ev::PteWrite, 2 * CONT_PTES as u64);
        c.add(Ev::ContFold, 1);
        c.add(Ev::TlbFlushRange, 1);
    }

    /// Checks the contpte invariants of one table (for validation): every folded block has
    /// all 16 entries folded, valid, with consecutive aligned PFNs and equal attributes.
    pub(crate) fn check_contpte(&self, table: Pfn) -> Result<(), String> {
        if self.arch != Arch::Arm64 {
            return Ok(());
        }
        let arch = self.arch;
        for base in (0..super::PTRS_PER_TABLE).step_by(CONT_PTES) {
            let any = (0..CONT_PTES).any(|i| pte_cont(arch, self.ptep_get_raw(table, base + i)));
            if !any {
                continue;
            }
            let first = self.ptep_get_raw(table, base);
            let norm = |e: Pte| arch.mkclean(arch.mkold(e));
            for i in 0..CONT_PTES {
                let e = self.ptep_get_raw(table, base + i);
                if !pte_cont(arch, e) || norm(e) != arch.advance_pfn(norm(first), i as u64) {
                    return Err(format!(
                        "table {table:#x}: broken contpte block at index {base}"
                    ));
                }
            }
            if !arch.pfn(first).is_aligned(CONT_PTE_ORDER) {
                return Err(format!(
                    "table {table:#x}: contpte block at {base} maps unaligned pfn"
                ));
            }
        }
        Ok(())
    }
}

/// `pte_mknoncont`: `e` without the CONT bit, which only the block writers here set (x86
/// entries never have it: it is unused there).
#[inline]
pub(crate) fn pte_mknoncont(arch: Arch, e: Pte) -> Pte {
    match arch {
        Arch::Arm64 => Pte::from_val(e.val() & !arm64::CONT),
        Arch::X86_64 => e,
    }
}
