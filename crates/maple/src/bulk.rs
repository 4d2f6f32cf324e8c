//! Bulk loading in index order: the way `dup_mmap()` built a child's VMA tree
//! before `__mt_dup` (Linux 6.1–6.5: `mas_expected_entries()`, stores with
//! the maple state in bulk mode, `mas_destroy()`).
//!
//! # What Linux does
//!
//! Restated from `lib/maple_tree.c` of that era (not translated):
//!
//! * `mas_expected_entries(mas, n)` puts the maple state in bulk mode and
//!   preallocates, assuming a NULL gap between every two entries plus a
//!   trailing NULL (`2n + 1` ranges), `ceil((2n + 1) / 14)` leaves (16 slots
//!   less 2 of slack), `ceil(leaves / 8)` internal nodes (10 slots less 2) and
//!   3 more nodes of working room. [`bulk_prealloc_nodes`] is that count.
//! * `dup_mmap()` clears the tree's RCU mode, so nodes a split replaces go
//!   back to the maple state's pool and are reused: the slab sees only the
//!   preallocation (unless the estimate runs out).
//! * Each VMA is stored in address order, so it always lands in the trailing
//!   NULL range `[prev_end, ULONG_MAX]` of the rightmost leaf: it adds the
//!   NULL gap before it (if any) and itself, 2 or 1 ranges. The leaf is
//!   rewritten in place while it holds at most 16 ranges.
//! * When it would hold 17 or 18, `mas_split()` runs, level by level upwards,
//!   on the node being overfilled (always the rightmost of its level, whose
//!   maximum is `ULONG_MAX`):
//!   1. push left (`mas_push_data`): if the node has a left sibling under the
//!      same parent and both together hold fewer than `2 * slots - 2` (less
//!      one more for leaves, less one more for a node ending at `ULONG_MAX`)
//!      "ends" (last offsets: 28 for leaves, 17 for internal nodes), the two
//!      are redistributed with the left one taking `slots - 1` (15 ranges, or
//!      16 / 14 so that it does not end in a NULL range; 9 children). The
//!      parent keeps its number of children and the split stops there.
//!   2. otherwise the bulk split (`mab_calc_split` with `MA_STATE_BULK`): the
//!      right node gets just the minimum (`mt_min_slots`: 6 ranges, 4
//!      children) or one more for a leaf whose left part would end in a NULL
//!      range; the left node gets the rest (10 or 11 ranges, 7 children) and
//!      the parent gains a child, possibly overflowing in turn. A root split
//!      adds a level. A leaf split also flags `MA_STATE_REBALANCE`.
//!
//!   Completed leaves therefore end up full (16 ranges when the entries have
//!   gaps, 15 when they are contiguous) and completed internal nodes hold 9
//!   children, instead of the even split of ordinary stores.
//! * `mas_destroy()` rebalances the rightmost leaf with its left sibling when
//!   the flag is set and the leaf holds fewer than 5 ranges (the left one
//!   keeps 9, or 10 to avoid ending in NULL, and gives the rest), then frees
//!   the unused preallocated nodes.
//!
//! # This model
//!
//! The load first replays those rules on node *sizes* only (the [`Plan`]),
//! which fixes the shape Linux would produce, then writes each node exactly
//! once. The preallocation is charged up front through the single node
//! allocator (so the fail point can fire there, before any entry is
//! consumed), the finished tree takes its nodes from that pool, a pool that
//! is too small is topped up through the same allocator, and the unused part
//! is freed at the end, as `mas_destroy()` does. The transient nodes a Linux
//! split juggles come from and return to the pool, so they change nothing
//! that is counted. After a successful load, `TreeStats::allocated` grew by
//! `max(bulk_prealloc_nodes(expected), nodes of the new tree)` and
//! `allocated - freed` equals the tree's node count.
//!
//! For appends into an initially empty tree the rightmost leaf never holds
//! fewer than 6 ranges after a split and internal nodes never fewer than 4,
//! so the result meets the crate's occupancy minimums and `mas_destroy()`'s
//! rebalance never fires; it is kept (and unit-tested) for fidelity.

use core::fmt::Debug;

use crate::node::{
    Arange, Leaf, Node, NodeId, ARANGE_MIN, ARANGE_PIVOTS, ARANGE_SLOTS, LEAF_MIN, LEAF_PIVOTS,
    LEAF_SLOTS, MAX_HEIGHT,
};
use crate::{MapleError, MapleTree};

/// Number of nodes Linux's `mas_expected_entries(mas, expected)` preallocates
/// for a range-allocation (gap-tracking) tree: room for `2 * expected + 1`
/// ranges in leaves filled to 14, internal nodes filled to 8, plus 3.
pub fn bulk_prealloc_nodes(expected: usize) -> usize {
    let ranges = expected.saturating_mul(2).saturating_add(1);
    let leaves = ranges.div_ceil(LEAF_SLOTS - 2);
    let internal = leaves.div_ceil(ARANGE_SLOTS - 2);
    leaves + internal + 3
}

/// Leaves hold fewer than this many ranges before `mas_destroy()` rebalances
/// them (its test is `count < mt_min_slots - 1`).
const DESTROY_REBALANCE_BELOW: usize = LEAF_MIN - 1;

/// The shape of the tree being loaded: node sizes per level (0 = leaves, in
/// ranges; above, in children), in index order. The last node of each level
/// is the rightmost one, the only one appends touch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    pub(crate) levels: Vec<Vec<u8>>,
    /// Index (in the global range sequence) of the rightmost leaf's first
    /// range.
    tail_start: usize,
}

impl Plan {
    /// The empty tree: one leaf holding the NULL range `[0, u64::MAX]`.
    pub(crate) fn new() -> Self {
        Plan {
            levels: vec![vec![1]],
            tail_start: 0,
        }
    }

    /// Total number of nodes.
    pub(crate) fn nodes(&self) -> usize {
        self.levels.iter().map(Vec::len).sum()
    }

    /// Appends `added` ranges to the rightmost leaf (which already ends with
    /// the trailing NULL range: the entry splits it) and splits as Linux's bulk
    /// mode does. `is_null(g)` tells whether range `g` of the global sequence
    /// (the trailing NULL included) is NULL.
    pub(crate) fn append(&mut self, added: u8, is_null: impl Fn(usize) -> bool) {
        let tail = self.levels[0].last_mut().expect("invariant: a leaf exists");
        *tail += added;
        if usize::from(*tail) <= LEAF_SLOTS {
            return;
        }
        let mut level = 0;
        loop {
            let (cap, min) = if level == 0 {
                (LEAF_SLOTS, LEAF_MIN)
            } else {
                (ARANGE_SLOTS, ARANGE_MIN)
            };
            let nodes = &self.levels[level];
            let count = usize::from(nodes[nodes.len() - 1]);
            if count <= cap {
                return;
            }
            let has_parent = level + 1 < self.levels.len();
            let has_left =
                has_parent && *self.levels[level + 1].last().expect("invariant: parent") >= 2;
            if has_left && self.push_left(level, count, cap, min, &is_null) {
                return;
            }
            // Bulk split: the right node keeps the minimum.
            let mut last = count - 1 - min;
            if level == 0 && is_null(self.tail_start + last) {
                last -= 1;
            }
            let left = last + 1;
            let nodes = &mut self.levels[level];
            *nodes.last_mut().expect("invariant: node") = left as u8;
            nodes.push((count - left) as u8);
            if level == 0 {
                self.tail_start += left;
            }
            if has_parent {
                *self.levels[level + 1]
                    .last_mut()
                    .expect("invariant: parent") += 1;
                level += 1;
            } else {
                assert!(
                    self.levels.len() < MAX_HEIGHT,
                    "invariant: height stays below {MAX_HEIGHT}"
                );
                self.levels.push(vec![2]);
                return;
            }
        }
    }

    /// `mas_push_data` to the left for the rightmost node of `level`, which
    /// holds `count` (> `cap`) items; `false` if there is no room.
    fn push_left(
        &mut self,
        level: usize,
        count: usize,
        cap: usize,
        min: usize,
        is_null: &impl Fn(usize) -> bool,
    ) -> bool {
        let nodes = &self.levels[level];
        let n = nodes.len();
        let left_count = usize::from(nodes[n - 2]);
        // Linux compares the sum of the two last offsets with
        // 2 * slots - 2, less one for leaves and one for a node ending at
        // ULONG_MAX (the rightmost always does).
        let space = 2 * cap - 2 - usize::from(level == 0) - 1;
        if (count - 1) + (left_count - 1) >= space {
            return false;
        }
        let total = left_count + count;
        let mut last = cap - 2;
        let left_start = self.tail_start - left_count;
        if level == 0 && is_null(left_start + last) {
            last = if last < cap - 1 && total - 1 - last > min {
                last + 1
            } else {
                last - 1
            };
        }
        let nodes = &mut self.levels[level];
        nodes[n - 2] = (last + 1) as u8;
        nodes[n - 1] = (total - last - 1) as u8;
        if level == 0 {
            self.tail_start = left_start + last + 1;
        }
        true
    }

    /// `mas_destroy()`'s final rebalance of the rightmost leaf.
    pub(crate) fn destroy_rebalance(&mut self, is_null: impl Fn(usize) -> bool) {
        if self.levels.len() < 2 || *self.levels[1].last().expect("invariant: root") < 2 {
            return;
        }
        let leaves = &self.levels[0];
        let n = leaves.len();
        let count = usize::from(leaves[n - 1]);
        if count >= DESTROY_REBALANCE_BELOW {
            return;
        }
        let left_count = usize::from(leaves[n - 2]);
        let left_start = self.tail_start - left_count;
        let mut last = LEAF_SLOTS / 2;
        if is_null(left_start + last) {
            last += 1;
        }
        if last + 1 >= left_count {
            return;
        }
        let leaves = &mut self.levels[0];
        leaves[n - 2] = (last + 1) as u8;
        leaves[n - 1] = (count + left_count - last - 1) as u8;
        self.tail_start = left_start + last + 1;
    }
}

impl<T: Copy + Eq + Debug> MapleTree<T> {
    /// Builds a tree from `(start, end_exclusive, entry)` ranges given in
    /// ascending, non-overlapping order, as Linux's bulk mode builds one
    /// (`mas_expected_entries(expected)`, in-order stores, `mas_destroy()`;
    /// see the `bulk` module). `expected` is the number of entries announced
    /// up front (Linux passes `oldmm->map_count`); it only sizes the
    /// preallocation.
    ///
    /// # Errors
    /// [`MapleError::NoMemory`] if a node allocation fails;
    /// [`MapleError::InvalidRange`] for an empty range or one that does not
    /// start at or after the end of the previous one.
    pub fn from_sorted_bulk(
        entries: impl IntoIterator<Item = (u64, u64, T)>,
        expected: usize,
    ) -> Result<Self, MapleError> {
        let mut tree = Self::new();
        tree.load_sorted_bulk(entries, expected)?;
        Ok(tree)
    }

    /// Replaces the whole content of the tree with `entries`, built in bulk
    /// mode like [`MapleTree::from_sorted_bulk`], allocating from this tree's
    /// node cache (so its fail point and counters apply).
    ///
    /// The [`bulk_prealloc_nodes`]`(expected)` nodes are allocated before
    /// `entries` is iterated; if that fails, `entries` is never consumed. On
    /// any error the tree is unchanged and every node allocated by the load
    /// has been freed.
    ///
    /// # Errors
    /// As [`MapleTree::from_sorted_bulk`].
    pub fn load_sorted_bulk(
        &mut self,
        entries: impl IntoIterator<Item = (u64, u64, T)>,
        expected: usize,
    ) -> Result<(), MapleError> {
        // mas_expected_entries(): preallocate.
        let mut pool: Vec<NodeId> = Vec::with_capacity(bulk_prealloc_nodes(expected));
        for _ in 0..pool.capacity() {
            match self.alloc_node(Node::Leaf(Leaf::empty())) {
                Ok(id) => pool.push(id),
                Err(e) => {
                    self.free_pool(&mut pool);
                    return Err(e);
                }
            }
        }

        // In-order stores: record the ranges, replay the splits on sizes.
        let mut ranges: Vec<(u64, Option<T>)> = Vec::with_capacity(2 * expected + 1);
        let mut plan = Plan::new();
        let mut next = 0u64;
        let mut len = 0;
        for (start, end, entry) in entries {
            if start >= end || start < next {
                self.free_pool(&mut pool);
                return Err(MapleError::InvalidRange { start, end });
            }
            let added = if start > next {
                ranges.push((start - 1, None));
                2
            } else {
                1
            };
            ranges.push((end - 1, Some(entry)));
            next = end;
            len += 1;
            let known = ranges.len();
            plan.append(added, |g| g >= known || ranges[g].1.is_none());
        }
        ranges.push((u64::MAX, None));
        plan.destroy_rebalance(|g| ranges[g].1.is_none());

        // Stores that outgrow the preallocation allocate as they go.
        while pool.len() < plan.nodes() {
            match self.alloc_node(Node::Leaf(Leaf::empty())) {
                Ok(id) => pool.push(id),
                Err(e) => {
                    self.free_pool(&mut pool);
                    return Err(e);
                }
            }
        }

        let (root, height) = self.write_plan(&plan, &ranges, &mut pool);
        let old = self.root;
        self.free_subtree(old);
        self.root = root;
        self.height = height;
        self.len = len;
        // mas_destroy(): give back what was not used.
        self.free_pool(&mut pool);
        Ok(())
    }

    /// Frees the nodes of a bulk-load pool.
    fn free_pool(&mut self, pool: &mut Vec<NodeId>) {
        for id in pool.drain(..) {
            self.free_node(id);
        }
    }

    /// Frees every node of the subtree rooted at `root`.
    fn free_subtree(&mut self, root: NodeId) {
        let mut stack = vec![root];
        while let Some(id) = stack.pop() {
            if let Node::Arange(a) = &self.nodes[id as usize] {
                stack.extend_from_slice(&a.slots[..a.len()]);
            }
            self.free_node(id);
        }
    }

    /// Writes the nodes of `plan` over `ranges` (which ends with the trailing
    /// NULL range) into pool cells, bottom-up; returns the root and height.
    fn write_plan(
        &mut self,
        plan: &Plan,
        ranges: &[(u64, Option<T>)],
        pool: &mut Vec<NodeId>,
    ) -> (NodeId, u32) {
        // (max, node, largest gap) of each node of the level just written.
        let mut built: Vec<(u64, NodeId, u64)> = Vec::with_capacity(plan.levels[0].len());
        let mut at = 0;
        let mut min = 0u64;
        for &size in &plan.levels[0] {
            let size = usize::from(size);
            let part = &ranges[at..at + size];
            let mut pivots = [0; LEAF_PIVOTS];
            let mut slots = [None; LEAF_SLOTS];
            for (i, &(last, entry)) in part.iter().enumerate() {
                if i + 1 < size {
                    pivots[i] = last;
                }
                slots[i] = entry;
            }
            let leaf = Leaf {
                len: size as u8,
                pivots,
                slots,
            };
            let max = part[size - 1].0;
            let gap = leaf.max_gap(min, max);
            let id = pool.pop().expect("invariant: the pool holds the plan");
            self.nodes[id as usize] = Node::Leaf(leaf);
            built.push((max, id, gap));
            at += size;
            min = max.wrapping_add(1);
        }
        debug_assert_eq!(at, ranges.len());
        for level in &plan.levels[1..] {
            let mut parents = Vec::with_capacity(level.len());
            let mut at = 0;
            for &size in level {
                let size = usize::from(size);
                let part = &built[at..at + size];
                let mut node = Arange {
                    len: size as u8,
                    pivots: [0; ARANGE_PIVOTS],
                    gaps: [0; ARANGE_SLOTS],
                    slots: [0; ARANGE_SLOTS],
                };
                for (i, &(max, child, gap)) in part.iter().enumerate() {
                    if i + 1 < size {
                        node.pivots[i] = max;
                    }
                    node.slots[i] = child;
                    node.gaps[i] = gap;
                }
                let gap = node.max_gap();
                let id = pool.pop().expect("invariant: the pool holds the plan");
                self.nodes[id as usize] = Node::Arange(node);
                parents.push((part[size - 1].0, id, gap));
                at += size;
            }
            debug_assert_eq!(at, built.len());
            built = parents;
        }
        debug_assert_eq!(built.len(), 1, "a single root");
        (built[0].1, plan.levels.len() as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Plans `n` entries, each preceded by a gap when `gaps`.
    fn plan(n: usize, gaps: bool) -> Plan {
        let mut p = Plan::new();
        let mut null = vec![];
        for i in 0..n {
            let gap = i == 0 || gaps;
            if gap {
                null.push(true);
            }
            null.push(false);
            let known = null.len();
            p.append(if gap { 2 } else { 1 }, |g| g >= known || null[g]);
        }
        p
    }

    #[test]
    fn prealloc_matches_mas_expected_entries() {
        // ceil(13 / 14) = 1 leaf, ceil(1 / 8) = 1 internal, + 3.
        assert_eq!(bulk_prealloc_nodes(6), 5);
        assert_eq!(bulk_prealloc_nodes(0), 5);
        // 12843 ranges: 918 leaves, 115 internal nodes, + 3.
        assert_eq!(bulk_prealloc_nodes(6421), 1036);
    }

    #[test]
    fn first_leaf_split_keeps_the_minimum_on_the_right() {
        // 7 gapped entries: N E N E ... E N = 15 ranges; the 8th makes 17.
        let p = plan(8, true);
        // Bulk split of 17: the last offset 16 - 6 = 10 is a NULL range, so
        // the left leaf ends at offset 9 (10 ranges), the right holds 7.
        assert_eq!(p.levels, vec![vec![10, 7], vec![2]]);
    }

    #[test]
    fn push_left_fills_the_left_leaf() {
        // Contiguous: 1 leading NULL + entries + trailing NULL.
        let p = plan(15, false);
        // 17 ranges, offset 10 is an entry: 11 + 6.
        assert_eq!(p.levels, vec![vec![11, 6], vec![2]]);
        let p = plan(25, false);
        assert_eq!(p.levels, vec![vec![11, 16], vec![2]]);
        // The right leaf reaches 17: 16 + 10 offsets < 28, pushed left.
        let p = plan(26, false);
        assert_eq!(p.levels, vec![vec![15, 13], vec![2]]);
        let p = plan(100, true);
        assert!(p.levels[0][..p.levels[0].len() - 2]
            .iter()
            .all(|&s| usize::from(s) == LEAF_SLOTS));
    }

    #[test]
    fn internal_nodes_split_seven_four_then_fill_to_nine() {
        let p = plan(6421, true);
        let sizes: Vec<usize> = p.levels.iter().map(Vec::len).collect();
        assert_eq!(sizes, vec![803, 90, 10, 1]);
        let inner = &p.levels[1];
        assert!(inner[..inner.len() - 2].iter().all(|&s| s == 9));
        assert_eq!(&inner[inner.len() - 2..], &[7, 4]);
    }

    #[test]
    fn destroy_rebalance_refills_a_thin_last_leaf() {
        let mut p = Plan {
            levels: vec![vec![16, 16, 3], vec![3]],
            tail_start: 32,
        };
        // The left leaf starts at 16; its offset 8 (range 24) is an entry:
        // it keeps 9 and gives 7.
        p.destroy_rebalance(|g| g % 2 == 1);
        assert_eq!(p.levels[0], vec![16, 9, 10]);
        assert_eq!(p.tail_start, 25);
        let mut p = Plan {
            levels: vec![vec![16, 16, 3], vec![3]],
            tail_start: 32,
        };
        // Offset 8 is NULL: it keeps 10.
        p.destroy_rebalance(|g| g % 2 == 0);
        assert_eq!(p.levels[0], vec![16, 10, 9]);
        let mut p = Plan {
            levels: vec![vec![16, 6], vec![2]],
            tail_start: 16,
        };
        p.destroy_rebalance(|_| false);
        assert_eq!(p.levels[0], vec![16, 6], "6 ranges are enough");
    }
}
