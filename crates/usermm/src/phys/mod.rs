//! Simulated physical memory: the arena of frames, the memmap, and the buddy zones.
//!
//! Linux counterpart: `mm/page_alloc.c`, `mm/mm_init.c` (memmap), `mm/huge_memory.c`
//! (huge zero folio). Frames are named by pfn. A folio is allocated as one buddy block of
//! `2^order` frames; its head carries the refcount, the folio-wide mapcounts and the order.

pub(crate) mod arena;
pub(crate) mod buddy;
pub(crate) mod folio;
pub(crate) mod lru;
pub(crate) mod memmap;
pub(crate) mod pfn;

use crate::stats::{CpuCounters, Ev};
pub(crate) use arena::{Arena, PAGE_SHIFT};
use buddy::Zone;
pub use folio::Folio;
use lru::{FolioBatch, Lists, Lruvec, FOLIO_BATCH_SIZE};
pub use memmap::{LargeMapcountLock, Memmap, PageFlag};
pub use pfn::{Pfn, SwpEntry};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;

/// Order of a PMD-sized folio with 4 KiB pages.
pub(crate) const HPAGE_PMD_ORDER: u32 = 9;

/// What a new folio is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FolioKind {
    /// Anonymous memory (`PageFlag::Anon`, swap-backed).
    Anon,
    /// A shmem (shared anonymous or tmpfs) page-cache folio: swap-backed.
    Shmem,
    /// A page-cache folio of a disk file: on the file LRU.
    File,
    /// A page-table page.
    Pgtable,
}

/// Whether a new folio must be zeroed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Zeroing {
    /// Fill with zeroes (`__GFP_ZERO` / `clear_user_highpage`).
    Zero,
    /// The caller overwrites every byte (a COW copy).
    NoZero,
}

/// Deterministic allocation failure injection (issue 9 extends this).
#[derive(Debug, Default)]
pub struct FailPoint {
    /// Remaining successful allocations before one fails; 0 = disabled.
    countdown: AtomicU64,
}

impl FailPoint {
    /// Makes the `n`-th allocation from now fail (`None` disables).
    pub fn arm(&self, n: Option<u64>) {
        self.countdown.store(n.unwrap_or(0), Relaxed);
    }

    /// Allocations still to pass before the armed one fails (0: disarmed or fired). Armed
    /// with `u64::MAX`, a run counts its allocations without failing one: a failure armed at
    /// `n` is hit exactly when the run makes at least `n` of them.
    pub fn remaining(&self) -> u64 {
        self.countdown.load(Relaxed)
    }

    /// Consumes one allocation; true if this one must fail.
    fn should_fail(&self) -> bool {
        let v = self.countdown.load(Relaxed);
        if v == 0 {
            return false;
        }
        self.countdown.store(v - 1, Relaxed);
        v == 1
    }
}

/// All of simulated RAM.
#[derive(Debug)]
pub struct PhysMem {
    /// Frame contents.
    pub arena: Arena,
    /// Frame metadata.
    pub memmap: Memmap,
    zones: Vec<Zone>,
    zero_pfn: Pfn,
    huge_zero: OnceLock<Option<Pfn>>,
    /// Frames currently allocated (excluding the zero pages).
    allocated: AtomicU64,
    /// Allocation failure injection for folios.
    pub fail_folio: FailPoint,
    /// Allocation failure injection for page-table pages.
    pub fail_pgtable: FailPoint,
    /// One LRU per node.
    pub(crate) lruvecs: Vec<Lruvec>,
    /// `NR_MLOCK` per node, in pages.
    nr_mlock: Vec<AtomicI64>,
    /// "Mapped shared?" trackers of large anon folios (issue 5, seed 003).
    pub sharing: crate::sharing::Sharing,
}

impl PhysMem {
    /// Creates `bytes` of RAM (rounded down to whole 4 MiB blocks) split evenly over `nodes`.
    pub fn new(bytes: u64, nodes: u32) -> PhysMem {
        PhysMem::with_arena(bytes, nodes, Arena::default())
    }

    /// [`PhysMem::new`] on `arena` when it has the right number of frames (a machine's RAM
    /// handed on by [`crate::Machine::new_reusing`]: its frames hold old contents, which is
    /// fine, since every allocation either zeroes a frame or writes all of it), else on a
    /// new one.
    pub(crate) fn with_arena(bytes: u64, nodes: u32, arena: Arena) -> PhysMem {
        let nr_frames = (bytes >> PAGE_SHIFT) & !((1u64 << buddy::MAX_ORDER) - 1);
        let arena = if arena.nr_frames() == nr_frames {
            arena
        } else {
            Arena::new(nr_frames)
        };
        let memmap = Memmap::new(nr_frames);
        // If the host could not back that much, the machine has no RAM at all.
        let nr_frames = if arena.nr_frames() == nr_frames && memmap.nr_frames() == nr_frames {
            nr_frames
        } else {
            0
        };
        let nodes = u64::from(nodes.max(1));
        let per_node = (nr_frames / nodes) & !((1u64 << buddy::MAX_ORDER) - 1);
        let zones: Vec<Zone> = (0..nodes)
            .map(|n| {
                let start = n * per_node;
                let end = if n + 1 == nodes {
                    nr_frames
                } else {
                    start + per_node
                };
                Zone::new(&memmap, Pfn::new(start), Pfn::new(end))
            })
            .collect();
        let mut phys = PhysMem {
            arena,
            memmap,
            zones,
            zero_pfn: Pfn::new(0),
            huge_zero: OnceLock::new(),
            allocated: AtomicU64::new(0),
            fail_folio: FailPoint::default(),
            fail_pgtable: FailPoint::default(),
            lruvecs: (0..nodes).map(|_| Lruvec::default()).collect(),
            nr_mlock: (0..nodes).map(|_| AtomicI64::new(0)).collect(),
            sharing: crate::sharing::Sharing::new(
                nr_frames,
                crate::sharing::SharingTracker::default(),
                false,
            ),
        };
        phys.zero_pfn = phys.alloc_reserved(0).unwrap_or(Pfn::new(0));
        phys
    }

    /// A zero page or folio of `2^order` frames, zeroed: Linux allocates the huge zero folio
    /// with `__GFP_ZERO` on first use, by which time its frames may have held another folio's
    /// data (not counted in `pages_zeroed`, as the allocation is in no allocation counter).
    fn alloc_reserved(&self, order: u32) -> Option<Pfn> {
        let pfn = self
            .zones
            .iter()
            .find_map(|z| z.alloc(&self.memmap, order))?;
        self.prep(pfn, order);
        for p in pfn.range(1 << order) {
            self.arena.zero_frame(p);
            self.memmap.set(p, PageFlag::Zero);
            self.memmap.set(p, PageFlag::Reserved);
        }
        Some(pfn)
    }

    /// Total frames.
    pub fn nr_frames(&self) -> u64 {
        self.arena.nr_frames()
    }

    /// Number of NUMA nodes.
    pub(crate) fn nr_nodes(&self) -> usize {
        self.zones.len()
    }

    /// The node owning a frame.
    pub(crate) fn node_of(&self, pfn: Pfn) -> usize {
        self.zones
            .iter()
            .position(|z| pfn >= z.start_pfn && pfn < z.end_pfn)
            .unwrap_or(0)
    }

    /// The shared zero page.
    pub(crate) fn zero_pfn(&self) -> Pfn {
        self.zero_pfn
    }

    /// The huge zero folio (allocated on first use; `None` if memory is exhausted).
    pub(crate) fn huge_zero_pfn(&self) -> Option<Pfn> {
        *self
            .huge_zero
            .get_or_init(|| self.alloc_reserved(HPAGE_PMD_ORDER))
    }

    /// Whether `pfn` belongs to the zero page or the huge zero folio.
    #[inline]
    pub(crate) fn is_zero_pfn(&self, pfn: Pfn) -> bool {
        self.memmap.test(pfn, PageFlag::Zero)
    }

    /// Frames currently allocated to folios and page tables.
    pub fn allocated_frames(&self) -> u64 {
        self.allocated.load(Relaxed)
    }

    /// Free frames over all zones.
    pub fn free_frames(&self) -> u64 {
        self.zones.iter().map(Zone::free_pages).sum()
    }

    /// Every zone (for validation and views).
    pub(crate) fn zones(&self) -> &[Zone] {
        &self.zones
    }

    fn prep(&self, pfn: Pfn, order: u32) {
        let mm = &self.memmap;
        mm.reset(pfn);
        mm.set_order(pfn, order);
        mm.set_refcount(pfn, 1);
        if order > 0 {
            mm.set(pfn, PageFlag::Head);
            for p in pfn.add(1).range_to(pfn.add(1 << order)) {
                mm.reset(p);
                mm.set_tail(p, pfn);
            }
        }
    }

    /// Allocates a folio of `2^order` frames with refcount 1, preferring `node`.
    ///
    /// # Returns
    /// The head pfn, or `None` when memory is exhausted (or a fail point fired).
    pub(crate) fn alloc_folio(
        &self,
        c: &CpuCounters,
        order: u32,
        node: usize,
        kind: FolioKind,
        zero: Zeroing,
    ) -> Option<Pfn> {
        let fail = match kind {
            FolioKind::Pgtable => &self.fail_pgtable,
            FolioKind::Anon | FolioKind::Shmem | FolioKind::File => &self.fail_folio,
        };
        if fail.should_fail() {
            return None;
        }
        let n = self.zones.len();
        let pfn = (0..n).find_map(|i| {
            c.add(Ev::LockZone, 1);
            self.zones[(node + i) % n].alloc(&self.memmap, order)
        })?;
        self.prep(pfn, order);
        let nr = 1u64 << order;
        self.allocated.fetch_add(nr, Relaxed);
        c.add(Ev::FramesAlloc, nr);
        c.add(Ev::FolioAlloc, 1);
        if !pcp_order(order) {
            c.add(Ev::FolioBuddyDirect, 1);
        }
        let mm = &self.memmap;
        match kind {
            FolioKind::Anon => {
                mm.set(pfn, PageFlag::Anon);
                mm.set(pfn, PageFlag::SwapBacked);
                if order > 0 {
                    mm.set(pfn, PageFlag::LargeRmappable);
                }
            }
            FolioKind::Shmem => {
                mm.set(pfn, PageFlag::SwapBacked);
                if order > 0 {
                    mm.set(pfn, PageFlag::LargeRmappable);
                }
            }
            FolioKind::File => {}
            FolioKind::Pgtable => {
                mm.set(pfn, PageFlag::Pgtable);
                c.add(Ev::PgtableAlloc, 1);
            }
        }
        mm.set(pfn, PageFlag::Uptodate);
        if order > 0 && kind != FolioKind::Pgtable {
            use crate::sharing::FolioCounts;
            match self.sharing.folio_counts() {
                FolioCounts::Scanned => {}
                FolioCounts::Total => mm.set(pfn, PageFlag::TotalMapcount),
                FolioCounts::TotalAndOwner => {
                    mm.set(pfn, PageFlag::TotalMapcount);
                    mm.set(pfn, PageFlag::OwnerTracked);
                }
            }
        }
        if zero == Zeroing::Zero {
            for p in pfn.range(nr) {
                self.arena.zero_frame(p);
            }
            c.add(Ev::PagesZeroed, nr);
        }
        Some(pfn)
    }

    /// Splits an unmapped large page-cache folio into the naturally aligned `pieces` (page
    /// offset from `head`, order) that tile it (`__split_unmapped_folio`). Each piece keeps the
    /// folio's state, file, and the references of its pages (one per page: the page cache's);
    /// pieces that were on an LRU list go back on it in place of the folio.
    ///
    /// # Context
    /// No mapping, pin or batch holds the folio: its refcount is its number of pages.
    pub(crate) fn split_unmapped_folio(&self, c: &CpuCounters, head: Pfn, pieces: &[(u64, u32)]) {
        let mm = &self.memmap;
        let folio = mm.folio(head);
        let nr = folio.nr_pages();
        let carried = [
            PageFlag::Dirty,
            PageFlag::Uptodate,
            PageFlag::SwapBacked,
            PageFlag::Referenced,
            PageFlag::Active,
            PageFlag::MappedToDisk,
            PageFlag::Workingset,
        ];
        let flags: Vec<PageFlag> = carried.into_iter().filter(|&f| folio.test(f)).collect();
        let (mapping, index) = (folio.mapping(), folio.index());
        let on_lru = folio.test(PageFlag::Lru);
        c.add(Ev::LockLru, 1);
        let mut lists = self.lruvec_of(head).lock();
        if on_lru {
            lists.del(folio, nr);
        }
        for &(off, order) in pieces {
            let p = head.add(off);
            self.prep(p, order);
            mm.set_refcount(p, 1 << order);
            let piece = mm.folio(p);
            for &f in &flags {
                piece.set(f);
            }
            if order > 0 {
                piece.set(PageFlag::LargeRmappable);
            }
            piece.set_mapping(mapping);
            piece.set_index(index + off);
            if on_lru {
                piece.set(PageFlag::Lru);
                lists.add(piece, 1 << order);
            }
        }
        c.add(Ev::ThpSplitFolio, 1);
    }

    /// Drops `n` references to a folio; frees it when the count reaches zero.
    ///
    /// # Returns
    /// True if the folio was freed.
    pub(crate) fn put_folio(&self, c: &CpuCounters, head: Pfn, n: i32) -> bool {
        if self.is_zero_pfn(head) {
            return false;
        }
        c.add(Ev::FolioAtomic, 1);
        c.add(Ev::RefcountAtomic, 1);
        let left = self.memmap.folio(head).ref_sub(n);
        if left == 0 {
            self.free_folio(c, head);
            return true;
        }
        left < 0
    }

    /// Adds to `NR_MLOCK` of the folio's node through CPU `c`'s vmstat diff
    /// (`__mod_zone_page_state`).
    pub(crate) fn mod_nr_mlock(&self, c: &CpuCounters, head: Pfn, pages: i64) {
        let node = self.node_of(head);
        c.mod_vmstat(node, pages, &self.nr_mlock[node]);
    }

    /// The folded part of `NR_MLOCK` summed over nodes (see [`crate::Machine::nr_mlock`] for
    /// the exact value).
    pub(crate) fn nr_mlock_folded(&self) -> i64 {
        self.nr_mlock.iter().map(|n| n.load(Relaxed)).sum()
    }

    /// The lruvec of a folio.
    pub(crate) fn lruvec_of(&self, head: Pfn) -> &Lruvec {
        self.lruvec_of_node(self.node_of(head))
    }

    /// The lruvec of node `node`.
    pub(crate) fn lruvec_of_node(&self, node: usize) -> &Lruvec {
        &self.lruvecs[node.min(self.lruvecs.len() - 1)]
    }

    /// Drops the references `refs` (folio head, count) gathered for one TLB batch, as
    /// `folios_put_refs` does for `free_pages_and_swap_cache`: in batches of
    /// [`FOLIO_BATCH_SIZE`], the folios whose last reference went are taken off their LRU
    /// under one `lru_lock` per batch (re-taken only when the node changes), then freed, one
    /// `free_batches` per batch that freed any. Before, the engine took the lock once per freed
    /// folio, 31 times Linux's count.
    ///
    /// # Context
    /// No lru_lock or zone lock held; takes the lru_lock of each freed folio's node.
    pub(crate) fn folios_put_refs(&self, c: &CpuCounters, refs: &[(Pfn, i32)]) {
        for batch in refs.chunks(FOLIO_BATCH_SIZE) {
            let mut freed: FolioBatch<Pfn> = FolioBatch::new();
            for &(head, n) in batch {
                if self.is_zero_pfn(head) {
                    continue;
                }
                c.add(Ev::FolioAtomic, 1);
                c.add(Ev::RefcountAtomic, 1);
                if self.memmap.folio(head).ref_sub(n) == 0 {
                    freed.push(head);
                }
            }
            let listed: FolioBatch<Pfn> = freed
                .iter()
                .copied()
                .filter(|&h| self.memmap.test(h, PageFlag::Lru))
                .collect();
            if !freed.is_empty() {
                c.add(Ev::FreeBatch, 1);
            }
            self.with_lru_locks(
                c,
                &listed,
                |h| h,
                |lists, h| self.lru_del_freed(c, lists, h),
            );
            for head in freed {
                self.free_unlisted(c, head);
            }
        }
    }

    /// Runs `f` on each entry under the lru_lock of its folio's node (`head` names the
    /// folio), re-locking only on a node change (`folio_lruvec_relock_irq`).
    pub(crate) fn with_lru_locks<T: Copy>(
        &self,
        c: &CpuCounters,
        entries: &[T],
        head: impl Fn(T) -> Pfn,
        mut f: impl FnMut(&mut Lists, T),
    ) {
        let mut i = 0;
        while i < entries.len() {
            let node = self.node_of(head(entries[i]));
            c.add(Ev::LockLru, 1);
            let mut lists = self.lruvec_of_node(node).lock();
            while i < entries.len() && self.node_of(head(entries[i])) == node {
                f(&mut lists, entries[i]);
                i += 1;
            }
        }
    }

    /// Takes a folio whose last reference went off its LRU (`__page_cache_release`).
    fn lru_del_freed(&self, c: &CpuCounters, lists: &mut Lists, head: Pfn) {
        c.add(Ev::LruFreed, 1);
        let folio = self.memmap.folio(head);
        lists.del(folio, folio.nr_pages());
        folio.clear(PageFlag::Lru);
    }

    /// Returns a folio whose refcount reached zero to its zone, taking it off its LRU and
    /// clearing its mlocked state first (`__folio_put`).
    fn free_folio(&self, c: &CpuCounters, head: Pfn) {
        c.add(Ev::FreeBatch, 1);
        if self.memmap.test(head, PageFlag::Lru) {
            c.add(Ev::LockLru, 1);
            let mut l = self.lruvec_of(head).lock();
            self.lru_del_freed(c, &mut l, head);
        }
        self.free_unlisted(c, head);
    }

    /// Frees a folio whose refcount reached zero and which is on no LRU.
    fn free_unlisted(&self, c: &CpuCounters, head: Pfn) {
        let folio = self.memmap.folio(head);
        let order = folio.order();
        let nr = 1u64 << order;
        if folio.test_and_clear(PageFlag::Mlocked) {
            self.mod_nr_mlock(c, head, -(nr as i64));
        }
        if folio.test(PageFlag::Pgtable) {
            c.add(Ev::PgtableFree, 1);
        }
        for p in head.add(1).range_to(head.add(nr)) {
            self.memmap.reset(p);
        }
        self.memmap.reset(head);
        let node = self.node_of(head);
        c.add(Ev::LockZone, 1);
        self.zones[node].free(&self.memmap, head, order);
        self.allocated.fetch_sub(nr, Relaxed);
        c.add(Ev::FramesFree, nr);
        c.add(Ev::FolioFree, 1);
        if !pcp_order(order) {
            c.add(Ev::FolioBuddyDirect, 1);
        }
    }
}

/// Whether Linux keeps folios of `order` on its per-CPU page lists (`pcp_allowed_order`):
/// orders up to `PAGE_ALLOC_COSTLY_ORDER` (3) and the PMD order (9, with THP). The engine
/// has no per-CPU lists and takes the zone lock for every order; Linux allocates and frees
/// the other orders (64K to 1M folios) in the buddy lists under `zone->lock`, once each
/// (traced on a 6.18 guest: every 64K folio's allocation and free took the lock).
fn pcp_order(order: u32) -> bool {
    order <= 3 || order == 9
}

impl PhysMem {
    /// Whether the huge zero folio has been allocated.
    pub(crate) fn huge_zero_pfn_if_allocated(&self) -> bool {
        matches!(self.huge_zero.get(), Some(Some(_)))
    }
}
