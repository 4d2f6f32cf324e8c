//! One page-table cursor for the software walkers.
//!
//! Linux counterparts: the `pgd_offset` … `pmd_offset` descent with `p?d_addr_end` and
//! `p?d_none_or_clear_bad` that `zap_pmd_range`, `change_pmd_range`, `copy_pmd_range`,
//! `move_page_tables` and `walk_page_range` (`mm/pagewalk.c`) each spell out;
//! `pte_offset_map_lock` / `pte_unmap_unlock`; `vm_normal_folio` (`mm/memory.c`).
//!
//! Two layers:
//! - [`PmdWalk`] steps through a range one PMD entry at a time and yields only the entries
//!   that map something ([`PmdStep`]: a huge leaf or a PTE table), skipping a missing PUD or
//!   PGD table in one step (1 GiB or 512 GiB) instead of probing it per 2 MiB, and descending
//!   from the PGD once per 1 GiB rather than once per PMD.
//! - [`PteLock`] is a PTE table with its split lock held. Every read and write of the table
//!   goes through it, so a write without the lock cannot be written; it yields folio runs
//!   ([`PteLock::run`]: `ptep_get` + `vm_normal_folio` + `folio_pte_batch`, reads counted),
//!   applies Linux's batch primitives (`set_ptes`, `clear_ptes`, `wrprotect_ptes`, a single
//!   `set_pte`) and folds the table's entry-count bookkeeping in once, when it is dropped.
//!
//! Every write that a TLB may still hold the old version of returns a
//! [`TlbFlushPending`] (see `tlb`): [`PteLock::clear`], [`PteLock::replace`],
//! [`PteLock::wrprotect`], [`PteCopy::copy_run`] when it write-protects the parent,
//! [`PmdLock::clear`] and [`PmdLock::replace`]. The writes that cannot leave a stale
//! translation owe nothing: filling empty entries (`set_ptes`, [`PmdLock::install`]),
//! setting accessed/dirty as the hardware does, clearing a swap entry
//! ([`PteLock::clear_nonpresent`]), and [`PteLock::replace_no_flush`] /
//! [`PmdLock::replace_no_flush`] (a non-present entry replaced, or a present one given more
//! rights over the same page: a write fault's reuse).
//!
//! Deliberate differences: there is no `pte_offset_map` without the lock (the engine's
//! lockless readers are the MMU model in `access.rs`, which keeps its own walker because it
//! models hardware); a walk does not clear bad entries (the engine never writes one, and
//! `validate()` reports any).
//!
//! # Context
//! The caller holds the mmap lock (read or write), which keeps upper-level tables from being
//! freed under the walk; a [`PmdStep`]'s entry was read without the PMD lock and is re-read
//! under it by whoever changes it.

use super::batch::{folio_pte_batch, BatchFlags};
use super::entry::LeafEntry;
use super::{PageTables, Pmd, Pte, PtlGuard, PGD_SIZE, PMD_SIZE, PUD_SIZE};
use crate::pgtable::entry::AnyLeaf;
use crate::phys::Pfn;
use crate::stats::{CpuCounters, Ev};
use crate::tlb::TlbFlushPending;
use crate::tunables::PteBatching;
use crate::vaddr::{VirtAddr, PTRS_PER_TABLE};

/// The addresses four table levels translate.
const TABLE_SPAN: VirtAddr = VirtAddr::new(1 << 48);

/// What a non-empty PMD entry holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PmdKind {
    /// A 2 MiB leaf (the entry).
    Huge(Pmd),
    /// A PTE table (its frame).
    Table(Pfn),
}

/// A non-empty PMD entry met by a [`PmdWalk`], and the part of the walked range it covers.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PmdStep {
    /// First address of the range under this entry.
    pub(crate) start: VirtAddr,
    /// End of the range under this entry (at most the next 2 MiB boundary).
    pub(crate) end: VirtAddr,
    /// The PMD table holding the entry.
    pub(crate) table: Pfn,
    /// The entry's index in it.
    pub(crate) idx: usize,
    /// What the entry held when the walk read it.
    pub(crate) kind: PmdKind,
}

impl PmdStep {
    /// The 2 MiB-aligned address the entry maps.
    #[inline]
    pub(crate) fn haddr(&self) -> VirtAddr {
        self.start.pmd_align_down()
    }

    /// Whether the range covers the entry's whole 2 MiB.
    #[inline]
    pub(crate) fn whole(&self) -> bool {
        self.start == self.haddr() && self.end.offset_from(self.start) == PMD_SIZE
    }

    /// PTE indexes of the range in its table.
    #[inline]
    pub(crate) fn pte_indexes(&self) -> (usize, usize) {
        let i0 = self.start.pte_index();
        (i0, i0 + (self.end.offset_from(self.start) >> 12) as usize)
    }

    /// The address entry `i` of the PTE table maps (one of [`PmdStep::pte_indexes`]).
    #[inline]
    pub(crate) fn pte_addr(&self, i: usize) -> VirtAddr {
        self.start.add(((i - self.start.pte_index()) as u64) << 12)
    }
}

/// Iterates the non-empty PMD entries of `[start, end)`; see the module docs.
#[derive(Debug)]
pub(crate) struct PmdWalk<'a> {
    pt: PageTables<'a>,
    addr: VirtAddr,
    end: VirtAddr,
    /// The PMD table of the current 1 GiB, with that span's start.
    cached: Option<(VirtAddr, Pfn)>,
}

impl<'a> PmdWalk<'a> {
    /// A walk of `[start, end)` (clipped to the 48 bits four levels translate: higher
    /// addresses would alias lower table indexes).
    pub(crate) fn new(pt: PageTables<'a>, start: VirtAddr, end: VirtAddr) -> Self {
        PmdWalk {
            pt,
            addr: start,
            end: end.min(TABLE_SPAN),
            cached: None,
        }
    }

    /// The PMD table covering `addr`; `Err(next)` with the address where the empty upper
    /// level ends when there is none.
    fn pmd_table(&mut self, addr: VirtAddr) -> Result<Pfn, VirtAddr> {
        let span = addr.align_down(PUD_SIZE);
        if let Some((s, t)) = self.cached {
            if s == span {
                return Ok(t);
            }
        }
        let pt = self.pt;
        let Some(pud_t) = pt.upper_table_at(pt.pgd, addr.pgd_index()) else {
            return Err(addr.next_boundary(PGD_SIZE));
        };
        let Some(t) = pt.upper_table_at(pud_t, addr.pud_index()) else {
            return Err(addr.next_boundary(PUD_SIZE));
        };
        self.cached = Some((span, t));
        Ok(t)
    }
}

impl Iterator for PmdWalk<'_> {
    type Item = PmdStep;

    #[inline]
    fn next(&mut self) -> Option<PmdStep> {
        while self.addr < self.end {
            let addr = self.addr;
            let table = match self.pmd_table(addr) {
                Ok(t) => t,
                Err(next) => {
                    self.addr = next.min(self.end);
                    continue;
                }
            };
            let next = addr.pmd_addr_end(self.end);
            self.addr = next;
            let idx = addr.pmd_index();
            let e = self.pt.pmdp_get(table, idx);
            if e.is_none() {
                continue;
            }
            let kind = if self.pt.arch.is_table(e) {
                PmdKind::Table(self.pt.arch.table_pfn(e))
            } else {
                PmdKind::Huge(e)
            };
            return Some(PmdStep {
                start: addr,
                end: next,
                table,
                idx,
                kind,
            });
        }
        None
    }
}

impl<'a> PageTables<'a> {
    /// A [`PmdWalk`] of `[start, end)`.
    pub(crate) fn pmd_walk(self, start: VirtAddr, end: VirtAddr) -> PmdWalk<'a> {
        PmdWalk::new(self, start, end)
    }

    /// The PTE table entry `idx` of PMD table `pmd_table` points at now (after a split, say).
    #[inline]
    pub(crate) fn pte_table_at(&self, pmd_table: Pfn, idx: usize) -> Option<Pfn> {
        let e = self.pmdp_get(pmd_table, idx);
        self.arch.is_table(e).then(|| self.arch.table_pfn(e))
    }

    /// `vm_normal_folio` (`vm_normal_folio_pmd` for a PMD leaf) for a present entry: the head
    /// of the folio it maps, or `None` for a special mapping of the shared zero page.
    #[inline]
    pub(crate) fn vm_normal_folio<E: LeafEntry>(&self, e: E) -> Option<Pfn> {
        let pfn = self.arch.pfn(e);
        if self.arch.special(e) && self.phys.is_zero_pfn(pfn) {
            return None;
        }
        Some(self.phys.memmap.folio_of(pfn))
    }
}

/// The net change of one table's entry count, folded into its memmap entry once, when
/// dropped. The lock types hold it before their lock guard, so it is folded in under the lock.
#[derive(Debug)]
struct EntryCount<'a> {
    delta: i32,
    phys: &'a crate::phys::PhysMem,
    table: Pfn,
}

impl<'a> EntryCount<'a> {
    fn new(pt: PageTables<'a>, table: Pfn) -> Self {
        EntryCount {
            delta: 0,
            phys: pt.phys,
            table,
        }
    }
}

impl Drop for EntryCount<'_> {
    fn drop(&mut self) {
        if self.delta != 0 {
            self.phys.memmap.pt_entries_add(self.table, self.delta);
        }
    }
}

/// A run of consecutive entries of one [`PteLock`] that map consecutive pages of one folio
/// alike (or a single entry).
#[derive(Clone, Copy, Debug)]
pub(crate) struct PteRun {
    /// The page the first entry maps.
    pub(crate) pfn: Pfn,
    /// The folio's head, `None` for the zero page.
    pub(crate) folio: Option<Pfn>,
    /// Entries in the run (at least 1).
    pub(crate) nr: usize,
    /// `folio_pte_batch` was asked (a large folio, batching on, room for more than one
    /// entry), even if the run it found is a single entry.
    pub(crate) batched: bool,
    /// Some entry of the batch was writable (with `merge_write`).
    pub(crate) any_writable: bool,
}

/// A PTE table with its split lock held (`pte_offset_map_lock`). See the module docs.
#[derive(Debug)]
#[must_use = "the table is unlocked (and its entry count updated) when this is dropped"]
pub(crate) struct PteLock<'a> {
    pt: PageTables<'a>,
    c: &'a CpuCounters,
    table: Pfn,
    /// Net change of the table's entry count, applied once on drop.
    entries: EntryCount<'a>,
    _ptl: PtlGuard<'a>,
}

impl<'a> PteLock<'a> {
    /// Locks PTE table `table`.
    #[inline]
    pub(crate) fn lock(pt: PageTables<'a>, c: &'a CpuCounters, table: Pfn) -> Self {
        let ptl = PtlGuard::lock(pt.phys, table, c);
        PteLock {
            pt,
            c,
            table,
            entries: EntryCount::new(pt, table),
            _ptl: ptl,
        }
    }

    /// The page tables the table belongs to.
    pub(crate) fn tables(&self) -> PageTables<'a> {
        self.pt
    }

    /// `ptep_get` of entry `idx`, counted as a PTE read.
    #[inline]
    pub(crate) fn get(&self, idx: usize) -> Pte {
        self.c.add(Ev::PteRead, 1);
        self.pt.ptep_get(self.table, idx)
    }

    /// `ptep_get` of entry `idx` again, not counted (the run that read it was).
    #[inline]
    pub(crate) fn peek(&self, idx: usize) -> Pte {
        self.pt.ptep_get(self.table, idx)
    }

    /// Entry `idx` as stored, not counted (walkers whose reads the counters leave out).
    #[inline]
    pub(crate) fn peek_raw(&self, idx: usize) -> Pte {
        self.pt.ptep_get_raw(self.table, idx)
    }

    /// Entry `idx` as stored (no contpte gathering of accessed/dirty), counted as a read.
    #[inline]
    pub(crate) fn get_raw(&self, idx: usize) -> Pte {
        self.c.add(Ev::PteRead, 1);
        self.pt.ptep_get_raw(self.table, idx)
    }

    /// The run that starts at `idx`, whose entry `e` ([`PteLock::get`]) is present: the zero
    /// page or a small folio is one entry; a large folio's entries are batched up to `limit`
    /// entries when `batching` allows (the extra reads are counted).
    #[inline]
    pub(crate) fn run(
        &self,
        idx: usize,
        e: Pte,
        limit: usize,
        batching: PteBatching,
        flags: BatchFlags,
    ) -> PteRun {
        let arch = self.pt.arch;
        let pfn = arch.pfn(e);
        let folio = self.pt.vm_normal_folio(e);
        let mut run = PteRun {
            pfn,
            folio,
            nr: 1,
            batched: false,
            any_writable: arch.write(e),
        };
        let Some(head) = folio else {
            return run;
        };
        let folio = self.pt.phys.memmap.folio(head);
        if batching == PteBatching::Batched && limit > 1 && folio.is_large() {
            let last = folio.last_page();
            let b = folio_pte_batch(self.pt, self.table, idx, e, last, limit, flags);
            self.c.add(Ev::PteRead, b.nr as u64 - 1);
            run.nr = b.nr;
            run.batched = true;
            run.any_writable = b.any_writable;
        }
        run
    }

    /// Clears `nr` entries from `idx` (`clear_ptes`); returns whether any was dirty, and the
    /// flush the cleared translations owe.
    #[inline]
    pub(crate) fn clear(&mut self, idx: usize, nr: usize) -> (bool, TlbFlushPending) {
        self.entries.delta -= nr as i32;
        let dirty = self.pt.clear_ptes(self.c, self.table, idx, nr);
        (dirty, TlbFlushPending::owed())
    }

    /// Clears the non-present entry `idx` (a swap entry: `zap_nonpresent_ptes`,
    /// `free_swap_and_cache_nr`'s caller). No TLB holds it, so nothing is owed; counted as
    /// [`PteLock::clear`] is.
    #[inline]
    pub(crate) fn clear_nonpresent(&mut self, idx: usize) {
        debug_assert!(
            !self.pt.arch.present(self.peek_raw(idx)),
            "clear_nonpresent of a present entry"
        );
        self.entries.delta -= 1;
        let _ = self.pt.clear_ptes(self.c, self.table, idx, 1);
    }

    /// Fills `nr` empty entries from `idx` with consecutive pages, `e` first (`set_ptes`).
    #[inline]
    pub(crate) fn set_ptes(&mut self, idx: usize, e: Pte, nr: usize) {
        self.entries.delta += nr as i32;
        self.pt.set_ptes(self.c, self.table, idx, e, nr);
    }

    /// Replaces a present entry (`set_pte_at`) by one with fewer rights (old, clean,
    /// write-protected, another protection, or a swap entry): the flush is owed.
    #[inline]
    pub(crate) fn replace(&mut self, idx: usize, e: Pte) -> TlbFlushPending {
        self.pt.set_pte(self.c, self.table, idx, e);
        TlbFlushPending::owed()
    }

    /// Replaces entry `idx` (`set_pte_at`) where no TLB can hold a translation the new
    /// entry forbids: the old entry is not present (a swap entry), or the new one maps the
    /// same page with no fewer rights (a write fault's reuse). Counted as
    /// [`PteLock::replace`] is.
    #[inline]
    pub(crate) fn replace_no_flush(&mut self, idx: usize, e: Pte) {
        debug_assert!(
            {
                let (arch, old) = (self.pt.arch, self.peek_raw(idx));
                !arch.present(old)
                    || (arch.pfn(old) == arch.pfn(e) && (!arch.write(old) || arch.write(e)))
            },
            "replace_no_flush would take rights a TLB may hold"
        );
        self.pt.set_pte(self.c, self.table, idx, e);
    }

    /// Sets the accessed/dirty bits of entry `idx` as the hardware would, in place
    /// (`ptep_set_access_flags`; a folded block stays folded).
    #[inline]
    pub(crate) fn set_access_flags(&mut self, idx: usize, e: Pte) {
        self.pt.set(self.table, idx, e.val());
        self.c.add(Ev::PteWrite, 1);
    }

    /// Write-protects `nr` entries from `idx` (`wrprotect_ptes`).
    #[inline]
    pub(crate) fn wrprotect(&mut self, idx: usize, nr: usize) -> TlbFlushPending {
        self.pt.wrprotect_ptes(self.c, self.table, idx, nr);
        TlbFlushPending::owed()
    }
}

/// A PTE table no walker can reach yet (just withdrawn from a PMD leaf's deposit, about to
/// be linked by [`PmdLock::replace`]): written without its lock, as Linux fills a table before
/// `pmd_populate`. The entry count is folded in when it is dropped.
#[derive(Debug)]
#[must_use = "the entry count is updated when this is dropped"]
pub(crate) struct UnlinkedPtes<'a> {
    pt: PageTables<'a>,
    c: &'a CpuCounters,
    table: Pfn,
    entries: EntryCount<'a>,
}

impl<'a> UnlinkedPtes<'a> {
    /// The unlinked table `table`.
    pub(crate) fn new(pt: PageTables<'a>, c: &'a CpuCounters, table: Pfn) -> Self {
        debug_assert_eq!(
            pt.phys.memmap.pt_entries(table),
            0,
            "an unlinked table is empty"
        );
        UnlinkedPtes {
            pt,
            c,
            table,
            entries: EntryCount::new(pt, table),
        }
    }

    /// Stores `e` in `nr` entries from `idx` as it is (the same entry each time: the zero
    /// page), one counted write each.
    pub(crate) fn fill_same(&mut self, idx: usize, e: Pte, nr: usize) {
        for i in idx..idx + nr {
            self.pt.set(self.table, i, e.val());
        }
        self.entries.delta += nr as i32;
        self.c.add(Ev::PteWrite, nr as u64);
    }

    /// `set_ptes` of `nr` consecutive pages, `e` first.
    #[inline]
    pub(crate) fn set_ptes(&mut self, idx: usize, e: Pte, nr: usize) {
        self.pt.set_ptes(self.c, self.table, idx, e, nr);
        self.entries.delta += nr as i32;
    }
}

/// A PMD table with its split lock held (`pmd_lock`), for the huge-leaf paths: reading an
/// entry, installing a leaf or a PTE table into an empty one, clearing or replacing one. PMD
/// reads are not counted (no walker ever counted them); writes are, and the entry count is
/// folded in once, when the lock is dropped.
#[derive(Debug)]
#[must_use = "the table is unlocked (and its entry count updated) when this is dropped"]
pub(crate) struct PmdLock<'a> {
    pt: PageTables<'a>,
    c: &'a CpuCounters,
    table: Pfn,
    entries: EntryCount<'a>,
    _ptl: PtlGuard<'a>,
}

impl<'a> PmdLock<'a> {
    /// Locks PMD table `table`.
    pub(crate) fn lock(pt: PageTables<'a>, c: &'a CpuCounters, table: Pfn) -> Self {
        let ptl = PtlGuard::lock(pt.phys, table, c);
        PmdLock {
            pt,
            c,
            table,
            entries: EntryCount::new(pt, table),
            _ptl: ptl,
        }
    }

    /// Entry `idx`.
    #[inline]
    pub(crate) fn get(&self, idx: usize) -> Pmd {
        self.pt.pmdp_get(self.table, idx)
    }

    /// Fills the empty entry `idx` with a leaf or a table entry.
    pub(crate) fn install(&mut self, idx: usize, e: Pmd) {
        debug_assert_eq!(self.get(idx), Pmd::NONE, "installing over a live PMD entry");
        self.pt.set(self.table, idx, e.val());
        self.entries.delta += 1;
        self.c.add(Ev::PteWrite, 1);
    }

    /// Empties entry `idx`; returns what it held, and the flush its translations owe.
    #[inline]
    pub(crate) fn clear(&mut self, idx: usize) -> (Pmd, TlbFlushPending) {
        let old = self.get(idx);
        self.pt.set(self.table, idx, Pmd::NONE.val());
        self.entries.delta -= 1;
        self.c.add(Ev::PteWrite, 1);
        (old, TlbFlushPending::owed())
    }

    /// Replaces the live entry `idx` (a leaf by a leaf with fewer rights, a leaf by its PTE
    /// table, or a PTE table by a leaf): the flush is owed.
    #[inline]
    pub(crate) fn replace(&mut self, idx: usize, e: Pmd) -> TlbFlushPending {
        self.pt.set(self.table, idx, e.val());
        self.c.add(Ev::PteWrite, 1);
        TlbFlushPending::owed()
    }

    /// Replaces leaf `idx` by one mapping the same folio with no fewer rights (a write
    /// fault's reuse): nothing to flush. Counted as [`PmdLock::replace`] is.
    #[inline]
    pub(crate) fn replace_no_flush(&mut self, idx: usize, e: Pmd) {
        debug_assert!(
            {
                let (arch, old) = (self.pt.arch, self.get(idx));
                arch.pfn(old) == arch.pfn(e) && (!arch.write(old) || arch.write(e))
            },
            "replace_no_flush would take rights a TLB may hold"
        );
        self.pt.set(self.table, idx, e.val());
        self.c.add(Ev::PteWrite, 1);
    }
}

/// A child's PTE table and a parent's locked together for `copy_pte_range`: the destination
/// first, then the source (the lock ladder in `mm.rs`); unlocked in the reverse order.
#[derive(Debug)]
pub(crate) struct PteCopy<'a> {
    /// The parent's table.
    pub(crate) src: PteLock<'a>,
    /// The child's table.
    pub(crate) dst: PteLock<'a>,
}

impl<'a> PteCopy<'a> {
    /// Locks `dst_t` of `dpt`, then `src_t` of `spt`.
    pub(crate) fn lock(
        spt: PageTables<'a>,
        dpt: PageTables<'a>,
        c: &'a CpuCounters,
        src_t: Pfn,
        dst_t: Pfn,
    ) -> Self {
        let dst = PteLock::lock(dpt, c, dst_t);
        let src = PteLock::lock(spt, c, src_t);
        PteCopy { src, dst }
    }

    /// The table writes of `__copy_present_ptes` for a run of `nr` entries from `idx`:
    /// write-protects the parent's writable entries when `wrprotect_parent`, and fills the
    /// child's empty entries with consecutive pages, `child` first. On x86-64 one pass walks
    /// both tables together (each parent entry is read once, each child entry written once);
    /// arm64 goes through the contpte-aware `wrprotect_ptes` and `set_ptes`. The counters
    /// are the same either way.
    ///
    /// Returns the flush the parent's write-protected entries owe (nothing without
    /// `wrprotect_parent`).
    #[inline]
    pub(crate) fn copy_run(
        &mut self,
        idx: usize,
        child: Pte,
        nr: usize,
        wrprotect_parent: bool,
    ) -> TlbFlushPending {
        let arch = self.src.pt.arch;
        if arch != super::Arch::X86_64 || nr == 1 {
            let mut flush = TlbFlushPending::none();
            if wrprotect_parent {
                flush = self.src.wrprotect(idx, nr);
            }
            self.dst.set_ptes(idx, child, nr);
            return flush;
        }
        let (spt, dpt) = (self.src.pt, self.dst.pt);
        let (st, dt) = (self.src.table, self.dst.table);
        let mut writes = nr as u64;
        for j in 0..nr {
            if wrprotect_parent {
                let e = spt.ptep_get_raw(st, idx + j);
                if arch.write(e) {
                    spt.set(st, idx + j, arch.wrprotect(e).val());
                    writes += 1;
                }
            }
            dpt.set(dt, idx + j, arch.advance_pfn(child, j as u64).val());
        }
        self.dst.entries.delta += nr as i32;
        self.src.c.add(Ev::PteWrite, writes);
        self.src.c.add(Ev::PteAtomic, writes - nr as u64);
        if wrprotect_parent {
            TlbFlushPending::owed()
        } else {
            TlbFlushPending::none()
        }
    }
}

/// Calls `f(addr, entry)` for every non-empty leaf entry (as stored), in address order.
pub(crate) fn walk_leaves(pt: PageTables<'_>, f: &mut impl FnMut(u64, AnyLeaf)) {
    for step in pt.pmd_walk(VirtAddr::new(0), VirtAddr::new(u64::MAX)) {
        match step.kind {
            PmdKind::Huge(e) => f(step.start.val(), AnyLeaf::Pmd(e)),
            PmdKind::Table(table) => {
                for i in 0..PTRS_PER_TABLE {
                    let e = pt.ptep_get_raw(table, i);
                    if !e.is_none() {
                        f(step.start.add((i as u64) << 12).val(), AnyLeaf::Pte(e));
                    }
                }
            }
        }
    }
}
