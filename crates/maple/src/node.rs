//! Node layout, the node arena and the shared node cache.
//!
//! Two node types exist, as in Linux's maple tree:
//!
//! * `Leaf` (Linux `maple_leaf_64`): 16 slots holding `Option<T>`, 15 pivots.
//! * `Arange` (Linux `maple_arange_64`): 10 child slots, 9 pivots and, per
//!   child, the size of the largest NULL range in that child's subtree.
//!
//! Pivots are inclusive upper bounds. Slot `i` covers
//! `[pivot[i-1] + 1, pivot[i]]`; slot 0 starts at the node's minimum and the
//! last used slot ends at the node's maximum (its pivot is implied). A node
//! does not store its own bounds: they are inherited from the parent while
//! walking down, exactly like Linux's `ma_state` `min`/`max`.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::MapleError;

/// Index of a node in the tree's arena.
pub(crate) type NodeId = u32;

/// Slots in a leaf node (`MAPLE_RANGE64_SLOTS`).
pub(crate) const LEAF_SLOTS: usize = 16;
/// Pivots in a leaf node.
pub(crate) const LEAF_PIVOTS: usize = LEAF_SLOTS - 1;
/// Child slots in an internal node (`MAPLE_ARANGE64_SLOTS`).
pub(crate) const ARANGE_SLOTS: usize = 10;
/// Pivots in an internal node.
pub(crate) const ARANGE_PIVOTS: usize = ARANGE_SLOTS - 1;
/// Minimum number of ranges in a non-root leaf.
pub(crate) const LEAF_MIN: usize = 6;
/// Minimum number of children of a non-root internal node.
pub(crate) const ARANGE_MIN: usize = 4;
/// Upper bound on the height. With the minimum occupancies above a tree of
/// this height would need more than 4^30 entries, far more than memory holds.
pub(crate) const MAX_HEIGHT: usize = 32;

/// Number of indices in the inclusive range `[start, last]`, saturating at
/// `u64::MAX` (only the full range `[0, u64::MAX]` saturates).
#[inline]
pub(crate) fn range_size(start: u64, last: u64) -> u64 {
    (last - start).saturating_add(1)
}

/// A leaf node: up to 16 ranges, each holding an entry or NULL.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Leaf<T> {
    /// Number of used slots (1..=16).
    pub(crate) len: u8,
    /// Inclusive upper bound of slot `i`, for `i < len - 1`.
    pub(crate) pivots: [u64; LEAF_PIVOTS],
    /// The entries; `None` is a NULL range.
    pub(crate) slots: [Option<T>; LEAF_SLOTS],
}

impl<T> Leaf<T> {
    /// Number of used slots.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len as usize
    }

    /// Slot whose range contains `index` (the index must be inside the node).
    #[inline]
    pub(crate) fn find(&self, index: u64) -> usize {
        let last = self.len() - 1;
        let mut i = 0;
        while i < last && self.pivots[i] < index {
            i += 1;
        }
        i
    }

    /// First index covered by slot `i`.
    #[inline]
    pub(crate) fn start(&self, i: usize, min: u64) -> u64 {
        if i == 0 {
            min
        } else {
            self.pivots[i - 1] + 1
        }
    }

    /// Last index (inclusive) covered by slot `i`.
    #[inline]
    pub(crate) fn last(&self, i: usize, max: u64) -> u64 {
        if i + 1 < self.len() {
            self.pivots[i]
        } else {
            max
        }
    }

    /// Size of the largest NULL range in the leaf (Linux `mas_leaf_max_gap`).
    pub(crate) fn max_gap(&self, min: u64, max: u64) -> u64 {
        let mut gap = 0;
        let mut start = min;
        for i in 0..self.len() {
            let last = self.last(i, max);
            if self.slots[i].is_none() {
                gap = gap.max(range_size(start, last));
            }
            start = last.wrapping_add(1);
        }
        gap
    }

    /// Number of non-NULL ranges.
    pub(crate) fn count_entries(&self) -> usize {
        self.slots[..self.len()]
            .iter()
            .filter(|s| s.is_some())
            .count()
    }
}

impl<T: Copy> Leaf<T> {
    /// A leaf holding a single NULL range (the root of an empty tree).
    pub(crate) fn empty() -> Self {
        Leaf {
            len: 1,
            pivots: [0; LEAF_PIVOTS],
            slots: [None; LEAF_SLOTS],
        }
    }
}

/// An internal node that tracks gaps (Linux `maple_arange_64`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Arange {
    /// Number of children (2..=10 for the root, 4..=10 otherwise).
    pub(crate) len: u8,
    /// Inclusive upper bound of child `i`, for `i < len - 1`.
    pub(crate) pivots: [u64; ARANGE_PIVOTS],
    /// Largest NULL range in each child's subtree.
    pub(crate) gaps: [u64; ARANGE_SLOTS],
    /// The children.
    pub(crate) slots: [NodeId; ARANGE_SLOTS],
}

impl Arange {
    /// Number of children.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len as usize
    }

    /// Child whose range contains `index`.
    #[inline]
    pub(crate) fn find(&self, index: u64) -> usize {
        let last = self.len() - 1;
        let mut i = 0;
        while i < last && self.pivots[i] < index {
            i += 1;
        }
        i
    }

    /// Last index (inclusive) covered by child `i`.
    #[inline]
    pub(crate) fn last(&self, i: usize, max: u64) -> u64 {
        if i + 1 < self.len() {
            self.pivots[i]
        } else {
            max
        }
    }

    /// Bounds `(min, max)` of child `i` given the node's own bounds.
    #[inline]
    pub(crate) fn bounds(&self, i: usize, min: u64, max: u64) -> (u64, u64) {
        let cmin = if i == 0 { min } else { self.pivots[i - 1] + 1 };
        (cmin, self.last(i, max))
    }

    /// Largest gap of the whole subtree (Linux `ma_max_gap`).
    #[inline]
    pub(crate) fn max_gap(&self) -> u64 {
        self.gaps[..self.len()].iter().copied().max().unwrap_or(0)
    }
}

/// An arena cell.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Node<T> {
    Leaf(Leaf<T>),
    Arange(Arange),
    /// On the free list.
    Free,
}

/// Node accounting shared by a tree and every tree duplicated from it, like
/// Linux's global `maple_node_cache`: cumulative allocation and free counters
/// plus the fail point consulted by every node allocation.
#[derive(Debug, Default)]
pub(crate) struct NodeCache {
    allocated: AtomicU64,
    freed: AtomicU64,
    attempts: AtomicU64,
    /// 0 = disarmed, otherwise the 1-based attempt number that fails.
    fail_nth: AtomicU64,
}

impl NodeCache {
    /// Accounts for one node allocation, failing if the fail point fires.
    #[inline]
    pub(crate) fn charge(&self) -> Result<(), MapleError> {
        let nth = self.fail_nth.load(Ordering::Relaxed);
        if nth != 0 {
            let attempt = self.attempts.fetch_add(1, Ordering::Relaxed) + 1;
            if attempt == nth {
                return Err(MapleError::NoMemory);
            }
        }
        self.allocated.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Accounts for `n` freed nodes.
    #[inline]
    pub(crate) fn uncharge(&self, n: u64) {
        self.freed.fetch_add(n, Ordering::Relaxed);
    }

    /// Arms (or with `None`/`Some(0)` disarms) the fail point.
    pub(crate) fn set_fail_point(&self, nth: Option<u64>) {
        self.attempts.store(0, Ordering::Relaxed);
        self.fail_nth.store(nth.unwrap_or(0), Ordering::Relaxed);
    }

    /// `(allocated, freed)` so far.
    pub(crate) fn counters(&self) -> (u64, u64) {
        (
            self.allocated.load(Ordering::Relaxed),
            self.freed.load(Ordering::Relaxed),
        )
    }
}

/// One level of a walk: the node at that level, its bounds and the slot
/// taken (for internal nodes: the child leading to the level below).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Step {
    pub(crate) node: NodeId,
    pub(crate) idx: u32,
    pub(crate) min: u64,
    pub(crate) max: u64,
}

/// Root-to-leaf walk, indexed by level (0 = leaves, `height - 1` = root).
/// This plays the role of Linux's `ma_state` during a write.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Path {
    pub(crate) steps: [Step; MAX_HEIGHT],
}

impl Path {
    pub(crate) fn new() -> Self {
        Path {
            steps: [Step::default(); MAX_HEIGHT],
        }
    }
}

impl<T> crate::MapleTree<T> {
    /// The leaf `id`.
    #[inline]
    pub(crate) fn leaf(&self, id: NodeId) -> &Leaf<T> {
        match &self.nodes[id as usize] {
            Node::Leaf(l) => l,
            _ => unreachable!("invariant: node {id} is a leaf"),
        }
    }

    /// The internal node `id`.
    #[inline]
    pub(crate) fn arange(&self, id: NodeId) -> &Arange {
        match &self.nodes[id as usize] {
            Node::Arange(a) => a,
            _ => unreachable!("invariant: node {id} is an internal node"),
        }
    }

    /// The internal node `id`, mutably.
    #[inline]
    pub(crate) fn arange_mut(&mut self, id: NodeId) -> &mut Arange {
        match &mut self.nodes[id as usize] {
            Node::Arange(a) => a,
            _ => unreachable!("invariant: node {id} is an internal node"),
        }
    }

    /// Number of used slots of node `id`.
    #[inline]
    pub(crate) fn node_len(&self, id: NodeId) -> usize {
        match &self.nodes[id as usize] {
            Node::Leaf(l) => l.len(),
            Node::Arange(a) => a.len(),
            Node::Free => unreachable!("invariant: node {id} is live"),
        }
    }

    /// The single node allocator: every node of every tree comes from here,
    /// and here the fail point is consulted.
    pub(crate) fn alloc_node(&mut self, node: Node<T>) -> Result<NodeId, MapleError> {
        self.cache.charge()?;
        self.live += 1;
        if let Some(id) = self.free.pop() {
            self.nodes[id as usize] = node;
            Ok(id)
        } else {
            let id = NodeId::try_from(self.nodes.len()).expect("invariant: fewer than 2^32 nodes");
            self.nodes.push(node);
            Ok(id)
        }
    }

    /// Returns node `id` to the free list.
    pub(crate) fn free_node(&mut self, id: NodeId) {
        debug_assert!(
            !matches!(self.nodes[id as usize], Node::Free),
            "double free of node {id}"
        );
        self.nodes[id as usize] = Node::Free;
        self.free.push(id);
        self.live -= 1;
        self.cache.uncharge(1);
    }

    /// Walks from the root to the leaf range containing `index`, recording
    /// every level in `path`.
    #[inline]
    pub(crate) fn walk(&self, index: u64, path: &mut Path) {
        let mut id = self.root;
        let mut min = 0;
        let mut max = u64::MAX;
        let mut level = self.height as usize;
        loop {
            level -= 1;
            match &self.nodes[id as usize] {
                Node::Arange(n) => {
                    let i = n.find(index);
                    path.steps[level] = Step {
                        node: id,
                        idx: i as u32,
                        min,
                        max,
                    };
                    (min, max) = n.bounds(i, min, max);
                    id = n.slots[i];
                }
                Node::Leaf(n) => {
                    let i = n.find(index);
                    path.steps[level] = Step {
                        node: id,
                        idx: i as u32,
                        min,
                        max,
                    };
                    debug_assert_eq!(level, 0);
                    return;
                }
                Node::Free => unreachable!("invariant: walk reaches live nodes only"),
            }
        }
    }

    /// `(start, last, entry)` of the range containing `index`.
    #[inline]
    pub(crate) fn range_at(&self, index: u64) -> (u64, u64, Option<&T>) {
        let mut id = self.root;
        let mut min = 0;
        let mut max = u64::MAX;
        loop {
            match &self.nodes[id as usize] {
                Node::Arange(n) => {
                    let i = n.find(index);
                    (min, max) = n.bounds(i, min, max);
                    id = n.slots[i];
                }
                Node::Leaf(n) => {
                    let i = n.find(index);
                    return (n.start(i, min), n.last(i, max), n.slots[i].as_ref());
                }
                Node::Free => unreachable!("invariant: walk reaches live nodes only"),
            }
        }
    }

    /// The node at `level` before the one `path` points to at that level
    /// (possibly under another parent), with the path re-pointed to it.
    pub(crate) fn prev_node(&self, path: &Path, level: usize) -> Option<Path> {
        let top = self.height as usize - 1;
        let mut j = level + 1;
        while j <= top && path.steps[j].idx == 0 {
            j += 1;
        }
        if j > top {
            return None;
        }
        let mut p = *path;
        p.steps[j].idx -= 1;
        for k in (level..j).rev() {
            let parent = p.steps[k + 1];
            let n = self.arange(parent.node);
            let i = parent.idx as usize;
            let (min, max) = n.bounds(i, parent.min, parent.max);
            let child = n.slots[i];
            let idx = self.node_len(child) as u32 - 1;
            p.steps[k] = Step {
                node: child,
                idx,
                min,
                max,
            };
        }
        Some(p)
    }

    /// The node at `level` after the one `path` points to at that level.
    pub(crate) fn next_node(&self, path: &Path, level: usize) -> Option<Path> {
        let top = self.height as usize - 1;
        let mut j = level + 1;
        while j <= top && path.steps[j].idx as usize + 1 >= self.node_len(path.steps[j].node) {
            j += 1;
        }
        if j > top {
            return None;
        }
        let mut p = *path;
        p.steps[j].idx += 1;
        for k in (level..j).rev() {
            let parent = p.steps[k + 1];
            let n = self.arange(parent.node);
            let i = parent.idx as usize;
            let (min, max) = n.bounds(i, parent.min, parent.max);
            p.steps[k] = Step {
                node: n.slots[i],
                idx: 0,
                min,
                max,
            };
        }
        Some(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf(ranges: &[(u64, Option<u8>)]) -> Leaf<u8> {
        let mut l = Leaf::empty();
        l.len = ranges.len() as u8;
        for (i, &(last, e)) in ranges.iter().enumerate() {
            if i + 1 < ranges.len() {
                l.pivots[i] = last;
            }
            l.slots[i] = e;
        }
        l
    }

    #[test]
    fn leaf_slots_cover_consecutive_ranges() {
        let l = leaf(&[(9, None), (19, Some(1)), (99, None)]);
        assert_eq!(l.find(0), 0);
        assert_eq!(l.find(10), 1);
        assert_eq!(l.find(u64::MAX), 2);
        assert_eq!((l.start(1, 0), l.last(1, 99)), (10, 19));
        assert_eq!(l.last(2, 99), 99, "the last slot ends at the node max");
        assert_eq!(l.max_gap(0, 99), 80);
        assert_eq!(l.count_entries(), 1);
    }

    #[test]
    fn full_range_gap_saturates() {
        let l: Leaf<u8> = Leaf::empty();
        assert_eq!(l.max_gap(0, u64::MAX), u64::MAX);
        assert_eq!(range_size(5, 5), 1);
    }

    #[test]
    fn fail_point_counts_attempts_from_arming() {
        let c = NodeCache::default();
        c.charge().expect("disarmed");
        c.set_fail_point(Some(2));
        c.charge().expect("first attempt");
        assert_eq!(c.charge(), Err(MapleError::NoMemory));
        c.charge().expect("fires once");
        c.uncharge(1);
        assert_eq!(c.counters(), (3, 1));
    }
}
