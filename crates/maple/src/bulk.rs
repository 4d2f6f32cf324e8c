//! Bulk loading in index order: the way `dup_mmap()` built a child's VMA tree
//! before `__mt_dup` (Linux 6.1 until then, the seed's baseline
//! next-20230829 among them: `mas_expected_entries()`, stores with the maple
//! state in bulk mode, `mas_destroy()`).
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
//!   written in place while it holds at most 16 ranges.
//!
//! ## One store, step by step (next-20230829)
//!
//! The replay follows 6.5.0-next-20230829, the kernel seed 001 measured
//! against. Its store path differs from 6.5's in one place for these loads:
//! 6.5's `mas_wr_append()` adds one range only, so every VMA after a gap
//! (two new ranges) went through `mas_wr_node_store()`, a rebuild of the
//! leaf in a scratch node copied back; next-20230829 appends both in place.
//!
//! * The walk. `dup_mmap()` stores each copy with `vma_iter_bulk_store()`
//!   (`mm/internal.h`): it sets the maple state's range to the VMA and calls
//!   `mas_store()`. `mas_wr_store_setup()` keeps an active state whose range
//!   ends within the node it points to, and the rightmost leaf ends at
//!   `ULONG_MAX`, so every store walks from the leaf the previous one left
//!   (also after a split, which re-walks to the leaf of the stored index):
//!   `mas_wr_walk()` scans the leaf's pivots from the previous offset to the
//!   trailing NULL range, `mas_wr_end_piv()` and `mas_wr_new_end()` size the
//!   result (`new_end`: the last offset after the store: the current end,
//!   plus one as the store starts past the range's start, plus one as it
//!   ends before the range's end, less the offsets it overwrites).
//! * `mas_wr_modify()` then picks, in this order: a direct replacement (the
//!   range matches a slot exactly; never here), the slow path when
//!   `new_end` reaches the node's 16 slots, `mas_wr_append(wr_mas, new_end)`,
//!   a slot store when the end does not move (never here), otherwise
//!   `mas_wr_node_store()`. The append gives up unless the store is in the
//!   node's last range (`mas->offset == node_end`) and, where it has the
//!   check that keeps RCU readers from seeing a moving end, when the tree is
//!   in RCU mode (a fix of August 2023); `dup_mmap()` copies with RCU mode
//!   off (`mt_clear_in_rcu()`), so the check changes nothing here. Every
//!   store of this load is in the trailing NULL range of the rightmost leaf,
//!   so every one that fits is an append; `mas_wr_node_store()` is never
//!   reached.
//! * `mas_wr_append()` works in place. When `new_end` is below the last
//!   pivot's offset (15), it first copies the old end's pivot to offset
//!   `new_end` and records `new_end` in the node's metadata (`ma_set_meta`;
//!   a full leaf has none). Then, for one new range (`new_end == end + 1`, a
//!   VMA that starts where the previous one ended: "append to start of
//!   range") the entry takes the trailing NULL range's slot up to its end and
//!   the NULL moves one slot right; for two (`new_end == end + 2`, a VMA
//!   after a gap: "append to the range without touching any boundaries",
//!   added in the 6.6 cycle by "maple_tree: optimize mas_wr_append(), also
//!   improve duplicating VMAs") the NULL goes into slot `new_end`, the entry
//!   into `end + 1` with its last index as pivot, and the old end's pivot
//!   becomes the gap's last index. As the old content was NULL it then
//!   updates the gaps (`mas_update_gap`), as 6.5's node store did.
//! * `mas_update_gap()` computes the leaf's largest NULL range by scanning
//!   it (`mas_leaf_max_gap`) and compares it with the gap the parent records
//!   for this child; if they differ, `mas_parent_gap()` writes the slot and
//!   climbs: it stops when the parent's largest gap (its offset kept in the
//!   node's metadata) did not change, otherwise it updates that offset
//!   (rescanning the gaps when the largest one shrank) and goes on with the
//!   parent's own parent, up to the root. In a tree of VMAs the trailing
//!   NULL range is the largest gap of every node on the rightmost path and
//!   every store shrinks it, so each store writes one gap slot per level
//!   above the leaf. (next-20230829 also has "maple_tree: don't use
//!   MAPLE_ARANGE64_META_MAX to indicate no gap", which changes only the
//!   offset a node without any gap records; the nodes of the rightmost path
//!   always have one, so these updates are 6.5's.)
//! * When `new_end` reaches 16 the store takes the slow path
//!   (`mas_wr_bnode`): the leaf and the new ranges are copied into a big
//!   node and `mas_split()` runs as described next, writing new nodes for
//!   both halves and the parent (taken from, and given back to, the
//!   preallocated pool), then updating the gaps from the top node it wrote.
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
//! which fixes the shape Linux would produce and so the number of nodes it
//! needs; then it replays the stores one by one on pool nodes, doing for each
//! the work listed above: the append of one or two ranges on the rightmost
//! leaf, the metadata (the node's length), the gap update climbing while the recorded gaps change, and, on
//! overflow, the split or push, which writes both halves and the parent
//! afresh and updates the gaps from there. [`StoreWork`] counts those steps.
//! Deliberate differences: the walk is not modelled (a few comparisons in
//! Linux); the first store, which in Linux expands the empty root
//! (`mas_root_expand`), is done and counted like the later ones; nodes carry
//! no metadata, so the load keeps the offset of each internal node's largest
//! gap beside the tree it builds (and a leaf's length is kept even when it is
//! full, where Linux writes no metadata); a split or push rebuilds the nodes
//! it changes from the plan's sizes rather than through a big node; `mas_destroy()`'s rebalance is not counted. The
//! preallocation is charged up front through the single node
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
    Arange, Leaf, Node, NodeId, ARANGE_MIN, ARANGE_PIVOTS, ARANGE_SLOTS, LEAF_MIN, LEAF_SLOTS,
    MAX_HEIGHT,
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

/// Work done by the stores of bulk loads ([`MapleTree::load_sorted_bulk`]),
/// summed over a tree's life (see [`MapleTree::store_work`]). Each counter
/// is named after the Linux step (next-20230829) it counts; the `bulk`
/// module describes them. Every store is either an append or part of a
/// split or push: next-20230829 never rebuilds the leaf through
/// `mas_wr_node_store` for these loads (6.5 did, for every entry after a
/// gap).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StoreWork {
    /// In-place appends (`mas_wr_append`) in the rightmost leaf: an entry
    /// that starts where the previous one ended (one new range) or after a
    /// gap (two new ranges, the gap and the entry).
    pub appends: u64,
    /// Gap slots of parents written while a changed largest gap climbs the
    /// tree (`mas_update_gap`, `mas_parent_gap`).
    pub gap_updates: u64,
    /// Nodes split in two (`mas_split`), counted per level.
    pub splits: u64,
    /// Overfull nodes shared out with their left sibling (`mas_push_data`).
    pub pushes: u64,
}

/// What one append did to the plan beyond filling the rightmost leaf.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Reshape {
    /// The rightmost nodes of levels `0..split` were split in two; level
    /// `split` took the extra child (unless pushed or new).
    pub(crate) split: usize,
    /// Level `split`'s rightmost node was overfull and shared out with its
    /// left sibling instead of splitting.
    pub(crate) pushed: bool,
    /// Level `split` is a new root holding the two halves of the old one.
    pub(crate) new_root: bool,
}

/// What the replay's node writes read: the planned sizes so far and the
/// ranges stored so far (`ranges[..known]`; the rest of the index space is
/// the trailing NULL range).
#[derive(Clone, Copy)]
struct Loaded<'a, T> {
    shape: &'a Plan,
    ranges: &'a [(u64, Option<T>)],
    known: usize,
}

/// A node of the tree being loaded, as its parent records it.
#[derive(Debug, Clone, Copy)]
struct Placed {
    id: NodeId,
    /// Last index covered (`u64::MAX` for the rightmost node of a level).
    max: u64,
    /// Largest NULL range below it.
    gap: u64,
    /// For an internal node, the offset of its child with the largest gap:
    /// the gap offset Linux keeps in the node's metadata, which nodes here
    /// do not carry.
    meta: usize,
}

/// The highest offset of the largest gap in `gaps`, and that gap, as
/// `ma_max_gap` finds them.
fn largest_gap(gaps: &[u64]) -> (usize, u64) {
    let mut best = (0, 0);
    for (k, &g) in gaps.iter().enumerate() {
        if g >= best.1 {
            best = (k, g);
        }
    }
    best
}

/// Lowest index covered by node `i` of a level.
fn min_of(level: &[Placed], i: usize) -> u64 {
    if i == 0 {
        0
    } else {
        level[i - 1].max + 1
    }
}

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
    pub(crate) fn append(&mut self, added: u8, is_null: impl Fn(usize) -> bool) -> Reshape {
        let tail = self.levels[0].last_mut().expect("invariant: a leaf exists");
        *tail += added;
        if usize::from(*tail) <= LEAF_SLOTS {
            return Reshape::default();
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
                return Reshape {
                    split: level,
                    ..Reshape::default()
                };
            }
            let has_parent = level + 1 < self.levels.len();
            let has_left =
                has_parent && *self.levels[level + 1].last().expect("invariant: parent") >= 2;
            if has_left && self.push_left(level, count, cap, min, &is_null) {
                return Reshape {
                    split: level,
                    pushed: true,
                    new_root: false,
                };
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
                return Reshape {
                    split: level + 1,
                    pushed: false,
                    new_root: true,
                };
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
    /// has been freed. The work of the stores adds to
    /// [`MapleTree::store_work`].
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

        // Check and record the ranges, replaying the splits on sizes: the
        // number of nodes the stores will need is known before any is made,
        // so the top-up below comes after `entries` and the stores never
        // fail halfway.
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

        // Stores that outgrow the preallocation allocate (Linux: as they go).
        while pool.len() < plan.nodes() {
            match self.alloc_node(Node::Leaf(Leaf::empty())) {
                Ok(id) => pool.push(id),
                Err(e) => {
                    self.free_pool(&mut pool);
                    return Err(e);
                }
            }
        }

        let (root, height) = self.replay_stores(&plan, &ranges, &mut pool);
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

    /// Replays the stores of the load one entry at a time on pool nodes, doing
    /// for each the work Linux next-20230829 does (see the module doc); returns the
    /// root and height. `ranges` ends with the trailing NULL range; `plan` is
    /// the shape the sizes-only pass found, which the replay reproduces.
    fn replay_stores(
        &mut self,
        plan: &Plan,
        ranges: &[(u64, Option<T>)],
        pool: &mut Vec<NodeId>,
    ) -> (NodeId, u32) {
        let mut work = StoreWork::default();
        let mut shape = Plan::new();
        let first = pool.pop().expect("invariant: the pool holds the plan");
        self.nodes[first as usize] = Node::Leaf(Leaf::empty());
        let mut tree = vec![vec![Placed {
            id: first,
            max: u64::MAX,
            gap: u64::MAX,
            meta: 0,
        }]];
        // `ranges[..known]` are stored; the rest of the index space is the
        // trailing NULL range of the rightmost leaf.
        let mut known = 0;
        let stored = ranges.len() - 1;
        while known < stored {
            let added: u8 = if ranges[known].1.is_none() { 2 } else { 1 };
            known += usize::from(added);
            let reshape = shape.append(added, |g| g >= known || ranges[g].1.is_none());
            if reshape == Reshape::default() {
                let leaf = tree[0].last().expect("invariant: a leaf").id;
                self.store_in_leaf(leaf, &ranges[known - usize::from(added)..known], &mut work);
                self.update_gap(&mut tree, 0, &mut work);
            } else {
                let src = Loaded {
                    shape: &shape,
                    ranges,
                    known,
                };
                self.split_or_push(&mut tree, &src, reshape, pool, &mut work);
            }
        }

        // mas_destroy(): the rebalance of a thin last leaf, if any.
        let leaves = shape.levels[0].len();
        let before = shape.levels[0][leaves.saturating_sub(2)..].to_vec();
        shape.destroy_rebalance(|g| ranges[g].1.is_none());
        if shape.levels[0][leaves.saturating_sub(2)..] != before[..] {
            let src = Loaded {
                shape: &shape,
                ranges,
                known,
            };
            self.write_node(&mut tree, &src, 0, leaves - 2);
            self.write_node(&mut tree, &src, 0, leaves - 1);
            let parent = tree[1].len() - 1;
            self.write_node(&mut tree, &src, 1, parent);
            self.update_gap(&mut tree, 1, &mut work);
        }
        debug_assert_eq!(&shape, plan, "the replay builds the planned shape");

        let w = &mut self.work;
        w.appends += work.appends;
        w.gap_updates += work.gap_updates;
        w.splits += work.splits;
        w.pushes += work.pushes;
        let root = tree.last().expect("invariant: a root level")[0].id;
        (root, tree.len() as u32)
    }

    /// One store that fits in the rightmost leaf, appended in place
    /// (`mas_wr_append`): `new` is the one or two ranges it adds (the gap
    /// before the entry, if any, and the entry), carved out of the leaf's
    /// trailing NULL range. The gap update is the caller's.
    ///
    /// The walk is not modelled: `dup_mmap()`'s maple state stays on this
    /// leaf between stores, so Linux's walk is a few pivot comparisons.
    fn store_in_leaf(&mut self, id: NodeId, new: &[(u64, Option<T>)], work: &mut StoreWork) {
        let Node::Leaf(leaf) = &mut self.nodes[id as usize] else {
            unreachable!("invariant: node {id} is a leaf");
        };
        // Offset of the trailing NULL range, whose upper bound (the node's
        // maximum) is implied: mas_wr_append's `end`.
        let end = leaf.len() - 1;
        let (last, entry) = new[new.len() - 1];
        let trailing = leaf.slots[end];
        if new.len() == 1 {
            // "Append to start of range": the entry takes the trailing
            // range's slot up to `last`, the NULL moves one slot right.
            leaf.slots[end + 1] = trailing;
            leaf.pivots[end] = last;
            leaf.slots[end] = entry;
        } else {
            // "Append to the range without touching any boundaries": the NULL
            // into slot `end + 2`, the entry into `end + 1` up to `last`, the
            // old end's pivot lowered to the gap's last index.
            leaf.slots[end + 2] = trailing;
            leaf.pivots[end + 1] = last;
            leaf.slots[end + 1] = entry;
            leaf.pivots[end] = new[0].0;
        }
        // The new end (ma_set_meta, below offset 15 only).
        leaf.len += new.len() as u8;
        work.appends += 1;
    }

    /// The slow path of a store that overfills the rightmost leaf
    /// (`mas_wr_bnode`, `mas_split`): the rightmost nodes of the levels
    /// `reshape` names are split in two (the old node keeps the left part, a
    /// pool node takes the right one), then the level above takes the new
    /// child, or is pushed into its left sibling (`mas_push_data`), or is a
    /// new root; the gap change then climbs from the last node rewritten.
    fn split_or_push(
        &mut self,
        tree: &mut Vec<Vec<Placed>>,
        src: &Loaded<'_, T>,
        reshape: Reshape,
        pool: &mut Vec<NodeId>,
        work: &mut StoreWork,
    ) {
        let new_node = |pool: &mut Vec<NodeId>| Placed {
            id: pool.pop().expect("invariant: the pool holds the plan"),
            max: u64::MAX,
            gap: 0,
            meta: 0,
        };
        for level in 0..reshape.split {
            tree[level].push(new_node(pool));
            let n = tree[level].len();
            self.write_node(tree, src, level, n - 2);
            self.write_node(tree, src, level, n - 1);
            work.splits += 1;
        }
        let level = reshape.split;
        if reshape.new_root {
            tree.push(vec![new_node(pool)]);
            self.write_node(tree, src, level, 0);
        } else if reshape.pushed {
            let n = tree[level].len();
            self.write_node(tree, src, level, n - 2);
            self.write_node(tree, src, level, n - 1);
            let parent = tree[level + 1].len() - 1;
            self.write_node(tree, src, level + 1, parent);
            work.pushes += 1;
            self.update_gap(tree, level + 1, work);
        } else {
            let n = tree[level].len();
            self.write_node(tree, src, level, n - 1);
            self.update_gap(tree, level, work);
        }
    }

    /// Writes node `i` (one of the two rightmost) of `level` afresh from
    /// `shape`'s sizes: a leaf from the stored ranges (`ranges[..known]`, then
    /// the trailing NULL range), an internal node from its children's
    /// records; then records its maximum and largest gap.
    fn write_node(
        &mut self,
        tree: &mut [Vec<Placed>],
        src: &Loaded<'_, T>,
        level: usize,
        i: usize,
    ) {
        let Loaded {
            shape,
            ranges,
            known,
        } = *src;
        let sizes = &shape.levels[level];
        debug_assert_eq!(sizes.len(), tree[level].len());
        let size = usize::from(sizes[i]);
        let after: usize = sizes[i + 1..].iter().map(|&s| usize::from(s)).sum();
        let rightmost = i + 1 == sizes.len();
        let min = min_of(&tree[level], i);
        let (node, max, gap, meta) = if level == 0 {
            // The ranges so far: the stored ones and the trailing NULL.
            let end = known + 1 - after;
            let mut leaf = Leaf::empty();
            leaf.len = size as u8;
            for (k, g) in (end - size..end).enumerate() {
                let (last, entry) = if g < known {
                    ranges[g]
                } else {
                    (u64::MAX, None)
                };
                if k + 1 < size {
                    leaf.pivots[k] = last;
                }
                leaf.slots[k] = entry;
            }
            let max = if rightmost {
                u64::MAX
            } else {
                ranges[end - 1].0
            };
            let gap = leaf.max_gap(min, max);
            (Node::Leaf(leaf), max, gap, 0)
        } else {
            let end = tree[level - 1].len() - after;
            let children = &tree[level - 1][end - size..end];
            let mut node = Arange {
                len: size as u8,
                pivots: [0; ARANGE_PIVOTS],
                gaps: [0; ARANGE_SLOTS],
                slots: [0; ARANGE_SLOTS],
            };
            for (k, child) in children.iter().enumerate() {
                if k + 1 < size {
                    node.pivots[k] = child.max;
                }
                node.slots[k] = child.id;
                node.gaps[k] = child.gap;
            }
            let max = children[size - 1].max;
            let (meta, gap) = largest_gap(&node.gaps[..size]);
            (Node::Arange(node), max, gap, meta)
        };
        let placed = &mut tree[level][i];
        self.nodes[placed.id as usize] = node;
        placed.max = max;
        placed.gap = gap;
        placed.meta = meta;
    }

    /// `mas_update_gap` for the rightmost node of `level`: when its largest
    /// gap differs from what its parent records, `mas_parent_gap` writes it
    /// there and climbs while the parent's largest gap changes.
    fn update_gap(&mut self, tree: &mut [Vec<Placed>], level: usize, work: &mut StoreWork) {
        let top = tree.len() - 1;
        if level == top {
            return;
        }
        // mas_max_gap: a leaf is scanned, an internal node's metadata read.
        let last = tree[level].len() - 1;
        let node = tree[level][last];
        let mut new = match &self.nodes[node.id as usize] {
            Node::Leaf(leaf) => leaf.max_gap(min_of(&tree[level], last), u64::MAX),
            Node::Arange(a) => a.gaps[node.meta],
            Node::Free => unreachable!("invariant: the tree's nodes are live"),
        };
        for child in level..top {
            if let Some(node) = tree[child].last_mut() {
                node.gap = new;
            }
            let placed = tree[child + 1]
                .last_mut()
                .expect("invariant: a parent level is not empty");
            let parent = self.arange_mut(placed.id);
            let slot = parent.len() - 1;
            if child == level && parent.gaps[slot] == new {
                return;
            }
            let meta_gap = parent.gaps[placed.meta];
            parent.gaps[slot] = new;
            work.gap_updates += 1;
            if meta_gap == new {
                return;
            }
            if slot != placed.meta {
                if meta_gap > new {
                    return;
                }
                placed.meta = slot;
            } else if new < meta_gap {
                (placed.meta, new) = largest_gap(&parent.gaps[..=slot]);
            }
        }
    }

    /// Writes the nodes of `plan` over `ranges` (which ends with the trailing
    /// NULL range) into pool cells, bottom-up, each once; returns the root and
    /// height. This was the load before the stores were replayed; the tests
    /// keep it as the reference for the finished tree.
    #[cfg(test)]
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
            let mut pivots = [0; crate::node::LEAF_PIVOTS];
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

    /// `n` one-page entries from `0x1000_0000`, each after a one-page gap
    /// when `gaps`, else contiguous.
    fn entries(n: u64, gaps: bool) -> Vec<(u64, u64, u64)> {
        let step = if gaps { 0x2000 } else { 0x1000 };
        (0..n)
            .map(|i| (0x1000_0000 + i * step, 0x1000_1000 + i * step, i))
            .collect()
    }

    /// The tree as the load built it before the stores were replayed: the
    /// plan's nodes written once each.
    fn reference(entries: &[(u64, u64, u64)]) -> MapleTree<u64> {
        let mut t = MapleTree::new();
        let mut ranges = vec![];
        let mut plan = Plan::new();
        let mut next = 0;
        for &(start, end, v) in entries {
            let added = if start > next {
                ranges.push((start - 1, None));
                2
            } else {
                1
            };
            ranges.push((end - 1, Some(v)));
            next = end;
            let known = ranges.len();
            plan.append(added, |g| g >= known || ranges[g].1.is_none());
        }
        ranges.push((u64::MAX, None));
        plan.destroy_rebalance(|g| ranges[g].1.is_none());
        let mut pool: Vec<NodeId> = (0..plan.nodes())
            .map(|_| t.alloc_node(Node::Leaf(Leaf::empty())).expect("alloc"))
            .collect();
        let (root, height) = t.write_plan(&plan, &ranges, &mut pool);
        let old = t.root;
        t.free_subtree(old);
        t.root = root;
        t.height = height;
        t.len = entries.len();
        t
    }

    /// Every node's content in depth-first order, child ids left out (the
    /// two builds number their nodes differently).
    fn dump(t: &MapleTree<u64>) -> Vec<String> {
        let mut out = vec![];
        let mut stack = vec![t.root];
        while let Some(id) = stack.pop() {
            match &t.nodes[id as usize] {
                Node::Leaf(l) => out.push(format!("{l:?}")),
                Node::Arange(a) => {
                    out.push(format!("{} {:?} {:?}", a.len, a.pivots, a.gaps));
                    stack.extend(a.slots[..a.len()].iter().rev());
                }
                Node::Free => panic!("free node {id} in the tree"),
            }
        }
        out
    }

    #[test]
    fn replayed_stores_build_the_reference_tree() {
        // A gap before every third entry: appends and node stores mixed.
        let mut mixed = entries(300, true);
        for (i, e) in mixed.iter_mut().enumerate() {
            if i % 3 != 0 {
                e.0 -= 0x1000;
            }
        }
        let mut cases: Vec<Vec<(u64, u64, u64)>> = vec![mixed];
        for n in (0..200).chain([6421]) {
            cases.push(entries(n, true));
            cases.push(entries(n, false));
        }
        // An entry at index 0: the first store adds one range.
        cases.push(vec![(0, 0x1000, 7), (0x3000, 0x4000, 8)]);
        for case in &cases {
            let t = MapleTree::from_sorted_bulk(case.iter().copied(), case.len()).expect("bulk");
            t.validate().expect("valid");
            let r = reference(case);
            assert_eq!(t.shape(), r.shape(), "{} entries", case.len());
            assert_eq!(dump(&t), dump(&r), "{} entries", case.len());
            assert!(t.iter().eq(r.iter()));
        }
    }

    #[test]
    fn gapped_stores_append_two_ranges_split_twice_and_push_once() {
        let t = MapleTree::from_sorted_bulk(entries(20, true), 20).expect("bulk");
        // Each store adds a gap and an entry: new_end = end + 2. Stores 1-7
        // append to the root leaf (ends 2, 4, ... 14: 15 ranges; a root leaf
        // has no gap to update); the 8th would end at 16, not below the 16
        // slots, so it splits 17 ranges 10 + 7 under a new root. Stores 9-12
        // append to the right leaf (ends 8 ... 14) and each writes its
        // shrinking trailing gap into the root (4 gap slots); the 13th
        // (end 16 again) pushes 27 ranges into 16 + 11; 14-15 append (ends
        // 12, 14; 2 gap slots), the 16th splits 10 + 7 again (the left leaf
        // is full), 17-20 append (4 gap slots). Appends: 7 + 4 + 2 + 4.
        assert_eq!(
            t.store_work(),
            StoreWork {
                appends: 17,
                gap_updates: 10,
                splits: 2,
                pushes: 1,
            }
        );
        assert_eq!(t.shape().last().map(Vec::len), Some(3));
    }

    #[test]
    fn contiguous_stores_append_in_place() {
        let t = MapleTree::from_sorted_bulk(entries(20, false), 20).expect("bulk");
        // Store 1 adds the leading gap too (two ranges, end 0 -> 2), stores
        // 2-14 one range each (end + 1, up to end 15: 16 ranges), all
        // appended; the 15th would end at 16: it splits 17 ranges 11 + 6
        // under a new root, and 16-20 append, each writing the leaf's gap
        // into the root. Appends: 14 + 5.
        assert_eq!(
            t.store_work(),
            StoreWork {
                appends: 19,
                gap_updates: 5,
                splits: 1,
                pushes: 0,
            }
        );
        assert_eq!(
            t.dup_structure().expect("dup").store_work(),
            StoreWork::default()
        );
    }

    #[test]
    fn gap_changes_climb_to_the_root() {
        // 6421 gapped entries: four levels (see the plan test below). Every
        // store that fits in the rightmost leaf shrinks the trailing gap, the
        // largest of every node on the rightmost path, so its gap update
        // writes one slot per ancestor.
        let t = MapleTree::from_sorted_bulk(entries(6421, true), 6421).expect("bulk");
        let w = t.store_work();
        assert_eq!(t.height(), 4);
        // 803 leaves, 90 and 10 internal nodes and a root: each level but
        // the root's grew by splits from the one node a root split made.
        assert_eq!(w.splits, 802 + 89 + 9);
        // Every other store is a two-range append; the stores that overfill
        // the leaf: 802 splits, a push of the refilled right leaf into its
        // half-empty left sibling between two of them, and one after the
        // last.
        assert_eq!(6421 - w.appends, 802 + 802);
        // Regression values: pushes at every level, and gap slots written
        // (three per store at the final height, more after reshapes).
        assert_eq!((w.pushes, w.gap_updates), (899, 16651));
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
