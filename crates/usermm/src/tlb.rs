//! The software TLB: one per CPU, consulted by every access.
//!
//! Linux counterparts: `arch/x86/mm/tlb.c` (`flush_tlb_mm_range`, shootdowns),
//! `include/asm-generic/tlb.h` (the mmu_gather contract: unmap, then invalidate, then free).
//! Each CPU caches translations `(mm, virtual page) -> (pfn, writable, dirty)` in a
//! direct-mapped array. A flush is a shootdown: it invalidates matching entries on every CPU
//! and counts once. A translation that outlives its PTE (a missing flush) is caught by
//! [`crate::machine::Machine::validate`] and, with the `check_tlb` tunable, at the access itself.
//!
//! The engine's one addition: the obligation to flush is a value. Every page-table change a
//! TLB may still hold the old version of (an entry cleared, write-protected, made old or
//! clean, or replaced) returns a [`TlbFlushPending`], which must end in a flush (the
//! [`TlbFlushed`] receipt `Cpu::flush_tlb` returns) or in an mmu_gather, which flushes
//! before it frees. Linux leaves this to each caller (`flush_tlb_range` after
//! `change_protection`, `ptep_clear_flush`, `tlb_remove_tlb_entry`); a forgotten one shows
//! here as a `#[must_use]` warning at compile time and, in debug builds, as an assertion when
//! the token is dropped owed.
//!
//! # Locking
//! Each CPU's TLB has its own lock; it is a leaf lock (nothing is taken under it).

use crate::phys::Pfn;
use crate::stats::{CpuCounters, Ev};
use crate::vaddr::VirtAddr;
use parking_lot::Mutex;

/// Entries per CPU.
pub(crate) const TLB_ENTRIES: usize = 256;

/// One cached translation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TlbEntry {
    /// Owning mm id (0 = invalid).
    pub(crate) mm: u32,
    /// Virtual page number.
    pub(crate) vpn: u64,
    /// Physical frame.
    pub(crate) pfn: Pfn,
    /// Writes are allowed through this entry (and the PTE is already dirty).
    pub(crate) writable: bool,
}

/// One CPU's TLB.
#[derive(Debug)]
pub struct Tlb {
    entries: Mutex<Box<[TlbEntry; TLB_ENTRIES]>>,
}

impl Default for Tlb {
    fn default() -> Self {
        Tlb {
            entries: Mutex::new(Box::new([TlbEntry::default(); TLB_ENTRIES])),
        }
    }
}

#[inline]
fn slot(vpn: u64, mm: u32) -> usize {
    ((vpn ^ (u64::from(mm) << 7)) as usize) % TLB_ENTRIES
}

impl Tlb {
    /// Looks up a translation.
    #[inline]
    pub(crate) fn lookup(&self, mm: u32, vpn: u64) -> Option<TlbEntry> {
        let e = self.entries.lock()[slot(vpn, mm)];
        (e.mm == mm && e.vpn == vpn).then_some(e)
    }

    /// Caches a translation.
    #[inline]
    pub(crate) fn fill(&self, e: TlbEntry) {
        self.entries.lock()[slot(e.vpn, e.mm)] = e;
    }

    /// Invalidates every entry of `mm` in `[start_vpn, end_vpn)`.
    pub(crate) fn invalidate(&self, mm: u32, start_vpn: u64, end_vpn: u64) {
        let mut es = self.entries.lock();
        if end_vpn - start_vpn < TLB_ENTRIES as u64 / 4 {
            for vpn in start_vpn..end_vpn {
                let e = &mut es[slot(vpn, mm)];
                if e.mm == mm && e.vpn == vpn {
                    *e = TlbEntry::default();
                }
            }
            return;
        }
        for e in es.iter_mut() {
            if e.mm == mm && e.vpn >= start_vpn && e.vpn < end_vpn {
                *e = TlbEntry::default();
            }
        }
    }

    /// Every valid entry (for validation).
    pub fn entries(&self) -> Vec<TlbEntry> {
        self.entries
            .lock()
            .iter()
            .copied()
            .filter(|e| e.mm != 0)
            .collect()
    }
}

/// What a flush covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FlushScope {
    /// One page.
    Page(VirtAddr),
    /// `[start, end)`.
    Range(VirtAddr, VirtAddr),
    /// The whole mm.
    Mm,
}

/// A TLB flush owed by page-table changes: see the module docs.
///
/// One `bool` (whether anything is owed), the same flag the callers kept as `changed` or
/// `aged` before: release builds have no `Drop` for it, so it costs what that flag cost.
/// Tokens of one operation are folded together with [`TlbFlushPending::merge`] and settled
/// once, as the operation flushes once.
#[derive(Debug, Default)]
#[must_use = "a changed page-table entry must be flushed from the TLBs (settle the token with a \
              flush receipt or hand it to the mmu_gather)"]
pub(crate) struct TlbFlushPending {
    owed: bool,
}

impl TlbFlushPending {
    /// Nothing owed yet: the accumulator an operation starts with.
    #[inline]
    pub(crate) fn none() -> TlbFlushPending {
        TlbFlushPending { owed: false }
    }

    /// A flush owed (made by the page-table primitives that change a live entry).
    #[inline]
    pub(crate) fn owed() -> TlbFlushPending {
        TlbFlushPending { owed: true }
    }

    /// Whether a flush is owed (the operations that flush only when something changed).
    #[inline]
    pub(crate) fn is_owed(&self) -> bool {
        self.owed
    }

    /// Takes over what `other` owes.
    #[inline]
    pub(crate) fn merge(&mut self, mut other: TlbFlushPending) {
        self.owed |= std::mem::take(&mut other.owed);
    }

    /// Settled by a flush done after the changes, whose receipt is `flushed`.
    #[inline]
    pub(crate) fn flushed(mut self, flushed: TlbFlushed) {
        let _ = flushed;
        self.owed = false;
    }

    /// Settled by the mmu_gather that recorded the changed range: it flushes before it
    /// frees. Only `MmuGather::add_range` calls this.
    #[inline]
    pub(crate) fn gathered(mut self) {
        self.owed = false;
    }
}

#[cfg(debug_assertions)]
impl Drop for TlbFlushPending {
    fn drop(&mut self) {
        debug_assert!(
            !self.owed || std::thread::panicking(),
            "a TLB flush owed by a page-table change was dropped unsettled"
        );
    }
}

/// The receipt of a TLB flush ([`flush`], `Cpu::flush_tlb`): what settles a
/// [`TlbFlushPending`]. Only a flush makes one.
#[derive(Debug)]
pub(crate) struct TlbFlushed(());

impl TlbFlushed {
    /// The receipt of a flush the test switch `test_skip_tlb_flush` suppressed on purpose
    /// (the tests that check the engine catches stale translations).
    pub(crate) fn skipped_for_test() -> TlbFlushed {
        TlbFlushed(())
    }
}

/// Shoots down translations of `mm` on every CPU and counts one flush of the given kind.
pub(crate) fn flush(tlbs: &[&Tlb], c: &CpuCounters, mm: u32, scope: FlushScope) -> TlbFlushed {
    let (start, end, ev) = match scope {
        FlushScope::Page(a) => (a.vpn(), a.vpn() + 1, Ev::TlbFlushPage),
        FlushScope::Range(s, e) => (s.vpn(), e.val().div_ceil(4096), Ev::TlbFlushRange),
        FlushScope::Mm => (0, u64::MAX, Ev::TlbFlushMm),
    };
    c.add(ev, 1);
    for t in tlbs {
        t.invalidate(mm, start, end);
    }
    TlbFlushed(())
}
