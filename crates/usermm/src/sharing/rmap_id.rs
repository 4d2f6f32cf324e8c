//! Per-MM rmap IDs and the per-folio tracker state they feed.
//!
//! Linux counterpart: none merged. Seed 003 patch 07 (`mm/rmap_id.c`: the IDA of per-MM rmap
//! IDs below 16M, `folio->_rmap_val0..5`, `__folio_add_rmap_id`/`__folio_remove_rmap_id`) and
//! patch 09 (`folio_mapped_shared`), restated from `research/sharing-and-cow.md` §A.2.1–A.2.4.
//! The moment sums of [`super::sq`] live in the same record and are protected by the same
//! seqcount.
//!
//! One folio record ([`FolioWords`]) holds the seqcount word, the folio's total mapcount
//! (the seed's `_total_mapcount`, kept here so it is read under the same seqcount as the
//! values), the moment sums `Σid`, `Σid²`, and up to six rmap values. Every change of the total
//! mapcount applies the same delta, times the acting MM's sub-IDs (or id, id²), to the values
//! inside one write section.

use std::collections::BTreeSet;
use std::sync::Arc;

use parking_lot::Mutex;

use super::seqcount::{SeqCount, Word, WriteSection, WriterMode, WRITERS_MASK};
use super::subid::{Layout, MAX_VALUES, RMAP_ID_MAX};

/// Allocates per-MM rmap IDs in `[1, max]` (`mm_rmap_id` from an IDA), smallest free first.
#[derive(Debug)]
#[allow(dead_code)] // No caller left since the public surface was narrowed (h14).
pub(crate) struct RmapIdAllocator {
    max: u32,
    state: Mutex<IdaState>,
}

#[derive(Debug, Default)]
#[allow(dead_code)] // No caller left since the public surface was narrowed (h14).
struct IdaState {
    /// Next never-used ID.
    next: u32,
    /// Freed IDs below `next`.
    free: BTreeSet<u32>,
    /// Test hook: the ID the next allocation returns if it is free.
    wish: Option<u32>,
}

impl Default for RmapIdAllocator {
    fn default() -> Self {
        RmapIdAllocator::with_max(RMAP_ID_MAX)
    }
}

#[allow(dead_code)] // No caller left since the public surface was narrowed (h14).
impl RmapIdAllocator {
    /// An allocator of IDs `1..=max` (`max` is clamped to [`RMAP_ID_MAX`]).
    pub(crate) fn with_max(max: u32) -> RmapIdAllocator {
        RmapIdAllocator {
            max: max.min(RMAP_ID_MAX),
            state: Mutex::new(IdaState {
                next: 1,
                free: BTreeSet::new(),
                wish: None,
            }),
        }
    }

    /// Allocates an ID, or `None` when all are in use.
    pub(crate) fn alloc_raw(&self) -> Option<u32> {
        let mut s = self.state.lock();
        if let Some(w) = s.wish.take() {
            if s.free.remove(&w) {
                return Some(w);
            }
            if w >= s.next && w <= self.max {
                let old = s.next;
                s.free.extend(old..w);
                s.next = w + 1;
                return Some(w);
            }
        }
        if let Some(id) = s.free.pop_first() {
            return Some(id);
        }
        if s.next > self.max {
            return None;
        }
        s.next += 1;
        Some(s.next - 1)
    }

    /// Frees an ID (`__mmdrop`). Freeing an ID that is not allocated is ignored.
    pub(crate) fn free_raw(&self, id: u32) {
        let mut s = self.state.lock();
        if id == 0 || id >= s.next {
            return;
        }
        if id + 1 == s.next {
            s.next -= 1;
            loop {
                let below = s.next - 1;
                if below == 0 || !s.free.remove(&below) {
                    break;
                }
                s.next = below;
            }
        } else {
            s.free.insert(id);
        }
    }

    /// Test hook: the next allocation returns `id` if it is free (to build the ID patterns
    /// of `subid::find_false_exclusive` with real processes).
    pub(crate) fn reserve_next(&self, id: u32) {
        if (1..=self.max).contains(&id) {
            self.state.lock().wish = Some(id);
        }
    }

    /// Number of IDs in use.
    pub(crate) fn in_use(&self) -> u32 {
        let s = self.state.lock();
        s.next - 1 - s.free.len() as u32
    }

    /// Allocates an ID owned by the returned handle (freed when the handle drops, i.e. when
    /// the MM is dropped).
    pub(crate) fn alloc(self: &Arc<Self>) -> Option<RmapId> {
        Some(RmapId {
            id: self.alloc_raw()?,
            ida: Arc::clone(self),
        })
    }
}

/// An MM's rmap ID; dropping it returns the ID to its allocator.
#[derive(Debug)]
#[allow(dead_code)] // No caller left since the public surface was narrowed (h14).
pub(crate) struct RmapId {
    id: u32,
    ida: Arc<RmapIdAllocator>,
}

#[allow(dead_code)] // No caller left since the public surface was narrowed (h14).
impl RmapId {
    /// The ID.
    #[inline]
    pub(crate) fn get(&self) -> u32 {
        self.id
    }
}

impl Drop for RmapId {
    fn drop(&mut self) {
        self.ida.free_raw(self.id);
    }
}

/// Which state a folio record maintains.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Maintained {
    /// The rmap values with this layout.
    pub(crate) rmap: Option<Layout>,
    /// Whether that layout is the seed's sizing.
    pub(crate) seed_sizing: bool,
    /// The moment sums.
    pub(crate) sq: bool,
}

/// Index of the seqcount word in a record.
pub(crate) const W_SEQ: usize = 0;
/// Index of the total mapcount.
pub(crate) const W_TOTAL: usize = 1;
/// Index of `Σ id`.
pub(crate) const W_S1: usize = 2;
/// Index of `Σ id²`.
pub(crate) const W_S2: usize = 3;
/// Index of the first rmap value.
pub(crate) const W_VALS: usize = 4;
/// Words of a record.
pub(crate) const RECORD_WORDS: usize = W_VALS + MAX_VALUES;

/// One folio's tracker words (a slice of [`RECORD_WORDS`] words).
#[derive(Clone, Copy, Debug)]
pub(crate) struct FolioWords<'a, A: Word> {
    /// The words.
    pub(crate) w: &'a [A],
}

/// A consistent view of a folio record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Snapshot {
    /// Total mapcount.
    pub total: u64,
    /// `Σ id` over all mappings.
    pub s1: u64,
    /// `Σ id²` over all mappings.
    pub(crate) s2: u64,
    /// The rmap values (first `layout.values` valid).
    pub(crate) vals: [u64; MAX_VALUES],
}

impl Snapshot {
    /// The seed's test: not obviously shared (`M ≤ P`) and every value `== M × subid_j(id)`.
    pub(crate) fn rmap_exclusive(&self, l: &Layout, order: u32, id: u32) -> bool {
        let m = self.total;
        if m == 0 || m > 1 << order {
            return false;
        }
        // XOR-and-OR, no early exit, like the seed.
        let mut diff = 0u64;
        for j in 0..l.values {
            diff |= self.vals[j as usize] ^ m.wrapping_mul(l.subid_of(id, j));
        }
        diff == 0
    }
}

impl<'a, A: Word> FolioWords<'a, A> {
    /// The record in `w` (which must hold [`RECORD_WORDS`] words).
    pub(crate) fn new(w: &'a [A]) -> FolioWords<'a, A> {
        FolioWords { w }
    }

    /// The seqcount.
    #[inline]
    pub(crate) fn seq(&self) -> SeqCount<'a, A> {
        SeqCount(&self.w[W_SEQ])
    }

    /// Initialises a fresh folio mapped `nr` times by `id` (`folio_set_large_mapcount`): plain
    /// stores, nobody else can see the folio. Leaves the sequence, clears nothing else.
    pub(crate) fn init(&self, what: Maintained, id: u32, nr: u64) {
        let o = std::sync::atomic::Ordering::Relaxed;
        self.w[W_TOTAL].store(nr, o);
        let (s1, s2) = if what.sq { sq_terms(id, nr) } else { (0, 0) };
        self.w[W_S1].store(s1, o);
        self.w[W_S2].store(s2, o);
        for j in 0..MAX_VALUES {
            let v = match what.rmap {
                Some(l) if (j as u32) < l.values => nr.wrapping_mul(l.subid_of(id, j as u32)),
                _ => 0,
            };
            self.w[W_VALS + j].store(v, o);
        }
        // Publish with a release store of the (writer-free) seqcount word.
        let seq = self.w[W_SEQ].load(o) & !WRITERS_MASK;
        self.w[W_SEQ].store(seq, std::sync::atomic::Ordering::Release);
    }

    /// Adds `delta` mappings (negative: removes) by `id` under the seqcount. Returns the
    /// number of atomic RMW operations performed.
    pub(crate) fn apply(&self, what: Maintained, mode: WriterMode, id: u32, delta: i64) -> u32 {
        let ws = self.seq().write_begin(mode);
        let atomics = 2 + self.apply_in(&ws, what, id, delta);
        drop(ws);
        atomics
    }

    /// The counter updates of [`FolioWords::apply`] inside a write section the caller holds.
    pub(crate) fn apply_in(
        &self,
        ws: &WriteSection<'_, A>,
        what: Maintained,
        id: u32,
        delta: i64,
    ) -> u32 {
        let d = delta as u64;
        let mut atomics = ws.add(&self.w[W_TOTAL], d);
        if let Some(l) = what.rmap {
            for j in 0..l.values {
                atomics += ws.add(
                    &self.w[W_VALS + j as usize],
                    d.wrapping_mul(l.subid_of(id, j)),
                );
            }
        }
        if what.sq {
            let id = u64::from(id);
            atomics += ws.add(&self.w[W_S1], d.wrapping_mul(id));
            atomics += ws.add(&self.w[W_S2], d.wrapping_mul(id.wrapping_mul(id)));
        }
        atomics
    }

    fn read_words(&self, what: Maintained) -> Snapshot {
        let o = std::sync::atomic::Ordering::Relaxed;
        let mut s = Snapshot {
            total: self.w[W_TOTAL].load(o),
            ..Snapshot::default()
        };
        if what.sq {
            s.s1 = self.w[W_S1].load(o);
            s.s2 = self.w[W_S2].load(o);
        }
        if let Some(l) = what.rmap {
            for j in 0..l.values as usize {
                s.vals[j] = self.w[W_VALS + j].load(o);
            }
        }
        s
    }

    /// A consistent snapshot (`read_begin` … `read_retry` loop). Gives up after `max_tries`
    /// retries and returns `None` ("say shared": the seed's documented escape hatch).
    pub(crate) fn snapshot(&self, what: Maintained, max_tries: u32) -> Option<Snapshot> {
        let seq = self.seq();
        for _ in 0..max_tries.max(1) {
            let start = seq.read_begin();
            let s = self.read_words(what);
            if !seq.read_retry(start) {
                return Some(s);
            }
        }
        None
    }

    /// One attempt without waiting (the COW path): `None` if a writer is inside or the word
    /// changed; otherwise the snapshot and `check(snapshot)` evaluated inside the window.
    pub(crate) fn try_snapshot_with<R>(
        &self,
        what: Maintained,
        check: impl FnOnce(&Snapshot) -> R,
    ) -> Option<(Snapshot, R)> {
        let seq = self.seq();
        let start = seq.raw_read();
        if start & WRITERS_MASK != 0 {
            return None;
        }
        let s = self.read_words(what);
        let r = check(&s);
        if seq.read_retry(start) {
            return None;
        }
        Some((s, r))
    }
}

/// `(nr·id, nr·id²)` wrapping.
#[inline]
pub(crate) fn sq_terms(id: u32, nr: u64) -> (u64, u64) {
    let id = u64::from(id);
    (nr.wrapping_mul(id), nr.wrapping_mul(id.wrapping_mul(id)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ida_reuses_smallest_free() {
        let a = Arc::new(RmapIdAllocator::with_max(3));
        let i1 = a.alloc();
        let i2 = a.alloc();
        let i3 = a.alloc();
        assert_eq!(i1.as_ref().map(RmapId::get), Some(1));
        assert_eq!(i3.as_ref().map(RmapId::get), Some(3));
        assert!(a.alloc().is_none());
        assert_eq!(a.in_use(), 3);
        drop(i2);
        assert_eq!(a.in_use(), 2);
        assert_eq!(a.alloc_raw(), Some(2));
        drop(i3);
        a.free_raw(2);
        drop(i1);
        assert_eq!(a.in_use(), 0);
        assert_eq!(a.alloc_raw(), Some(1));
        let b = RmapIdAllocator::with_max(100);
        b.reserve_next(50);
        assert_eq!(b.alloc_raw(), Some(50));
        assert_eq!(b.alloc_raw(), Some(1));
        assert_eq!(b.in_use(), 2);
        b.reserve_next(1);
        assert_eq!(b.alloc_raw(), Some(2));
    }
}
