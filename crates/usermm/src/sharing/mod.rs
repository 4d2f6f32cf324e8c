//! "Mapped shared" vs. "mapped exclusively" for large anon folios: four trackers.
//!
//! Linux counterparts: `folio_likely_mapped_shared()` (the first-page estimate, ≤ v6.14),
//! `folio_maybe_mapped_shared()` with MM owner tracking (`CONFIG_MM_ID`, v6.15; implemented in
//! [`crate::rmap::owner`]), and seed 003 — D. Hildenbrand's Nov-2023 WIP series "mm: precise
//! 'mapped shared' vs. 'mapped exclusively' detection for PTE-mapped THP / partially-mappable
//! folios" (per-MM rmap IDs, sub-IDs, per-folio rmap values, the atomic seqcount) — plus the
//! exact two-counter alternative derived in `research/sharing-and-cow.md` §A.2.2.
//!
//! The tunable `sharing` picks the tracker COW reuse consults ([`SharingTracker`]):
//!
//! | name | state | exclusive wrongly? | shared wrongly? |
//! |---|---|---|---|
//! | `estimate` | none (first page's mapcount; v6.7, no folio-wide mapcount) | yes (partial maps) | no |
//! | `mapcount` | folio-wide total mapcount (seed patches 1-3) | yes (partial maps) | no |
//! | `rmap-id` | seqcount, total, 1–6 values | never (safe sizing) / orders 7–9 (seed sizing) | never |
//! | `rmap-id-sq` | seqcount, total, Σid, Σid² | never | never |
//! | `owner` | two slots + bit (memmap) | never | after a 3rd MM |
//!
//! The memmap has no room left, so the rmap-ID and moment-sum state lives in a side table
//! ([`Sharing`]): one 16-word entry per 4 frames (tracked folios have order ≥ 2), indexed by
//! `head >> 2`, zero-allocated and lazily backed by the host. Each entry holds a tag (which
//! state this folio maintains, and the configuration epoch it was created in), a spare word,
//! and the `rmap_id::FolioWords` record. Only folios whose head carries
//! `PageFlag::SharingRecord` (a record was made when they were first mapped) look at the table;
//! the owner tracker lives in the memmap, as Linux's does. Changing the tracker starts a new
//! epoch: folios created before keep answering "shared" for the new tracker (never wrong),
//! folios created after are tracked. With `shadow` on, every side-table tracker is maintained
//! for every folio, so views and validation can compare all of them against the truth.
//!
//! Which memmap counts a large folio keeps is likewise fixed when it is allocated
//! (`FolioCounts`): the total mapcount only for `mapcount` and `owner` (the rmap-ID trackers
//! keep theirs in the record, v6.7 kept none and scanned), the owner slots only for `owner`.
//! The seed's stages map onto switches: `rmap-id+shared|+cmpxchg|+add-return` (patches
//! 10/17/18), `+atomic-pages` vs `+all` (patches 19-20: per-page mapcounts inside the
//! seqcount, plain stores for the exclusive writer), and the separate tunable
//! `remap_rmap_batch` (patches 12-14).

pub mod estimate;
pub(crate) mod rmap_id;
pub(crate) mod seqcount;
pub(crate) mod sq;
pub mod subid;
pub(crate) mod tracker;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::phys::{Folio, Pfn};
pub(crate) use rmap_id::{FolioWords, Maintained, RmapIdAllocator, Snapshot};
pub use seqcount::WriterMode;
pub(crate) use subid::Sizing;
pub use tracker::{PageMapcounts, RmapIdOptions, SharingTracker};

/// Every tracker's answer for one folio and one MM (the `usermm` view).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SharingAnswers {
    /// The selected tracker.
    pub(crate) selected: String,
    /// Folio order.
    pub(crate) order: u32,
    /// `folio_mapcount()`: the memmap's folio-wide mapcount, or the per-page scan for a folio
    /// that keeps none.
    pub(crate) large_mapcount: i32,
    /// The side table's total mapcount (if tracked).
    pub(crate) tracked_total: Option<u64>,
    /// `estimate` (v6.7 first page): exclusive?
    pub(crate) estimate: bool,
    /// `mapcount` (total mapcount + first page): exclusive?
    pub(crate) mapcount: bool,
    /// `owner`: exclusive to this MM?
    pub owner: bool,
    /// `rmap-id` (with the sizing this folio was created with): exclusive? `None` if untracked.
    pub rmap_id: Option<bool>,
    /// The sizing behind `rmap_id`.
    pub(crate) rmap_id_sizing: Option<&'static str>,
    /// `rmap-id-sq`: exclusive? `None` if untracked.
    pub rmap_id_sq: Option<bool>,
}

const STRIDE: usize = 16;
const E_TAG: usize = 0;
const E_REC: usize = 2;

const F_RMAP: u64 = 1;
const F_SEED: u64 = 2;
const F_SQ: u64 = 4;
/// The folio's per-page mapcounts are updated under its seqcount (stage "all"). Unlike the
/// other flags this one binds for the folio's lifetime, whatever the epoch.
const F_PAGES: u64 = 8;
const FLAGS: u64 = 0xff;
const SHADOW: u64 = 1 << 16;
const EPOCH_SHIFT: u32 = 32;

/// Retries a reader makes before it says "shared".
const READ_TRIES: u32 = 1 << 16;

/// The sharing trackers' side table and configuration, one per machine.
pub struct Sharing {
    words: Box<[AtomicU64]>,
    config: AtomicU64,
    /// Per-MM rmap IDs (`mm_rmap_id`).
    #[allow(dead_code)] // No caller left since the public surface was narrowed (h14).
    pub(crate) ids: Arc<RmapIdAllocator>,
}

impl std::fmt::Debug for Sharing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sharing")
            .field("entries", &(self.words.len() / STRIDE))
            .field("tracker", &self.tracker())
            .field("shadow", &self.shadow())
            .finish()
    }
}

fn maintain_flags(t: SharingTracker, shadow: bool) -> u64 {
    let every = if shadow { F_RMAP | F_SQ } else { 0 };
    match t {
        SharingTracker::RmapId(o) => {
            every
                | F_RMAP
                | if o.sizing == Sizing::Seed { F_SEED } else { 0 }
                | if o.pages == PageMapcounts::UnderSeqcount {
                    F_PAGES
                } else {
                    0
                }
        }
        SharingTracker::RmapIdSq => every | F_SQ,
        SharingTracker::Estimate | SharingTracker::Mapcount | SharingTracker::Owner => every,
    }
}

/// Which folio-wide counts in the memmap a large folio keeps for its lifetime (decided when
/// it is allocated, so that switching trackers never leaves a count half-maintained).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FolioCounts {
    /// None: `folio_mapcount()` scans the per-page mapcounts (v6.7; and the rmap-ID trackers,
    /// whose total mapcount lives in their record under the seqcount).
    Scanned,
    /// The total mapcount (seed 003 patches 1-3).
    Total,
    /// The total mapcount and MM owner tracking under the folio's bit lock (upstream 6.15).
    TotalAndOwner,
}

fn maintained(flags: u64, order: u32) -> Maintained {
    let sizing = if flags & F_SEED != 0 {
        Sizing::Seed
    } else {
        Sizing::Safe
    };
    Maintained {
        rmap: (flags & F_RMAP != 0).then(|| sizing.layout(order)),
        seed_sizing: sizing == Sizing::Seed,
        sq: flags & F_SQ != 0,
    }
}

/// Whether per-page mapcounts may be updated by plain load+store (inside an exclusively held
/// seqcount) or need atomic adds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plain {
    /// Plain stores: this writer holds the folio's seqcount exclusively.
    Yes,
    /// Atomic adds.
    No,
}

impl Sharing {
    /// A side table for `nr_frames` frames with `tracker` selected.
    pub fn new(nr_frames: u64, tracker: SharingTracker, shadow: bool) -> Sharing {
        let len = (nr_frames as usize / 4 + 1) * STRIDE;
        let words: Box<[AtomicU64]> = match bytemuck::allocation::zeroed_slice_box::<AtomicU64>(len)
        {
            b if b.len() == len => b,
            _ => Vec::new().into_boxed_slice(),
        };
        let s = Sharing {
            words,
            config: AtomicU64::new(0),
            ids: Arc::new(RmapIdAllocator::default()),
        };
        s.select(tracker, shadow);
        s
    }

    /// Selects the tracker (call whenever the `sharing` tunable may have changed). Starts a
    /// new epoch only if the maintained state changes.
    pub fn select(&self, tracker: SharingTracker, shadow: bool) {
        let flags = maintain_flags(tracker, shadow);
        let _ = self
            .config
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |old| {
                let mut epoch = old >> EPOCH_SHIFT;
                if epoch == 0 || old & FLAGS != flags {
                    epoch += 1;
                }
                Some(
                    epoch << EPOCH_SHIFT
                        | tracker.code() << 8
                        | if shadow { SHADOW } else { 0 }
                        | flags,
                )
            });
    }

    /// The selected tracker.
    pub(crate) fn tracker(&self) -> SharingTracker {
        SharingTracker::from_code(self.config.load(Ordering::Relaxed) >> 8 & 0xff)
    }

    /// Whether every side-table tracker is maintained.
    pub(crate) fn shadow(&self) -> bool {
        self.config.load(Ordering::Relaxed) & SHADOW != 0
    }

    /// The memmap counts a large folio allocated now maintains (shadow mode keeps them all).
    pub(crate) fn folio_counts(&self) -> FolioCounts {
        if self.shadow() {
            return FolioCounts::TotalAndOwner;
        }
        match self.tracker() {
            SharingTracker::Owner => FolioCounts::TotalAndOwner,
            SharingTracker::Mapcount => FolioCounts::Total,
            SharingTracker::Estimate | SharingTracker::RmapId(_) | SharingTracker::RmapIdSq => {
                FolioCounts::Scanned
            }
        }
    }

    fn writer(cfg: u64) -> WriterMode {
        match SharingTracker::from_code(cfg >> 8 & 0xff) {
            SharingTracker::RmapId(o) => o.writer,
            _ => WriterMode::ExclusiveAddReturn,
        }
    }

    // The side-table methods below stay keyed by the head frame number, not by a
    // `Folio`: like the memmap's accessors they are the table itself, indexed by frame
    // number, and their unit and property tests drive them with no memmap at all. What
    // reads folio state (`answers`, the `estimate` guesses) takes a `Folio`.
    #[inline]
    fn entry(&self, head: Pfn) -> Option<&[AtomicU64]> {
        let i = (head.val() >> 2) as usize * STRIDE;
        self.words.get(i..i + STRIDE)
    }

    /// The entry and maintained state of a tracked folio of the current epoch.
    #[inline]
    fn tracked(
        &self,
        head: Pfn,
        order: u32,
    ) -> Option<(u64, Maintained, FolioWords<'_, AtomicU64>)> {
        let cfg = self.config.load(Ordering::Acquire);
        if cfg & FLAGS == 0 {
            return None;
        }
        let e = self.entry(head)?;
        let tag = e[E_TAG].load(Ordering::Relaxed);
        if tag >> EPOCH_SHIFT != cfg >> EPOCH_SHIFT || tag & FLAGS == 0 {
            return None;
        }
        Some((
            cfg,
            maintained(tag & FLAGS, order),
            FolioWords::new(&e[E_REC..E_REC + rmap_id::RECORD_WORDS]),
        ))
    }

    /// A fresh large anon folio is mapped `nr` times by the MM with `rmap_id`
    /// (`folio_add_new_anon_rmap`): records which state it maintains and initialises it.
    /// Returns whether the folio has a record (the caller marks its head
    /// `PageFlag::SharingRecord`).
    pub fn on_new(&self, head: Pfn, order: u32, rmap_id: u32, nr: u64) -> bool {
        let cfg = self.config.load(Ordering::Acquire);
        let mut flags = cfg & FLAGS;
        let Some(e) = self.entry(head) else {
            return false;
        };
        if !(subid::MIN_ORDER..=subid::MAX_ORDER).contains(&order) {
            flags = 0;
        }
        e[E_TAG].store(cfg >> EPOCH_SHIFT << EPOCH_SHIFT | flags, Ordering::Relaxed);
        if flags != 0 {
            FolioWords::new(&e[E_REC..E_REC + rmap_id::RECORD_WORDS]).init(
                maintained(flags, order),
                rmap_id,
                nr,
            );
        }
        flags != 0
    }

    /// `delta` mappings (negative: removed) of an anon folio by `rmap_id` (PTE batch, PMD = 1,
    /// fork dup: the child's ID), with `pages` — the operation's per-page mapcount updates,
    /// told whether plain stores suffice — run inside the folio's seqcount write section when
    /// the folio was created in stage "all", before the tracker update otherwise. Returns the
    /// tracker's atomic RMW operations (`pages` counts its own).
    pub fn update(
        &self,
        head: Pfn,
        order: u32,
        rmap_id: u32,
        delta: i64,
        pages: impl FnOnce(Plain),
    ) -> u32 {
        let Some(e) = self.entry(head) else {
            pages(Plain::No);
            return 0;
        };
        let under_seq = e[E_TAG].load(Ordering::Relaxed) & F_PAGES != 0;
        let tracked = self.tracked(head, order);
        if !under_seq {
            pages(Plain::No);
            return tracked.map_or(0, |(cfg, what, f)| {
                f.apply(what, Self::writer(cfg), rmap_id, delta)
            });
        }
        // Stage "all": the per-page counts bind to the seqcount for the folio's lifetime, so
        // every writer of this folio enters it, tracked in this epoch or not.
        let cfg = tracked
            .as_ref()
            .map_or_else(|| self.config.load(Ordering::Acquire), |t| t.0);
        let f = FolioWords::new(&e[E_REC..E_REC + rmap_id::RECORD_WORDS]);
        let ws = f.seq().write_begin(Self::writer(cfg));
        pages(if ws.exclusive() {
            Plain::Yes
        } else {
            Plain::No
        });
        let mut n = 2;
        if let Some((_, what, _)) = tracked {
            n += f.apply_in(&ws, what, rmap_id, delta);
        }
        drop(ws);
        n
    }

    /// `nr` more mappings by `rmap_id`, no per-page counts involved. Returns the atomics.
    pub fn on_map(&self, head: Pfn, order: u32, rmap_id: u32, nr: u64) -> u32 {
        self.update(head, order, rmap_id, nr as i64, |_| {})
    }

    /// `nr` fewer mappings by `rmap_id` (the counterpart of [`Sharing::on_map`]).
    pub fn on_unmap(&self, head: Pfn, order: u32, rmap_id: u32, nr: u64) -> u32 {
        self.update(head, order, rmap_id, -(nr as i64), |_| {})
    }

    /// A consistent snapshot of a tracked folio.
    pub fn snapshot(&self, head: Pfn, order: u32) -> Option<(Maintained, Snapshot)> {
        let (_, what, f) = self.tracked(head, order)?;
        Some((what, f.snapshot(what, READ_TRIES)?))
    }

    /// The selected side-table tracker's answer: is the folio mapped only by `rmap_id`?
    /// `None` when the selected tracker keeps no side state or the folio is not tracked.
    pub fn exclusive(&self, head: Pfn, order: u32, rmap_id: u32) -> Option<bool> {
        let t = self.tracker();
        let (what, s) = self.snapshot(head, order)?;
        match t {
            SharingTracker::RmapId(_) => Some(s.rmap_exclusive(&what.rmap?, order, rmap_id)),
            SharingTracker::RmapIdSq => what.sq.then(|| sq::exclusive(&s, order, rmap_id)),
            _ => None,
        }
    }

    /// COW reuse with the selected side-table tracker (seed patch 10's
    /// `wp_can_reuse_anon_folio` for large folios): one look without waiting; no if a writer
    /// is inside, if `M ≤ 1` or `M > P`, if `check(M)` fails (the caller compares the refcount
    /// with `M` and rejects PMD mappings), if the values do not say "only `rmap_id`", or if the
    /// seqcount moved meanwhile. `false` for untracked folios and other trackers.
    pub fn cow_reusable(
        &self,
        head: Pfn,
        order: u32,
        rmap_id: u32,
        check: impl FnOnce(u64) -> bool,
    ) -> bool {
        let t = self.tracker();
        let Some((_, what, f)) = self.tracked(head, order) else {
            return false;
        };
        let r = f.try_snapshot_with(what, |s| {
            let m = s.total;
            if m <= 1 || m > 1 << order {
                return false;
            }
            let mine = match t {
                SharingTracker::RmapId(_) => what
                    .rmap
                    .is_some_and(|l| s.rmap_exclusive(&l, order, rmap_id)),
                SharingTracker::RmapIdSq => what.sq && sq::exclusive(s, order, rmap_id),
                _ => false,
            };
            mine && check(m)
        });
        matches!(r, Some((_, true)))
    }

    /// Every tracker's answer for `folio` and the MM (`mm_id` for the owner tracker,
    /// `rmap_id` for the others).
    pub fn answers(&self, folio: Folio<'_>, mm_id: u32, rmap_id: u32) -> SharingAnswers {
        let (mem, head) = (folio.memmap(), folio.pfn());
        let order = mem.order(head);
        let snap = self.snapshot(head, order);
        let owner = mem.test(head, crate::phys::PageFlag::OwnerTracked)
            && !crate::rmap::owner::maybe_mapped_shared(folio)
            && crate::rmap::owner::slots(folio)
                .iter()
                .any(|&(id, cnt)| id == mm_id && cnt > 0);
        SharingAnswers {
            selected: self.tracker().name(),
            order,
            large_mapcount: mem.folio_mapcount(head),
            tracked_total: snap.map(|s| s.1.total),
            estimate: !estimate::estimated_shared(folio),
            mapcount: !estimate::likely_mapped_shared(folio),
            owner,
            rmap_id: snap.and_then(|(w, s)| w.rmap.map(|l| s.rmap_exclusive(&l, order, rmap_id))),
            rmap_id_sizing: snap
                .and_then(|(w, _)| w.rmap.map(|_| if w.seed_sizing { "seed" } else { "safe" })),
            rmap_id_sq: snap.and_then(|(w, s)| w.sq.then(|| sq::exclusive(&s, order, rmap_id))),
        }
    }

    /// Validation: the tracked state of a folio against the truth, `(rmap_id, mappings)` of
    /// every MM mapping it. Returns one message per disagreement (empty if untracked).
    pub fn verify(&self, head: Pfn, order: u32, truth: &[(u32, u64)]) -> Vec<String> {
        let mut errs = Vec::new();
        let Some((what, s)) = self.snapshot(head, order) else {
            return errs;
        };
        let total: u64 = truth.iter().map(|t| t.1).sum();
        if s.total != total {
            errs.push(format!(
                "folio {head:#x}: tracked total mapcount {} but {total} mappings",
                s.total
            ));
        }
        let mappers = truth.iter().filter(|t| t.1 > 0).count();
        for &(id, n) in truth {
            let want = n > 0 && mappers == 1;
            if let Some(l) = what.rmap {
                if l.overflow_free() && s.rmap_exclusive(&l, order, id) != want {
                    errs.push(format!(
                        "folio {head:#x}: rmap-id says exclusive={} for rmap id {id}, truth {want}",
                        !want
                    ));
                }
            }
            if what.sq && sq::exclusive(&s, order, id) != want {
                errs.push(format!(
                    "folio {head:#x}: rmap-id-sq says exclusive={} for rmap id {id}, truth {want}",
                    !want
                ));
            }
        }
        errs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for t in SharingTracker::all() {
            assert_eq!(SharingTracker::parse(&t.name()), Some(t), "{}", t.name());
            assert_eq!(SharingTracker::from_code(t.code()), t);
        }
        for w in [
            WriterMode::Shared,
            WriterMode::ExclusiveCmpxchg,
            WriterMode::ExclusiveAddReturn,
        ] {
            for sizing in [Sizing::Seed, Sizing::Safe] {
                for pages in [PageMapcounts::Atomic, PageMapcounts::UnderSeqcount] {
                    let t = SharingTracker::RmapId(RmapIdOptions {
                        writer: w,
                        sizing,
                        pages,
                    });
                    assert_eq!(SharingTracker::parse(&t.name()), Some(t));
                    assert_eq!(SharingTracker::from_code(t.code()), t);
                }
            }
        }
        assert_eq!(
            SharingTracker::parse("rmap-id+shared+seed-sizing+atomic-pages").map(|t| t.code()),
            Some(10)
        );
        assert_eq!(SharingTracker::from_code(15), SharingTracker::Mapcount);
        assert_eq!(SharingTracker::parse("rmap-id+bogus"), None);
        assert_eq!(SharingTracker::parse("rmap"), None);
    }

    #[test]
    fn switching_tracker_untracks_older_folios() {
        let s = Sharing::new(64, SharingTracker::RmapIdSq, false);
        let head = Pfn::new(8);
        s.on_new(head, 2, 7, 4);
        assert_eq!(s.exclusive(head, 2, 7), Some(true));
        s.select(SharingTracker::RmapIdSq, false); // same state: same epoch
        assert_eq!(s.exclusive(head, 2, 7), Some(true));
        s.select(SharingTracker::RmapId(RmapIdOptions::default()), false);
        assert_eq!(s.exclusive(head, 2, 7), None);
        assert_eq!(s.on_map(head, 2, 9, 1), 0);
        assert!(!s.cow_reusable(head, 2, 7, |_| true));
        s.on_new(head, 2, 7, 4);
        assert_eq!(s.exclusive(head, 2, 7), Some(true));
        assert!(s.cow_reusable(head, 2, 7, |m| m == 4));
        s.on_map(head, 2, 9, 1);
        assert_eq!(s.exclusive(head, 2, 7), Some(false));
    }
}
