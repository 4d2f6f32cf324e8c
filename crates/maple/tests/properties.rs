//! Property tests: the maple tree against a naive model (a `BTreeMap` of
//! ranges), plus duplication and failure injection.

use std::collections::BTreeMap;
use std::ops::Bound;

use maple::{MapleError, MapleTree};
use proptest::prelude::*;

/// start -> (end_exclusive, value)
#[derive(Clone, Debug, Default)]
struct Model(BTreeMap<u64, (u64, u8)>);

impl Model {
    fn store(&mut self, start: u64, end: u64, v: Option<u8>) {
        let hit: Vec<(u64, (u64, u8))> = self
            .0
            .range(..end)
            .rev()
            .take_while(|(_, &(e, _))| e > start)
            .map(|(&s, &r)| (s, r))
            .collect();
        for (s, (e, x)) in hit {
            self.0.remove(&s);
            if s < start {
                self.0.insert(s, (start, x));
            }
            if e > end {
                self.0.insert(end, (e, x));
            }
        }
        if let Some(x) = v {
            self.0.insert(start, (end, x));
        }
    }

    fn entries(&self) -> Vec<(u64, u64, u8)> {
        self.0.iter().map(|(&s, &(e, v))| (s, e, v)).collect()
    }

    fn find(&self, i: u64) -> Option<(u64, u64, u8)> {
        let (&s, &(e, v)) = self.0.range(..=i).next_back()?;
        (e > i).then_some((s, e, v))
    }

    fn find_after(&self, i: u64) -> Option<(u64, u64, u8)> {
        self.find(i).or_else(|| {
            self.0
                .range((Bound::Excluded(i), Bound::Unbounded))
                .next()
                .map(|(&s, &(e, v))| (s, e, v))
        })
    }

    fn find_before(&self, i: u64) -> Option<(u64, u64, u8)> {
        self.0.range(..i).next_back().map(|(&s, &(e, v))| (s, e, v))
    }

    /// Free ranges `[a, b)` in order; the last one ends at `u64::MAX`
    /// (index `u64::MAX` itself is never inside a query window).
    fn holes(&self) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut at = 0;
        for (&s, &(e, _)) in &self.0 {
            if s > at {
                out.push((at, s));
            }
            at = e;
        }
        if at < u64::MAX {
            out.push((at, u64::MAX));
        }
        out
    }

    fn clip(low: u64, high: u64, size: u64, (a, b): (u64, u64)) -> Option<(u64, u64)> {
        let (s, e) = (a.max(low), b.min(high));
        (size > 0 && e > s && e - s >= size).then_some((s, e))
    }

    fn empty_area(&self, low: u64, high: u64, size: u64) -> Option<u64> {
        self.holes()
            .into_iter()
            .find_map(|h| Self::clip(low, high, size, h))
            .map(|(s, _)| s)
    }

    fn empty_area_rev(&self, low: u64, high: u64, size: u64) -> Option<(u64, u64)> {
        self.holes()
            .into_iter()
            .rev()
            .find_map(|h| Self::clip(low, high, size, h))
    }
}

const LOW: u64 = 0;
const HIGH: u64 = u64::MAX - 40_000;
const SPAN: u64 = 40_000;

/// An index: dense near 0, dense near `u64::MAX`, or anywhere.
fn index() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => LOW..LOW + SPAN,
        3 => HIGH..=u64::MAX,
        1 => any::<u64>(),
    ]
}

/// A range length: short, spanning many nodes, or huge.
fn length() -> impl Strategy<Value = u64> {
    prop_oneof![
        5 => 1u64..64,
        3 => 1u64..8_000,
        1 => any::<u64>(),
    ]
}

#[derive(Clone, Debug)]
struct Op {
    start: u64,
    len: u64,
    value: Option<u8>,
}

impl Op {
    fn range(&self) -> Option<(u64, u64)> {
        let end = self.start.saturating_add(self.len);
        (end > self.start).then_some((self.start, end))
    }
}

fn op() -> impl Strategy<Value = Op> {
    (
        index(),
        length(),
        prop_oneof![3 => (0u8..4).prop_map(Some), 2 => Just(None)],
    )
        .prop_map(|(start, len, value)| Op { start, len, value })
}

/// Seeds: `n` entries of `width` every `stride` starting at `base`.
#[derive(Clone, Debug)]
struct Seed {
    base: u64,
    n: u64,
    stride: u64,
    width: u64,
}

fn seed() -> impl Strategy<Value = Seed> {
    (prop_oneof![Just(LOW), Just(HIGH)], 0u64..400, 2u64..80)
        .prop_flat_map(|(base, n, stride)| (Just(base), Just(n), Just(stride), 1..=stride))
        .prop_map(|(base, n, stride, width)| Seed {
            base,
            n,
            stride,
            width,
        })
}

fn build(seeds: &[Seed]) -> (MapleTree<u8>, Model) {
    let mut t = MapleTree::new();
    let mut m = Model::default();
    for sd in seeds {
        for i in 0..sd.n {
            let s = sd.base + i * sd.stride;
            let e = s.saturating_add(sd.width);
            if e > s {
                let v = (i % 4) as u8;
                t.store_range(s, e, Some(v)).expect("seed store");
                m.store(s, e, Some(v));
            }
        }
    }
    (t, m)
}

fn check(t: &MapleTree<u8>, m: &Model, probes: &[u64], windows: &[(u64, u64, u64)]) {
    if let Err(e) = t.validate() {
        panic!("invalid tree: {e}\n{t:?}");
    }
    assert_eq!(t.iter().collect::<Vec<_>>(), m.entries());
    assert_eq!(t.len(), m.0.len());
    let mut points: Vec<u64> = probes.to_vec();
    for (&s, &(e, _)) in m.0.iter().step_by(7) {
        points.extend([s.saturating_sub(1), s, e - 1, e]);
    }
    for &i in &points {
        assert_eq!(t.find(i), m.find(i), "find({i:#x})");
        assert_eq!(t.load(i), m.find(i).map(|x| x.2), "load({i:#x})");
        assert_eq!(t.find_after(i), m.find_after(i), "find_after({i:#x})");
        assert_eq!(t.find_before(i), m.find_before(i), "find_before({i:#x})");
    }
    for &(low, high, size) in windows {
        assert_eq!(
            t.empty_area(low, high, size),
            m.empty_area(low, high, size),
            "empty_area({low:#x}, {high:#x}, {size:#x})"
        );
        assert_eq!(
            t.empty_area_rev(low, high, size),
            m.empty_area_rev(low, high, size),
            "empty_area_rev({low:#x}, {high:#x}, {size:#x})"
        );
    }
}

fn window() -> impl Strategy<Value = (u64, u64, u64)> {
    (
        index(),
        index(),
        prop_oneof![1u64..4, 1u64..200, any::<u64>()],
    )
        .prop_map(|(a, b, size)| (a.min(b), a.max(b), size))
}

fn range_query() -> impl Strategy<Value = (u64, u64)> {
    (index(), length()).prop_map(|(s, l)| (s, s.saturating_add(l)))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn stores_match_the_model(
        seeds in prop::collection::vec(seed(), 0..3),
        ops in prop::collection::vec(op(), 1..40),
        probes in prop::collection::vec(index(), 0..12),
        windows in prop::collection::vec(window(), 0..6),
        ranges in prop::collection::vec(range_query(), 0..4),
    ) {
        let (mut t, mut m) = build(&seeds);
        check(&t, &m, &probes, &windows);
        for op in &ops {
            match op.range() {
                Some((s, e)) => {
                    if op.value.is_some() || op.len % 2 == 0 {
                        t.store_range(s, e, op.value).expect("store");
                    } else {
                        t.erase_range(s, e).expect("erase");
                    }
                    m.store(s, e, op.value);
                }
                None => {
                    let e = op.start;
                    prop_assert_eq!(
                        t.store_range(op.start, e, op.value),
                        Err(MapleError::InvalidRange { start: op.start, end: e })
                    );
                }
            }
            check(&t, &m, &probes, &windows);
        }
        for &(s, e) in &ranges {
            let want: Vec<_> = m.entries().into_iter().filter(|&(a, b, _)| a < e && b > s).collect();
            prop_assert_eq!(t.range(s, e).collect::<Vec<_>>(), want);
        }
        let stats = t.stats();
        prop_assert_eq!(stats.allocated - stats.freed, t.node_count() as u64);
    }

    #[test]
    fn dup_equals_the_source(
        seeds in prop::collection::vec(seed(), 0..3),
        ops in prop::collection::vec(op(), 0..20),
    ) {
        let (mut t, _) = build(&seeds);
        for op in &ops {
            if let Some((s, e)) = op.range() {
                t.store_range(s, e, op.value).expect("store");
            }
        }
        let d = t.dup_structure().expect("dup");
        prop_assert!(d.validate().is_ok());
        prop_assert_eq!(d.shape(), t.shape());
        prop_assert_eq!(d.iter().collect::<Vec<_>>(), t.iter().collect::<Vec<_>>());
        prop_assert_eq!((d.len(), d.height(), d.node_count()), (t.len(), t.height(), t.node_count()));
    }

    #[test]
    fn failed_dup_leaks_nothing_and_keeps_the_source(
        seeds in prop::collection::vec(seed(), 1..3),
    ) {
        let (mut t, _) = build(&seeds);
        let entries: Vec<_> = t.iter().collect();
        let shape = t.shape();
        let before = t.stats();
        for n in 1..=t.node_count() as u64 {
            t.set_fail_point(Some(n));
            prop_assert_eq!(t.dup_structure().err(), Some(MapleError::NoMemory));
            let now = t.stats();
            prop_assert_eq!(now.allocated - now.freed, before.allocated - before.freed);
            prop_assert_eq!(now.nodes, before.nodes);
        }
        t.set_fail_point(None);
        prop_assert!(t.validate().is_ok());
        prop_assert_eq!(t.shape(), shape);
        prop_assert_eq!(t.iter().collect::<Vec<_>>(), entries);
    }

    #[test]
    fn failed_store_leaves_the_tree_unchanged(
        seeds in prop::collection::vec(seed(), 1..3),
        ops in prop::collection::vec(op(), 1..6),
    ) {
        let (mut t, mut m) = build(&seeds);
        for op in &ops {
            let Some((s, e)) = op.range() else { continue };
            let entries = t.iter().collect::<Vec<_>>();
            let shape = t.shape();
            let before = t.stats();
            let mut n = 1;
            loop {
                t.set_fail_point(Some(n));
                match t.store_range(s, e, op.value) {
                    Ok(()) => break,
                    Err(err) => {
                        prop_assert_eq!(err, MapleError::NoMemory);
                        prop_assert!(t.validate().is_ok());
                        prop_assert_eq!(t.shape(), shape.clone());
                        prop_assert_eq!(t.iter().collect::<Vec<_>>(), entries.clone());
                        let now = t.stats();
                        prop_assert_eq!(now.allocated - now.freed, before.allocated - before.freed);
                        n += 1;
                    }
                }
            }
            t.set_fail_point(None);
            m.store(s, e, op.value);
            check(&t, &m, &[], &[]);
        }
    }

    #[test]
    fn bulk_load_matches_the_model(
        seeds in prop::collection::vec(seed(), 0..3),
        ops in prop::collection::vec(op(), 0..20),
        probes in prop::collection::vec(index(), 0..12),
        windows in prop::collection::vec(window(), 0..6),
        slack in 0usize..3,
    ) {
        let (_, mut m) = build(&seeds);
        for op in &ops {
            if let Some((s, e)) = op.range() {
                m.store(s, e, op.value);
            }
        }
        let entries = m.entries();
        let expected = entries.len() / (slack + 1);
        let t = MapleTree::from_sorted_bulk(entries.iter().copied(), expected).expect("bulk");
        check(&t, &m, &probes, &windows);
        let stats = t.stats();
        prop_assert_eq!(stats.allocated - stats.freed, t.node_count() as u64);
        prop_assert_eq!(
            stats.allocated,
            1 + maple::bulk_prealloc_nodes(expected).max(t.node_count()) as u64
        );
        // One store per entry builds the same content. (It is not always
        // taller: stores push into siblings as Linux's do, which can fill
        // nodes more than bulk mode's splits.)
        let insert = MapleTree::from_sorted_insert(entries.iter().copied()).expect("insert");
        prop_assert!(insert.validate().is_ok(), "{:?}", insert.validate());
        prop_assert_eq!(insert.iter().collect::<Vec<_>>(), t.iter().collect::<Vec<_>>());
    }

    #[test]
    fn replace_entries_matches_the_model(
        seeds in prop::collection::vec(seed(), 0..3),
        ops in prop::collection::vec(op(), 0..10),
        drop_mask in any::<u8>(),
        fail_at in prop::option::of(1u64..6),
    ) {
        let (mut t, mut m) = build(&seeds);
        for op in &ops {
            if let Some((s, e)) = op.range() {
                t.store_range(s, e, op.value).expect("store");
                m.store(s, e, op.value);
            }
        }
        let mut d = t.dup_structure().expect("dup");
        let keep = |v: u8| drop_mask & (1 << v) == 0;
        d.set_fail_point(fail_at);
        let mut seen = Vec::new();
        let res = d.replace_entries(|s, e, v| {
            seen.push((s, e, v));
            keep(v).then_some(v + 4)
        });
        d.set_fail_point(None);
        prop_assert_eq!(&seen, &m.entries());
        prop_assert!(d.validate().is_ok(), "{:?}", d.validate());
        if res.is_ok() {
            let mut want = Model::default();
            for (s, e, v) in m.entries() {
                if keep(v) {
                    want.store(s, e, Some(v + 4));
                }
            }
            check(&d, &want, &[], &[]);
        } else {
            prop_assert_eq!(res, Err(MapleError::NoMemory));
        }
        // The source is untouched by whatever happened to the copy.
        check(&t, &m, &[], &[]);
    }
}
