//! Behaviour tests of the maple tree through its public API.

use maple::{MapleError, MapleTree, TreeStats};

const PAGE: u64 = 0x1000;

/// `n` entries of two pages each, separated by one-page holes.
fn spaced(n: u64) -> MapleTree<u64> {
    let mut t = MapleTree::new();
    for i in 0..n {
        t.store_range(i * 3 * PAGE, i * 3 * PAGE + 2 * PAGE, Some(i))
            .expect("store");
    }
    t.validate().expect("valid");
    t
}

fn live(s: TreeStats) -> u64 {
    s.allocated - s.freed
}

#[test]
fn empty_tree_holds_one_null_range() {
    let t: MapleTree<u32> = MapleTree::new();
    assert!(t.is_empty());
    assert_eq!(t.len(), 0);
    assert_eq!(t.height(), 1);
    assert_eq!(t.node_count(), 1);
    assert_eq!(t.load(0), None);
    assert_eq!(t.load(u64::MAX), None);
    assert_eq!(t.iter().count(), 0);
    assert_eq!(t.find_after(0), None);
    assert_eq!(t.find_before(u64::MAX), None);
    assert_eq!(t.empty_area(0, u64::MAX, 10), Some(0));
    assert_eq!(t.empty_area_rev(0, u64::MAX, 10), Some((0, u64::MAX)));
    assert_eq!(t.shape(), vec![vec![(0, u64::MAX)]]);
    t.validate().expect("valid");
}

#[test]
fn store_then_load_and_find() {
    let mut t = MapleTree::new();
    t.store_range(0x1000, 0x3000, Some(7u32)).expect("store");
    assert_eq!(t.load(0xfff), None);
    assert_eq!(t.load(0x1000), Some(7));
    assert_eq!(t.load(0x2fff), Some(7));
    assert_eq!(t.load(0x3000), None);
    assert_eq!(t.find(0x2000), Some((0x1000, 0x3000, 7)));
    assert_eq!(t.find(0x3000), None);
    assert_eq!(t.len(), 1);
    t.validate().expect("valid");
}

#[test]
fn empty_or_reversed_ranges_are_rejected() {
    let mut t = MapleTree::<u8>::new();
    assert_eq!(
        t.store_range(5, 5, Some(1)),
        Err(MapleError::InvalidRange { start: 5, end: 5 })
    );
    assert_eq!(
        t.erase_range(9, 2),
        Err(MapleError::InvalidRange { start: 9, end: 2 })
    );
    assert_eq!(
        MapleError::InvalidRange {
            start: 0x10,
            end: 0x8
        }
        .to_string(),
        "invalid range 0x10..0x8"
    );
    assert_eq!(MapleError::NoMemory.to_string(), "node allocation failed");
    assert!(t.is_empty());
}

#[test]
fn overwrite_trims_partially_covered_entries() {
    let mut t = MapleTree::new();
    t.store_range(0, 100, Some('a')).expect("store");
    t.store_range(40, 60, Some('b')).expect("store");
    assert_eq!(
        t.iter().collect::<Vec<_>>(),
        vec![(0, 40, 'a'), (40, 60, 'b'), (60, 100, 'a')]
    );
    t.store_range(30, 70, None).expect("erase");
    assert_eq!(
        t.iter().collect::<Vec<_>>(),
        vec![(0, 30, 'a'), (70, 100, 'a')]
    );
    t.validate().expect("valid");
}

#[test]
fn erase_coalesces_null_neighbours() {
    let mut t = MapleTree::new();
    for i in 0..5u64 {
        t.store_range(i * 10, i * 10 + 10, Some(i)).expect("store");
    }
    t.erase_range(10, 20).expect("erase");
    t.erase_range(30, 40).expect("erase");
    // [20, 30) is now surrounded by NULL ranges; erasing it must leave one.
    t.erase_range(20, 30).expect("erase");
    t.validate().expect("valid");
    assert_eq!(t.find_after(10), Some((40, 50, 4)));
    assert_eq!(t.empty_area(0, 100, 30), Some(10));
    assert_eq!(t.empty_area(0, 100, 31), Some(50));
}

#[test]
fn sequential_inserts_split_and_grow() {
    let t = spaced(2000);
    assert_eq!(t.len(), 2000);
    assert!(t.height() >= 3, "height {}", t.height());
    for i in 0..2000u64 {
        assert_eq!(t.load(i * 3 * PAGE + PAGE), Some(i));
        assert_eq!(t.load(i * 3 * PAGE + 2 * PAGE), None);
    }
    assert_eq!(t.iter().count(), 2000);
}

#[test]
fn reverse_and_interleaved_inserts_stay_valid() {
    let mut t = MapleTree::new();
    for i in (0..700u64).rev() {
        t.store_range(i * 4, i * 4 + 2, Some(i)).expect("store");
    }
    for i in 0..700u64 {
        t.store_range(i * 4 + 2, i * 4 + 3, Some(i + 1000))
            .expect("store");
        if i % 50 == 0 {
            t.validate().expect("valid");
        }
    }
    assert_eq!(t.len(), 1400);
    t.validate().expect("valid");
}

#[test]
fn spanning_store_replaces_many_nodes() {
    let mut t = spaced(3000);
    let before = t.node_count();
    t.store_range(5 * PAGE, 8000 * PAGE, Some(99))
        .expect("spanning store");
    t.validate().expect("valid");
    assert!(t.node_count() < before);
    assert_eq!(t.find(100 * PAGE), Some((5 * PAGE, 8000 * PAGE, 99)));
    assert_eq!(
        t.find(4 * PAGE + 1),
        Some((3 * PAGE, 5 * PAGE, 1)),
        "left part trimmed"
    );
    // Entry 2666 is [7998, 8000) pages: fully covered; 2667 starts at 8001.
    assert_eq!(
        t.find_after(8000 * PAGE),
        Some((8001 * PAGE, 8003 * PAGE, 2667))
    );
}

#[test]
fn erasing_everything_shrinks_to_a_single_leaf() {
    let mut t = spaced(1500);
    t.erase_range(0, u64::MAX).expect("erase all");
    t.validate().expect("valid");
    assert!(t.is_empty());
    assert_eq!(t.height(), 1);
    assert_eq!(t.node_count(), 1);
}

#[test]
fn erasing_one_by_one_rebalances() {
    let mut t = spaced(800);
    for i in (0..800u64).step_by(2) {
        t.erase_range(i * 3 * PAGE, i * 3 * PAGE + 2 * PAGE)
            .expect("erase");
    }
    t.validate().expect("valid");
    for i in (1..800u64).step_by(2) {
        t.erase_range(i * 3 * PAGE, i * 3 * PAGE + 2 * PAGE)
            .expect("erase");
        t.validate().expect("valid");
    }
    assert!(t.is_empty());
    assert_eq!(t.height(), 1);
}

#[test]
fn find_after_and_before_follow_find_vma_semantics() {
    let t = spaced(100);
    assert_eq!(t.find_after(0), Some((0, 2 * PAGE, 0)));
    assert_eq!(t.find_after(2 * PAGE), Some((3 * PAGE, 5 * PAGE, 1)));
    assert_eq!(t.find_after(4 * PAGE), Some((3 * PAGE, 5 * PAGE, 1)));
    assert_eq!(t.find_after(300 * PAGE), None);
    assert_eq!(t.find_before(0), None);
    assert_eq!(t.find_before(1), Some((0, 2 * PAGE, 0)));
    assert_eq!(t.find_before(3 * PAGE), Some((0, 2 * PAGE, 0)));
    assert_eq!(t.find_before(3 * PAGE + 1), Some((3 * PAGE, 5 * PAGE, 1)));
    assert_eq!(t.find_before(u64::MAX), Some((297 * PAGE, 299 * PAGE, 99)));
}

#[test]
fn range_yields_overlapping_entries_unclipped() {
    let t = spaced(100);
    let got: Vec<_> = t.range(PAGE, 6 * PAGE + 1).collect();
    assert_eq!(
        got,
        vec![
            (0, 2 * PAGE, 0),
            (3 * PAGE, 5 * PAGE, 1),
            (6 * PAGE, 8 * PAGE, 2)
        ]
    );
    assert_eq!(t.range(2 * PAGE, 3 * PAGE).count(), 0);
    assert_eq!(t.range(5, 5).count(), 0);
    assert_eq!(t.range(0, u64::MAX).count(), 100);
}

#[test]
fn empty_area_searches_bottom_up() {
    let mut t = spaced(500);
    t.erase_range(300 * 3 * PAGE, 300 * 3 * PAGE + 2 * PAGE)
        .expect("erase");
    // One-page holes everywhere, one 5-page hole at entry 300.
    assert_eq!(t.empty_area(0, u64::MAX, PAGE), Some(2 * PAGE));
    assert_eq!(
        t.empty_area(0, u64::MAX, 3 * PAGE),
        Some(299 * 3 * PAGE + 2 * PAGE)
    );
    assert_eq!(t.empty_area(0, 900 * PAGE, 3 * PAGE), None);
    assert_eq!(
        t.empty_area(900 * PAGE, u64::MAX, 2 * PAGE),
        Some(900 * PAGE)
    );
    assert_eq!(
        t.empty_area(0, u64::MAX, 6 * PAGE),
        Some(1500 * PAGE - PAGE)
    );
    assert_eq!(t.empty_area(0, u64::MAX, 0), None);
    assert_eq!(t.empty_area(10, 10, 1), None);
}

#[test]
fn empty_area_rev_searches_top_down() {
    let mut t = spaced(500);
    t.erase_range(100 * 3 * PAGE, 100 * 3 * PAGE + 2 * PAGE)
        .expect("erase");
    let top = 1500 * PAGE;
    assert_eq!(t.empty_area_rev(0, top, PAGE), Some((top - PAGE, top)));
    assert_eq!(
        t.empty_area_rev(0, top, 2 * PAGE),
        Some((299 * PAGE, 303 * PAGE))
    );
    assert_eq!(t.empty_area_rev(0, 300 * PAGE, 2 * PAGE), None);
    // Clipped to the window.
    assert_eq!(
        t.empty_area_rev(300 * PAGE, 301 * PAGE, PAGE),
        Some((300 * PAGE, 301 * PAGE))
    );
    assert_eq!(
        t.empty_area_rev(0, u64::MAX, PAGE << 20),
        Some((top - PAGE, u64::MAX))
    );
}

#[test]
fn entries_near_the_top_of_the_index_space() {
    let mut t = MapleTree::new();
    let m = u64::MAX;
    t.store_range(m - 10, m, Some(1u8)).expect("store");
    t.store_range(0, 1, Some(2)).expect("store");
    assert_eq!(t.find(m - 1), Some((m - 10, m, 1)));
    assert_eq!(t.load(m), None);
    assert_eq!(t.find_after(m - 10), Some((m - 10, m, 1)));
    assert_eq!(t.find_after(m), None);
    assert_eq!(t.find_before(m), Some((m - 10, m, 1)));
    assert_eq!(t.empty_area_rev(0, m, 5), Some((1, m - 10)));
    t.erase_range(m - 5, m).expect("erase");
    assert_eq!(
        t.iter().collect::<Vec<_>>(),
        vec![(0, 1, 2), (m - 10, m - 5, 1)]
    );
    t.validate().expect("valid");
}

#[test]
fn dup_structure_copies_nodes_verbatim() {
    let t = spaced(3000);
    let before = live(t.stats());
    let d = t.dup_structure().expect("dup");
    d.validate().expect("valid");
    assert_eq!(d.shape(), t.shape());
    assert!(d.iter().eq(t.iter()));
    assert_eq!(d.len(), t.len());
    assert_eq!(d.height(), t.height());
    assert_eq!(d.node_count(), t.node_count());
    assert_eq!(live(t.stats()), before + t.node_count() as u64);
    drop(d);
    assert_eq!(live(t.stats()), before);
}

#[test]
fn dup_failure_at_every_allocation_leaks_nothing() {
    let mut t = spaced(600);
    let entries: Vec<_> = t.iter().collect();
    let shape = t.shape();
    let before = live(t.stats());
    for n in 1..=t.node_count() as u64 {
        t.set_fail_point(Some(n));
        assert_eq!(
            t.dup_structure().err(),
            Some(MapleError::NoMemory),
            "n = {n}"
        );
        assert_eq!(live(t.stats()), before, "leak after failing at {n}");
        assert_eq!(t.shape(), shape);
        assert!(t.iter().eq(entries.iter().copied()));
    }
    t.set_fail_point(Some(t.node_count() as u64 + 1));
    let d = t.dup_structure().expect("enough allocations");
    t.set_fail_point(None);
    d.validate().expect("valid");
    t.validate().expect("valid");
}

#[test]
fn failed_store_leaves_the_tree_unchanged() {
    let mut t = spaced(900);
    let entries: Vec<_> = t.iter().collect();
    let shape = t.shape();
    let before = live(t.stats());
    let mut n = 1;
    loop {
        t.set_fail_point(Some(n));
        match t.store_range(10 * PAGE, 2000 * PAGE, Some(5000)) {
            Err(MapleError::NoMemory) => {
                t.validate().expect("valid after failure");
                assert_eq!(t.shape(), shape);
                assert!(t.iter().eq(entries.iter().copied()));
                assert_eq!(live(t.stats()), before);
                n += 1;
            }
            Err(e) => panic!("unexpected {e}"),
            Ok(()) => break,
        }
    }
    assert!(n > 1, "the spanning store allocates");
    t.set_fail_point(None);
    t.validate().expect("valid");
    assert_eq!(t.find(11 * PAGE), Some((10 * PAGE, 2000 * PAGE, 5000)));
}

#[test]
fn fail_point_fires_once_then_allows_allocations() {
    let mut t = MapleTree::new();
    t.set_fail_point(Some(1));
    // Filling a root leaf needs no allocation at all.
    for i in 0..8u64 {
        t.store_range(i * 2, i * 2 + 1, Some(i))
            .expect("in-place store");
    }
    // The split needs two leaves and a root: the first allocation fails.
    assert_eq!(t.store_range(100, 101, Some(8)), Err(MapleError::NoMemory));
    assert_eq!(t.len(), 8);
    t.store_range(100, 101, Some(8))
        .expect("second attempt succeeds");
    assert_eq!(t.height(), 2);
    t.validate().expect("valid");
}

#[test]
fn replace_entries_overwrites_in_place() {
    let t = spaced(1000);
    let mut d = t.dup_structure().expect("dup");
    let nodes = d.stats().allocated;
    let mut calls = 0;
    d.replace_entries(|s, e, v| {
        calls += 1;
        assert_eq!((s, e), (v * 3 * PAGE, v * 3 * PAGE + 2 * PAGE));
        Some(v + 10_000)
    })
    .expect("no allocation needed");
    assert_eq!(calls, 1000);
    assert_eq!(d.stats().allocated, nodes);
    assert_eq!(d.shape(), t.shape());
    assert!(d.iter().map(|(s, e, v)| (s, e, v - 10_000)).eq(t.iter()));
    d.validate().expect("valid");
}

#[test]
fn replace_entries_with_none_coalesces_and_rebalances() {
    let mut t = MapleTree::new();
    // Contiguous entries: dropping neighbours must merge their NULL ranges.
    for i in 0..1000u64 {
        t.store_range(i * PAGE, (i + 1) * PAGE, Some(i))
            .expect("store");
    }
    t.replace_entries(|_, _, v| {
        if v % 7 == 3 || (200..600).contains(&v) {
            None
        } else {
            Some(v)
        }
    })
    .expect("replace");
    t.validate().expect("valid");
    let expected: Vec<_> = (0..1000u64)
        .filter(|v| !(v % 7 == 3 || (200..600).contains(v)))
        .map(|v| (v * PAGE, (v + 1) * PAGE, v))
        .collect();
    assert!(t.iter().eq(expected.iter().copied()));
    assert_eq!(t.empty_area(0, u64::MAX, 400 * PAGE), Some(199 * PAGE));

    t.replace_entries(|_, _, _| None).expect("drop all");
    t.validate().expect("valid");
    assert!(t.is_empty());
    assert_eq!(t.node_count(), 1);
}

#[test]
fn from_sorted_insert_matches_dup_content() {
    let t = spaced(6400);
    let rebuilt = MapleTree::from_sorted_insert(t.iter()).expect("insert");
    rebuilt.validate().expect("valid");
    assert!(rebuilt.iter().eq(t.iter()));
    let d = t.dup_structure().expect("dup");
    assert!(d.iter().eq(rebuilt.iter()));
}

#[test]
fn stats_count_allocations_and_frees() {
    let mut t = MapleTree::new();
    assert_eq!(
        t.stats(),
        TreeStats {
            allocated: 1,
            freed: 0,
            nodes: 1
        }
    );
    for i in 0..100u64 {
        t.store_range(i * 2, i * 2 + 1, Some(i)).expect("store");
    }
    let s = t.stats();
    assert_eq!(s.nodes, t.node_count());
    assert_eq!(s.allocated - s.freed, s.nodes as u64);
    t.erase_range(0, u64::MAX).expect("erase");
    let s = t.stats();
    assert_eq!(s.nodes, 1);
    assert_eq!(s.allocated - s.freed, 1);
}

#[test]
fn gaps_are_maintained_by_every_store() {
    let mut t = spaced(2000);
    // Open a big hole deep inside the tree, then fill parts of it again.
    t.erase_range(500 * PAGE, 4000 * PAGE).expect("erase");
    t.validate().expect("valid");
    assert_eq!(t.empty_area(0, u64::MAX, 3000 * PAGE), Some(500 * PAGE));
    t.store_range(1000 * PAGE, 1001 * PAGE, Some(1))
        .expect("store");
    t.validate().expect("valid");
    // Neither half of the hole holds 3000 pages any more.
    assert_eq!(t.empty_area(0, u64::MAX, 3000 * PAGE), Some(5999 * PAGE));
    assert_eq!(t.empty_area(0, u64::MAX, 2999 * PAGE), Some(1001 * PAGE));
    assert_eq!(
        t.empty_area_rev(0, 2000 * PAGE, 3 * PAGE),
        Some((1001 * PAGE, 2000 * PAGE))
    );
}

#[test]
fn debug_lists_entries() {
    let mut t = MapleTree::new();
    t.store_range(0x1000, 0x2000, Some(3u8)).expect("store");
    let s = format!("{t:?}");
    assert!(s.contains("len: 1"), "{s}");
    assert!(s.contains("0x1000..0x2000: 3"), "{s}");
    assert_eq!(
        format!("{:?}", MapleTree::<u8>::default().iter().next()),
        "None"
    );
}

#[test]
fn tree_is_send_and_sync() {
    fn check<S: Send + Sync>() {}
    check::<MapleTree<u64>>();
}
