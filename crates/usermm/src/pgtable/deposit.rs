//! The page tables deposited with PMD-mapped THPs, for a later split: [`DepositedTables`].
//!
//! Linux counterpart: `pgtable_trans_huge_deposit` / `pgtable_trans_huge_withdraw`
//! (`mm/pgtable-generic.c`). Linux hangs the deposited tables off the PMD table's page
//! (`pmd_huge_pte`, with split PMD locks as on x86-64) and guards them with that table's
//! split lock, which every caller already holds: both functions assert it
//! (`assert_spin_locked(pmd_lockptr(..))`) and take no lock of their own.
//!
//! Deliberate differences:
//! - one map per mm, keyed by the 2 MiB address of the PMD leaf, instead of a list per PMD
//!   table: a split takes back the table deposited for its own leaf rather than any table of
//!   the list (one table per leaf either way, so the counts are the same);
//! - the map sits behind a mutex of its own, because two PMD tables of one mm are locked
//!   independently and both may reach the one map. That mutex is a leaf (see the lock ladder
//!   in `mm.rs`) and is not counted: Linux takes no lock there. What stands for Linux's
//!   assertion is an argument: every method that changes the map takes the caller's
//!   [`PmdLock`], so it cannot be called without a PMD lock held.

use super::cursor::PmdLock;
use crate::phys::Pfn;
use crate::vaddr::VirtAddr;
use parking_lot::Mutex;
use std::collections::HashMap;

/// The tables deposited by an mm's PMD-mapped THPs, by the leaf's 2 MiB address. See the
/// module docs.
#[derive(Debug, Default)]
pub(crate) struct DepositedTables {
    map: Mutex<HashMap<VirtAddr, Pfn>>,
}

impl DepositedTables {
    /// Deposits `table` for the PMD leaf at `haddr` (`pgtable_trans_huge_deposit`).
    ///
    /// # Context
    /// `pmdl` is the lock of the PMD table the leaf is being installed in (a fault, fork's
    /// copy, MADV_COLLAPSE), so no other deposit for `haddr` exists.
    #[inline]
    pub(crate) fn deposit(&self, pmdl: &PmdLock<'_>, haddr: VirtAddr, table: Pfn) {
        let _ = pmdl;
        self.map.lock().insert(haddr, table);
    }

    /// Takes back the table deposited for the PMD leaf at `haddr`
    /// (`pgtable_trans_huge_withdraw`): a split fills it, a zap frees it.
    ///
    /// # Context
    /// `pmdl` is the lock of the PMD table that holds the leaf.
    #[inline]
    pub(crate) fn withdraw(&self, pmdl: &PmdLock<'_>, haddr: VirtAddr) -> Option<Pfn> {
        let _ = pmdl;
        self.map.lock().remove(&haddr)
    }

    /// Moves the deposit of the leaf at `from` to the leaf's new address `to` (`move_huge_pmd`:
    /// a withdraw under the source PMD lock and a deposit under the destination's).
    ///
    /// # Context
    /// `from_pmdl` and `to_pmdl` are the locks of the source and destination PMD tables (the
    /// same lock twice when both addresses share a table).
    pub(crate) fn relocate(
        &self,
        from_pmdl: &PmdLock<'_>,
        to_pmdl: &PmdLock<'_>,
        from: VirtAddr,
        to: VirtAddr,
    ) {
        let _ = (from_pmdl, to_pmdl);
        let mut map = self.map.lock();
        if let Some(t) = map.remove(&from) {
            map.insert(to, t);
        }
    }

    /// Takes every table still deposited, for freeing (`exit_mmap`'s end).
    ///
    /// # Context
    /// The mm is being torn down: its last user is gone and its mmap lock is held for
    /// writing, so no PMD lock is needed (nothing else can reach its page tables).
    pub(crate) fn drain(&self) -> Vec<Pfn> {
        self.map.lock().drain().map(|(_, t)| t).collect()
    }

    /// How many tables are deposited (for validation).
    pub(crate) fn len(&self) -> usize {
        self.map.lock().len()
    }
}
