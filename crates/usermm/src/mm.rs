//! Address spaces (`struct mm_struct`) and tasks.
//!
//! Linux counterparts: `include/linux/mm_types.h` (`struct mm_struct`), `kernel/fork.c`,
//! `mm/mmap.c`.
//!
//! # Lock order (the one place it is written down)
//!
//! ```text
//! Machine::tasks (process table; read-locked only to look a process up, never held below)
//!   -> Mm::lock (mmap_lock; at fork: parent, then child)
//!     -> Mm::page_table_lock (upper-level populate and unlink; leaf: never held while
//!        a split PTL is taken)
//!     -> a shmem object's page map (fault-around holds it while it takes the PTL: the page
//!        cache lookup comes first, as in Linux)
//!     -> split PTL of a table page, taken only through `pgtable::cursor` (`PteLock`,
//!        `PmdLock`, `PteCopy`); two at once only as Linux nests them: at fork the child's
//!        table, then the parent's (`copy_pte_range`, `copy_huge_pmd`); at mremap the source
//!        table, then the destination (`move_ptes`, `move_huge_pmd`) — safe because both
//!        belong to one mm whose mmap lock is held for writing
//!       -> Mm::deposited (the deposited-table map's mutex, leaf and not counted: taken only
//!          under a PMD lock, which its methods take as an argument; Linux guards the list
//!          with that PMD lock alone)
//!       -> Machine::tunables read lock (leaf; read under the PTL by zap and split)
//!       -> folio flags / mapcounts (atomics, no lock)
//!       -> folio owner bit lock (`folio_lock_large_mapcount`, leaf)
//!       -> a folio's rmap seqcount write section (leaf; entered after the owner lock is
//!          released, never with another folio's)
//!       -> per-CPU folio batch lock (a drain processes the batch in place under it, taking
//!          the lruvec and zone locks below)
//!       -> lruvec lock of one node (leaf; a drain relocks per node)
//!       -> Tlb lock of each CPU (leaf)
//!       -> Zone lock (leaf)
//! ```
//! A fault holds the mmap lock for reading; every system call that changes VMAs holds it for
//! writing. Page-table pages are freed only with the mmap lock held for writing.

use crate::pgtable::deposit::DepositedTables;
use crate::pgtable::PageTableLock;
use crate::phys::Pfn;
use crate::vma::{Vma, VmaSet};
use parking_lot::RwLock;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering::Relaxed};
use std::sync::Arc;

/// Process identifier.
pub type Pid = u32;

/// RSS counter kinds (`MM_ANONPAGES`, `MM_SHMEMPAGES`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RssKind {
    /// Anonymous pages.
    Anon = 0,
    /// Shared memory pages (shared anonymous memory and tmpfs: `MM_SHMEMPAGES`).
    Shmem = 1,
    /// Pages of other files (`MM_FILEPAGES`).
    File = 2,
    /// Swap entries in the page tables (`MM_SWAPENTS`; status `VmSwap`).
    Swap = 3,
}

/// The RSS counter of the file pages `vma` maps (`mm_counter_file`): shmem for shared
/// anonymous memory and tmpfs, file otherwise. Anonymous pages count as [`RssKind::Anon`].
pub(crate) fn mm_counter_file(vma: &Vma) -> RssKind {
    match &vma.file {
        Some(f) if !f.kind.is_shmem() => RssKind::File,
        _ => RssKind::Shmem,
    }
}

/// A long-term pin taken by `pin` (an io_uring fixed buffer).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PinRecord {
    /// Start address given to `pin`.
    pub(crate) start: u64,
    /// Length given to `pin`.
    pub(crate) len: u64,
    /// The pinned pages (one per 4 KiB page of the range).
    pub(crate) pfns: Vec<Pfn>,
}

/// The VMA-side state of an mm, guarded by the mmap lock.
#[derive(Debug, Default)]
pub struct MmState {
    /// VMAs.
    pub vmas: VmaSet,
    /// Start of the heap.
    pub start_brk: u64,
    /// Current break.
    pub(crate) brk: u64,
    /// Top of the top-down mmap area.
    pub(crate) mmap_base: u64,
    /// Pages in `VM_LOCKED` VMAs.
    pub(crate) locked_vm: u64,
    /// Pages pinned long-term.
    pub(crate) pinned_vm: u64,
    /// Outstanding pins.
    pub(crate) pins: Vec<PinRecord>,
    /// Flags added to every new VMA (`mlockall(MCL_FUTURE)`).
    pub(crate) def_flags: u64,
    /// Overcommit pages charged while this mm was being forked (for undoing a failed fork).
    pub(crate) fork_charge: u64,
    /// `locked_vm` pages no `VM_LOCKED` VMA accounts for: Linux's `MREMAP_DONTUNMAP` of a
    /// locked VMA adds the moved length to `locked_vm` and clears `VM_LOCKED` on the source
    /// without subtracting it (`dontunmap_complete`), so RLIMIT_MEMLOCK sees both until exit.
    pub(crate) locked_vm_orphaned: u64,
    /// Source ranges of `MREMAP_DONTUNMAP` whose VMA lost `VM_LOCKED` without a munlock:
    /// their folios may stay mlocked (Linux leaves them for reclaim to notice).
    pub(crate) mlock_stale: Vec<(u64, u64)>,
}

/// An address space.
#[derive(Debug)]
pub struct Mm {
    /// Identifier (also the TLB tag).
    pub(crate) id: u32,
    /// Root page table.
    pub(crate) pgd: Pfn,
    /// The mmap lock and the VMA state it protects.
    pub lock: RwLock<MmState>,
    /// `page_table_lock`: populating and unlinking upper page-table levels, and attaching a
    /// VMA's first anon_vma.
    pub(crate) page_table_lock: PageTableLock,
    rss: [AtomicI64; 4],
    /// `MMF_HAS_PINNED`: this mm has ever had a long-term pin.
    pub(crate) has_pinned: AtomicBool,
    /// Page tables deposited by PMD-mapped THPs for a later split, by PMD address; changed
    /// only under the PMD table's lock (see [`DepositedTables`]).
    pub(crate) deposited: DepositedTables,
}

impl Mm {
    /// A new mm with root table `pgd`.
    pub(crate) fn new(id: u32, pgd: Pfn, state: MmState) -> Mm {
        Mm {
            id,
            pgd,
            lock: RwLock::new(state),
            page_table_lock: PageTableLock::default(),
            rss: Default::default(),
            has_pinned: AtomicBool::new(false),
            deposited: DepositedTables::default(),
        }
    }

    /// Adds to an RSS counter (in pages).
    #[inline]
    pub(crate) fn rss_add(&self, kind: RssKind, n: i64) {
        self.rss[kind as usize].fetch_add(n, Relaxed);
    }

    /// An RSS counter (in pages).
    pub(crate) fn rss(&self, kind: RssKind) -> i64 {
        self.rss[kind as usize].load(Relaxed)
    }
}

/// Process credentials relevant to mm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Privilege {
    /// No capabilities.
    Ordinary,
    /// CAP_IPC_LOCK and CAP_SYS_RAWIO.
    Privileged,
}

/// A process.
#[derive(Debug)]
pub struct Task {
    /// Process id.
    pub pid: Pid,
    /// Its address space.
    pub mm: Arc<Mm>,
    /// Capabilities.
    pub(crate) privilege: Privilege,
    /// RLIMIT_MEMLOCK in bytes (`u64::MAX` = unlimited).
    pub(crate) rlimit_memlock: u64,
}
