//! Bulk loading (`MapleTree::from_sorted_bulk`): contents, structure, the
//! node counts Linux's bulk mode (6.1–6.5 `dup_mmap`) gets, allocation
//! accounting and failure injection.

use maple::{bulk_prealloc_nodes, MapleError, MapleTree};

const PAGE: u64 = 0x1000;

/// `n` one-page entries every two pages (a NULL gap before each), starting
/// at `base`.
fn gapped(n: u64, base: u64) -> Vec<(u64, u64, u64)> {
    (0..n)
        .map(|i| (base + i * 2 * PAGE, base + i * 2 * PAGE + PAGE, i))
        .collect()
}

/// `n` contiguous one-page entries starting at `base`.
fn contiguous(n: u64, base: u64) -> Vec<(u64, u64, u64)> {
    (0..n)
        .map(|i| (base + i * PAGE, base + (i + 1) * PAGE, i))
        .collect()
}

/// The ranges (entries and NULL gaps) of a tree holding `entries`, as
/// `(start, last_inclusive, is_entry)`.
fn ranges(entries: &[(u64, u64, u64)]) -> Vec<(u64, u64, bool)> {
    let mut out = Vec::new();
    let mut next = 0;
    for &(s, e, _) in entries {
        if s > next {
            out.push((next, s - 1, false));
        }
        out.push((s, e - 1, true));
        next = e;
    }
    out.push((next, u64::MAX, false));
    out
}

/// Items per node, level by level from the root: ranges for leaves,
/// children for internal nodes.
fn fill(t: &MapleTree<u64>, entries: &[(u64, u64, u64)]) -> Vec<Vec<usize>> {
    let shape = t.shape();
    let r = ranges(entries);
    let mut out = Vec::new();
    for (k, level) in shape.iter().enumerate() {
        let below: Vec<u64> = match shape.get(k + 1) {
            Some(next) => next.iter().map(|&(min, _)| min).collect(),
            None => r.iter().map(|&(s, _, _)| s).collect(),
        };
        out.push(
            level
                .iter()
                .map(|&(min, max)| below.iter().filter(|&&s| s >= min && s <= max).count())
                .collect(),
        );
    }
    out
}

fn check(t: &MapleTree<u64>, entries: &[(u64, u64, u64)]) {
    if let Err(e) = t.validate() {
        panic!("invalid tree: {e}\n{t:?}");
    }
    assert_eq!(t.iter().collect::<Vec<_>>(), entries);
    assert_eq!(t.len(), entries.len());
    let s = t.stats();
    assert_eq!(s.nodes, t.node_count());
    assert_eq!(s.allocated - s.freed, s.nodes as u64, "nothing leaked");
}

/// Node counts and heights Linux's bulk mode produces for 0, 1, 15, 16, 17,
/// 100 and 6421 entries, obtained by replaying `mas_split`'s bulk rules
/// (push left, else right node at the minimum) and checked against the
/// structural expectations below. For 0 entries the model keeps its one
/// empty leaf (Linux has no node at all).
const SIZES: [u64; 7] = [0, 1, 15, 16, 17, 100, 6421];
const GAPPED: [(usize, u32); 7] = [(1, 1), (1, 1), (3, 2), (4, 2), (4, 2), (16, 3), (904, 4)];
const CONTIGUOUS: [(usize, u32); 7] = [(1, 1), (1, 1), (3, 2), (3, 2), (3, 2), (8, 2), (484, 4)];
/// Contiguous from index 0: no leading NULL, so 15 entries still fit a leaf.
const CONTIGUOUS_AT_0: [(usize, u32); 7] =
    [(1, 1), (1, 1), (1, 1), (3, 2), (3, 2), (8, 2), (484, 4)];

/// A layout: name, entry maker, base address, expected `(nodes, height)`.
type Layout = (
    &'static str,
    fn(u64, u64) -> Vec<(u64, u64, u64)>,
    u64,
    [(usize, u32); 7],
);

#[test]
fn bulk_builds_match_linux_node_counts() {
    let layouts: [Layout; 4] = [
        ("gapped", gapped, 0x1000_0000, GAPPED),
        ("gapped at 0", gapped, 0, GAPPED),
        ("contiguous", contiguous, 0x1000_0000, CONTIGUOUS),
        ("contiguous at 0", contiguous, 0, CONTIGUOUS_AT_0),
    ];
    for (name, make, base, want) in layouts {
        for (&n, &(nodes, height)) in SIZES.iter().zip(&want) {
            let entries = make(n, base);
            let t = MapleTree::from_sorted_bulk(entries.iter().copied(), n as usize).expect("bulk");
            check(&t, &entries);
            assert_eq!(
                (t.node_count(), t.height()),
                (nodes, height),
                "{name}, {n} entries"
            );
            // Preallocated up front (plus the empty tree's own leaf), the
            // unused part freed.
            let s = t.stats();
            let prealloc = bulk_prealloc_nodes(n as usize).max(nodes) as u64;
            assert_eq!(s.allocated, 1 + prealloc, "{name}, {n}");
            assert!(nodes <= bulk_prealloc_nodes(n as usize), "{name}, {n}");
        }
    }
}

#[test]
fn bulk_leaves_are_full_and_internal_nodes_hold_nine() {
    for (entries, full) in [
        (gapped(6421, 0x1000_0000), 16),
        (contiguous(6421, 0x1000_0000), 15),
        (gapped(821, 0x1000_0000), 16),
    ] {
        let t = MapleTree::from_sorted_bulk(entries.iter().copied(), entries.len()).expect("bulk");
        let fill = fill(&t, &entries);
        let leaves = fill.last().expect("leaves");
        // Only the two rightmost leaves can be partial (the last split).
        assert!(
            leaves[..leaves.len() - 2].iter().all(|&c| c == full),
            "{leaves:?}"
        );
        assert!(leaves.iter().all(|&c| c >= 6));
        for level in &fill[1..fill.len() - 1] {
            if level.len() > 2 {
                assert!(
                    level[..level.len() - 2].iter().all(|&c| c == 9),
                    "{level:?}"
                );
            }
            assert!(level.iter().all(|&c| c >= 4));
        }
        // With gaps the leaves are as few as 16-range leaves allow.
        if full == 16 {
            assert_eq!(leaves.len(), ranges(&entries).len().div_ceil(16));
        }
    }
}

#[test]
fn bulk_allocates_fewer_nodes_than_one_store_per_entry() {
    let entries = gapped(6421, 0x1000_0000);
    let bulk = MapleTree::from_sorted_bulk(entries.iter().copied(), entries.len()).expect("bulk");
    let insert = MapleTree::from_sorted_insert(entries.iter().copied()).expect("insert");
    assert!(bulk.iter().eq(insert.iter()));
    assert_eq!(bulk.node_count(), 904);
    // Ascending stores end up as dense: each overflow of the rightmost leaf
    // pushes into its left sibling, which Linux fills to 16 ranges here (see
    // tests/push.rs), and internal nodes to 9 children, as bulk mode does.
    assert_eq!(insert.node_count(), 904);
    // Allocations: the 1036 nodes mas_expected_entries(6421) asks for.
    assert_eq!(bulk_prealloc_nodes(6421), 1036);
    let s = bulk.stats();
    assert_eq!((s.allocated, s.freed), (1 + 1036, 1 + 1036 - 904));
    assert!(s.allocated < insert.stats().allocated);
    // Gap searches see the same free space.
    for size in [PAGE, 2 * PAGE, 0x100_0000] {
        for (low, high) in [(0, u64::MAX), (0x1000_5000, 0x1200_0000), (0, 0x1000_0000)] {
            assert_eq!(
                bulk.empty_area(low, high, size),
                insert.empty_area(low, high, size)
            );
            assert_eq!(
                bulk.empty_area_rev(low, high, size),
                insert.empty_area_rev(low, high, size)
            );
        }
    }
}

#[test]
fn bulk_tree_takes_ordinary_stores_afterwards() {
    let entries = gapped(3000, 0x1000_0000);
    let mut t = MapleTree::from_sorted_bulk(entries.iter().copied(), entries.len()).expect("bulk");
    let mut model = MapleTree::from_sorted_insert(entries.iter().copied()).expect("insert");
    for i in (0..3000u64).step_by(7) {
        let s = 0x1000_0000 + i * 2 * PAGE + PAGE;
        t.store_range(s, s + PAGE, Some(i + 10_000)).expect("store");
        model
            .store_range(s, s + PAGE, Some(i + 10_000))
            .expect("store");
    }
    t.erase_range(0x1000_0000, 0x1000_0000 + 900 * PAGE)
        .expect("erase");
    model
        .erase_range(0x1000_0000, 0x1000_0000 + 900 * PAGE)
        .expect("erase");
    t.validate().expect("valid");
    assert!(t.iter().eq(model.iter()));
}

#[test]
fn fewer_expected_entries_allocate_the_rest_on_the_way() {
    let entries = gapped(100, PAGE);
    for expected in [0, 10, 99] {
        let t = MapleTree::from_sorted_bulk(entries.iter().copied(), expected).expect("bulk");
        check(&t, &entries);
        assert_eq!(
            t.node_count(),
            16,
            "the shape does not depend on the estimate"
        );
        let s = t.stats();
        assert_eq!(
            s.allocated,
            1 + bulk_prealloc_nodes(expected).max(16) as u64
        );
    }
}

#[test]
fn entries_at_the_ends_of_the_index_space() {
    let entries = vec![(0, 5, 1u64), (5, 9, 2), (u64::MAX - 3, u64::MAX, 3)];
    let t = MapleTree::from_sorted_bulk(entries.iter().copied(), 3).expect("bulk");
    check(&t, &entries);
    assert_eq!(t.load(u64::MAX), None);
    assert_eq!(t.load(u64::MAX - 1), Some(3));
    assert_eq!(t.empty_area(0, u64::MAX, 10), Some(9));
}

#[test]
fn invalid_input_is_rejected_without_leaks() {
    for bad in [
        vec![(10, 10, 1u64)],
        vec![(10, 20, 1), (5, 8, 2)],
        vec![(10, 20, 1), (19, 30, 2)],
    ] {
        let (s, e, _) = *bad.last().expect("bad entry");
        let mut t = MapleTree::from_sorted_bulk(gapped(40, PAGE), 40).expect("bulk");
        let before = t.iter().collect::<Vec<_>>();
        let shape = t.shape();
        assert_eq!(
            t.load_sorted_bulk(bad.iter().copied(), bad.len()),
            Err(MapleError::InvalidRange { start: s, end: e })
        );
        check(&t, &before);
        assert_eq!(t.shape(), shape);
    }
}

#[test]
fn loading_replaces_the_previous_content() {
    let mut t = MapleTree::from_sorted_bulk(gapped(500, PAGE), 500).expect("bulk");
    let entries = contiguous(40, 0x5000_0000);
    t.load_sorted_bulk(entries.iter().copied(), 40)
        .expect("reload");
    check(&t, &entries);
    t.load_sorted_bulk(std::iter::empty(), 0).expect("empty");
    check(&t, &[]);
    assert_eq!(t.node_count(), 1);
}

#[test]
fn failure_at_every_allocation_leaves_the_tree_unchanged() {
    for (entries, expected) in [
        (gapped(100, PAGE), 100),
        // An estimate of 0 preallocates 5: the rest is allocated after the
        // entries were consumed.
        (gapped(100, PAGE), 0),
        (contiguous(17, 0), 17),
    ] {
        let prealloc = bulk_prealloc_nodes(expected) as u64;
        let mut t: MapleTree<u64> = MapleTree::new();
        let mut n = 1;
        loop {
            t.set_fail_point(Some(n));
            let mut consumed = 0;
            let res =
                t.load_sorted_bulk(entries.iter().copied().inspect(|_| consumed += 1), expected);
            t.set_fail_point(None);
            match res {
                Ok(()) => break,
                Err(e) => {
                    assert_eq!(e, MapleError::NoMemory);
                    check(&t, &[]);
                    assert_eq!(t.node_count(), 1);
                    if n <= prealloc {
                        assert_eq!(consumed, 0, "the preallocation comes first (n={n})");
                    } else {
                        assert_eq!(consumed, entries.len());
                    }
                    n += 1;
                }
            }
        }
        check(&t, &entries);
        assert_eq!(
            n,
            prealloc.max(t.node_count() as u64) + 1,
            "every allocation was tried"
        );
    }
}
