//! The atomic seqcount: concurrent writers that only add, readers that retry.
//!
//! Linux counterpart: none merged. Seed 003's `include/linux/atomic_seqcount.h` (patch 06 "new
//! (raw) seqcount variant to support concurrent writers", patch 16 "support a single exclusive
//! writer in the absence of other writers", patch 18 "use atomic add-return instead of atomic
//! cmpxchg on 64bit"), restated from `research/sharing-and-cow.md` §A.2.5.
//!
//! One 64-bit word: bits 0–15 count the shared writers inside, bits 16–31 the would-be
//! exclusive writers, bits 32–63 are the sequence. A writer enters by adding its writer unit and
//! leaves by adding `SEQUENCE_STEP − unit`; a reader waits for "no writers", reads, and retries
//! if the word changed. Shared writers never wait for each other, only for one exclusive
//! writer. The exclusive writer (the word showed no writer when it entered) updates the
//! protected counters with a plain load and store instead of an atomic add.
//!
//! Memory ordering (the seed relies on full barriers; these are the C11 equivalents the model
//! checker verifies, see `tests/loom_seqcount.rs`): entering is an acquire RMW followed by a
//! release fence (so a reader that sees any counter store also sees the writer bits in its
//! retry read); leaving is a release RMW; readers load the word with acquire, the counters
//! relaxed, and fence with acquire before the retry read.
//!
//! The code is generic over [`Word`] so the same functions run on `std` atomics in the engine
//! and on loom's atomics under the model checker. User space cannot disable preemption, so
//! spinning writers and readers spin briefly and then yield.

use std::sync::atomic::{AtomicU64, Ordering};

/// One shared writer.
pub(crate) const SHARED_WRITER: u64 = 1;
/// One would-be exclusive writer.
pub(crate) const EXCLUSIVE_WRITER: u64 = 1 << 16;
/// One completed write section.
pub(crate) const SEQUENCE_STEP: u64 = 1 << 32;
/// Shared-writer count bits.
pub(crate) const SHARED_MASK: u64 = 0xffff;
/// Exclusive-writer count bits.
pub(crate) const EXCLUSIVE_MASK: u64 = 0xffff << 16;
/// All writer bits.
pub(crate) const WRITERS_MASK: u64 = SHARED_MASK | EXCLUSIVE_MASK;

/// What a seqcount step did (for instrumentation and the model checker's coverage checks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SeqEvent {
    /// A writer entered as the exclusive writer.
    Exclusive,
    /// A would-be exclusive writer raced and became a shared writer.
    Converted,
    /// A shared writer entered.
    Shared,
    /// A writer had to wait for an exclusive writer.
    WaitedForExclusive,
    /// A reader retried.
    ReaderRetry,
}

/// A 64-bit atomic word: `std`'s in the engine, loom's under the model checker.
pub(crate) trait Word: Send + Sync {
    /// Atomic load.
    fn load(&self, o: Ordering) -> u64;
    /// Atomic store.
    fn store(&self, v: u64, o: Ordering);
    /// Wrapping atomic add returning the previous value.
    fn fetch_add(&self, v: u64, o: Ordering) -> u64;
    /// Compare-and-exchange.
    fn compare_exchange(
        &self,
        cur: u64,
        new: u64,
        ok: Ordering,
        fail: Ordering,
    ) -> Result<u64, u64>;
    /// A memory fence of this atomics implementation.
    fn fence(o: Ordering);
    /// One step of a spin-wait (`spins` counts the steps so far).
    fn relax(spins: &mut u32);
    /// Instrumentation hook (no-op in the engine).
    #[inline]
    fn note(_e: SeqEvent) {}
}

impl Word for AtomicU64 {
    #[inline]
    fn load(&self, o: Ordering) -> u64 {
        AtomicU64::load(self, o)
    }
    #[inline]
    fn store(&self, v: u64, o: Ordering) {
        AtomicU64::store(self, v, o)
    }
    #[inline]
    fn fetch_add(&self, v: u64, o: Ordering) -> u64 {
        AtomicU64::fetch_add(self, v, o)
    }
    #[inline]
    fn compare_exchange(
        &self,
        cur: u64,
        new: u64,
        ok: Ordering,
        fail: Ordering,
    ) -> Result<u64, u64> {
        AtomicU64::compare_exchange(self, cur, new, ok, fail)
    }
    #[inline]
    fn fence(o: Ordering) {
        std::sync::atomic::fence(o)
    }
    #[inline]
    fn relax(spins: &mut u32) {
        *spins += 1;
        if *spins < 64 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

/// How writers enter (the seed's stages).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WriterMode {
    /// Patch 06: every writer is a shared writer and updates counters with atomic adds.
    Shared,
    /// Patches 16–17: a writer that finds no other writer becomes exclusive with a cmpxchg and
    /// updates counters with plain load+store.
    ExclusiveCmpxchg,
    /// Patch 18: as `ExclusiveCmpxchg` but the exclusive attempt is an add-return; a writer that
    /// raced converts itself into a shared writer.
    ExclusiveAddReturn,
}

impl WriterMode {
    /// `shared`, `cmpxchg` or `add-return`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            WriterMode::Shared => "shared",
            WriterMode::ExclusiveCmpxchg => "cmpxchg",
            WriterMode::ExclusiveAddReturn => "add-return",
        }
    }
}

/// A seqcount word.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SeqCount<'a, A: Word>(pub(crate) &'a A);

/// An open write section; leaving it (drop) bumps the sequence.
#[derive(Debug)]
pub(crate) struct WriteSection<'a, A: Word> {
    word: &'a A,
    exclusive: bool,
}

impl<'a, A: Word> SeqCount<'a, A> {
    /// Enters a write section (`write_begin`).
    pub(crate) fn write_begin(&self, mode: WriterMode) -> WriteSection<'a, A> {
        let w = self.0;
        match mode {
            WriterMode::Shared => {}
            WriterMode::ExclusiveCmpxchg => {
                let seen = w.load(Ordering::Relaxed);
                if seen & WRITERS_MASK == 0
                    && w.compare_exchange(
                        seen,
                        seen.wrapping_add(EXCLUSIVE_WRITER),
                        Ordering::Acquire,
                        Ordering::Relaxed,
                    )
                    .is_ok()
                {
                    return self.entered(true);
                }
            }
            WriterMode::ExclusiveAddReturn => {
                if w.load(Ordering::Relaxed) & WRITERS_MASK == 0 {
                    let old = w.fetch_add(EXCLUSIVE_WRITER, Ordering::Acquire);
                    if old & WRITERS_MASK == 0 {
                        return self.entered(true);
                    }
                    // Raced with another writer: become a shared writer, then wait until no
                    // exclusive writer (the winner, or others still converting) remains.
                    A::note(SeqEvent::Converted);
                    let old = w.fetch_add(
                        SHARED_WRITER.wrapping_sub(EXCLUSIVE_WRITER),
                        Ordering::Acquire,
                    );
                    if old.wrapping_sub(EXCLUSIVE_WRITER) & EXCLUSIVE_MASK != 0 {
                        self.wait_no_exclusive();
                    }
                    return self.entered(false);
                }
            }
        }
        let old = w.fetch_add(SHARED_WRITER, Ordering::Acquire);
        if old & EXCLUSIVE_MASK != 0 {
            self.wait_no_exclusive();
        }
        self.entered(false)
    }

    fn wait_no_exclusive(&self) {
        A::note(SeqEvent::WaitedForExclusive);
        let mut spins = 0;
        while self.0.load(Ordering::Acquire) & EXCLUSIVE_MASK != 0 {
            A::relax(&mut spins);
        }
    }

    fn entered(&self, exclusive: bool) -> WriteSection<'a, A> {
        A::note(if exclusive {
            SeqEvent::Exclusive
        } else {
            SeqEvent::Shared
        });
        // Counter stores after this fence are seen by a reader only together with our entry.
        A::fence(Ordering::Release);
        WriteSection {
            word: self.0,
            exclusive,
        }
    }

    /// Waits until no writer is inside and returns the word (`read_begin`).
    pub(crate) fn read_begin(&self) -> u64 {
        let mut spins = 0;
        loop {
            let v = self.0.load(Ordering::Acquire);
            if v & WRITERS_MASK == 0 {
                return v;
            }
            A::relax(&mut spins);
        }
    }

    /// Whether the section read since `start` must be retried (`read_retry`).
    pub(crate) fn read_retry(&self, start: u64) -> bool {
        A::fence(Ordering::Acquire);
        let retry = self.0.load(Ordering::Relaxed) != start;
        if retry {
            A::note(SeqEvent::ReaderRetry);
        }
        retry
    }

    /// The word without waiting (`raw_read`); the caller decides what writer bits mean.
    pub(crate) fn raw_read(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }
}

impl<A: Word> WriteSection<'_, A> {
    /// Whether this is the exclusive writer.
    pub(crate) fn exclusive(&self) -> bool {
        self.exclusive
    }

    /// Adds `delta` (wrapping) to a protected counter: a plain load+store for the exclusive
    /// writer, an atomic add otherwise. Returns the number of atomic RMW operations (0 or 1).
    #[inline]
    pub(crate) fn add(&self, counter: &A, delta: u64) -> u32 {
        if self.exclusive {
            let v = counter.load(Ordering::Relaxed);
            counter.store(v.wrapping_add(delta), Ordering::Relaxed);
            0
        } else {
            counter.fetch_add(delta, Ordering::Relaxed);
            1
        }
    }
}

impl<A: Word> Drop for WriteSection<'_, A> {
    fn drop(&mut self) {
        let unit = if self.exclusive {
            EXCLUSIVE_WRITER
        } else {
            SHARED_WRITER
        };
        self.word
            .fetch_add(SEQUENCE_STEP.wrapping_sub(unit), Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_bump_the_sequence_and_clear_writer_bits() {
        for mode in [
            WriterMode::Shared,
            WriterMode::ExclusiveCmpxchg,
            WriterMode::ExclusiveAddReturn,
        ] {
            let w = AtomicU64::new(0);
            let c = AtomicU64::new(0);
            let s = SeqCount(&w);
            let start = s.read_begin();
            {
                let ws = s.write_begin(mode);
                assert_eq!(ws.exclusive(), mode != WriterMode::Shared);
                assert_ne!(s.raw_read() & WRITERS_MASK, 0);
                ws.add(&c, 5);
            }
            assert!(s.read_retry(start));
            assert_eq!(w.load(Ordering::Relaxed), SEQUENCE_STEP);
            assert_eq!(c.load(Ordering::Relaxed), 5);
        }
    }

    #[test]
    fn a_second_writer_is_shared_while_one_is_exclusive() {
        let w = AtomicU64::new(0);
        let s = SeqCount(&w);
        let a = s.write_begin(WriterMode::ExclusiveAddReturn);
        assert!(a.exclusive());
        // A concurrent would-be exclusive writer converts: it would wait for `a`, so only check
        // the word arithmetic of the conversion here.
        let old = w.fetch_add(EXCLUSIVE_WRITER, Ordering::Acquire);
        assert_ne!(old & WRITERS_MASK, 0);
        w.fetch_add(
            SHARED_WRITER.wrapping_sub(EXCLUSIVE_WRITER),
            Ordering::Acquire,
        );
        assert_eq!(
            w.load(Ordering::Relaxed) & WRITERS_MASK,
            EXCLUSIVE_WRITER | SHARED_WRITER
        );
        drop(a);
        w.fetch_add(SEQUENCE_STEP - SHARED_WRITER, Ordering::Release);
        assert_eq!(w.load(Ordering::Relaxed), 2 * SEQUENCE_STEP);
    }
}
