//! LRU lists: one `lruvec` per NUMA node with its lock.
//!
//! Linux counterparts: `include/linux/mmzone.h` (`struct lruvec`, `enum lru_list`),
//! `include/linux/mm_inline.h` (`lruvec_add_folio`, `lruvec_del_folio`, `folio_lru_list`).
//! Folios are threaded through the memmap's `next`/`prev` words of their head page (free
//! blocks use the same words, but a folio on an LRU is never free). The list a folio is on
//! follows from its flags: unevictable, else active or inactive, anon or file (shmem counts as
//! anon: it is swap-backed). This is the classic two-list LRU (the host runs without MGLRU).
//!
//! # Locking
//! `lru_lock` of the folio's node; taken under the PTL, never the other way round.

use super::memmap::{Memmap, PageFlag};
use super::{Folio, Pfn};
use parking_lot::{Mutex, MutexGuard};

const NONE: u32 = u32::MAX;

/// Entries per per-CPU batch (`PAGEVEC_SIZE` / `folio_batch`).
pub(crate) const FOLIO_BATCH_SIZE: usize = 31;

/// A fixed-capacity batch of folios, stored inline like Linux's `struct folio_batch`
/// (`include/linux/pagevec.h`; no heap allocation on the paths being measured).
pub(crate) type FolioBatch<T> = smallvec::SmallVec<[T; FOLIO_BATCH_SIZE]>;

/// What a queued mlock-batch entry asks for (Linux tags the folio pointer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MlockOp {
    /// Mlock a folio already on an LRU (`LRU_FOLIO`).
    Mlock,
    /// First LRU insertion of a new folio in a locked VMA (`NEW_FOLIO`).
    New,
    /// Munlock (untagged).
    Munlock,
}

/// One CPU's folio batches (`cpu_fbatches.lru_add` of `mm/swap.c`, `mlock_fbatch` of
/// `mm/mlock.c`); [`crate::mlock`] fills and drains them.
#[derive(Debug, Default)]
pub struct CpuBatches {
    /// `lru_add` batch: new folios waiting to join an LRU.
    pub(crate) lru_add: FolioBatch<Pfn>,
    /// `mlock_fbatch`.
    pub(crate) mlock: FolioBatch<(Pfn, MlockOp)>,
}

impl CpuBatches {
    /// Every folio referenced by a batch entry (for validation).
    pub fn folios(&self) -> impl Iterator<Item = Pfn> + '_ {
        self.lru_add
            .iter()
            .copied()
            .chain(self.mlock.iter().map(|&(f, _)| f))
    }
}

/// The LRU lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub(crate) enum LruList {
    /// Inactive anon (and shmem).
    InactiveAnon = 0,
    /// Active anon.
    ActiveAnon = 1,
    /// Inactive file.
    InactiveFile = 2,
    /// Active file.
    ActiveFile = 3,
    /// Unevictable (mlocked).
    Unevictable = 4,
}

impl LruList {
    /// Every list.
    pub(crate) const ALL: [LruList; 5] = [
        LruList::InactiveAnon,
        LruList::ActiveAnon,
        LruList::InactiveFile,
        LruList::ActiveFile,
        LruList::Unevictable,
    ];
}

#[derive(Debug, Clone, Copy)]
struct ListHead {
    head: u32,
    tail: u32,
    pages: u64,
}

/// The lists of one node.
#[derive(Debug)]
pub(crate) struct Lists {
    lists: [ListHead; 5],
}

/// One node's LRU.
#[derive(Debug)]
pub(crate) struct Lruvec {
    lock: Mutex<Lists>,
    /// The non-resident age (`nonresident_age`): pages evicted and activated so far.
    nonresident_age: std::sync::atomic::AtomicU64,
}

impl Default for Lruvec {
    fn default() -> Self {
        Lruvec {
            nonresident_age: std::sync::atomic::AtomicU64::new(0),
            lock: Mutex::new(Lists {
                lists: [ListHead {
                    head: NONE,
                    tail: NONE,
                    pages: 0,
                }; 5],
            }),
        }
    }
}

/// Which list a folio belongs on, from its flags (`folio_lru_list`).
pub(crate) fn folio_lru_list(folio: Folio<'_>) -> LruList {
    if folio.test(PageFlag::Unevictable) {
        return LruList::Unevictable;
    }
    let file = !folio.test(PageFlag::SwapBacked);
    match (file, folio.test(PageFlag::Active)) {
        (false, false) => LruList::InactiveAnon,
        (false, true) => LruList::ActiveAnon,
        (true, false) => LruList::InactiveFile,
        (true, true) => LruList::ActiveFile,
    }
}

impl Lruvec {
    /// The non-resident age now.
    pub(crate) fn nonresident_age(&self) -> u64 {
        self.nonresident_age
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Advances the non-resident age by `nr` (`workingset_age_nonresident`); returns the age
    /// before.
    pub(crate) fn age_nonresident(&self, nr: u64) -> u64 {
        self.nonresident_age
            .fetch_add(nr, std::sync::atomic::Ordering::Relaxed)
    }

    /// Takes the lru_lock.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Lists> {
        self.lock.lock()
    }
}

impl Lists {
    /// Adds a folio at the head of the list its flags select (`lruvec_add_folio`).
    pub(crate) fn add(&mut self, folio: Folio<'_>, nr_pages: u64) {
        let (mm, head) = (folio.memmap(), folio.pfn());
        let l = &mut self.lists[folio_lru_list(folio) as usize];
        mm.set_prev(head, NONE);
        mm.set_next(head, l.head);
        if l.head != NONE {
            mm.set_prev(Pfn::from_u32(l.head), head.as_u32());
        } else {
            l.tail = head.as_u32();
        }
        l.head = head.as_u32();
        l.pages += nr_pages;
    }

    /// Removes a folio from the list its flags select (`lruvec_del_folio`).
    pub(crate) fn del(&mut self, folio: Folio<'_>, nr_pages: u64) {
        let (mm, head) = (folio.memmap(), folio.pfn());
        let l = &mut self.lists[folio_lru_list(folio) as usize];
        let (next, prev) = (mm.next(head), mm.prev(head));
        if prev == NONE {
            l.head = next;
        } else {
            mm.set_next(Pfn::from_u32(prev), next);
        }
        if next == NONE {
            l.tail = prev;
        } else {
            mm.set_prev(Pfn::from_u32(next), prev);
        }
        l.pages -= nr_pages;
        mm.set_next(head, NONE);
        mm.set_prev(head, NONE);
    }

    /// Pages on a list.
    pub(crate) fn pages(&self, list: LruList) -> u64 {
        self.lists[list as usize].pages
    }

    /// The folio at the tail of a list (the oldest), if any.
    pub(crate) fn tail(&self, list: LruList) -> Option<Pfn> {
        let t = self.lists[list as usize].tail;
        (t != NONE).then_some(Pfn::from_u32(t))
    }

    /// The folios on a list, head first (for validation).
    pub(crate) fn folios(&self, mm: &Memmap, list: LruList) -> Vec<Pfn> {
        let mut out = Vec::new();
        let mut p = self.lists[list as usize].head;
        while p != NONE {
            out.push(Pfn::from_u32(p));
            p = mm.next(Pfn::from_u32(p));
        }
        out
    }
}
