//! The buddy allocator, one zone per NUMA node.
//!
//! Linux counterpart: `mm/page_alloc.c` (`__rmqueue_smallest`, `expand`, `__free_one_page`).
//! Free blocks are naturally aligned runs of `2^order` frames threaded on per-order doubly
//! linked lists through the memmap's `next`/`prev` words, with `PageFlag::Buddy` and the order
//! on the block's first frame. Allocation takes the smallest block that fits and splits it;
//! freeing merges with the buddy while the buddy is free at the same order.
//!
//! # Locking
//! Each zone has one lock (`zone->lock`); nothing else is held under it.

use super::memmap::{Memmap, PageFlag};
use super::Pfn;
use parking_lot::Mutex;

/// Largest block order (Linux `MAX_PAGE_ORDER` = 10: 4 MiB blocks).
pub(crate) const MAX_ORDER: u32 = 10;
const NONE: u32 = u32::MAX;

#[derive(Debug)]
struct FreeArea {
    heads: [u32; MAX_ORDER as usize + 1],
    counts: [u64; MAX_ORDER as usize + 1],
}

/// One node's zone.
#[derive(Debug)]
pub(crate) struct Zone {
    /// First frame of the zone.
    pub(crate) start_pfn: Pfn,
    /// One past the last frame.
    pub(crate) end_pfn: Pfn,
    free: Mutex<FreeArea>,
}

impl Zone {
    /// Creates a zone over `[start_pfn, end_pfn)` with every frame free except `reserved`.
    pub(crate) fn new(mm: &Memmap, start_pfn: Pfn, end_pfn: Pfn) -> Zone {
        let zone = Zone {
            start_pfn,
            end_pfn,
            free: Mutex::new(FreeArea {
                heads: [NONE; MAX_ORDER as usize + 1],
                counts: [0; MAX_ORDER as usize + 1],
            }),
        };
        let mut area = zone.free.lock();
        let mut pfn = start_pfn;
        while pfn < end_pfn {
            let mut order = MAX_ORDER;
            while order > 0 && (!pfn.is_aligned(order) || pfn.add(1 << order) > end_pfn) {
                order -= 1;
            }
            push(mm, &mut area, pfn, order);
            pfn = pfn.add(1 << order);
        }
        drop(area);
        zone
    }

    /// Allocates a block of `2^order` frames.
    ///
    /// # Returns
    /// The first pfn, or `None` when no block of that order or larger is free.
    pub(crate) fn alloc(&self, mm: &Memmap, order: u32) -> Option<Pfn> {
        let mut area = self.free.lock();
        let mut o = order;
        while o <= MAX_ORDER && area.heads[o as usize] == NONE {
            o += 1;
        }
        if o > MAX_ORDER {
            return None;
        }
        let pfn = Pfn::from_u32(area.heads[o as usize]);
        unlink(mm, &mut area, pfn, o);
        while o > order {
            o -= 1;
            push(mm, &mut area, pfn.add(1 << o), o);
        }
        Some(pfn)
    }

    /// Returns a block of `2^order` frames, merging with free buddies.
    pub(crate) fn free(&self, mm: &Memmap, pfn: Pfn, order: u32) {
        let mut area = self.free.lock();
        let (mut pfn, mut order) = (pfn, order);
        while order < MAX_ORDER {
            let buddy = pfn.buddy(order);
            if buddy < self.start_pfn
                || buddy.add(1 << order) > self.end_pfn
                || !mm.test(buddy, PageFlag::Buddy)
                || mm.order(buddy) != order
            {
                break;
            }
            unlink(mm, &mut area, buddy, order);
            pfn = pfn.min(buddy);
            order += 1;
        }
        push(mm, &mut area, pfn, order);
    }

    /// Free blocks per order.
    pub(crate) fn free_counts(&self) -> [u64; MAX_ORDER as usize + 1] {
        self.free.lock().counts
    }

    /// Free frames in the zone.
    pub(crate) fn free_pages(&self) -> u64 {
        self.free_counts()
            .iter()
            .enumerate()
            .map(|(o, n)| n << o)
            .sum()
    }

    /// Every free block as (pfn, order), for validation.
    pub(crate) fn free_blocks(&self, mm: &Memmap) -> Vec<(Pfn, u32)> {
        let area = self.free.lock();
        let mut out = Vec::new();
        for (o, &head) in area.heads.iter().enumerate() {
            let mut p = head;
            while p != NONE {
                out.push((Pfn::from_u32(p), o as u32));
                p = mm.next(Pfn::from_u32(p));
            }
        }
        out
    }
}

fn push(mm: &Memmap, area: &mut FreeArea, pfn: Pfn, order: u32) {
    mm.reset(pfn);
    mm.set(pfn, PageFlag::Buddy);
    mm.set_order(pfn, order);
    let old = area.heads[order as usize];
    mm.set_next(pfn, old);
    mm.set_prev(pfn, NONE);
    if old != NONE {
        mm.set_prev(Pfn::from_u32(old), pfn.as_u32());
    }
    area.heads[order as usize] = pfn.as_u32();
    area.counts[order as usize] += 1;
}

fn unlink(mm: &Memmap, area: &mut FreeArea, pfn: Pfn, order: u32) {
    let (next, prev) = (mm.next(pfn), mm.prev(pfn));
    if prev == NONE {
        area.heads[order as usize] = next;
    } else {
        mm.set_next(Pfn::from_u32(prev), next);
    }
    if next != NONE {
        mm.set_prev(Pfn::from_u32(next), prev);
    }
    mm.reset(pfn);
    area.counts[order as usize] -= 1;
}
