//! `folio_pte_batch`: how many consecutive PTEs map consecutive pages of one folio alike.
//!
//! Linux counterpart: `mm/internal.h` (`folio_pte_batch_flags`, `__pte_batch_clear_ignored`,
//! the `FPB_*` flags). Two entries belong to one batch when, after *normalising* both (clear
//! the bits the caller does not care about, always clear accessed) and advancing the PFN, they
//! are identical. The scan stops at the end of the folio and at `max_nr`, which the caller
//! limits to the page table and the VMA.

use super::{Arch, PageTables};

/// What the batch must respect or merge (`fpb_t`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct BatchFlags {
    /// Entries must agree on dirty (`FPB_RESPECT_DIRTY`).
    pub(crate) respect_dirty: bool,
    /// Entries must agree on soft-dirty (`FPB_RESPECT_SOFT_DIRTY`).
    pub(crate) respect_soft_dirty: bool,
    /// Entries must agree on write (`FPB_RESPECT_WRITE`).
    pub(crate) respect_write: bool,
    /// Report whether any entry was writable (`FPB_MERGE_WRITE`).
    pub(crate) merge_write: bool,
}

/// The outcome of a batch scan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Batch {
    /// Entries in the batch (at least 1).
    pub(crate) nr: usize,
    /// Some entry of the batch was writable.
    pub(crate) any_writable: bool,
    /// Some entry of the batch was dirty.
    pub(crate) any_dirty: bool,
}

/// Clears what `flags` ignores (`__pte_batch_clear_ignored`).
#[inline]
pub(crate) fn normalise(arch: Arch, e: u64, flags: BatchFlags) -> u64 {
    let mut v = e;
    if !flags.respect_dirty {
        v = arch.mkclean(v);
    }
    if !flags.respect_soft_dirty {
        v = arch.clear_soft_dirty(v);
    }
    if !flags.respect_write {
        v = arch.wrprotect(v);
    }
    arch.mkold(v)
}

/// Scans entries `idx..idx+max_nr` of `table`, starting with `first` (the entry at `idx`,
/// which maps page `pfn` of the folio whose last page is `folio_last_pfn`).
///
/// # Context
/// The PTL of `table` is held; `max_nr >= 1` and `idx + max_nr` stays inside the table.
pub(crate) fn folio_pte_batch(
    pt: PageTables<'_>,
    table: u64,
    idx: usize,
    first: u64,
    folio_last_pfn: u64,
    max_nr: usize,
    flags: BatchFlags,
) -> Batch {
    let arch = pt.arch;
    let pfn = arch.pfn(first);
    let max_nr = max_nr.min((folio_last_pfn - pfn + 1) as usize);
    let mut any_writable = arch.write(first);
    let mut any_dirty = arch.dirty(first);
    let mut expected = normalise(arch, arch.advance_pfn(first, 1), flags);
    let mut nr = 1;
    while nr < max_nr {
        let e = pt.get(table, idx + nr);
        if e == 0 || normalise(arch, e, flags) != expected {
            break;
        }
        any_writable |= arch.write(e);
        any_dirty |= arch.dirty(e);
        expected = arch.advance_pfn(expected, 1);
        nr += 1;
    }
    Batch {
        nr,
        any_writable: flags.merge_write && any_writable,
        any_dirty,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pgtable::Prot;
    use crate::phys::{FolioKind, PhysMem, Zeroing};
    use crate::stats::CpuCounters;

    const RO: Prot = Prot {
        read: true,
        write: false,
        exec: false,
    };

    fn setup(arch: Arch) -> (PhysMem, u64) {
        let phys = PhysMem::new(16 << 20, 1);
        let c = CpuCounters::default();
        let t = phys
            .alloc_folio(&c, 0, 0, FolioKind::Pgtable, Zeroing::Zero)
            .expect("table");
        let _ = arch;
        (phys, t)
    }

    #[test]
    fn batch_stops_at_folio_end_dirty_change_and_gap() {
        for arch in [Arch::X86_64, Arch::Arm64] {
            let (phys, t) = setup(arch);
            let pt = PageTables {
                phys: &phys,
                arch,
                pgd: t,
            };
            let base = arch.mk_pte(0x100, RO, false);
            for i in 0..16u64 {
                pt.set(t, i as usize, arch.advance_pfn(base, i));
            }
            let respect = BatchFlags {
                respect_dirty: true,
                merge_write: true,
                ..BatchFlags::default()
            };
            // Folio of 16 pages: the whole run.
            assert_eq!(folio_pte_batch(pt, t, 0, base, 0x10f, 32, respect).nr, 16);
            // Folio end at page 8 stops it.
            assert_eq!(folio_pte_batch(pt, t, 0, base, 0x107, 32, respect).nr, 8);
            // max_nr (table / VMA end) stops it.
            assert_eq!(folio_pte_batch(pt, t, 0, base, 0x10f, 5, respect).nr, 5);
            // A dirty entry splits the batch when dirty is respected, not otherwise.
            pt.set(t, 4, arch.mkdirty(arch.advance_pfn(base, 4)));
            assert_eq!(folio_pte_batch(pt, t, 0, base, 0x10f, 32, respect).nr, 4);
            let ignore = BatchFlags::default();
            let b = folio_pte_batch(pt, t, 0, base, 0x10f, 32, ignore);
            assert!(b.nr == 16 && b.any_dirty);
            // A writable entry merges; an empty entry stops.
            pt.set(t, 6, arch.mkwrite(arch.advance_pfn(base, 6)));
            let b = folio_pte_batch(
                pt,
                t,
                0,
                base,
                0x10f,
                32,
                BatchFlags {
                    merge_write: true,
                    ..ignore
                },
            );
            assert!(b.nr == 16 && b.any_writable);
            pt.set(t, 9, 0);
            assert_eq!(folio_pte_batch(pt, t, 0, base, 0x10f, 32, ignore).nr, 9);
            // Non-consecutive PFNs stop it.
            pt.set(t, 2, arch.advance_pfn(base, 3));
            assert_eq!(folio_pte_batch(pt, t, 0, base, 0x10f, 32, ignore).nr, 2);
        }
    }

    #[test]
    fn x86_protnone_batches_advance_downwards_in_raw_bits() {
        let arch = Arch::X86_64;
        let (phys, t) = setup(arch);
        let pt = PageTables {
            phys: &phys,
            arch,
            pgd: t,
        };
        let base = arch.mk_pte(0x200, Prot::NONE, false);
        for i in 0..4u64 {
            pt.set(t, i as usize, arch.mk_pte(0x200 + i, Prot::NONE, false));
        }
        assert_eq!(
            folio_pte_batch(pt, t, 0, base, 0x203, 8, BatchFlags::default()).nr,
            4
        );
    }
}
