//! The main stack's growth on replay and export, as Linux 6.18's fault path grows it
//! (`lock_mm_and_find_vma` → `expand_stack_locked` → `expand_downwards`, mm/mmap.c).
//!
//! Exec leaves the main stack a `VM_GROWSDOWN` VMA that covers only what exec copied to it
//! (the arguments, environment and auxiliary vector: 132 KiB in the recordings here). A
//! fault below it moves its start down to the faulting page, no further, when the new size
//! stays within `RLIMIT_STACK` and at least `stack_guard_gap` (256 pages) stays free above
//! the next accessible mapping below. The engine has no `VM_GROWSDOWN`, so replay and export
//! play that growth as a fixed anonymous mapping of the new pages just below the stack (the
//! engine, like Linux, merges it into the stack's VMA) before the fault.
//!
//! Why it matters: a large folio is only allocated where its whole aligned range lies in the
//! VMA. A stack mapped 8 MiB deep from the start (the replay's model before this) took a
//! 2 MiB THP, or a 64 KiB folio, as soon as the stack grew into a new aligned block under
//! `always`; the host's stack, whose start is the faulting page, took 4 KiB pages. Measured
//! on 6.18 with a program that recurses 6 MiB deep: host `AnonHugePages` 0 kB at exit, the
//! old replay 6 144 kB; under `64K=always` the old replay's `RssAnon` was 56 kB over.
//!
//! Deliberate differences: the limit is the default `RLIMIT_STACK` of 8 MiB (a trace does
//! not carry the recorded process's limit), and export (which has no engine to ask) finds
//! the mapping below the stack among the exec image's only.

use crate::format::{ImageVma, IMG_STACK};

/// The default `RLIMIT_STACK`: how deep the main stack may grow.
pub(crate) const STACK_LIMIT: u64 = 8 << 20;
/// `stack_guard_gap`: 256 pages kept free below the stack (mm/mmap.c, default).
pub(crate) const GUARD_GAP: u64 = 256 << 12;

/// One address space's main stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Stack {
    /// Its start now (it moves down as it grows).
    pub start: u64,
    /// Its end (exec's stack top).
    pub end: u64,
    /// Its protection bits (`PROT_*`).
    pub prot: u8,
}

impl Stack {
    /// The main stack exec left, if `v` is it (`IMG_STACK`).
    pub fn of(v: &ImageVma) -> Option<Stack> {
        (v.flags & IMG_STACK != 0).then_some(Stack {
            start: v.start,
            end: v.end,
            prot: v.prot,
        })
    }

    /// The range `[from, self.start)` a fault at `addr` grows the stack by, or `None` when
    /// `addr` is not below the stack, lies in the mapping below it (which ends at
    /// `prev_end`, 0 if none), or growing to it breaks the stack limit or, when that mapping
    /// is accessible (any of read, write, execute), the guard gap above it. The caller maps
    /// the range and then calls [`Stack::grown`].
    pub fn growth(&self, addr: u64, prev_end: u64, prev_accessible: bool) -> Option<(u64, u64)> {
        let page = addr & !4095;
        if page >= self.start || self.end.saturating_sub(page) > STACK_LIMIT || page < prev_end {
            return None;
        }
        if prev_accessible && page - prev_end < GUARD_GAP {
            return None;
        }
        Some((page, self.start - page))
    }

    /// Records that the stack now starts at `from`.
    pub fn grown(&mut self, from: u64) {
        self.start = self.start.min(from);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOP: u64 = 0x7ffc_8d60_b000;

    fn stack() -> Stack {
        Stack {
            start: TOP - (132 << 10),
            end: TOP,
            prot: 3,
        }
    }

    #[test]
    fn a_fault_below_grows_the_stack_to_its_page_only() {
        let s = stack();
        let addr = s.start - 3 * 4096 + 17;
        assert_eq!(
            s.growth(addr, 0, true),
            Some((s.start - 3 * 4096, 3 * 4096))
        );
        // Inside or above: nothing to grow.
        assert_eq!(s.growth(s.start, 0, true), None);
        assert_eq!(s.growth(TOP + 4096, 0, true), None);
    }

    #[test]
    fn the_limit_and_the_guard_gap_stop_growth() {
        let s = stack();
        // The deepest page within 8 MiB grows; one page deeper does not.
        assert!(s.growth(TOP - STACK_LIMIT, 0, true).is_some());
        assert_eq!(s.growth(TOP - STACK_LIMIT - 4096, 0, true), None);
        // A mapping ending 256 pages below the new start is far enough; one page closer is
        // not, unless nothing can access it (a PROT_NONE guard keeps no gap).
        let page = s.start - (1 << 20);
        assert!(s.growth(page, page - GUARD_GAP, true).is_some());
        assert_eq!(s.growth(page, page - GUARD_GAP + 4096, true), None);
        assert!(s.growth(page, page - 4096, false).is_some());
        // An address inside the mapping below is that mapping's, not the stack's.
        assert_eq!(s.growth(page, page + 4096, false), None);
    }

    #[test]
    fn growth_only_moves_the_start_down() {
        let mut s = stack();
        let old = s.start;
        s.grown(old - 8192);
        assert_eq!(s.start, old - 8192);
        s.grown(old);
        assert_eq!(s.start, old - 8192);
    }
}
