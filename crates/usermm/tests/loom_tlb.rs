//! Model checking (loom) of the PTE-lock + TLB-shootdown ordering and of the per-CPU batch
//! references.
//!
//! Run with (a separate target directory keeps the `--cfg loom` build from evicting the normal
//! one):
//!
//! ```text
//! CARGO_TARGET_DIR=target/loom RUSTFLAGS="--cfg loom" \
//!     cargo test -p usermm --release --test loom_tlb
//! ```
//!
//! These are small models of the protocols, written with loom's atomics and mutexes (the
//! engine's `Tlb` and memmap use `parking_lot` and std atomics, which loom cannot schedule):
//!
//! 1. **Unmap**: CPU 0 clears a PTE under the page-table lock, shoots down every CPU's TLB
//!    entry for it, then frees the frame (the mmu_gather contract). CPU 1 accesses the page
//!    twice: a TLB hit uses the cached frame; a miss walks the PTE and fills the TLB; then it
//!    writes through the translation. With the shootdown, no write lands on a freed frame;
//!    without it, one can.
//! 2. **Replace (COW)**: CPU 0 replaces a PTE (clear, shoot down, install the copy) and then
//!    signals; an access CPU 1 starts after the signal must use the new frame. This holds when
//!    a walk and its TLB fill are one step with respect to the shootdown (hardware: the flush
//!    IPI is taken between instructions; here: the fill happens under the CPU's TLB lock that
//!    the shootdown also takes, re-checked against the PTE). It does not hold when the walk and
//!    the fill are separate steps, as in the engine's `translate` today (`walk_leaf`, then
//!    `hw_fill`, which fills the TLB with the walked frame even when its compare-and-exchange
//!    finds the entry changed): a walk that read the old PTE can fill the TLB after the
//!    shootdown, and that stale entry outlives the replacement.
//! 3. **Per-CPU batch**: a fault queues a new folio in its CPU's `lru_add` batch, taking a
//!    reference for the batch; another CPU unmaps the folio (drops the mapping's reference) and
//!    may drain the first CPU's batch (`lru_add_drain_all`). The folio is freed exactly once,
//!    and never while a batch still holds it; without the batch's reference it can be freed
//!    while queued, and the drain then touches a freed folio.

#![allow(unexpected_cfgs)]
#![cfg(loom)]

use loom::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering::*};
use loom::sync::{Arc, Mutex};
use loom::thread;

/// How the accessing CPU translates, and whether the unmapping CPU shoots down.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Protocol {
    /// Walk + fill as one step under the CPU's TLB lock (what hardware guarantees), and a
    /// shootdown that takes every CPU's TLB lock.
    Atomic,
    /// The shootdown is skipped (the engine's `test_skip_tlb_flush`).
    NoShootdown,
    /// Walk, then fill in a separate step (the engine's `translate` today).
    SplitWalkAndFill,
}

/// Two frames, one PTE, one CPU-1 TLB entry.
struct Mmu {
    ptl: Mutex<()>,
    /// 0: none; f + 1: maps frame f.
    pte: AtomicU64,
    /// CPU 1's TLB (one entry: the frame, if cached).
    tlb: Mutex<Option<u64>>,
    freed: [AtomicBool; 2],
    data: [AtomicU64; 2],
}

impl Mmu {
    fn new() -> Mmu {
        Mmu {
            ptl: Mutex::new(()),
            pte: AtomicU64::new(1),
            tlb: Mutex::new(None),
            freed: [AtomicBool::new(false), AtomicBool::new(false)],
            data: [AtomicU64::new(0), AtomicU64::new(0)],
        }
    }

    /// CPU 1 translates the page; `None` is a fault on an empty PTE.
    fn translate(&self, p: Protocol) -> Option<u64> {
        match p {
            Protocol::Atomic | Protocol::NoShootdown => {
                let mut t = self.tlb.lock().unwrap();
                if let Some(f) = *t {
                    return Some(f);
                }
                let e = self.pte.load(Acquire);
                let f = e.checked_sub(1)?;
                *t = Some(f);
                Some(f)
            }
            Protocol::SplitWalkAndFill => {
                if let Some(f) = *self.tlb.lock().unwrap() {
                    return Some(f);
                }
                let e = self.pte.load(Acquire); // walk_leaf
                let f = e.checked_sub(1)?;
                *self.tlb.lock().unwrap() = Some(f); // hw_fill
                Some(f)
            }
        }
    }

    /// Shoots CPU 1's entry down (every CPU's, in general).
    fn shootdown(&self, p: Protocol) {
        if p != Protocol::NoShootdown {
            *self.tlb.lock().unwrap() = None;
        }
    }
}

/// CPU 0 unmaps and frees frame 0 while CPU 1 stores to the page twice; each store is one
/// step with its translation (it runs under CPU 1's TLB lock, which the shootdown takes, as a
/// flush IPI waits for the instruction in flight).
fn unmap_then_free(p: Protocol) {
    loom::model(move || {
        let mmu = Arc::new(Mmu::new());
        let m0 = mmu.clone();
        let cpu0 = thread::spawn(move || {
            {
                let _ptl = m0.ptl.lock().unwrap();
                m0.pte.store(0, Release);
            }
            m0.shootdown(p);
            m0.freed[0].store(true, Release);
        });
        for _ in 0..2 {
            let mut t = mmu.tlb.lock().unwrap();
            let f = match *t {
                Some(f) => Some(f),
                None => mmu
                    .pte
                    .load(Acquire)
                    .checked_sub(1)
                    .inspect(|&f| *t = Some(f)),
            };
            if let Some(f) = f {
                assert!(
                    !mmu.freed[f as usize].load(Acquire),
                    "a write went through a stale translation to a freed frame"
                );
                mmu.data[f as usize].store(1, Relaxed);
            }
            drop(t);
        }
        cpu0.join().unwrap();
    });
}

#[test]
fn shootdown_before_free_keeps_every_write_off_freed_frames() {
    unmap_then_free(Protocol::Atomic);
}

#[test]
#[should_panic(expected = "freed frame")]
fn without_the_shootdown_a_write_lands_on_a_freed_frame() {
    unmap_then_free(Protocol::NoShootdown);
}

fn replace_then_signal(p: Protocol) {
    loom::model(move || {
        let mmu = Arc::new(Mmu::new());
        let done = Arc::new(AtomicBool::new(false));
        let (m0, d0) = (mmu.clone(), done.clone());
        let cpu0 = thread::spawn(move || {
            // wp_page_copy: under the PTL, clear, shoot down, install the copy (frame 1).
            let _ptl = m0.ptl.lock().unwrap();
            m0.pte.store(0, Release);
            m0.shootdown(p);
            m0.pte.store(2, Release);
            drop(_ptl);
            d0.store(true, Release);
        });
        // An access racing with the replacement.
        let _ = mmu.translate(p);
        if done.load(Acquire) {
            // An access started after the replacement completed.
            assert_eq!(
                mmu.translate(p),
                Some(1),
                "an access after the replacement used the old frame (stale TLB entry)"
            );
        }
        cpu0.join().unwrap();
    });
}

#[test]
fn walk_and_fill_in_one_step_never_leave_a_stale_entry_after_a_replacement() {
    replace_then_signal(Protocol::Atomic);
}

#[test]
#[should_panic(expected = "stale TLB entry")]
fn a_walk_separate_from_its_fill_can_leave_a_stale_entry_after_a_replacement() {
    replace_then_signal(Protocol::SplitWalkAndFill);
}

/// One folio's refcount and state, and CPU 0's `lru_add` batch.
struct Folio {
    refcount: AtomicI64,
    freed: AtomicBool,
    on_lru: AtomicBool,
    batch: Mutex<Vec<()>>,
}

impl Folio {
    /// `folio_put`: drops `n` references; frees at zero. Freeing twice or freeing a folio
    /// still on the LRU is a bug.
    fn put(&self, n: i64) {
        let left = self.refcount.fetch_sub(n, AcqRel) - n;
        assert!(left >= 0, "refcount underflow");
        if left == 0 {
            assert!(!self.freed.swap(true, AcqRel), "folio freed twice");
        }
    }

    /// Processes a batch taken from a CPU: each entry joins the LRU, then drops the batch's
    /// reference (`folio_batch_move_lru`).
    fn process(&self, taken: Vec<()>, batch_holds_ref: bool) {
        for _ in taken {
            assert!(
                !self.freed.load(Acquire),
                "the drain touched a folio freed while it was queued"
            );
            self.on_lru.store(true, Release);
            if batch_holds_ref {
                self.put(1);
            }
        }
    }
}

fn batch_vs_unmap(batch_holds_ref: bool) {
    loom::model(move || {
        // A new folio: one reference, which the PTE will own.
        let f = Arc::new(Folio {
            refcount: AtomicI64::new(1),
            freed: AtomicBool::new(false),
            on_lru: AtomicBool::new(false),
            batch: Mutex::new(Vec::new()),
        });
        // The PTE, under its lock: whether the folio is mapped.
        let pte = Arc::new(Mutex::new(false));
        // CPU 0: the fault. Under the PTL: `folio_add_lru` (take the batch's reference,
        // queue), install the PTE. Later, its own `lru_add_drain`.
        let (f0, pte0) = (f.clone(), pte.clone());
        let cpu0 = thread::spawn(move || {
            {
                let mut mapped = pte0.lock().unwrap();
                if batch_holds_ref {
                    f0.refcount.fetch_add(1, AcqRel);
                }
                f0.batch.lock().unwrap().push(());
                *mapped = true;
            }
            let taken = std::mem::take(&mut *f0.batch.lock().unwrap());
            f0.process(taken, batch_holds_ref);
        });
        // CPU 1: unmap if it is mapped (zap under the PTL, drop the PTE's reference), then
        // `lru_add_drain_all`, which takes CPU 0's batch.
        let unmap = || {
            let mut mapped = pte.lock().unwrap();
            if std::mem::take(&mut *mapped) {
                f.put(1);
            }
        };
        unmap();
        let taken = std::mem::take(&mut *f.batch.lock().unwrap());
        f.process(taken, batch_holds_ref);
        cpu0.join().unwrap();
        unmap();
        assert!(f.freed.load(Acquire), "the folio must be freed in the end");
        assert_eq!(f.refcount.load(Acquire), 0);
    });
}

#[test]
fn a_queued_folio_is_freed_once_and_only_after_its_batch_drains() {
    batch_vs_unmap(true);
}

#[test]
#[should_panic(expected = "freed while it was queued")]
fn without_the_batch_reference_a_queued_folio_can_be_freed_under_the_drain() {
    batch_vs_unmap(false);
}
