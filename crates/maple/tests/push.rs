//! Overflowing stores push into a sibling before splitting (Linux `mas_split`
//! trying `mas_push_data` left, then right): tree shapes against an
//! independent replay of Linux's rules, validity under random stores, and
//! failure injection on the push path.

use std::collections::BTreeMap;

use maple::{MapleError, MapleTree};

const PAGE: u64 = 0x1000;
/// Where top-down placements start (the engine's `mmap_base` region).
const TOP: u64 = 0x7fff_0000_0000;

// ---------------------------------------------------------------------------
// Replay: Linux's write path for entries stored into free space.
//
// Restated from lib/maple_tree.c (a 2025 mainline with `mas_wr_store_type`):
// a store that leaves a leaf with more than 16 ranges is a split store.
// Going up from the leaf, a node with too much content first tries its
// previous sibling under the same parent, then its next one: the push is
// taken when the two big-node ends (item count - 1 each) add up to less than
// 2 * slots - 2, minus one for a leaf, minus one more when the overflowing
// node ends at ULONG_MAX. The sibling receiving the push is filled to
// slots - 1 items, moved by one item when that would end the left node on a
// NULL range. The parent keeps its child count and the write stops there.
// Otherwise the content is split at the middle (the left node taking the odd
// item), moved off a NULL range, and the two halves go up as the parent's new
// children; a split root grows the tree. (The `mab_calc_split` rule that
// moves the split right over ranges spanning fewer than 15 indices never
// fires with page-sized ranges and is left out.)
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Item {
    Null,
    Entry,
    Child(usize),
}

/// `(inclusive last index, item)`; the last item's index is the node's max.
type Items = Vec<(u64, Item)>;

struct Replay {
    nodes: Vec<Option<Items>>,
    root: usize,
}

impl Replay {
    fn new() -> Self {
        Replay {
            nodes: vec![Some(vec![(u64::MAX, Item::Null)])],
            root: 0,
        }
    }

    fn node_count(&self) -> usize {
        self.nodes.iter().filter(|n| n.is_some()).count()
    }

    fn items(&self, id: usize) -> &Items {
        self.nodes[id].as_ref().expect("live node")
    }

    fn set(&mut self, id: usize, items: Items) {
        self.nodes[id] = Some(items);
    }

    fn alloc(&mut self, items: Items) -> usize {
        self.nodes.push(Some(items));
        self.nodes.len() - 1
    }

    /// Stores an entry over `[s, l]`, which must lie inside one NULL range.
    fn insert(&mut self, s: u64, l: u64) {
        // (node, slot taken, node max) from the root down.
        let mut path = Vec::new();
        let (mut id, mut min, mut max) = (self.root, 0u64, u64::MAX);
        loop {
            let items = self.items(id);
            let i = items
                .iter()
                .position(|&(last, _)| last >= s)
                .expect("the last item ends at the node max");
            path.push((id, i, max));
            let start = if i == 0 { min } else { items[i - 1].0 + 1 };
            let (last, item) = items[i];
            match item {
                Item::Child(c) => {
                    (id, min, max) = (c, start, last);
                }
                Item::Null => {
                    assert!(l <= last, "the store fits one NULL range");
                    let mut new = items[..i].to_vec();
                    if start < s {
                        new.push((s - 1, Item::Null));
                    }
                    new.push((l, Item::Entry));
                    if l < last {
                        new.push((last, Item::Null));
                    }
                    new.extend_from_slice(&items[i + 1..]);
                    self.write(&path, new);
                    return;
                }
                Item::Entry => panic!("[{s:#x}, {l:#x}] is not free"),
            }
        }
    }

    /// Writes `content` into the node at the end of `path`, pushing or
    /// splitting upwards.
    fn write(&mut self, path: &[(usize, usize, u64)], mut content: Items) {
        let mut d = path.len() - 1;
        let mut leaf = true;
        loop {
            let (cap, min_slots) = if leaf { (16, 6) } else { (10, 4) };
            let (id, _, max) = path[d];
            if content.len() <= cap {
                self.set(id, content);
                return;
            }
            if d > 0 && self.push(path[d - 1], id, &content, (cap, min_slots), leaf, max) {
                return;
            }
            let n = content.len();
            assert!(
                n < 2 * cap,
                "no three-way split from stores into free space"
            );
            let mut split = (n - 1) / 2;
            if content[split].1 == Item::Null {
                split = if split < cap - 1 && n - 1 - split > min_slots {
                    split + 1
                } else {
                    split - 1
                };
            }
            let right = content.split_off(split + 1);
            let (lmax, rmax) = (content[split].0, right[right.len() - 1].0);
            self.set(id, content);
            let r = self.alloc(right);
            let halves = [(lmax, Item::Child(id)), (rmax, Item::Child(r))];
            if d == 0 {
                self.root = self.alloc(halves.to_vec());
                return;
            }
            let (pid, idx, _) = path[d - 1];
            let mut parent = self.items(pid).clone();
            parent.splice(idx..=idx, halves);
            content = parent;
            d -= 1;
            leaf = false;
        }
    }

    /// `mas_push_data`, left then right; whether the content was placed.
    fn push(
        &mut self,
        (pid, idx, _): (usize, usize, u64),
        id: usize,
        content: &Items,
        (cap, min_slots): (usize, usize),
        leaf: bool,
        max: u64,
    ) -> bool {
        let siblings = self.items(pid).clone();
        let child = |k: usize| match siblings[k].1 {
            Item::Child(c) => c,
            _ => unreachable!("internal nodes hold children"),
        };
        let room = 2 * cap - 2 - usize::from(leaf) - usize::from(max == u64::MAX);
        for left in [true, false] {
            let k = if left {
                match idx.checked_sub(1) {
                    Some(k) => k,
                    None => continue,
                }
            } else if idx + 1 < siblings.len() {
                idx + 1
            } else {
                continue;
            };
            let sib = child(k);
            let other = self.items(sib);
            if (other.len() - 1) + (content.len() - 1) >= room {
                continue;
            }
            let mut all = if left { other.clone() } else { content.clone() };
            all.extend_from_slice(if left { content } else { other });
            let total = all.len();
            // Items the left node of the pair keeps.
            let mut keep = if left { cap - 1 } else { total - cap + 1 };
            if all[keep - 1].1 == Item::Null {
                // Linux compares against its big-node end: the last index
                // after a push to the left, the item count after one to the
                // right (where moving right always wins).
                let end = if left { total - 1 } else { total };
                keep = if keep - 1 < cap - 1 && end - (keep - 1) > min_slots {
                    keep + 1
                } else {
                    keep - 1
                };
            }
            let right = all.split_off(keep);
            let (l_id, r_id, pivot_at) = if left { (sib, id, k) } else { (id, sib, idx) };
            let mut parent = siblings.clone();
            parent[pivot_at].0 = all[keep - 1].0;
            self.set(pid, parent);
            self.set(l_id, all);
            self.set(r_id, right);
            return true;
        }
        false
    }

    /// `(min, max)` of every node, level by level from the root.
    fn shape(&self) -> Vec<Vec<(u64, u64)>> {
        let mut levels = Vec::new();
        let mut current = vec![(self.root, 0u64, u64::MAX)];
        while !current.is_empty() {
            levels.push(current.iter().map(|&(_, a, b)| (a, b)).collect());
            let mut next = Vec::new();
            for &(id, min, _) in &current {
                let mut start = min;
                for &(last, item) in self.items(id) {
                    if let Item::Child(c) = item {
                        next.push((c, start, last));
                    }
                    start = last.wrapping_add(1);
                }
            }
            current = next;
        }
        levels
    }
}

// ---------------------------------------------------------------------------

fn nodes_per_level(shape: &[Vec<(u64, u64)>]) -> Vec<usize> {
    shape.iter().map(Vec::len).collect()
}

/// Stores `[start, end)` entries one by one into a tree and into the replay,
/// checking after every store that both have the same nodes; returns the
/// tree.
fn replay_check(name: &str, entries: &[(u64, u64)]) -> MapleTree<u32> {
    let mut t = MapleTree::new();
    let mut r = Replay::new();
    for (i, &(s, e)) in entries.iter().enumerate() {
        t.store_range(s, e, Some(i as u32)).expect("store");
        r.insert(s, e - 1);
        assert_eq!(
            t.shape(),
            r.shape(),
            "{name}: after store {i} [{s:#x}, {e:#x})"
        );
    }
    t.validate().expect("valid");
    assert_eq!(t.node_count(), r.node_count());
    assert_eq!(t.len(), entries.len());
    t
}

/// One-page entries every two pages from `base` upwards (mmap with
/// `MAP_FIXED` as the spawn benchmark builds its parent, or bottom-up).
fn ascending_gapped(n: u64, base: u64) -> Vec<(u64, u64)> {
    (0..n)
        .map(|i| (base + 2 * i * PAGE, base + (2 * i + 1) * PAGE))
        .collect()
}

/// Contiguous one-page entries from `base` upwards.
fn ascending_contiguous(n: u64, base: u64) -> Vec<(u64, u64)> {
    (0..n)
        .map(|i| (base + i * PAGE, base + (i + 1) * PAGE))
        .collect()
}

/// One-page entries every two pages downwards from `top` (top-down
/// placement leaving a guard page).
fn descending_gapped(n: u64, top: u64) -> Vec<(u64, u64)> {
    (0..n)
        .map(|i| (top - (2 * i + 2) * PAGE, top - (2 * i + 1) * PAGE))
        .collect()
}

/// Contiguous one-page entries downwards from `top`: what the engine's
/// `get_unmapped_area` (top-down, `empty_area_rev` below `mmap_base`) does
/// for mappings that do not merge.
fn descending_contiguous(n: u64, top: u64) -> Vec<(u64, u64)> {
    (0..n)
        .map(|i| (top - (i + 1) * PAGE, top - i * PAGE))
        .collect()
}

#[test]
fn ascending_stores_fill_nodes_as_linux_does() {
    // The spawn benchmark's parent: 21 + N one-page VMAs every 8 KiB from
    // 0x1000_0000. Node counts from the replay: each overflow of the
    // rightmost leaf (17 ranges) pushes into its left sibling, which ends
    // with 16 ranges (its 15th is a NULL gap, so it takes one more), or
    // splits it 10 + 7 when the sibling is full; internal nodes are pushed
    // to 9 children. Before pushing was implemented (even splits only) the
    // same trees had 111, 218, 859 and 1711 nodes at 21 + 400 ... 6400.
    let entries = ascending_gapped(21 + 6400, 0x1000_0000);
    let expected: [(usize, usize, Vec<usize>); 6] = [
        (21, 4, vec![1, 3]),
        (21 + 100, 19, vec![1, 2, 16]),
        (21 + 400, 60, vec![1, 6, 53]),
        (21 + 800, 118, vec![1, 2, 12, 103]),
        (21 + 3200, 454, vec![1, 5, 45, 403]),
        (21 + 6400, 904, vec![1, 10, 90, 803]),
    ];
    for (n, nodes, levels) in expected {
        let t = replay_check("ascending gapped", &entries[..n]);
        assert_eq!(t.node_count(), nodes, "{n} entries");
        assert_eq!(nodes_per_level(&t.shape()), levels, "{n} entries");
    }
}

#[test]
fn ascending_contiguous_stores_match_the_replay() {
    let t = replay_check(
        "ascending contiguous",
        &ascending_contiguous(3000, 0x1000_0000),
    );
    // 3001 ranges in leaves of 15 (pushed to slots - 1, no NULL to move off).
    assert_eq!(nodes_per_level(&t.shape()), vec![1, 3, 23, 201]);
}

#[test]
fn descending_stores_match_the_replay() {
    // Top-down placement prepends: the overflowing leaf is the leftmost one,
    // it has no left sibling and pushes right instead.
    let t = replay_check("descending gapped", &descending_gapped(3000, TOP));
    assert!(t.node_count() < 500, "{:?}", nodes_per_level(&t.shape()));
    let t = replay_check("descending contiguous", &descending_contiguous(3000, TOP));
    assert!(t.node_count() < 300, "{:?}", nodes_per_level(&t.shape()));
}

/// xorshift64*: deterministic pseudo-random numbers without dependencies.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[test]
fn random_order_inserts_match_the_replay() {
    // Entries of 1..=3 pages at random free places: pushes to both sides
    // and at every level, stores adjacent to neighbours and exact fits.
    for seed in [1u64, 0xdead_beef, 42] {
        let mut rng = Rng(seed);
        let mut t = MapleTree::new();
        let mut r = Replay::new();
        let mut used = vec![false; 6000];
        let mut stored = 0;
        for step in 0..20_000 {
            let len = 1 + rng.below(3) as usize;
            let at = 1 + rng.below((used.len() - len - 1) as u64) as usize;
            if used[at..at + len].iter().any(|&u| u) {
                continue;
            }
            used[at..at + len].iter_mut().for_each(|u| *u = true);
            let (s, e) = (at as u64 * PAGE, (at + len) as u64 * PAGE);
            t.store_range(s, e, Some(step)).expect("store");
            r.insert(s, e - 1);
            stored += 1;
            assert_eq!(t.shape(), r.shape(), "seed {seed}, step {step}");
        }
        t.validate().expect("valid");
        assert_eq!(t.len(), stored);
        assert!(t.height() >= 3, "seed {seed}");
    }
}

#[test]
fn a_push_replaces_two_nodes_with_two_fresh_ones() {
    let entries = ascending_gapped(400, 0x1000_0000);
    let mut t = MapleTree::new();
    let mut pushes = 0;
    for (i, &(s, e)) in entries.iter().enumerate() {
        let (before, nodes) = (t.stats(), t.node_count());
        t.store_range(s, e, Some(i as u32)).expect("store");
        let after = t.stats();
        if after.allocated > before.allocated && t.node_count() == nodes {
            // Both leaves of the pair are rebuilt through the allocator; the
            // parent is rewritten in place.
            assert_eq!(after.allocated - before.allocated, 2, "store {i}");
            assert_eq!(after.freed - before.freed, 2, "store {i}");
            pushes += 1;
        }
    }
    t.validate().expect("valid");
    assert!(pushes > 20, "{pushes} pushes");
}

#[test]
fn failed_pushes_leave_the_tree_unchanged() {
    for entries in [
        ascending_gapped(700, 0x1000_0000),
        descending_gapped(700, TOP),
    ] {
        let mut t = MapleTree::new();
        let mut failures = 0;
        for (i, &(s, e)) in entries.iter().enumerate() {
            let shape = t.shape();
            let content: Vec<_> = t.iter().collect();
            let stats = t.stats();
            let mut n = 1;
            loop {
                t.set_fail_point(Some(n));
                match t.store_range(s, e, Some(i as u32)) {
                    Err(MapleError::NoMemory) => {
                        t.validate().expect("valid after failure");
                        assert_eq!(t.shape(), shape);
                        assert!(t.iter().eq(content.iter().copied()));
                        let now = t.stats();
                        assert_eq!(now.allocated - now.freed, stats.allocated - stats.freed);
                        failures += 1;
                        n += 1;
                    }
                    Err(e) => panic!("unexpected {e}"),
                    Ok(()) => break,
                }
            }
            t.set_fail_point(None);
        }
        t.validate().expect("valid");
        assert!(failures > 100, "{failures}");
    }
}

#[test]
fn random_stores_over_a_pushed_tree_stay_valid() {
    // Overwrites, erases (rebalancing, spanning) and inserts on trees shaped
    // by pushes, against a page map.
    const PAGES: usize = 8000;
    for seed in [7u64, 0x1234_5678, 99] {
        let mut rng = Rng(seed);
        let mut t = MapleTree::new();
        let mut pages: Vec<Option<u32>> = vec![None; PAGES];
        for (i, (s, e)) in ascending_gapped(2500, 0).into_iter().enumerate() {
            t.store_range(s, e, Some(i as u32)).expect("store");
            pages[(s / PAGE) as usize] = Some(i as u32);
        }
        for step in 0..4000u32 {
            let len = match rng.below(10) {
                0 => 1 + rng.below(600),
                1..=3 => 1 + rng.below(20),
                _ => 1 + rng.below(3),
            } as usize;
            let at = rng.below((PAGES - len) as u64) as usize;
            let v = (rng.below(4) != 0).then_some(100_000 + step);
            t.store_range(at as u64 * PAGE, (at + len) as u64 * PAGE, v)
                .expect("store");
            pages[at..at + len].iter_mut().for_each(|p| *p = v);
            if let Err(e) = t.validate() {
                panic!("seed {seed}, step {step}: {e}");
            }
        }
        // Entries are ranges of equal consecutive pages (a value is never
        // stored twice apart, so no two entries hold the same one).
        let mut want: BTreeMap<u64, (u64, u32)> = BTreeMap::new();
        let mut i = 0;
        while i < PAGES {
            match pages[i] {
                None => i += 1,
                Some(v) => {
                    let start = i;
                    while i < PAGES && pages[i] == Some(v) {
                        i += 1;
                    }
                    want.insert(start as u64 * PAGE, (i as u64 * PAGE, v));
                }
            }
        }
        let got: Vec<_> = t.iter().collect();
        let want: Vec<_> = want.into_iter().map(|(s, (e, v))| (s, e, v)).collect();
        assert_eq!(got, want, "seed {seed}");
    }
}
