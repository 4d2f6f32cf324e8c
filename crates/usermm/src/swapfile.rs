//! The swap device: its slots, their reference counts, the swap cache and the bytes.
//!
//! Linux counterparts: `mm/swapfile.c` (`struct swap_info_struct`, `swap_map` counts,
//! `folio_alloc_swap` / the cluster allocator, `swap_duplicate`, `swap_free_nr`,
//! `put_swap_folio`, `free_swap_and_cache`, `folio_free_swap`, `swp_swapcount`), the swap
//! cache of `mm/swap_state.c` (`swap_cache_add_folio`, `swap_cache_del_folio`,
//! `swap_cache_get_folio`) and the device I/O of `mm/page_io.c` (`swap_writeout`,
//! `swap_read_folio`).
//!
//! A machine has at most one swap area (`set swap SIZE`, swap type 0). Slot 0 is the
//! header, as on disk, so an area of SIZE bytes holds SIZE/4K − 1 pages (what
//! `/proc/swaps` reports). Each slot has a count: the swap PTEs that name it, plus the
//! `SWAP_HAS_CACHE` bit while a folio in the swap cache owns it. A slot is free when both are
//! gone. The swap cache maps a slot to the page that holds its data in memory; a folio in
//! it has `PG_swapcache`, one reference per page held by the cache, and its first slot in
//! `folio->swap` (`Memmap::swap_entry`). The data of a swapped-out page lives in a host
//! allocation of the area's size (lazily backed, like the simulated RAM), written and read
//! synchronously.
//!
//! Deliberate differences:
//! - one lock (the `swap_info_struct` lock) guards counts and cache, where Linux has a lock
//!   per cluster and one per swap-cache table; the counts are 16 bits wide, so there are
//!   no continuation pages (`add_swap_count_continuation`), and a count that would pass
//!   `SWAP_MAP_MAX` makes fork fail with ENOMEM as a failed continuation does;
//! - large folios get a run of slots only on a solid-state device (`MachineConfig::
//!   swap_ssd`); the default is rotational, as this host's virtio disk (measured on 6.18:
//!   `thp_swpout` 0, every large folio counted in `thp_swpout_fallback` and split);
//! - the allocator hands out the lowest free run, naturally aligned to the folio's size
//!   (a cluster of its order), scanning from where the last allocation ended, where Linux
//!   keeps per-CPU clusters and per-order free lists: slot numbers differ, what is
//!   observable (which pages are swapped, counts, whether a large folio is swapped whole)
//!   does not;
//! - writeback completes at once (the engine has no I/O latency), so a folio reclaim wrote
//!   is freed in the same pass, where Linux frees it when its writeback ends.

use crate::phys::{Arena, Pfn, PhysMem, SwpEntry};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// The count bit of a slot owned by a folio in the swap cache (`SWAP_HAS_CACHE`).
const SWAP_HAS_CACHE: u16 = 0x8000;

/// The most swap PTEs one slot may have (`SWAP_MAP_MAX`, here without continuations).
pub(crate) const SWAP_MAP_MAX: u16 = 0x7ffe;

/// Copies one frame's words (relaxed, as the arena's own copies are).
fn copy_words(dst: &[AtomicU64], src: &[AtomicU64]) {
    for (d, s) in dst.iter().zip(src) {
        d.store(s.load(Relaxed), Relaxed);
    }
}

/// Slot counts and the swap cache, under the area's lock.
#[derive(Debug)]
struct SwapMap {
    /// `swap_map`: per slot, the swap PTEs naming it and [`SWAP_HAS_CACHE`].
    count: Vec<u16>,
    /// The swap cache: slot → the page holding its data.
    cache: HashMap<u64, Pfn>,
    /// Slots in use (`inuse_pages`).
    inuse: u64,
    /// Where the next search for free slots starts.
    cursor: u64,
}

/// The first run of `nr` free slots aligned to `nr` in `[lo, hi)`.
fn find_free_run(count: &[u16], nr: u64, lo: u64, hi: u64) -> Option<u64> {
    let mut s = lo.max(1).next_multiple_of(nr);
    while s + nr <= hi {
        match count[s as usize..(s + nr) as usize]
            .iter()
            .rposition(|&c| c != 0)
        {
            None => return Some(s),
            // Past the busy slot, to the next aligned start.
            Some(busy) => s = (s + busy as u64 + 1).next_multiple_of(nr),
        }
    }
    None
}

/// One swap area (`struct swap_info_struct`).
#[derive(Debug)]
pub struct SwapInfo {
    /// Usable slots (1..=pages; slot 0 is the header).
    pages: u64,
    /// A solid-state device (`SWP_SOLIDSTATE`): only then does 6.18 hand a large folio a
    /// run of slots of its size; on a rotational one every large folio is split first.
    solidstate: bool,
    map: Mutex<SwapMap>,
    /// The area's bytes, one frame per slot.
    data: Arena,
}

impl SwapInfo {
    /// An area of `bytes` (rounded down to pages; `None` if it has no usable slot or the
    /// host cannot back it), on a solid-state device or not.
    pub(crate) fn new(bytes: u64, solidstate: bool) -> Option<SwapInfo> {
        let slots = bytes / 4096;
        if slots < 2 || slots > u64::from(u32::MAX) {
            return None;
        }
        let data = Arena::new(slots);
        if data.nr_frames() != slots {
            return None;
        }
        Some(SwapInfo {
            pages: slots - 1,
            solidstate,
            map: Mutex::new(SwapMap {
                count: vec![0; usize::try_from(slots).ok()?],
                cache: HashMap::new(),
                inuse: 0,
                cursor: 1,
            }),
            data,
        })
    }

    /// Usable pages (`/proc/swaps` Size / 4K).
    pub fn pages(&self) -> u64 {
        self.pages
    }

    /// Slots in use (`/proc/swaps` Used / 4K).
    pub fn inuse(&self) -> u64 {
        self.map.lock().inuse
    }

    /// Whether more than half the area is in use (`vm_swap_full`).
    pub(crate) fn full(&self) -> bool {
        self.inuse() * 2 > self.pages
    }

    /// `folio_alloc_swap`'s slot search: `1 << order` free slots, naturally aligned, owned
    /// by the cache (`SWAP_HAS_CACHE`); `None` when the area has no such run.
    pub(crate) fn alloc(&self, order: u32) -> Option<SwpEntry> {
        if order > 0 && !self.solidstate {
            return None;
        }
        self.alloc_run(order)
    }

    /// [`SwapInfo::alloc`] on any device (for a large folio the engine cannot split).
    pub(crate) fn alloc_run(&self, order: u32) -> Option<SwpEntry> {
        let nr = 1u64 << order;
        let mut m = self.map.lock();
        let total = self.pages + 1;
        if m.inuse + nr > self.pages {
            return None;
        }
        // From where the last search ended to the end, then from the start.
        let cursor = m.cursor;
        let s = find_free_run(&m.count, nr, cursor, total)
            .or_else(|| find_free_run(&m.count, nr, 1, (cursor + nr).min(total)))?;
        for c in &mut m.count[s as usize..(s + nr) as usize] {
            *c = SWAP_HAS_CACHE;
        }
        m.inuse += nr;
        m.cursor = s + nr;
        Some(SwpEntry::new(s))
    }

    /// Whether [`SwapInfo::alloc`] would find a run for a folio of `order`.
    pub(crate) fn has_free_run(&self, order: u32) -> bool {
        if order > 0 && !self.solidstate {
            return false;
        }
        let nr = 1u64 << order;
        let m = self.map.lock();
        m.inuse + nr <= self.pages && find_free_run(&m.count, nr, 1, self.pages + 1).is_some()
    }

    /// `swap_duplicate`: one more swap PTE names `e`; false (nothing changed) when the
    /// count is at its maximum or the slot is free.
    pub(crate) fn duplicate(&self, e: SwpEntry) -> bool {
        let mut m = self.map.lock();
        let Some(c) = m.count.get_mut(e.offset() as usize) else {
            return false;
        };
        if *c & !SWAP_HAS_CACHE >= SWAP_MAP_MAX || *c == 0 {
            return false;
        }
        *c += 1;
        true
    }

    /// `swap_free_nr`: `nr` swap PTEs from `e` on are gone; a slot no PTE and no cache
    /// holds is freed.
    pub(crate) fn free_nr(&self, e: SwpEntry, nr: u64) {
        let mut m = self.map.lock();
        for s in e.offset()..e.offset() + nr {
            let c = &mut m.count[s as usize];
            debug_assert!(*c & !SWAP_HAS_CACHE > 0, "swap slot {s} freed twice");
            *c -= 1;
            if *c == 0 {
                m.inuse -= 1;
            }
        }
    }

    /// The swap PTEs naming `e` (`swp_swapcount`).
    pub(crate) fn swapcount(&self, e: SwpEntry) -> u16 {
        self.map.lock().count[e.offset() as usize] & !SWAP_HAS_CACHE
    }

    /// The page of the swap cache holding `e`'s data (`swap_cache_get_folio`).
    pub(crate) fn cache_lookup(&self, e: SwpEntry) -> Option<Pfn> {
        self.map.lock().cache.get(&e.offset()).copied()
    }

    /// Enters the `nr` pages from `page` as the data of slots `e…` (owned by the cache since
    /// [`SwapInfo::alloc`] or [`SwapInfo::claim_cache`]).
    pub(crate) fn cache_add(&self, e: SwpEntry, page: Pfn, nr: u64) {
        let mut m = self.map.lock();
        for i in 0..nr {
            debug_assert!(m.count[(e.offset() + i) as usize] & SWAP_HAS_CACHE != 0);
            m.cache.insert(e.offset() + i, page.add(i));
        }
    }

    /// Claims slot `e` for a folio about to be read into the cache (`swapcache_prepare`):
    /// false when it is already owned (another reader, or already cached) or free.
    pub(crate) fn claim_cache(&self, e: SwpEntry) -> bool {
        let mut m = self.map.lock();
        let c = &mut m.count[e.offset() as usize];
        if *c & SWAP_HAS_CACHE != 0 || *c == 0 {
            return false;
        }
        *c |= SWAP_HAS_CACHE;
        true
    }

    /// Removes slots `e…e+nr` from the cache (`swap_cache_del_folio` + `put_swap_folio`):
    /// the cache no longer owns them; those no PTE names are freed. Returns how many were
    /// freed.
    pub(crate) fn cache_del(&self, e: SwpEntry, nr: u64) -> u64 {
        let mut m = self.map.lock();
        let mut freed = 0;
        for s in e.offset()..e.offset() + nr {
            m.cache.remove(&s);
            let c = &mut m.count[s as usize];
            debug_assert!(*c & SWAP_HAS_CACHE != 0, "slot {s} not owned by the cache");
            *c &= !SWAP_HAS_CACHE;
            if *c == 0 {
                m.inuse -= 1;
                freed += 1;
            }
        }
        freed
    }

    /// Whether any of slots `e…e+nr` is still named by a swap PTE (`folio_swapped`).
    pub(crate) fn any_swapped(&self, e: SwpEntry, nr: u64) -> bool {
        let m = self.map.lock();
        (e.offset()..e.offset() + nr).any(|s| m.count[s as usize] & !SWAP_HAS_CACHE != 0)
    }

    /// Writes page `pfn` of `phys` to slot `e` (`swap_writeout`, completed at once).
    pub(crate) fn write(&self, e: SwpEntry, phys: &PhysMem, pfn: Pfn) {
        let (src, dst) = (phys.arena.frame(pfn), self.data.frame(Pfn::new(e.offset())));
        copy_words(dst, src);
    }

    /// Reads slot `e` into page `pfn` of `phys` (`swap_read_folio`, completed at once).
    pub(crate) fn read(&self, e: SwpEntry, phys: &PhysMem, pfn: Pfn) {
        let (src, dst) = (self.data.frame(Pfn::new(e.offset())), phys.arena.frame(pfn));
        copy_words(dst, src);
    }

    /// Every slot's count and cache page, for validation: (slot, PTE count, owned by the
    /// cache, cached page).
    pub(crate) fn snapshot(&self) -> Vec<(u64, u16, bool, Option<Pfn>)> {
        let m = self.map.lock();
        m.count
            .iter()
            .enumerate()
            .filter(|(_, &c)| c != 0)
            .map(|(s, &c)| {
                let s = s as u64;
                (
                    s,
                    c & !SWAP_HAS_CACHE,
                    c & SWAP_HAS_CACHE != 0,
                    m.cache.get(&s).copied(),
                )
            })
            .collect()
    }

    /// Slots in use, counted from the map (validation of `inuse`).
    pub(crate) fn inuse_counted(&self) -> (u64, u64) {
        let m = self.map.lock();
        (m.inuse, m.count.iter().filter(|&&c| c != 0).count() as u64)
    }
}
