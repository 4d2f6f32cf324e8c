//! The sharing trackers of large anon folios (issue 5): the flaw in seed 003's sub-ID sizing,
//! the exhaustive sub-ID property for small orders, and a property test of every tracker
//! against a brute-force per-MM count.
//!
//! The tracker-level model mirrors what `rmap.rs` does at each mapcount change of a large anon
//! folio (per-page mapcounts, `large_mapcount`, `entire_mapcount`, the upstream owner slots on
//! a real memmap) and feeds the same changes to the side-table trackers.

use proptest::prelude::*;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use usermm::phys::{PageFlag, Pfn, PhysMem};
use usermm::rmap::owner;
use usermm::sharing::estimate;
use usermm::sharing::subid::{self, find_false_exclusive, values_say_exclusive, Layout, Sizing};
use usermm::sharing::{RmapIdOptions, Sharing, SharingTracker, WriterMode};

fn rmap_id(writer: WriterMode, sizing: Sizing) -> SharingTracker {
    SharingTracker::RmapId(RmapIdOptions {
        writer,
        sizing,
        ..RmapIdOptions::default()
    })
}

/// Builds the tracker state of `mappings` (the first creates the folio) and asks for `victim`.
fn tracker_answer(
    t: SharingTracker,
    order: u32,
    mappings: &[(u32, u32)],
    victim: u32,
) -> Option<bool> {
    let s = Sharing::new(4096, t, false);
    let head = Pfn::new(1024);
    for (i, &(id, n)) in mappings.iter().enumerate() {
        if i == 0 {
            s.on_new(head, order, id, u64::from(n));
        } else {
            s.on_map(head, order, id, u64::from(n));
        }
    }
    s.exclusive(head, order, victim)
}

// ---------------------------------------------------------------------------------------------
// The flaw

#[test]
fn seed_sizing_gives_false_exclusive_for_orders_7_to_9() {
    for order in 7..=9 {
        let fe = find_false_exclusive(order, Sizing::Seed)
            .unwrap_or_else(|| panic!("order {order}: no false exclusive found"));
        let p = 1u32 << order;
        assert!(fe.total() <= p, "{fe:?}");
        assert!(fe.mappings.len() >= 2, "{fe:?}");
        assert!(fe.mappings.iter().any(|&(id, n)| id == fe.victim && n > 0));
        assert!(fe
            .mappings
            .iter()
            .all(|&(id, _)| (1..=subid::RMAP_ID_MAX).contains(&id)));
        // The arithmetic says "exclusive" with the seed's sizing only.
        assert!(values_say_exclusive(
            order,
            Sizing::Seed,
            fe.victim,
            &fe.mappings
        ));
        assert!(!values_say_exclusive(
            order,
            Sizing::Safe,
            fe.victim,
            &fe.mappings
        ));
        // And so do the trackers built from the same (un)map calls the engine makes.
        let seed = rmap_id(WriterMode::ExclusiveAddReturn, Sizing::Seed);
        let safe = rmap_id(WriterMode::ExclusiveAddReturn, Sizing::Safe);
        assert_eq!(
            tracker_answer(seed, order, &fe.mappings, fe.victim),
            Some(true)
        );
        assert_eq!(
            tracker_answer(safe, order, &fe.mappings, fe.victim),
            Some(false)
        );
        assert_eq!(
            tracker_answer(SharingTracker::RmapIdSq, order, &fe.mappings, fe.victim),
            Some(false)
        );
        // Every other MM is answered correctly by the exact trackers too.
        for &(id, _) in &fe.mappings {
            assert_eq!(tracker_answer(safe, order, &fe.mappings, id), Some(false));
            assert_eq!(
                tracker_answer(SharingTracker::RmapIdSq, order, &fe.mappings, id),
                Some(false)
            );
        }
        let counts: Vec<u32> = fe.mappings.iter().map(|m| m.1).collect();
        eprintln!(
            "order {order}: victim {:#x}, {} MMs map {} pages in all {counts:?}",
            fe.victim,
            fe.mappings.len(),
            fe.total()
        );
    }
}

#[test]
fn smallest_false_exclusive_is_71_mappings_by_5_mms_on_an_order_7_folio() {
    let fe = find_false_exclusive(7, Sizing::Seed).expect("pattern");
    assert_eq!(fe.total(), 71);
    assert_eq!(fe.mappings.len(), 5);
    let mut counts: Vec<u32> = fe.mappings.iter().map(|m| m.1).collect();
    counts.sort_unstable();
    assert_eq!(counts, [1, 2, 12, 28, 28]);
    // The victim maps one page: it takes a write fault there and would reuse the folio.
    assert_eq!(
        fe.mappings.iter().find(|m| m.0 == fe.victim).map(|m| m.1),
        Some(1)
    );
}

#[test]
fn the_research_order_9_example_with_512_mappings() {
    // Victim slice 0xff; c_i = 512 − (base-513 digits of 2^64) summands carry bit i.
    let base = 513u128;
    let mut r = 1u128 << 64;
    let mut c = [0u32; 8];
    for ci in &mut c {
        *ci = 512 - (r % base) as u32;
        r /= base;
    }
    assert_eq!(c, [1, 499, 41, 443, 69, 471, 13, 511]);
    let high = 0x0012_3400u32;
    let mut mappings: Vec<(u32, u32)> = Vec::new();
    for j in 0..512u32 {
        let x: u32 = (0..8).filter(|&i| j < c[i]).map(|i| 1 << i).sum();
        match mappings.iter_mut().find(|m| m.0 == high | x) {
            Some(m) => m.1 += 1,
            None => mappings.push((high | x, 1)),
        }
    }
    let victim = high | 0xff;
    assert_eq!(mappings.len(), 9);
    assert!(mappings.iter().any(|m| m.0 == victim));
    assert!(values_say_exclusive(9, Sizing::Seed, victim, &mappings));
    assert!(!values_say_exclusive(9, Sizing::Safe, victim, &mappings));
    let seed = rmap_id(WriterMode::Shared, Sizing::Seed);
    assert_eq!(tracker_answer(seed, 9, &mappings, victim), Some(true));
    assert_eq!(
        tracker_answer(SharingTracker::RmapIdSq, 9, &mappings, victim),
        Some(false)
    );
}

#[test]
fn order_6_overflows_but_has_no_false_answer_and_safe_sizing_has_none_anywhere() {
    // Order 6 shares the 513-base bucket (513^8 > 2^64) but 64 mappings cannot reach a
    // multiple of 2^64: the search is exhaustive there (|e_i| <= 64 < 513/2).
    assert!(!Sizing::Seed.layout(6).overflow_free());
    assert_eq!(find_false_exclusive(6, Sizing::Seed), None);
    for order in subid::MIN_ORDER..=subid::MAX_ORDER {
        assert_eq!(
            find_false_exclusive(order, Sizing::Safe),
            None,
            "order {order}"
        );
        if !(6..=9).contains(&order) {
            assert_eq!(
                find_false_exclusive(order, Sizing::Seed),
                None,
                "order {order}"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Exhaustive sub-ID property

/// Checks every multiset of `1..=P` indices below `2^bits` against every victim: the sum of
/// sub-IDs equals `M × s(y)` (mod `2^word_bits`) iff every index is `y`. Returns the number of
/// false "exclusive" answers.
fn exhaustive(order: u32, bits: u32, word_bits: u32) -> u64 {
    let l = Layout {
        values: 1,
        bits,
        base: (1 << order) + 1,
    };
    let p = 1u32 << order;
    let n = 1u32 << bits;
    let mask = if word_bits == 64 {
        u64::MAX
    } else {
        (1u64 << word_bits) - 1
    };
    let s: Vec<u64> = (0..n).map(|x| l.subid(x) & mask).collect();
    // Multisets as non-decreasing index sequences, with running sums.
    struct Walk<'a> {
        s: &'a [u64],
        mask: u64,
        p: u32,
        bad: u64,
    }
    /// A prefix of a multiset: its size, sum, first index, and whether all are that index.
    #[derive(Clone, Copy)]
    struct Prefix {
        start: usize,
        m: u32,
        sum: u64,
        first: usize,
        all_same: bool,
    }
    fn rec(w: &mut Walk<'_>, x: Prefix) {
        if x.m > 0 {
            for (y, sy) in w.s.iter().enumerate() {
                let says = x.sum == u64::from(x.m).wrapping_mul(*sy) & w.mask;
                let truth = x.all_same && x.first == y;
                assert!(!truth || says, "true exclusive missed");
                if says && !truth {
                    w.bad += 1;
                }
            }
        }
        if x.m == w.p {
            return;
        }
        for i in x.start..w.s.len() {
            let f = if x.m == 0 { i } else { x.first };
            let next = Prefix {
                start: i,
                m: x.m + 1,
                sum: x.sum.wrapping_add(w.s[i]) & w.mask,
                first: f,
                all_same: (x.m == 0 || x.all_same) && f == i,
            };
            rec(w, next);
        }
    }
    let mut w = Walk {
        s: &s,
        mask,
        p,
        bad: 0,
    };
    let start = Prefix {
        start: 0,
        m: 0,
        sum: 0,
        first: 0,
        all_same: true,
    };
    rec(&mut w, start);
    w.bad
}

#[test]
fn sub_id_property_holds_exhaustively_for_small_orders() {
    // Order 1 (P = 2) up to 6 bits, order 2 (P = 4) up to 5 bits, order 3 (P = 8) up to 4 bits:
    // every multiset of up to P mappings, every victim, exact in 64-bit arithmetic.
    for (order, max_bits) in [(1, 6), (2, 5), (3, 4)] {
        for bits in 1..=max_bits {
            assert_eq!(exhaustive(order, bits, 64), 0, "order {order}, {bits} bits");
        }
    }
}

#[test]
fn sub_id_bound_is_tight_in_a_scaled_down_word() {
    // The same construction in 10-bit words: exact while (P+1)^bits <= 2^10, and the seed's
    // kind of overflow produces false answers beyond it.
    let mut broke = false;
    for (order, bits) in [(1, 6), (1, 7), (2, 4), (2, 5), (3, 3), (3, 4)] {
        let l = Layout {
            values: 1,
            bits,
            base: (1 << order) + 1,
        };
        let fits = u64::pow(l.base, bits) <= 1 << 10;
        let bad = exhaustive(order, bits, 10);
        if fits {
            assert_eq!(bad, 0, "order {order} bits {bits}");
        } else if bad > 0 {
            broke = true;
        }
    }
    assert!(broke, "no overflowing layout produced a false answer");
}

// ---------------------------------------------------------------------------------------------
// Property test: every tracker against the truth

const NR_MMS: usize = 5;
const HEAD: Pfn = Pfn::new(1536);

struct Model {
    order: u32,
    p: usize,
    ids: [u32; NR_MMS],
    pages: Vec<Vec<bool>>,
    pmd: [bool; NR_MMS],
    phys: PhysMem,
    trackers: Vec<(SharingTracker, Sharing)>,
    /// The folio exists (has been created and not fully unmapped).
    live: bool,
    estimate_false_exclusive: u64,
    owner_false_shared: u64,
}

impl Model {
    fn new(order: u32, ids: [u32; NR_MMS]) -> Model {
        let phys = PhysMem::new(8 << 20, 1);
        // Nobody allocates from this memory: use the frames' metadata directly.
        for p in HEAD.range(2) {
            phys.memmap.reset(p);
        }
        phys.memmap.set(HEAD, PageFlag::Head);
        phys.memmap.set(HEAD, PageFlag::Anon);
        phys.memmap.set(HEAD, PageFlag::TotalMapcount);
        phys.memmap.set(HEAD, PageFlag::OwnerTracked);
        phys.memmap.set_order(HEAD, order);
        let nr = phys.nr_frames();
        let trackers = vec![
            (rmap_id(WriterMode::ExclusiveAddReturn, Sizing::Safe), true),
            (rmap_id(WriterMode::ExclusiveCmpxchg, Sizing::Safe), false),
            (rmap_id(WriterMode::Shared, Sizing::Safe), false),
            (rmap_id(WriterMode::ExclusiveAddReturn, Sizing::Seed), false),
            (SharingTracker::RmapIdSq, false),
            (SharingTracker::Owner, true),
        ]
        .into_iter()
        .map(|(t, shadow)| (t, Sharing::new(nr, t, shadow)))
        .collect();
        Model {
            order,
            p: 1 << order,
            ids,
            pages: vec![vec![false; 1 << order]; NR_MMS],
            pmd: [false; NR_MMS],
            phys,
            trackers,
            live: false,
            estimate_false_exclusive: 0,
            owner_false_shared: 0,
        }
    }

    fn count(&self, mm: usize) -> u64 {
        self.pages[mm].iter().filter(|&&b| b).count() as u64 + u64::from(self.pmd[mm])
    }

    fn total(&self) -> u64 {
        (0..NR_MMS).map(|m| self.count(m)).sum()
    }

    /// `folio_add_new_anon_rmap` or the add/dup paths: `pages` newly PTE-mapped (or a PMD).
    fn map(&mut self, mm: usize, pages: &[usize], pmd: bool) {
        let n = if pmd { 1 } else { pages.len() as u64 };
        if n == 0 {
            return;
        }
        let mem = &self.phys.memmap;
        let id = self.ids[mm];
        for &p in pages {
            assert!(!self.pages[mm][p]);
            self.pages[mm][p] = true;
            mem.mapcount_add(HEAD.add(p as u64), 1);
        }
        if pmd {
            self.pmd[mm] = true;
            mem.entire_mapcount_add(HEAD, 1);
        }
        let total = mem.large_mapcount_add(HEAD, n as i32);
        if !self.live {
            owner::reset(self.phys.memmap.folio(HEAD));
        }
        owner::map(self.phys.memmap.folio(HEAD), id, n as i32, total);
        for (_, s) in &self.trackers {
            if self.live {
                s.on_map(HEAD, self.order, id, n);
            } else {
                s.on_new(HEAD, self.order, id, n);
            }
        }
        self.live = true;
    }

    fn unmap(&mut self, mm: usize, pages: &[usize], pmd: bool) {
        let n = if pmd { 1 } else { pages.len() as u64 };
        if n == 0 {
            return;
        }
        let mem = &self.phys.memmap;
        let id = self.ids[mm];
        for &p in pages {
            assert!(self.pages[mm][p]);
            self.pages[mm][p] = false;
            mem.mapcount_add(HEAD.add(p as u64), -1);
        }
        if pmd {
            assert!(self.pmd[mm]);
            self.pmd[mm] = false;
            mem.entire_mapcount_add(HEAD, -1);
        }
        let total = mem.large_mapcount_add(HEAD, -(n as i32));
        owner::unmap(self.phys.memmap.folio(HEAD), id, n as i32, total);
        for (_, s) in &self.trackers {
            s.on_unmap(HEAD, self.order, id, n);
        }
        if total == 0 {
            self.live = false; // freed; the next map creates a new folio here
        }
    }

    /// Applies one random step. Batches are split by `chunk` like rmap batches.
    fn step(&mut self, kind: u8, mm: usize, a: usize, b: usize, chunk: usize) {
        let p = self.p;
        let (lo, len) = (a % p, b % p + 1);
        let hi = (lo + len).min(p);
        let chunk = chunk.max(1);
        match kind % 10 {
            // Map a range (fault, or mremap/shmem-like add): only pages this mm lacks.
            0..=2 => {
                if self.pmd[mm] || (!self.live && self.total() != 0) {
                    return;
                }
                let pages: Vec<usize> = (lo..hi).filter(|&i| !self.pages[mm][i]).collect();
                for c in pages.chunks(chunk) {
                    self.map(mm, c, false);
                }
            }
            // Partial unmap (munmap, MADV_DONTNEED, COW of single pages).
            3..=5 => {
                if self.pmd[mm] {
                    if len > p / 2 {
                        self.unmap(mm, &[], true);
                    }
                    return;
                }
                let pages: Vec<usize> = (lo..hi).filter(|&i| self.pages[mm][i]).collect();
                for c in pages.chunks(chunk) {
                    self.unmap(mm, c, false);
                }
            }
            // Fork: an empty mm duplicates everything `mm` maps (dup: the child's ID).
            6 | 7 => {
                let Some(dst) = (0..NR_MMS).find(|&d| d != mm && self.count(d) == 0) else {
                    return;
                };
                if self.pmd[mm] {
                    self.map(dst, &[], true);
                }
                let pages: Vec<usize> = (0..p).filter(|&i| self.pages[mm][i]).collect();
                for c in pages.chunks(chunk) {
                    self.map(dst, c, false);
                }
            }
            // Exit: unmap everything of mm.
            8 => {
                if self.pmd[mm] {
                    self.unmap(mm, &[], true);
                }
                let pages: Vec<usize> = (0..p).filter(|&i| self.pages[mm][i]).collect();
                for c in pages.chunks(chunk) {
                    self.unmap(mm, c, false);
                }
            }
            // PMD: map a new PMD-sized folio by PMD, or split this mm's PMD into PTEs
            // (all PTEs added before the PMD is removed, like `__split_huge_pmd_locked`).
            _ => {
                if self.order != 9 {
                    return;
                }
                if self.pmd[mm] {
                    let all: Vec<usize> = (0..p).collect();
                    self.map(mm, &all, false);
                    self.unmap(mm, &[], true);
                } else if !self.live {
                    self.map(mm, &[], true);
                }
            }
        }
    }

    /// Compares every tracker with the truth for every mm.
    fn check(&mut self) -> Result<(), TestCaseError> {
        let mappers: Vec<usize> = (0..NR_MMS).filter(|&m| self.count(m) > 0).collect();
        let total = self.total();
        let mem = &self.phys.memmap;
        prop_assert_eq!(i64::from(mem.large_mapcount(HEAD)), total as i64);
        let truth_list: Vec<(u32, u64)> =
            (0..NR_MMS).map(|m| (self.ids[m], self.count(m))).collect();
        let est_excl = !estimate::likely_mapped_shared(mem.folio(HEAD));
        // The v6.7 first-page estimate errs the same way, never toward "shared".
        let v67_excl = !estimate::estimated_shared(mem.folio(HEAD));
        if mappers.len() == 1 {
            prop_assert!(v67_excl, "v6.7 estimate falsely shared");
        }
        let owner_shared = owner::maybe_mapped_shared(self.phys.memmap.folio(HEAD));
        for mm in 0..NR_MMS {
            let id = self.ids[mm];
            let truth = self.count(mm) > 0 && mappers.len() == 1;
            let maps = self.count(mm) > 0;
            // estimate: never "shared" wrongly; "exclusive" wrongly allowed (and counted).
            if maps {
                prop_assert!(est_excl || mappers.len() > 1, "estimate falsely shared");
                if est_excl && !truth {
                    self.estimate_false_exclusive += 1;
                }
            }
            for (t, s) in &self.trackers {
                match t {
                    SharingTracker::Owner => {
                        let a = s.answers(self.phys.memmap.folio(HEAD), id, id);
                        if maps {
                            prop_assert!(
                                !a.owner || truth,
                                "owner falsely exclusive for mm {} ({:?})",
                                mm,
                                owner::slots(self.phys.memmap.folio(HEAD))
                            );
                            prop_assert!(owner_shared || truth, "owner: bit clear but shared");
                            if truth && owner_shared {
                                self.owner_false_shared += 1;
                            }
                        }
                        // The shadow state of the owner machine is exact too.
                        prop_assert_eq!(a.rmap_id, Some(truth));
                        prop_assert_eq!(a.rmap_id_sq, Some(truth));
                    }
                    SharingTracker::RmapId(o) if o.sizing == Sizing::Seed => {
                        let a = s.exclusive(HEAD, self.order, id);
                        if self.order <= 6 {
                            prop_assert_eq!(a, Some(truth), "seed sizing at order {}", self.order);
                        } else {
                            // Wrong answers need >= 71 mappings in a crafted pattern.
                            prop_assert!(a == Some(truth) || (total >= 71 && a == Some(true)));
                        }
                    }
                    _ => {
                        prop_assert_eq!(
                            s.exclusive(HEAD, self.order, id),
                            Some(truth),
                            "{} for mm {}",
                            t.name(),
                            mm
                        );
                        let reuse = s.cow_reusable(HEAD, self.order, id, |m| m == total);
                        prop_assert_eq!(reuse, truth && total > 1, "{} cow", t.name());
                    }
                }
            }
        }
        if self.live {
            for (t, s) in &self.trackers {
                if t.never_falsely_exclusive() {
                    let errs = s.verify(HEAD, self.order, &truth_list);
                    prop_assert!(errs.is_empty(), "{}: {:?}", t.name(), errs);
                }
            }
        }
        Ok(())
    }
}

fn distinct_ids() -> impl Strategy<Value = [u32; NR_MMS]> {
    prop_oneof![
        // Small IDs, as a fresh machine hands out.
        Just([1u32, 2, 3, 4, 5]),
        // Random 24-bit IDs (the whole range of slices and sub-IDs).
        prop::collection::btree_set(1..=subid::RMAP_ID_MAX, NR_MMS).prop_map(|s| {
            let v: Vec<u32> = s.into_iter().collect();
            [v[0], v[1], v[2], v[3], v[4]]
        }),
        // IDs that differ in one slice only, and the largest IDs.
        (0u32..256).prop_map(|x| [
            x << 8 | 1,
            x << 8 | 2,
            x << 8 | 0x81,
            0xff_ff00 | 1,
            subid::RMAP_ID_MAX
        ]),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(256),
        ..ProptestConfig::default()
    })]

    #[test]
    fn every_tracker_against_the_truth(
        order in prop_oneof![Just(2u32), Just(3), Just(4), Just(6), Just(7), Just(9)],
        ids in distinct_ids(),
        steps in prop::collection::vec((any::<u8>(), 0usize..NR_MMS, any::<u16>(), any::<u16>(), 1usize..40), 1..80),
    ) {
        let mut m = Model::new(order, ids);
        // The folio starts fully mapped by mm 0 (a fresh fault) unless the first step maps.
        let all: Vec<usize> = (0..m.p).collect();
        m.map(0, &all, false);
        m.check()?;
        for (kind, mm, a, b, chunk) in steps {
            m.step(kind, mm, usize::from(a), usize::from(b), chunk);
            m.check()?;
        }
    }
}

/// The one-sided errors of the two imprecise trackers, on the patterns that show them.
#[test]
fn estimate_and_owner_errors_are_the_documented_ones() {
    // estimate: A maps all, fork B; A unmaps the second half, B COWs the first half away ->
    // the first page is mapped once, so "exclusive", although A and B both map the folio.
    let mut m = Model::new(4, [1, 2, 3, 4, 5]);
    let all: Vec<usize> = (0..16).collect();
    m.map(0, &all, false);
    m.map(1, &all, false);
    m.unmap(0, &all[8..], false);
    m.unmap(1, &all[..8], false);
    assert!(!estimate::likely_mapped_shared(m.phys.memmap.folio(HEAD)));
    m.check().expect("trackers");
    assert!(m.estimate_false_exclusive > 0);
    // owner: A, B take the slots, C maps untracked, A and B leave -> C alone, still "shared".
    let mut m = Model::new(4, [1, 2, 3, 4, 5]);
    m.map(0, &all, false);
    m.map(1, &all, false);
    m.map(2, &all[..4], false);
    m.unmap(0, &all, false);
    m.unmap(1, &all, false);
    m.check().expect("trackers");
    assert!(owner::maybe_mapped_shared(m.phys.memmap.folio(HEAD)));
    assert!(m.owner_false_shared > 0);
}

// ---------------------------------------------------------------------------------------------
// Concurrency on real threads (the model checker covers interleavings exhaustively; this runs
// the real memory system).

#[test]
fn concurrent_writers_and_a_reader_on_real_threads() {
    for t in [
        rmap_id(WriterMode::Shared, Sizing::Safe),
        rmap_id(WriterMode::ExclusiveCmpxchg, Sizing::Safe),
        rmap_id(WriterMode::ExclusiveAddReturn, Sizing::Safe),
        SharingTracker::RmapIdSq,
    ] {
        let s = Arc::new(Sharing::new(4096, t, true));
        let order = 9;
        let base_id = 77;
        s.on_new(HEAD, order, base_id, 100);
        let stop = Arc::new(AtomicBool::new(false));
        let ids = [1000u32, 0x12_3456, subid::RMAP_ID_MAX];
        let writers: Vec<_> = ids
            .iter()
            .map(|&id| {
                let s = Arc::clone(&s);
                std::thread::spawn(move || {
                    for i in 0..20_000u64 {
                        let n = 1 + i % 3;
                        s.on_map(HEAD, order, id, n);
                        s.on_unmap(HEAD, order, id, n);
                    }
                })
            })
            .collect();
        let reads = Arc::new(AtomicU64::new(0));
        let reader = {
            let (s, stop, reads) = (Arc::clone(&s), Arc::clone(&stop), Arc::clone(&reads));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) || reads.load(Ordering::Relaxed) < 1000 {
                    let Some((_, snap)) = s.snapshot(HEAD, order) else {
                        continue;
                    };
                    reads.fetch_add(1, Ordering::Relaxed);
                    // Consistent: 100 mappings of base_id plus 0..=3 of each writer.
                    let extra = snap.total - 100;
                    let s1 = snap.s1.wrapping_sub(100 * u64::from(base_id));
                    let ok = (0..64u64).any(|k| {
                        let n: Vec<u64> = (0..3).map(|j| k >> (2 * j) & 3).collect();
                        n.iter().sum::<u64>() == extra
                            && s1 == (0..3).map(|j| n[j] * u64::from(ids[j])).sum::<u64>()
                    });
                    assert!(ok, "inconsistent snapshot {snap:?}");
                }
            })
        };
        for w in writers {
            w.join().expect("writer");
        }
        stop.store(true, Ordering::Relaxed);
        reader.join().expect("reader");
        assert!(reads.load(Ordering::Relaxed) > 0);
        assert_eq!(
            s.verify(HEAD, order, &[(base_id, 100), (ids[0], 0)]),
            Vec::<String>::new()
        );
        assert_eq!(
            s.exclusive(HEAD, order, base_id),
            Some(true),
            "{}",
            t.name()
        );
    }
}

/// Stage "all": writers on several threads update the same pages' mapcounts through
/// `Sharing::update`; plain stores happen only inside an exclusively held seqcount, so no update
/// is lost. (Replacing the exclusivity test by "always plain" fails this test.)
#[test]
fn per_page_mapcounts_under_the_seqcount_lose_no_update() {
    let tracker = SharingTracker::parse("rmap-id+seed-sizing+all").expect("tracker");
    let phys = Arc::new(PhysMem::new(8 << 20, 1));
    phys.sharing.select(tracker, false);
    let order = 9;
    for p in HEAD.range(512) {
        phys.memmap.reset(p);
    }
    phys.sharing.on_new(HEAD, order, 5, 0);
    let page = HEAD.add(7);
    let plains = Arc::new(AtomicU64::new(0));
    let writers: Vec<_> = [11u32, 12, 13]
        .iter()
        .map(|&id| {
            let (phys, plains) = (Arc::clone(&phys), Arc::clone(&plains));
            std::thread::spawn(move || {
                let mem = &phys.memmap;
                for i in 0..100_000u32 {
                    let d = if i % 2 == 0 { 1 } else { -1 };
                    phys.sharing
                        .update(HEAD, order, id, i64::from(d), |plain| match plain {
                            usermm::sharing::Plain::Yes => {
                                plains.fetch_add(1, Ordering::Relaxed);
                                mem.mapcount_add_plain(page, d);
                            }
                            usermm::sharing::Plain::No => {
                                mem.mapcount_add(page, d);
                            }
                        });
                }
            })
        })
        .collect();
    for w in writers {
        w.join().expect("writer");
    }
    assert_eq!(phys.memmap.mapcount(page), 0);
    assert!(
        plains.load(Ordering::Relaxed) > 0,
        "the exclusive path never ran"
    );
    assert_eq!(
        phys.sharing.snapshot(HEAD, order).map(|s| s.1.total),
        Some(0)
    );
}

// ---------------------------------------------------------------------------------------------
// Tracker-level cost (informs the default; the engine benchmarks are in crates/bench).

/// Nanoseconds per (un)map call of each tracker, one thread and two threads on one folio:
/// `cargo test -p usermm --release --test sharing -- --ignored --nocapture tracker_cost`.
#[test]
#[ignore]
fn tracker_cost() {
    let phys = Arc::new(PhysMem::new(8 << 20, 1));
    for p in HEAD.range(2) {
        phys.memmap.reset(p);
    }
    let order = 9;
    let mut rows = Vec::new();
    for t in SharingTracker::all() {
        for threads in [1usize, 2] {
            let s = Arc::new(Sharing::new(phys.nr_frames(), t, false));
            s.on_new(HEAD, order, 1, 1);
            owner::reset(phys.memmap.folio(HEAD));
            owner::map(phys.memmap.folio(HEAD), 1, 1, 1);
            phys.memmap.large_mapcount_add(HEAD, 1);
            let iters = 2_000_000u64;
            let start = std::time::Instant::now();
            let hs: Vec<_> = (0..threads)
                .map(|i| {
                    let (s, phys) = (Arc::clone(&s), Arc::clone(&phys));
                    std::thread::spawn(move || {
                        let id = 2 + i as u32;
                        for _ in 0..iters {
                            for (d, up) in [(1i32, true), (-1, false)] {
                                match t {
                                    SharingTracker::Owner => {
                                        let g = phys.memmap.lock_large_mapcount(HEAD);
                                        let total =
                                            phys.memmap.large_mapcount_add_locked(&g, HEAD, d);
                                        if up {
                                            owner::map(phys.memmap.folio(HEAD), id, 1, total);
                                        } else {
                                            owner::unmap(phys.memmap.folio(HEAD), id, 1, total);
                                        }
                                    }
                                    SharingTracker::Estimate => {
                                        phys.memmap.large_mapcount_add(HEAD, d);
                                    }
                                    _ => {
                                        phys.memmap.large_mapcount_add(HEAD, d);
                                        if up {
                                            s.on_map(HEAD, order, id, 1);
                                        } else {
                                            s.on_unmap(HEAD, order, id, 1);
                                        }
                                    }
                                }
                            }
                        }
                    })
                })
                .collect();
            for h in hs {
                h.join().expect("thread");
            }
            let ns = start.elapsed().as_nanos() as f64 / (iters * 2) as f64;
            rows.push(format!(
                "{:<32} {threads} thread(s): {ns:6.1} ns per (un)map",
                t.name()
            ));
        }
    }
    for r in rows {
        eprintln!("{r}");
    }
}
