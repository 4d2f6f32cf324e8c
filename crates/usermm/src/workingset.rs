//! Shadow entries and refault activation of page-cache pages.
//!
//! Linux counterpart: `mm/workingset.c` (`workingset_eviction`, `workingset_refault`,
//! `workingset_test_recent`, `workingset_age_nonresident`) for the file LRU of the classic
//! active/inactive scheme (no MGLRU, as on this host).
//!
//! When reclaim evicts a page-cache folio it leaves a shadow in its slots: the node's
//! non-resident age at that moment (a clock that advances by the pages evicted and
//! activated). When the page is read in again, the refault distance — how far the clock
//! moved since — is how much more memory the page would have needed to stay resident; if
//! it is no more than the node's workingset (its active file pages, and with swap its
//! anonymous pages too), the page was thrashing out of a cache that is too small for it and
//! starts on the active list. Truncation and hole punching remove the shadows of their range.
//!
//! `PG_workingset` ([`PageFlag::Workingset`]) marks a folio reclaim deactivated; the shadow
//! keeps it (`pack_shadow`'s workingset bit), and a folio refaulting within reach over such
//! a shadow is activated and marked again (a restored working set). Its only reader here is
//! fault-around's `mmap_miss` count ([`crate::readahead`]).
//!
//! What of `PG_workingset` is left out, all of it without a reader in the engine:
//! anonymous folios get the flag when deactivated (as on Linux) but never back on swap-in
//! (no anonymous shadows, below); the kernel's other readers — PSI's memory-stall
//! accounting of a working-set read (`filemap_read_folio`, readahead), the
//! `workingset_restore` counter and `lru_note_cost_refault` — are not modelled; and nothing
//! compares it with the host, as `/proc/kpageflags` has no bit for it.
//!
//! Deliberate differences: the shadows are kept beside the page cache (a map per inode)
//! instead of as value entries in its xarray, so they cost no node reclaim (`shadow_lru`);
//! anonymous pages leave no shadows in the swap cache (measured on
//! 6.18: whether a swap-in is activated depends on the memory cgroup's statistics, which the
//! kernel refreshes at most every two seconds, so no deterministic rule reproduces it).

use crate::filemap::Inode;
use crate::machine::Cpu;
use crate::phys::lru::LruList;
use crate::phys::{PageFlag, Pfn};
use crate::stats::Ev;

/// A shadow's bit for "the folio was `PG_workingset` when it was evicted"; the clock is
/// in the bits below (it counts pages, and never reaches 2^63).
const SHADOW_WORKINGSET: u64 = 1 << 63;

/// `workingset_eviction` of the folio `head` at `idx..idx+nr` of `inode`, reclaimed now:
/// its slots get the node's clock as their shadow, with whether the folio was
/// `PG_workingset`, and the clock advances by `nr`.
pub(crate) fn workingset_eviction<'m>(cpu: &Cpu<'m>, inode: &Inode, idx: u64, head: Pfn) {
    let phys = &cpu.m.phys;
    let nr = 1u64 << phys.memmap.order(head);
    let lruvec = phys.lruvec_of(head);
    let age = lruvec.age_nonresident(nr);
    let shadow = if phys.memmap.test(head, PageFlag::Workingset) {
        age | SHADOW_WORKINGSET
    } else {
        age
    };
    let mut shadows = inode.shadows.lock();
    for i in idx..idx + nr {
        shadows.insert(i, shadow);
    }
}

/// `workingset_refault` for a new folio `head` at `idx` of `inode` about to enter the LRU:
/// activates it when its shadow says it was evicted within the workingset's reach, and
/// marks it `PG_workingset` too when it was so at eviction.
pub(crate) fn workingset_refault<'m>(cpu: &Cpu<'m>, inode: &Inode, idx: u64, head: Pfn) {
    let Some(shadow) = inode.shadows.lock().remove(&idx) else {
        return;
    };
    let eviction = shadow & !SHADOW_WORKINGSET;
    let phys = &cpu.m.phys;
    let nr = 1u64 << phys.memmap.order(head);
    cpu.c().add(Ev::WorkingsetRefault, nr);
    let lruvec = phys.lruvec_of(head);
    let distance = lruvec.nonresident_age().wrapping_sub(eviction);
    let workingset = {
        let l = lruvec.lock();
        let mut size = l.pages(LruList::ActiveFile);
        if cpu.m.swap.as_ref().is_some_and(|s| s.inuse() < s.pages()) {
            size += l.pages(LruList::ActiveAnon) + l.pages(LruList::InactiveAnon);
        }
        size
    };
    if distance <= workingset {
        phys.memmap.set(head, PageFlag::Active);
        if shadow & SHADOW_WORKINGSET != 0 {
            phys.memmap.set(head, PageFlag::Workingset);
        }
        lruvec.age_nonresident(nr);
        cpu.c().add(Ev::WorkingsetActivate, nr);
    }
}

/// Drops the shadows of `first..last` (truncation, hole punching).
pub(crate) fn clear_shadows(inode: &Inode, first: u64, last: u64) {
    let mut shadows = inode.shadows.lock();
    if shadows.is_empty() {
        return;
    }
    let gone: Vec<u64> = shadows.range(first..last).map(|(&i, _)| i).collect();
    for i in gone {
        shadows.remove(&i);
    }
}
