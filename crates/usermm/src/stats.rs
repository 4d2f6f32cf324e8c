//! Per-CPU event counters.
//!
//! Linux counterpart: `include/linux/vm_event_item.h` (`count_vm_event`) and the per-CPU
//! `vm_event_states`. Every counter is bumped by the CPU that does the work, so the totals are
//! deterministic for a given workload and tests may assert them exactly. Each slot is written
//! only by the thread that holds its CPU, with a relaxed load + store (no locked instruction),
//! and read by anyone with relaxed loads.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};

macro_rules! counters {
    ($($(#[doc = $doc:literal])* $name:ident => $text:literal,)*) => {
        /// One event counter.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr(usize)]
        pub enum Ev { $($(#[doc = $doc])* $name,)* }

        impl Ev {
            /// Every counter, in declaration order.
            pub const ALL: &'static [Ev] = &[$(Ev::$name,)*];
            /// The snake-case name used in reports and JSON.
            pub fn name(self) -> &'static str {
                match self { $(Ev::$name => $text,)* }
            }
        }
    };
}

counters! {
    /// Page faults handled (any kind).
    Fault => "faults",
    /// Anonymous read faults that mapped the shared zero page.
    FaultZeroPage => "faults_zero_page",
    /// Anonymous faults that allocated a new order-0 folio.
    FaultAnon => "faults_anon",
    /// Anonymous faults that allocated a PTE-mapped large folio (mTHP).
    FaultAnonMthp => "faults_anon_mthp",
    /// Anonymous faults that mapped a PMD-sized THP.
    FaultAnonPmd => "faults_anon_pmd",
    /// Faults on shared (shmem) mappings.
    FaultShared => "faults_shared",
    /// Read faults on file mappings that mapped a page-cache page (`do_read_fault`).
    FaultFile => "faults_file",
    /// File faults that had to read the page from the device (major faults).
    FaultFileMajor => "faults_file_major",
    /// Write faults on private file mappings that copied the page (`do_cow_fault`).
    FaultFileCow => "faults_file_cow",
    /// Pages mapped by fault-around (`filemap_map_pages`), besides the faulting one.
    FaultAroundPages => "fault_around_pages",
    /// Folios added to a page cache.
    PageCacheAdd => "pagecache_add",
    /// Folios removed from a page cache by truncate, hole punching or removal.
    PageCacheDelete => "pagecache_delete",
    /// Clean page-cache folios reclaimed (MADV_PAGEOUT).
    PageCacheEvict => "pagecache_evict",
    /// Large folios split: page-cache folios by a partial truncate, hole punch or
    /// COLD/PAGEOUT, anonymous ones by a partial MADV_FREE/COLD/PAGEOUT.
    ThpSplitFolio => "thp_split_folio",
    /// Anonymous THPs made by MADV_COLLAPSE (`thp_collapse_alloc`).
    ThpCollapseAlloc => "thp_collapse_alloc",
    /// Pages scanned by reclaim on the file LRU (`pgscan`).
    PgScan => "pgscan",
    /// Pages reclaimed from the file LRU (`pgsteal`).
    PgSteal => "pgsteal",
    /// Page-cache pages deactivated from the active file list by reclaim.
    PgDeactivate => "pgdeactivate",
    /// Pages scanned by reclaim on the anonymous LRU (`pgscan_anon`).
    PgScanAnon => "pgscan_anon",
    /// Anonymous pages reclaimed: swapped out or, lazily freed, discarded (`pgsteal_anon`).
    PgStealAnon => "pgsteal_anon",
    /// Pages reclaim moved to an active list (`pgactivate`).
    PgActivate => "pgactivate",
    /// Pages written to the swap area (`pswpout`).
    PswpOut => "pswpout",
    /// Pages read from the swap area (`pswpin`).
    PswpIn => "pswpin",
    /// Large folios swapped out whole (`thp_swpout`, every order).
    ThpSwpOut => "thp_swpout",
    /// Large folios split because no run of swap slots was free (`thp_swpout_fallback`).
    ThpSwpOutFallback => "thp_swpout_fallback",
    /// Faults on a swap entry (`do_swap_page`).
    FaultSwap => "faults_swap",
    /// Swap faults that found the page in the swap cache (minor).
    SwapCacheHit => "swap_cache_hit",
    /// Pages swap readahead read besides the faulting one (`swap_ra`).
    SwapRa => "swap_ra",
    /// Lazily freed (MADV_FREE) pages discarded by reclaim (`pglazyfreed`).
    PgLazyFreed => "pglazyfreed",
    /// Page-cache pages read in again over their shadow (`workingset_refault_file`).
    WorkingsetRefault => "workingset_refault",
    /// Refaulting pages activated: evicted within the workingset's reach
    /// (`workingset_activate_file`).
    WorkingsetActivate => "workingset_activate",
    /// Swap entries freed by unmapping or MADV_FREE (`free_swap_and_cache`).
    SwapEntriesFreed => "swap_entries_freed",
    /// Readahead windows submitted.
    Readahead => "readahead",
    /// Read I/Os to the disk device (one per run of consecutive allocated blocks).
    DiskReads => "disk_reads",
    /// Bytes read from the disk device.
    DiskReadBytes => "disk_read_bytes",
    /// Write I/Os to the disk device (writeback).
    DiskWrites => "disk_writes",
    /// Bytes written to the disk device.
    DiskWriteBytes => "disk_write_bytes",
    /// Bytes copied by `read(2)` from files.
    FileReadBytes => "file_read_bytes",
    /// Bytes copied by `write(2)` to files.
    FileWriteBytes => "file_write_bytes",
    /// Write-protect faults.
    FaultWp => "faults_wp",
    /// COW faults resolved by copying the page.
    CowCopy => "cow_copies",
    /// COW faults resolved by reusing the page in place.
    CowReuse => "cow_reuses",
    /// Faults that ended in SIGSEGV.
    FaultSigsegv => "faults_sigsegv",
    /// Faults that ended in SIGBUS (or OOM).
    FaultSigbus => "faults_sigbus",
    /// Page-table entries read by software (fork, zap, walks).
    PteRead => "pte_reads",
    /// Page-table entries written (set, clear, modify).
    PteWrite => "pte_writes",
    /// Atomic read-modify-write operations on folio metadata (refcount, mapcount, flags).
    FolioAtomic => "folio_atomics",
    /// Refcount atomics on folio metadata (a subset of `folio_atomics`).
    RefcountAtomic => "refcount_atomics",
    /// Mapcount atomics on folio metadata (a subset of `folio_atomics`).
    MapcountAtomic => "mapcount_atomics",
    /// Page-table lock acquisitions.
    LockPtl => "lock_ptl",
    /// mm-wide page_table_lock acquisitions.
    LockPageTable => "lock_page_table",
    /// mmap_lock acquisitions (read or write).
    LockMmap => "lock_mmap",
    /// Buddy zone lock acquisitions.
    LockZone => "lock_zone",
    /// lru_lock acquisitions.
    LockLru => "lock_lru",
    /// Per-CPU batch drains (lru_add or mlock batch).
    BatchDrain => "batch_drains",
    /// Pages mlocked (`UNEVICTABLE_PGMLOCKED`): a folio's pages as its `PG_mlocked` is set
    /// (the 2013 design, as that kernel counted: one per page or THP).
    Mlocked => "pgmlocked",
    /// Pages munlocked (`UNEVICTABLE_PGMUNLOCKED`): a folio's pages as its `PG_mlocked` is
    /// cleared, the folio isolated from its LRU or not unevictable (the 2013 design: one per
    /// page or THP, isolated or not).
    Munlocked => "pgmunlocked",
    /// Pages whose `PG_mlocked` was cleared while their folio was off its LRU and still
    /// unevictable (`UNEVICTABLE_PGSTRANDED`, a folio's pages): left there for reclaim to
    /// rescue.
    Stranded => "pgstranded",
    /// Folios whose `PG_mlocked` was set (`pgmlocked` counts their pages): the cost model's
    /// event for a folio's mlock work (not a Linux statistic).
    FolioMlocked => "folios_mlocked",
    /// Folios whose `PG_mlocked` was cleared (`pgmunlocked` and `pgstranded` count their
    /// pages): the cost model's event for a folio's munlock work (not a Linux statistic).
    FolioMunlocked => "folios_munlocked",
    /// Folios `mlock_pte_range`'s walk reached through PTEs (a small folio, or one batch of a
    /// large one), mlocked or munlocked or not: each is a first touch of its folio's `struct
    /// page` (not a Linux statistic).
    MlockPteFolio => "mlock_pte_folios",
    /// PMD-mapped folios reached by a page-table walk that reads their `struct page`
    /// (`mlock_pte_range`'s huge arm, `copy_huge_pmd`): each head is 512 `struct page`s
    /// (32 KiB of memmap) from the next, so no stream brings its line in (not a Linux
    /// statistic).
    PmdFolioVisit => "pmd_folio_visits",
    /// Pages GUP's slow path looked up one at a time (`follow_page_mask` from
    /// `__get_user_pages`, for populate, mlock and pins): one per PTE, one per PMD-mapped
    /// folio (its other pages come with it). A walk that starts inside a PMD-mapped folio
    /// counts it at the next PMD boundary only (not a Linux statistic).
    GupFollow => "gup_follows",
    /// Pages moved to the unevictable list (`UNEVICTABLE_PGCULLED`, a folio's pages).
    Culled => "pgculled",
    /// Pages moved back to an evictable list (`UNEVICTABLE_PGRESCUED`, a folio's pages; the
    /// 2013 design one per page or THP).
    Rescued => "pgrescued",
    /// Folios isolated from an LRU.
    Isolated => "lru_isolated",
    /// NR_MLOCK counter updates.
    NrMlockUpdate => "nr_mlock_updates",
    /// rmap walks (try_to_munlock in the 2013 design).
    RmapWalk => "rmap_walks",
    /// TLB lookups that hit.
    TlbHit => "tlb_hits",
    /// TLB lookups that missed and walked the page table.
    TlbMiss => "tlb_misses",
    /// Single-page TLB invalidations (shootdowns to every CPU count once).
    TlbFlushPage => "tlb_flush_page",
    /// Range TLB invalidations.
    TlbFlushRange => "tlb_flush_range",
    /// Whole-mm TLB invalidations.
    TlbFlushMm => "tlb_flush_mm",
    /// Accesses through a TLB entry that no longer matched the page table (a missing flush).
    TlbStaleHit => "tlb_stale_hits",
    /// Frames allocated from the buddy allocator (counted in pages).
    FramesAlloc => "frames_allocated",
    /// Frames returned to the buddy allocator (counted in pages).
    FramesFree => "frames_freed",
    /// Pages zeroed.
    PagesZeroed => "pages_zeroed",
    /// Pages copied.
    PagesCopied => "pages_copied",
    /// Page-table pages allocated.
    PgtableAlloc => "pgtable_allocated",
    /// Page-table pages freed.
    PgtableFree => "pgtable_freed",
    /// PTE batches processed by fork's copy (one per `copy_present_ptes` call that mapped a folio).
    ForkBatches => "fork_batches",
    /// Of them, the batches of a large folio's run (`folio_pte_batch` walked it).
    ForkBatchesLarge => "fork_batches_large",
    /// PTEs copied by fork.
    ForkPtes => "fork_ptes",
    /// Pages copied at fork because they were maybe pinned.
    ForkPinnedCopies => "fork_pinned_copies",
    /// PTE batches zapped (one per folio run).
    ZapBatches => "zap_batches",
    /// Of them, the batches of a large folio's run (`folio_pte_batch` walked it).
    ZapBatchesLarge => "zap_batches_large",
    /// Batches of entries mprotect changed (`mprotect_folio_pte_batch`: a large folio's
    /// run, else one entry).
    MprotectBatch => "mprotect_batches",
    /// PTEs zapped.
    ZapPtes => "zap_ptes",
    /// mmu_gather flushes (TLB flush followed by freeing).
    GatherFlush => "gather_flushes",
    /// arm64 contiguous blocks folded.
    ContFold => "contpte_folds",
    /// arm64 contiguous blocks unfolded.
    ContUnfold => "contpte_unfolds",
    /// VMA-tree nodes allocated for the child's tree by fork (seed 001: dup vs insert).
    VmaNodeAlloc => "vma_nodes_allocated",
    /// PMD-mapped THPs split into PTE mappings.
    ThpSplitPmd => "thp_split_pmd",
    /// Page-table entries changed by an atomic read-modify-write on x86-64
    /// (`ptep_get_and_clear`'s xchg, `ptep_set_wrprotect`'s locked bit clear): a subset of
    /// `pte_writes`, for the cost model (a locked RMW costs more than a store).
    PteAtomic => "pte_atomics",
    /// VMAs duplicated into a child by fork (`vm_area_dup` in `dup_mmap`).
    VmaCopied => "vmas_copied",
    /// VMAs freed (`remove_vma`: munmap, exit, merges are not counted).
    VmaFreed => "vmas_freed",
    /// VMAs an unmap takes out of the tree one by one before freeing them
    /// (`vms_gather_munmap_vmas`: each write-locked and stored in the side tree of detached
    /// VMAs): munmap, mremap's move and a MAP_FIXED mapping over old ones; exit frees its VMAs
    /// without (`exit_mmap`).
    VmaDetached => "vmas_detached",
    /// VMAs to which fork gave the child's copy an anon_vma of its own, chained to the
    /// parent's (`anon_vma_fork` past its early return for a VMA that never had anonymous
    /// pages: a new anon_vma and its chain links).
    AnonVmaFork => "anon_vma_forks",
    /// VMAs with an anon_vma freed (`unlink_anon_vmas` on the way out of `remove_vma`'s
    /// callers: the chain links unlinked and freed, the anon_vma put).
    AnonVmaUnlink => "anon_vma_unlinks",
    /// VMAs split in two (`__split_vma`: munmap, mprotect, mlock, madvise of part of a VMA).
    VmaSplit => "vma_splits",
    /// Ranges merged into a neighbouring VMA instead of making one (`vma_merge_new_range`
    /// of mmap, brk and mremap; `vma_merge_existing_range` of mprotect, mlock, madvise):
    /// one per merge, whether one or both neighbours took part.
    VmaMerge => "vma_merges",
    /// Folios allocated (any order; `frames_allocated` counts their pages).
    FolioAlloc => "folios_allocated",
    /// Folios freed (any order; `frames_freed` counts their pages).
    FolioFree => "folios_freed",
    /// Folios allocated or freed in the buddy lists under `zone->lock` in Linux: the orders
    /// its per-CPU page lists do not hold (4 to 8: 64K to 1M folios with 4K pages). A subset
    /// of `folios_allocated` plus `folios_freed`, for the cost model (the engine itself takes
    /// its zone lock for every folio: `lock_zone`).
    FolioBuddyDirect => "folios_buddy_direct",
    /// Folios taken off an LRU list as their last reference went (`__page_cache_release`);
    /// a batch of freed folios takes the lru_lock once (`folios_put_refs`).
    LruFreed => "lru_freed",
    /// Batches of freed folios returned together (`folios_put_refs` with a folio whose last
    /// reference went, or `__folio_put` of one): one memcg `uncharge_batch` and one per-CPU
    /// list lock round in `free_unref_folios` per batch, however many folios it holds.
    FreeBatch => "free_batches",
    /// System calls entered (each public system call of `Cpu` once; `exit` counts as the
    /// task's `exit_group`).
    Syscall => "syscalls",
    /// Bytes the user wrote through the access API to pages that the write's own fault did
    /// not just zero or copy: the user's stores inside a timed operation to lines no cache
    /// holds, for the cost model (a page the fault just zeroed or copied is in the cache).
    UserBytesCold => "user_bytes_cold",
}

/// Number of counters.
pub(crate) const NR_EVENTS: usize = Ev::ALL.len();

/// One CPU's counter block.
#[derive(Debug)]
pub(crate) struct CpuCounters {
    slots: [AtomicU64; NR_EVENTS],
    /// Per-node `NR_MLOCK` changes not yet folded into the node's counter (the per-CPU
    /// `vm_node_stat_diff` of Linux's vmstat).
    vmstat_diff: Box<[AtomicI64]>,
}

/// A per-CPU vmstat diff is folded into the global counter once it exceeds this many pages
/// either way (Linux computes 2…125 from the zone size and the number of CPUs).
pub(crate) const VMSTAT_THRESHOLD: i64 = 32;

impl Default for CpuCounters {
    /// Counters without per-CPU vmstat diffs (every vmstat change goes to the global counter).
    fn default() -> Self {
        CpuCounters::new(0)
    }
}

impl CpuCounters {
    /// Counters with per-CPU vmstat diffs for `nodes` nodes.
    pub(crate) fn new(nodes: usize) -> CpuCounters {
        CpuCounters {
            slots: std::array::from_fn(|_| AtomicU64::new(0)),
            vmstat_diff: (0..nodes).map(|_| AtomicI64::new(0)).collect(),
        }
    }

    /// `__mod_node_page_state`: adds `delta` to this CPU's diff of `node`, folding the diff
    /// into `global` (one atomic add) when it passes [`VMSTAT_THRESHOLD`].
    ///
    /// # Context
    /// Only the thread that holds this CPU slot calls it.
    #[inline]
    pub(crate) fn mod_vmstat(&self, node: usize, delta: i64, global: &AtomicI64) {
        let Some(d) = self.vmstat_diff.get(node) else {
            global.fetch_add(delta, Relaxed);
            return;
        };
        let v = d.load(Relaxed) + delta;
        if v.abs() > VMSTAT_THRESHOLD {
            global.fetch_add(v, Relaxed);
            d.store(0, Relaxed);
        } else {
            d.store(v, Relaxed);
        }
    }

    /// This CPU's unfolded diff of `node`.
    pub(crate) fn vmstat_diff(&self, node: usize) -> i64 {
        self.vmstat_diff.get(node).map_or(0, |d| d.load(Relaxed))
    }

    /// This CPU's count of `ev`.
    #[inline]
    pub(crate) fn read(&self, ev: Ev) -> u64 {
        self.slots[ev as usize].load(Relaxed)
    }

    /// Adds `n` to a counter.
    ///
    /// # Context
    /// Only the thread that holds this CPU slot writes to it.
    #[inline]
    pub(crate) fn add(&self, ev: Ev, n: u64) {
        let slot = &self.slots[ev as usize];
        slot.store(slot.load(Relaxed).wrapping_add(n), Relaxed);
    }
}

/// A snapshot of the counters summed over all CPUs.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Snapshot {
    values: Vec<u64>,
}

impl Snapshot {
    /// Sums the given per-CPU blocks.
    pub(crate) fn sum<'a>(cpus: impl IntoIterator<Item = &'a CpuCounters>) -> Snapshot {
        let mut values = vec![0u64; NR_EVENTS];
        for c in cpus {
            for (i, v) in values.iter_mut().enumerate() {
                *v += c.slots[i].load(Relaxed);
            }
        }
        Snapshot { values }
    }

    /// The value of one counter.
    pub fn get(&self, ev: Ev) -> u64 {
        self.values.get(ev as usize).copied().unwrap_or(0)
    }

    /// `self - earlier`, counter by counter.
    pub fn delta(&self, earlier: &Snapshot) -> Snapshot {
        let values = (0..NR_EVENTS)
            .map(|i| self.get_idx(i).wrapping_sub(earlier.get_idx(i)))
            .collect();
        Snapshot { values }
    }

    /// Adds `other` counter by counter (the counters of several timed regions of a run).
    pub fn accumulate(&mut self, other: &Snapshot) {
        self.values.resize(NR_EVENTS, 0);
        for (i, v) in self.values.iter_mut().enumerate() {
            *v = v.wrapping_add(other.get_idx(i));
        }
    }

    fn get_idx(&self, i: usize) -> u64 {
        self.values.get(i).copied().unwrap_or(0)
    }

    /// (name, value) pairs of the non-zero counters.
    pub fn nonzero(&self) -> Vec<(&'static str, u64)> {
        Ev::ALL
            .iter()
            .map(|&e| (e.name(), self.get(e)))
            .filter(|&(_, v)| v != 0)
            .collect()
    }

    /// (name, value) pairs of every counter.
    pub fn all(&self) -> Vec<(&'static str, u64)> {
        Ev::ALL.iter().map(|&e| (e.name(), self.get(e))).collect()
    }
}
