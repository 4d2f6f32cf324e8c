//! Four-level page tables living in arena frames, and their locks.
//!
//! Linux counterparts: `include/linux/pgtable.h` (index helpers, `set_ptes`),
//! `mm/memory.c` (`__pte_alloc`, `__pmd_alloc`), `include/linux/mm.h` (split PTE locks,
//! `pte_offset_map_lock`). A table is one 4 KiB frame of 512 64-bit entries; an entry is read
//! and written atomically. Levels: PGD (bits 47..39), PUD (38..30), PMD (29..21, may hold a
//! 2 MiB leaf), PTE (20..12).
//!
//! Entry values are typed (`entry`: `Pte`, `Pmd`, `Pud` for PUD and PGD entries); the
//! raw words are read and written only inside this module.
//!
//! # Locking
//! Populating PGD/PUD/PMD entries takes the mm-wide `page_table_lock` (`PageTableLock`);
//! each PTE table (and each PMD table, for huge PMD leaves) has its own split lock in its
//! memmap entry (`PtlGuard`, taken through `cursor`'s lock types). Tables are freed only
//! under the mmap write lock (nothing else can be walking them then).

pub(crate) mod arch;
pub(crate) mod batch;
pub(crate) mod contpte;
pub(crate) mod cursor;
pub(crate) mod deposit;
pub(crate) mod entry;

pub use crate::phys::SwpEntry;
use crate::phys::{FolioKind, Pfn, PhysMem, Zeroing};
use crate::stats::{CpuCounters, Ev};
use crate::vaddr::VirtAddr;
pub(crate) use crate::vaddr::{LEVEL_SHIFTS, PMD_SIZE, PTRS_PER_TABLE, PUD_SIZE};
pub use crate::vaddr::{PGD_SIZE, TASK_SIZE};
pub use arch::{Access, Arch, Prot};
pub(crate) use entry::Pud;
pub use entry::{AnyLeaf, Pmd, Pte};
use entry::{Entry, LeafEntry, TableEntry};
use std::sync::atomic::{AtomicU32, Ordering};

/// `mm->page_table_lock`: the mm-wide lock that serialises populating and unlinking upper
/// page-table entries (`__pud_alloc`, `__pmd_alloc`, `__pte_alloc`'s `pmd_install`,
/// `free_pgtables`) and `__anon_vma_prepare`'s check-and-set. [`PageTableLock::lock`] is the
/// only way to take it, and it counts `Ev::LockPageTable`, so no site can take it uncounted.
///
/// Deliberate difference: on x86-64 with split PMD locks Linux populates a PMD entry (a PTE
/// table) under the PMD table's split lock (`pmd_lock`), not this one; the engine takes this
/// lock for every level, as its counters always have.
#[derive(Debug, Default)]
pub(crate) struct PageTableLock(parking_lot::Mutex<()>);

/// A held [`PageTableLock`].
#[derive(Debug)]
#[must_use = "dropping the guard releases the lock"]
pub(crate) struct PageTableGuard<'a> {
    _held: parking_lot::MutexGuard<'a, ()>,
}

impl PageTableLock {
    /// Takes the lock (`spin_lock(&mm->page_table_lock)`), counted.
    #[inline]
    pub(crate) fn lock(&self, c: &CpuCounters) -> PageTableGuard<'_> {
        c.add(Ev::LockPageTable, 1);
        PageTableGuard {
            _held: self.0.lock(),
        }
    }
}

/// A held split page-table lock (a spinlock in the table page's memmap entry).
#[derive(Debug)]
#[must_use = "dropping the guard releases the lock"]
pub(crate) struct PtlGuard<'a> {
    word: &'a AtomicU32,
}

impl<'a> PtlGuard<'a> {
    /// Takes the lock of table page `pfn`.
    pub(crate) fn lock(phys: &'a PhysMem, pfn: Pfn, c: &CpuCounters) -> PtlGuard<'a> {
        c.add(Ev::LockPtl, 1);
        let word = phys.memmap.ptl(pfn);
        crate::phys::memmap::spin_lock(word);
        PtlGuard { word }
    }
}

impl Drop for PtlGuard<'_> {
    fn drop(&mut self) {
        self.word.store(0, Ordering::Release);
    }
}

/// Where a walk ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Walk {
    /// No PMD table covers the address (some upper level is empty).
    NoPmd,
    /// The PMD entry is empty.
    PmdNone {
        /// PMD table.
        table: Pfn,
        /// Index in it.
        idx: usize,
    },
    /// The PMD entry is a huge leaf.
    PmdLeaf {
        /// PMD table.
        table: Pfn,
        /// Index in it.
        idx: usize,
        /// The entry.
        entry: Pmd,
    },
    /// The PMD points at a PTE table.
    Pte {
        /// PTE table.
        table: Pfn,
        /// Index in it.
        idx: usize,
        /// The entry as stored (possibly none; no contpte gathering).
        entry: Pte,
    },
}

/// A view of one mm's page tables.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PageTables<'a> {
    /// Physical memory the tables live in.
    pub(crate) phys: &'a PhysMem,
    /// Entry format.
    pub(crate) arch: Arch,
    /// Root table.
    pub(crate) pgd: Pfn,
}

/// A page-table page could not be allocated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("out of memory for a page table")]
pub(crate) struct PgtableOom;

impl<'a> PageTables<'a> {
    /// Reads an entry's raw word. Private to the page-table module, as is [`Self::set`]:
    /// everything else reads typed entries ([`Self::ptep_get`], [`Self::ptep_get_raw`],
    /// [`Self::pmdp_get`], the cursor's lock types).
    #[inline]
    fn get(&self, table: Pfn, idx: usize) -> u64 {
        self.phys.arena.word(table, idx).load(Ordering::Acquire)
    }

    /// Writes an entry's raw word. Everything outside the page-table module writes through
    /// the cursor's lock types ([`cursor`]), which own the lock and the bookkeeping.
    #[inline]
    fn set(&self, table: Pfn, idx: usize, v: u64) {
        self.phys.arena.word(table, idx).store(v, Ordering::Release)
    }

    /// PTE `idx` of PTE table `table` as stored: for a folded contpte block, without the
    /// accessed/dirty bits of its other entries (arm64's `__ptep_get`; [`Self::ptep_get`]
    /// gathers them).
    #[inline]
    pub(crate) fn ptep_get_raw(&self, table: Pfn, idx: usize) -> Pte {
        Pte::from_val(self.get(table, idx))
    }

    /// PMD `idx` of PMD table `table` (`pmdp_get`).
    #[inline]
    pub(crate) fn pmdp_get(&self, table: Pfn, idx: usize) -> Pmd {
        Pmd::from_val(self.get(table, idx))
    }

    /// Entry `idx` of a PGD or PUD table (`pgdp_get`, `pudp_get`).
    #[inline]
    fn pudp_get(&self, table: Pfn, idx: usize) -> Pud {
        Pud::from_val(self.get(table, idx))
    }

    /// The table a PGD or PUD entry points at, if it points at one.
    #[inline]
    fn upper_table_at(&self, table: Pfn, idx: usize) -> Option<Pfn> {
        let e = self.pudp_get(table, idx);
        self.arch.is_table(e).then(|| self.arch.table_pfn(e))
    }

    /// The table that entry `idx` of `table`, a table at `level` (0 = PGD, 1 = PUD, 2 = PMD;
    /// see [`LEVEL_SHIFTS`]), points at, if it points at one (not none, not a PMD leaf).
    #[inline]
    pub(crate) fn lower_table(&self, level: usize, table: Pfn, idx: usize) -> Option<Pfn> {
        debug_assert!(level < 3, "a PTE table points at no table");
        if level == 2 {
            self.pte_table_at(table, idx)
        } else {
            self.upper_table_at(table, idx)
        }
    }

    /// Entry `idx` of `table` read again, as the same kind of entry as `like` (which was read
    /// from there): the MMU model's re-read of a leaf of either level.
    #[inline]
    pub(crate) fn reread<E: Entry>(&self, table: Pfn, idx: usize, like: E) -> E {
        like.with_val(self.get(table, idx))
    }

    /// Compare-and-exchange on a leaf entry (the MMU model's hardware A/D updates).
    #[inline]
    pub(crate) fn cmpxchg<E: LeafEntry>(&self, table: Pfn, idx: usize, old: E, new: E) -> bool {
        self.phys
            .arena
            .word(table, idx)
            .compare_exchange(old.val(), new.val(), Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }

    /// Walks to the PMD table covering `addr`.
    #[inline]
    pub(crate) fn pmd_table(&self, addr: VirtAddr) -> Option<Pfn> {
        let pud = self.upper_table_at(self.pgd, addr.pgd_index())?;
        self.upper_table_at(pud, addr.pud_index())
    }

    /// Walks `addr` down to its leaf.
    #[inline]
    pub(crate) fn walk(&self, addr: VirtAddr) -> Walk {
        let Some(pmd_table) = self.pmd_table(addr) else {
            return Walk::NoPmd;
        };
        let idx = addr.pmd_index();
        let pmd = self.pmdp_get(pmd_table, idx);
        if pmd.is_none() {
            return Walk::PmdNone {
                table: pmd_table,
                idx,
            };
        }
        if !self.arch.is_table(pmd) {
            return Walk::PmdLeaf {
                table: pmd_table,
                idx,
                entry: pmd,
            };
        }
        let table = self.arch.table_pfn(pmd);
        let idx = addr.pte_index();
        Walk::Pte {
            table,
            idx,
            entry: self.ptep_get_raw(table, idx),
        }
    }

    /// The PTE table covering `addr`, if the PMD points at one.
    #[inline]
    pub(crate) fn pte_table(&self, addr: VirtAddr) -> Option<Pfn> {
        let pmd_table = self.pmd_table(addr)?;
        self.pte_table_at(pmd_table, addr.pmd_index())
    }

    /// Allocates a zeroed table page.
    pub(crate) fn alloc_table(&self, c: &CpuCounters, node: usize) -> Result<Pfn, PgtableOom> {
        self.phys
            .alloc_folio(c, 0, node, FolioKind::Pgtable, Zeroing::Zero)
            .ok_or(PgtableOom)
    }

    /// Populates `table[idx]`, an entry of type `E` (a [`Pud`] for the PGD and PUD levels,
    /// a [`Pmd`] for the PMD level), with a new lower table if it is empty; returns the lower
    /// table.
    ///
    /// # Context
    /// Takes `page_table_lock` around the install; allocation happens outside it.
    fn ensure_table<E: TableEntry>(
        &self,
        c: &CpuCounters,
        lock: &PageTableLock,
        table: Pfn,
        idx: usize,
    ) -> Result<Option<Pfn>, PgtableOom> {
        let e = E::from_val(self.get(table, idx));
        if self.arch.is_table(e) {
            return Ok(Some(self.arch.table_pfn(e)));
        }
        if e.val() != 0 {
            return Ok(None);
        }
        let new = self.alloc_table(c, self.phys.node_of(table))?;
        let _g = lock.lock(c);
        let e = E::from_val(self.get(table, idx));
        if e.val() != 0 {
            drop(_g);
            self.phys.put_folio(c, new, 1);
            return Ok(self.arch.is_table(e).then(|| self.arch.table_pfn(e)));
        }
        self.set(table, idx, self.arch.mk_table::<E>(new).val());
        self.phys.memmap.pt_entries_add(table, 1);
        c.add(Ev::PteWrite, 1);
        Ok(Some(new))
    }

    /// Empties `table[idx]`, which points at a lower table (`free_pgtables`); the caller
    /// frees that table after the TLB flush.
    ///
    /// # Context
    /// mmap lock held for writing; takes `page_table_lock` around the store.
    pub(crate) fn unlink_table(
        &self,
        c: &CpuCounters,
        lock: &PageTableLock,
        table: Pfn,
        idx: usize,
    ) {
        let _g = lock.lock(c);
        self.set(table, idx, 0);
        self.phys.memmap.pt_entries_add(table, -1);
        c.add(Ev::PteWrite, 1);
    }

    /// Ensures the PGD and PUD levels exist for `addr` and returns the PMD table.
    pub(crate) fn alloc_pmd_table(
        &self,
        c: &CpuCounters,
        lock: &PageTableLock,
        addr: VirtAddr,
    ) -> Result<Pfn, PgtableOom> {
        let pud = self
            .ensure_table::<Pud>(c, lock, self.pgd, addr.pgd_index())?
            .ok_or(PgtableOom)?;
        self.ensure_table::<Pud>(c, lock, pud, addr.pud_index())?
            .ok_or(PgtableOom)
    }

    /// Ensures a PTE table exists for `addr`; `Ok(None)` if the PMD holds a huge leaf.
    pub(crate) fn alloc_pte_table(
        &self,
        c: &CpuCounters,
        lock: &PageTableLock,
        addr: VirtAddr,
    ) -> Result<Option<Pfn>, PgtableOom> {
        let pmd = self.alloc_pmd_table(c, lock, addr)?;
        self.ensure_table::<Pmd>(c, lock, pmd, addr.pmd_index())
    }

    /// Calls `f(level, table_pfn)` for every table page, children before parents.
    pub(crate) fn for_each_table(&self, mut f: impl FnMut(usize, Pfn)) {
        self.visit(0, self.pgd, &mut f);
    }

    fn visit(&self, level: usize, table: Pfn, f: &mut impl FnMut(usize, Pfn)) {
        if level < 3 {
            for i in 0..PTRS_PER_TABLE {
                if let Some(lower) = self.lower_table(level, table, i) {
                    self.visit(level + 1, lower, f);
                }
            }
        }
        f(level, table);
    }
}

/// The leaf mapping one address: the entry (a PTE or a PMD leaf) and the frame of the
/// address's page.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LeafInfo {
    pub(crate) entry: AnyLeaf,
    pub(crate) pfn: Pfn,
}

/// The present leaf that maps `addr`, if any (a swap entry maps nothing): a read-only walk
/// for the views and validation.
pub(crate) fn leaf_at(pt: PageTables<'_>, addr: u64) -> Option<LeafInfo> {
    match pt.walk(VirtAddr::new(addr)) {
        Walk::Pte { entry, .. } if !entry.is_none() && pt.arch.present(entry) => Some(LeafInfo {
            entry: AnyLeaf::Pte(entry),
            pfn: pt.arch.pfn(entry),
        }),
        Walk::PmdLeaf { entry, .. } => Some(LeafInfo {
            entry: AnyLeaf::Pmd(entry),
            pfn: pt.arch.pfn(entry).add((addr >> 12) & 511),
        }),
        _ => None,
    }
}
