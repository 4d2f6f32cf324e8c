//! Writes: storing an entry (or NULL) over a range.
//!
//! Counterpart of Linux's `mas_store_gfp` family in `lib/maple_tree.c`
//! (`mas_wr_node_store`, `mas_wr_spanning_store`, `mas_split`,
//! `mas_rebalance`, `mas_spanning_rebalance`), re-derived rather than
//! translated. The push and split rules follow a 2025 mainline
//! `lib/maple_tree.c` (the one with `mas_wr_store_type`).
//!
//! # Algorithm
//!
//! A store of `[s, l]` first widens the range over neighbouring NULL ranges
//! when the entry is NULL (so NULL ranges stay coalesced, also across nodes).
//! It then walks to the leaf `A` holding `s` and the leaf `B` holding `l`.
//! The new leaf-level content is
//!
//! ```text
//!   A's ranges before s  |  [s, l] = entry  |  B's ranges after l
//! ```
//!
//! Everything strictly between those two leaves is covered by the store. The
//! write then proceeds bottom-up, one level at a time. At each level the
//! "run" of consumed nodes (from the left boundary node to the right one) is
//! replaced by nodes built from the content:
//!
//! * content below the minimum occupancy (root exempt) absorbs the whole
//!   previous (or next) node of the same level, possibly a cousin — that is
//!   the rebalance;
//! * if the run is a single node and the content fits, the node is rewritten
//!   in place and only the gaps above it are refreshed — the walk stops;
//! * a store inside one leaf that overflows it is what Linux handles with
//!   `mas_split`: at each level, before splitting, the overflowing node's
//!   content is shared with its previous sibling under the same parent, else
//!   with its next one, when the two fit with the room Linux keeps spare
//!   (`mas_push_data`, see `push_fits` and `push_split`); the sibling joins
//!   the run, two fresh nodes replace the pair, and the parent, whose child
//!   count is unchanged, is rewritten in place — the walk stops;
//! * otherwise the content is split into 1..=3 fresh nodes at Linux's split
//!   points (`calc_split`: halves, thirds for three nodes, never ending a
//!   node on a NULL range), which become part of the parent level's content
//!   (the parents' ranges before and after the run are kept, those between
//!   are covered).
//!
//! At the root, overflow grows the tree by one level and a single child
//! shrinks it. Every node allocation happens before the first modification of
//! the tree, so a failed allocation frees the fresh nodes and leaves the tree
//! exactly as it was. Nodes absorbed or covered are freed at the end.

use core::fmt::Debug;

use crate::node::{
    Arange, Leaf, Node, NodeId, Path, ARANGE_MIN, ARANGE_PIVOTS, ARANGE_SLOTS, LEAF_MIN,
    LEAF_PIVOTS, LEAF_SLOTS, MAX_HEIGHT,
};
use crate::{MapleError, MapleTree};

/// Leaf-level content capacity: 16 + 1 + 16 ranges at most, or a small
/// content plus an absorbed neighbour.
const LEAF_BUF: usize = 2 * LEAF_SLOTS + 4;
/// Internal content capacity: 9 + 3 + 9 children at most, or a small content
/// plus an absorbed neighbour.
const ARANGE_BUF: usize = 2 * ARANGE_SLOTS + 6;
/// Bookkeeping capacity for nodes absorbed / allocated by one store.
const TRACK: usize = 4 * MAX_HEIGHT + 4;

/// Ranges destined for one or more leaves (Linux's `maple_big_node` for
/// leaves). Adjacent NULL ranges are merged on push.
struct LeafBuf<T> {
    last: [u64; LEAF_BUF],
    ent: [Option<T>; LEAF_BUF],
    n: usize,
}

impl<T: Copy> LeafBuf<T> {
    fn new() -> Self {
        LeafBuf {
            last: [0; LEAF_BUF],
            ent: [None; LEAF_BUF],
            n: 0,
        }
    }

    #[inline]
    fn push(&mut self, last: u64, e: Option<T>) {
        if e.is_none() && self.n > 0 && self.ent[self.n - 1].is_none() {
            self.last[self.n - 1] = last;
            return;
        }
        self.last[self.n] = last;
        self.ent[self.n] = e;
        self.n += 1;
    }

    fn push_leaf(&mut self, leaf: &Leaf<T>, max: u64) {
        for i in 0..leaf.len() {
            self.push(leaf.last(i, max), leaf.slots[i]);
        }
    }

    fn extend_from(&mut self, other: &Self) {
        for i in 0..other.n {
            self.push(other.last[i], other.ent[i]);
        }
    }

    fn count_entries(&self) -> usize {
        self.ent[..self.n].iter().filter(|e| e.is_some()).count()
    }

    /// A leaf from ranges `from..to` of the buffer.
    fn to_leaf(&self, from: usize, to: usize) -> Leaf<T> {
        let len = to - from;
        debug_assert!((1..=LEAF_SLOTS).contains(&len));
        let mut pivots = [0; LEAF_PIVOTS];
        pivots[..len - 1].copy_from_slice(&self.last[from..to - 1]);
        let mut slots = [None; LEAF_SLOTS];
        slots[..len].copy_from_slice(&self.ent[from..to]);
        Leaf {
            len: len as u8,
            pivots,
            slots,
        }
    }
}

/// Children destined for one or more internal nodes.
struct ArangeBuf {
    last: [u64; ARANGE_BUF],
    child: [NodeId; ARANGE_BUF],
    gap: [u64; ARANGE_BUF],
    n: usize,
}

impl ArangeBuf {
    fn new() -> Self {
        ArangeBuf {
            last: [0; ARANGE_BUF],
            child: [0; ARANGE_BUF],
            gap: [0; ARANGE_BUF],
            n: 0,
        }
    }

    #[inline]
    fn push(&mut self, last: u64, child: NodeId, gap: u64) {
        self.last[self.n] = last;
        self.child[self.n] = child;
        self.gap[self.n] = gap;
        self.n += 1;
    }

    fn push_node(&mut self, node: &Arange, max: u64) {
        for i in 0..node.len() {
            self.push(node.last(i, max), node.slots[i], node.gaps[i]);
        }
    }

    fn push_built(&mut self, built: &Built) {
        for i in 0..built.n {
            self.push(built.last[i], built.id[i], built.gap[i]);
        }
    }

    fn extend_from(&mut self, other: &Self) {
        for i in 0..other.n {
            self.push(other.last[i], other.child[i], other.gap[i]);
        }
    }

    /// An internal node from children `from..to` of the buffer.
    fn to_arange(&self, from: usize, to: usize) -> Arange {
        let len = to - from;
        debug_assert!((1..=ARANGE_SLOTS).contains(&len));
        let mut pivots = [0; ARANGE_PIVOTS];
        pivots[..len - 1].copy_from_slice(&self.last[from..to - 1]);
        let mut slots = [0; ARANGE_SLOTS];
        slots[..len].copy_from_slice(&self.child[from..to]);
        let mut gaps = [0; ARANGE_SLOTS];
        gaps[..len].copy_from_slice(&self.gap[from..to]);
        Arange {
            len: len as u8,
            pivots,
            gaps,
            slots,
        }
    }
}

/// Fresh nodes built for one level, to be linked into the level above.
#[derive(Default)]
struct Built {
    last: [u64; 3],
    id: [NodeId; 3],
    gap: [u64; 3],
    n: usize,
}

impl Built {
    fn push(&mut self, last: u64, id: NodeId, gap: u64) {
        self.last[self.n] = last;
        self.id[self.n] = id;
        self.gap[self.n] = gap;
        self.n += 1;
    }
}

/// Bookkeeping of one store.
struct StoreState {
    /// Old nodes whose content was copied into the new content: freed on
    /// commit, skipped when freeing covered subtrees.
    absorbed: [NodeId; TRACK],
    n_absorbed: usize,
    /// Fresh nodes: freed on rollback.
    allocated: [NodeId; TRACK],
    n_allocated: usize,
    /// Roots of subtrees covered by the store: freed on commit.
    covered: Vec<NodeId>,
    /// Entries held by the absorbed leaves before the store.
    old_entries: usize,
}

impl StoreState {
    fn new() -> Self {
        StoreState {
            absorbed: [0; TRACK],
            n_absorbed: 0,
            allocated: [0; TRACK],
            n_allocated: 0,
            covered: Vec::new(),
            old_entries: 0,
        }
    }

    fn absorb(&mut self, id: NodeId) {
        if !self.is_absorbed(id) {
            self.absorbed[self.n_absorbed] = id;
            self.n_absorbed += 1;
        }
    }

    fn is_absorbed(&self, id: NodeId) -> bool {
        self.absorbed[..self.n_absorbed].contains(&id)
    }
}

/// Linux `mab_no_null_split`: moves a split point (the big-node index of the
/// left node's last item) off a NULL range, towards the right while the
/// right side keeps more than `min_slots` items, otherwise towards the left.
/// `b_end` is the big node's end as the caller has it (see [`push_split`]).
fn no_null_split(
    split: usize,
    b_end: usize,
    cap: usize,
    min_slots: usize,
    is_null: &impl Fn(usize) -> bool,
) -> usize {
    if !is_null(split) {
        split
    } else if split < cap - 1 && b_end - split > min_slots {
        split + 1
    } else {
        split - 1
    }
}

/// Linux `mab_calc_split` outside bulk mode: the sizes of the 1..=3 nodes
/// `n` items are divided into.
///
/// Two nodes split at the middle (the left one takes the odd item), moved
/// right while the left part spans fewer than `cap - 1` indices (`narrow`,
/// which only tiny indices ever are) and the right part keeps more than
/// `min_slots` items, then moved off a NULL range. Three nodes (a store
/// overwriting the ends of two full nodes) split at thirds, again off NULL
/// ranges.
fn calc_split(
    n: usize,
    cap: usize,
    min_slots: usize,
    is_null: impl Fn(usize) -> bool,
    narrow: impl Fn(usize) -> bool,
) -> (usize, [usize; 3]) {
    if n <= cap {
        return (1, [n, 0, 0]);
    }
    let b_end = n - 1;
    let mut split = b_end / 2;
    if b_end >= 2 * cap || (is_null(split) && b_end >= 2 * cap - 1) {
        split = no_null_split(b_end / 3, b_end, cap, min_slots, &is_null);
        let mid = no_null_split(2 * (b_end / 3), b_end, cap, min_slots, &is_null);
        return (3, [split + 1, mid - split, b_end - mid]);
    }
    while split < cap - 1 && narrow(split) && b_end - split > min_slots {
        split += 1;
    }
    split = no_null_split(split, b_end, cap, min_slots, &is_null);
    (2, [split + 1, b_end - split, 0])
}

/// Linux `mas_push_data`'s room check: whether `total` items (an overflowing
/// node's new content plus a sibling's) may be shared by the two nodes
/// instead of splitting. Linux keeps two slots spare (no later three-way
/// split), one more in leaves and one more when the overflowing node ends
/// at the top of the index space.
fn push_fits(total: usize, cap: usize, leaf: bool, at_max: bool) -> bool {
    let space = 2 * cap - 2 - usize::from(leaf) - usize::from(at_max);
    total - 2 < space
}

/// Linux `mas_push_data`'s division of `total` items between the two
/// siblings: the sibling receiving the push ends up with `cap - 1` items
/// (then moved off a NULL range). Returns the size of the left node.
fn push_split(
    total: usize,
    cap: usize,
    min_slots: usize,
    into_left: bool,
    is_null: impl Fn(usize) -> bool,
) -> usize {
    // Linux's big node end is the last index after a push to the left but
    // the item count after a push to the right; it only matters for the
    // NULL adjustment.
    let (split, b_end) = if into_left {
        (cap - 2, total - 1)
    } else {
        (total - cap, total)
    };
    no_null_split(split, b_end, cap, min_slots, &is_null) + 1
}

impl<T: Copy + Eq + Debug> MapleTree<T> {
    /// Widens a NULL store over the NULL ranges touching it.
    fn extend_null(&self, mut s: u64, mut l: u64) -> (u64, u64) {
        let (rs, _, e) = self.range_at(s);
        if e.is_none() {
            s = rs;
        } else if rs == s && s > 0 {
            let (ps, _, pe) = self.range_at(s - 1);
            if pe.is_none() {
                s = ps;
            }
        }
        let (_, rl, e) = self.range_at(l);
        if e.is_none() {
            l = rl;
        } else if rl == l && l < u64::MAX {
            let (_, nl, ne) = self.range_at(l + 1);
            if ne.is_none() {
                l = nl;
            }
        }
        (s, l)
    }

    /// Frees the fresh nodes of a failed store.
    fn rollback(&mut self, st: &StoreState) {
        for &id in &st.allocated[..st.n_allocated] {
            self.free_node(id);
        }
    }

    /// Allocates a fresh node for the current store (rolling back on failure).
    fn alloc_for(&mut self, st: &mut StoreState, node: Node<T>) -> Result<NodeId, MapleError> {
        match self.alloc_node(node) {
            Ok(id) => {
                st.allocated[st.n_allocated] = id;
                st.n_allocated += 1;
                Ok(id)
            }
            Err(e) => {
                self.rollback(st);
                Err(e)
            }
        }
    }

    /// Frees a covered subtree, skipping absorbed nodes; returns the number
    /// of entries it held.
    fn free_covered(&mut self, root: NodeId, st: &StoreState, stack: &mut Vec<NodeId>) -> usize {
        let mut entries = 0;
        stack.push(root);
        while let Some(id) = stack.pop() {
            if st.is_absorbed(id) {
                continue;
            }
            match &self.nodes[id as usize] {
                Node::Leaf(l) => entries += l.count_entries(),
                Node::Arange(a) => stack.extend_from_slice(&a.slots[..a.len()]),
                Node::Free => unreachable!("invariant: covered nodes are live"),
            }
            self.free_node(id);
        }
        entries
    }

    /// Commit epilogue: frees what the store replaced and fixes `len`.
    fn finish(&mut self, st: &StoreState, keep: Option<NodeId>, new_entries: usize) {
        let mut old = st.old_entries;
        if !st.covered.is_empty() {
            let mut stack = Vec::new();
            for &r in &st.covered {
                old += self.free_covered(r, st, &mut stack);
            }
        }
        for &id in &st.absorbed[..st.n_absorbed] {
            if Some(id) != keep {
                self.free_node(id);
            }
        }
        self.len = self.len + new_entries - old;
    }

    /// Refreshes the gap values above a node rewritten in place at
    /// `from_level - 1` (Linux `mas_update_gap`).
    fn propagate_gap(&mut self, path: &Path, from_level: usize, mut gap: u64) {
        for k in from_level..self.height as usize {
            let p = path.steps[k];
            let n = self.arange_mut(p.node);
            if n.gaps[p.idx as usize] == gap {
                break;
            }
            n.gaps[p.idx as usize] = gap;
            gap = n.max_gap();
        }
    }

    /// Replaces a root with a single child by that child, repeatedly.
    fn collapse_root(&mut self) {
        while let Node::Arange(a) = &self.nodes[self.root as usize] {
            if a.len() != 1 {
                break;
            }
            let old = self.root;
            self.root = a.slots[0];
            self.height -= 1;
            self.free_node(old);
        }
    }

    /// Linux `mas_push_data` at the leaves: instead of splitting the
    /// overflowing leaf `lp`/`rp` point to, shares its new content `buf`
    /// with the previous sibling (same parent), else with the next one, if
    /// the two fit with the room Linux insists on. On success the sibling is
    /// absorbed into `buf` (the paths re-pointed to cover both leaves) and
    /// the sizes of the two replacement leaves are returned.
    fn push_leaf(
        &self,
        lp: &mut Path,
        rp: &mut Path,
        buf: &mut LeafBuf<T>,
        st: &mut StoreState,
    ) -> Option<(usize, [usize; 3])> {
        let at_max = lp.steps[0].max == u64::MAX;
        let parent = lp.steps[1];
        if parent.idx > 0 {
            let p = self
                .prev_node(lp, 0)
                .expect("invariant: a left sibling exists");
            let e = p.steps[0];
            let sib = self.leaf(e.node);
            let total = sib.len() + buf.n;
            if push_fits(total, LEAF_SLOTS, true, at_max) {
                let mut merged = LeafBuf::new();
                merged.push_leaf(sib, e.max);
                merged.extend_from(buf);
                debug_assert_eq!(merged.n, total, "no NULL ranges meet across leaves");
                st.old_entries += sib.count_entries();
                st.absorb(e.node);
                *lp = p;
                *buf = merged;
                let left = push_split(total, LEAF_SLOTS, LEAF_MIN, true, |i| buf.ent[i].is_none());
                return Some((2, [left, total - left, 0]));
            }
        }
        if (parent.idx as usize) + 1 < self.arange(parent.node).len() {
            let p = self
                .next_node(rp, 0)
                .expect("invariant: a right sibling exists");
            let e = p.steps[0];
            let sib = self.leaf(e.node);
            let total = sib.len() + buf.n;
            if push_fits(total, LEAF_SLOTS, true, at_max) {
                buf.push_leaf(sib, e.max);
                debug_assert_eq!(buf.n, total, "no NULL ranges meet across leaves");
                st.old_entries += sib.count_entries();
                st.absorb(e.node);
                *rp = p;
                let left = push_split(total, LEAF_SLOTS, LEAF_MIN, false, |i| buf.ent[i].is_none());
                return Some((2, [left, total - left, 0]));
            }
        }
        None
    }

    /// [`Self::push_leaf`] for the internal node at `level` and its new
    /// children `ab`.
    fn push_arange(
        &self,
        level: usize,
        lp: &mut Path,
        rp: &mut Path,
        ab: &mut ArangeBuf,
        st: &mut StoreState,
    ) -> Option<(usize, [usize; 3])> {
        let at_max = lp.steps[level].max == u64::MAX;
        let parent = lp.steps[level + 1];
        if parent.idx > 0 {
            let p = self
                .prev_node(lp, level)
                .expect("invariant: a left sibling exists");
            let e = p.steps[level];
            let sib = self.arange(e.node);
            let total = sib.len() + ab.n;
            if push_fits(total, ARANGE_SLOTS, false, at_max) {
                let mut merged = ArangeBuf::new();
                merged.push_node(sib, e.max);
                merged.extend_from(ab);
                st.absorb(e.node);
                *lp = p;
                *ab = merged;
                let left = push_split(total, ARANGE_SLOTS, ARANGE_MIN, true, |_| false);
                return Some((2, [left, total - left, 0]));
            }
        }
        if (parent.idx as usize) + 1 < self.arange(parent.node).len() {
            let p = self
                .next_node(rp, level)
                .expect("invariant: a right sibling exists");
            let e = p.steps[level];
            let sib = self.arange(e.node);
            let total = sib.len() + ab.n;
            if push_fits(total, ARANGE_SLOTS, false, at_max) {
                ab.push_node(sib, e.max);
                st.absorb(e.node);
                *rp = p;
                let left = push_split(total, ARANGE_SLOTS, ARANGE_MIN, false, |_| false);
                return Some((2, [left, total - left, 0]));
            }
        }
        None
    }

    /// Stores `entry` over the inclusive range `[s, l]`.
    pub(crate) fn store_incl(
        &mut self,
        s: u64,
        l: u64,
        entry: Option<T>,
    ) -> Result<(), MapleError> {
        debug_assert!(s <= l);
        let asked_last = l;
        let (s, l) = if entry.is_none() {
            self.extend_null(s, l)
        } else {
            (s, l)
        };
        let top = self.height as usize - 1;
        let mut lp = Path::new();
        let mut rp = Path::new();
        self.walk(s, &mut lp);
        if l <= lp.steps[0].max {
            // Both ends in the same leaf (the common case): no second walk.
            rp = lp;
            rp.steps[0].idx = self.leaf(lp.steps[0].node).find(l) as u32;
        } else {
            self.walk(l, &mut rp);
        }
        let mut st = StoreState::new();

        // ---- leaf level: A's prefix | new range | B's suffix.
        let mut buf = LeafBuf::new();
        let a = lp.steps[0];
        let b = rp.steps[0];
        {
            let la = self.leaf(a.node);
            let ai = a.idx as usize;
            for i in 0..ai {
                buf.push(la.last(i, a.max), la.slots[i]);
            }
            if la.start(ai, a.min) < s {
                buf.push(s - 1, la.slots[ai]);
            }
            st.old_entries += la.count_entries();
        }
        buf.push(l, entry);
        {
            let lb = self.leaf(b.node);
            let bi = b.idx as usize;
            let blast = lb.last(bi, b.max);
            if blast > l {
                buf.push(blast, lb.slots[bi]);
            }
            for i in bi + 1..lb.len() {
                buf.push(lb.last(i, b.max), lb.slots[i]);
            }
            if b.node != a.node {
                st.old_entries += lb.count_entries();
            }
        }
        st.absorb(a.node);
        st.absorb(b.node);
        if top > 0 && buf.n < LEAF_MIN {
            if let Some(p) = self.prev_node(&lp, 0) {
                let e = p.steps[0];
                let leaf = self.leaf(e.node);
                let mut merged = LeafBuf::new();
                merged.push_leaf(leaf, e.max);
                merged.extend_from(&buf);
                buf = merged;
                st.old_entries += leaf.count_entries();
                st.absorb(e.node);
                lp = p;
            } else if let Some(p) = self.next_node(&rp, 0) {
                let e = p.steps[0];
                let leaf = self.leaf(e.node);
                buf.push_leaf(leaf, e.max);
                st.old_entries += leaf.count_entries();
                st.absorb(e.node);
                rp = p;
            }
        }
        // Linux writes an overflowing store inside one leaf with `mas_split`,
        // which pushes into a sibling before splitting; everything else
        // (spanning stores, rebalances) goes through `mas_spanning_rebalance`,
        // which never pushes. Writing NULL up to a leaf's end counts as
        // spanning there (`mas_is_span_wr`), the NULL having to be coalesced
        // with the next leaf.
        let split_store = buf.n > LEAF_SLOTS
            && lp.steps[0].node == rp.steps[0].node
            && !(entry.is_none() && asked_last == lp.steps[0].max && asked_last != u64::MAX);
        // Node sizes decided by a push, overriding the ordinary split.
        let mut pushed: Option<(usize, [usize; 3])> = None;
        if split_store && top > 0 {
            pushed = self.push_leaf(&mut lp, &mut rp, &mut buf, &mut st);
        }
        let new_entries = buf.count_entries();

        if lp.steps[0].node == rp.steps[0].node && buf.n <= LEAF_SLOTS {
            // In-place rewrite of a single leaf: no allocation.
            let at = lp.steps[0];
            let leaf = buf.to_leaf(0, buf.n);
            let gap = leaf.max_gap(at.min, at.max);
            self.nodes[at.node as usize] = Node::Leaf(leaf);
            self.propagate_gap(&lp, 1, gap);
            self.finish(&st, Some(at.node), new_entries);
            return Ok(());
        }

        let mut built = Built::default();
        {
            // `mas_split` hands `mab_calc_split` the minimum of a fresh
            // maple state (0) at the leaves, `mas_spanning_rebalance` the
            // left node's.
            let narrow_min = if split_store { 0 } else { lp.steps[0].min };
            let (k, sizes) = pushed.unwrap_or_else(|| {
                calc_split(
                    buf.n,
                    LEAF_SLOTS,
                    LEAF_MIN,
                    |i| buf.ent[i].is_none(),
                    |i| buf.last[i].wrapping_sub(narrow_min) < (LEAF_SLOTS - 1) as u64,
                )
            });
            let mut from = 0;
            let mut min = lp.steps[0].min;
            for &sz in &sizes[..k] {
                let leaf = buf.to_leaf(from, from + sz);
                let max = buf.last[from + sz - 1];
                let gap = leaf.max_gap(min, max);
                let id = self.alloc_for(&mut st, Node::Leaf(leaf))?;
                built.push(max, id, gap);
                from += sz;
                min = max.wrapping_add(1);
            }
        }

        // ---- internal levels.
        let mut level = 1;
        loop {
            if level > top {
                // The old root was split: grow the tree.
                let mut ab = ArangeBuf::new();
                ab.push_built(&built);
                let root = ab.to_arange(0, ab.n);
                let id = self.alloc_for(&mut st, Node::Arange(root))?;
                assert!(
                    (self.height as usize) < MAX_HEIGHT,
                    "invariant: height stays below {MAX_HEIGHT}"
                );
                self.root = id;
                self.height += 1;
                self.finish(&st, None, new_entries);
                return Ok(());
            }

            let pa = lp.steps[level];
            let pb = rp.steps[level];
            let mut ab = ArangeBuf::new();
            {
                let na = self.arange(pa.node);
                let nb = self.arange(pb.node);
                let ia = pa.idx as usize;
                let ib = pb.idx as usize;
                for i in 0..ia {
                    ab.push(na.last(i, pa.max), na.slots[i], na.gaps[i]);
                }
                ab.push_built(&built);
                for i in ib + 1..nb.len() {
                    ab.push(nb.last(i, pb.max), nb.slots[i], nb.gaps[i]);
                }
                if pa.node == pb.node {
                    st.covered
                        .extend_from_slice(&na.slots[ia + 1..ib.max(ia + 1)]);
                } else {
                    st.covered.extend_from_slice(&na.slots[ia + 1..na.len()]);
                    st.covered.extend_from_slice(&nb.slots[..ib]);
                }
            }
            st.absorb(pa.node);
            st.absorb(pb.node);
            if level < top && ab.n < ARANGE_MIN {
                if let Some(p) = self.prev_node(&lp, level) {
                    let e = p.steps[level];
                    let mut merged = ArangeBuf::new();
                    merged.push_node(self.arange(e.node), e.max);
                    merged.extend_from(&ab);
                    ab = merged;
                    st.absorb(e.node);
                    lp = p;
                } else if let Some(p) = self.next_node(&rp, level) {
                    let e = p.steps[level];
                    ab.push_node(self.arange(e.node), e.max);
                    st.absorb(e.node);
                    rp = p;
                }
            }

            let mut pushed = None;
            if split_store && level < top && ab.n > ARANGE_SLOTS {
                pushed = self.push_arange(level, &mut lp, &mut rp, &mut ab, &mut st);
            }

            if lp.steps[level].node == rp.steps[level].node && ab.n <= ARANGE_SLOTS {
                if level == top && ab.n == 1 {
                    // The root is left with one child: shrink the tree.
                    self.root = ab.child[0];
                    self.height = level as u32;
                    self.finish(&st, None, new_entries);
                    self.collapse_root();
                    return Ok(());
                }
                let at = lp.steps[level];
                let node = ab.to_arange(0, ab.n);
                let gap = node.max_gap();
                self.nodes[at.node as usize] = Node::Arange(node);
                self.propagate_gap(&lp, level + 1, gap);
                self.finish(&st, Some(at.node), new_entries);
                return Ok(());
            }

            built = Built::default();
            // `mas_split` passes the minimum of the node it split one level
            // down, `mas_spanning_rebalance` this level's left node's.
            let narrow_min = if split_store {
                lp.steps[level - 1].min
            } else {
                lp.steps[level].min
            };
            let (k, sizes) = pushed.unwrap_or_else(|| {
                calc_split(
                    ab.n,
                    ARANGE_SLOTS,
                    ARANGE_MIN,
                    |_| false,
                    |i| ab.last[i].wrapping_sub(narrow_min) < (ARANGE_SLOTS - 1) as u64,
                )
            });
            let mut from = 0;
            for &sz in &sizes[..k] {
                let node = ab.to_arange(from, from + sz);
                let max = ab.last[from + sz - 1];
                let gap = node.max_gap();
                let id = self.alloc_for(&mut st, Node::Arange(node))?;
                built.push(max, id, gap);
                from += sz;
            }
            level += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `calc_split` on content without NULL ranges and with wide ranges.
    fn plain(n: usize, cap: usize, min: usize) -> (usize, [usize; 3]) {
        calc_split(n, cap, min, |_| false, |_| false)
    }

    #[test]
    fn calc_split_halves_and_respects_minimums() {
        assert_eq!(plain(16, LEAF_SLOTS, LEAF_MIN), (1, [16, 0, 0]));
        assert_eq!(plain(17, LEAF_SLOTS, LEAF_MIN), (2, [9, 8, 0]));
        assert_eq!(plain(18, LEAF_SLOTS, LEAF_MIN), (2, [9, 9, 0]));
        assert_eq!(plain(11, ARANGE_SLOTS, ARANGE_MIN), (2, [6, 5, 0]));
        // Three nodes from 33 ranges: the big node (last index 32) is cut
        // after indices 10 and 20.
        assert_eq!(plain(33, LEAF_SLOTS, LEAF_MIN), (3, [11, 10, 12]));
        assert_eq!(plain(21, ARANGE_SLOTS, ARANGE_MIN), (3, [7, 6, 8]));
        for nulls in [false, true] {
            // NULL at every odd index (or none).
            let is_null = |i: usize| nulls && i % 2 == 1;
            for n in LEAF_SLOTS + 1..=2 * LEAF_SLOTS + 4 {
                let (k, sizes) = calc_split(n, LEAF_SLOTS, LEAF_MIN, is_null, |_| false);
                assert_eq!(sizes[..k].iter().sum::<usize>(), n);
                assert!(
                    sizes[..k]
                        .iter()
                        .all(|&s| (LEAF_MIN..=LEAF_SLOTS).contains(&s)),
                    "{n}: {sizes:?}"
                );
                // No node but the last ends on a NULL range.
                let mut end = 0;
                for &s in &sizes[..k - 1] {
                    end += s;
                    assert!(!is_null(end - 1), "{n}: {sizes:?}");
                }
            }
        }
        for n in ARANGE_SLOTS + 1..=2 * ARANGE_SLOTS + 6 {
            let (k, sizes) = plain(n, ARANGE_SLOTS, ARANGE_MIN);
            assert_eq!(sizes[..k].iter().sum::<usize>(), n);
            assert!(sizes[..k]
                .iter()
                .all(|&s| (ARANGE_MIN..=ARANGE_SLOTS).contains(&s)));
        }
    }

    #[test]
    fn calc_split_moves_off_null_and_right_over_narrow_ranges() {
        // 17 ranges, NULL at index 8: the left leaf takes one more.
        let null8 = |i: usize| i == 8;
        assert_eq!(
            calc_split(17, LEAF_SLOTS, LEAF_MIN, null8, |_| false),
            (2, [10, 7, 0])
        );
        // Ranges of a few indices each: the left leaf grows while it spans
        // fewer than 15 indices and the right one keeps more than 6 ranges.
        assert_eq!(
            calc_split(20, LEAF_SLOTS, LEAF_MIN, |_| false, |i| i < 12),
            (2, [13, 7, 0])
        );
    }

    #[test]
    fn push_room_and_division_follow_linux() {
        // Two leaves share at most 30 ranges (big-node ends adding up to 28
        // < 32 - 2 - 1), 29 when the overflowing leaf ends the index space.
        assert!(push_fits(30, LEAF_SLOTS, true, false));
        assert!(!push_fits(31, LEAF_SLOTS, true, false));
        assert!(push_fits(29, LEAF_SLOTS, true, true));
        assert!(!push_fits(30, LEAF_SLOTS, true, true));
        // Internal nodes: 19, or 18 at the end of the index space.
        assert!(push_fits(19, ARANGE_SLOTS, false, false));
        assert!(!push_fits(20, ARANGE_SLOTS, false, false));
        assert!(push_fits(18, ARANGE_SLOTS, false, true));
        assert!(!push_fits(19, ARANGE_SLOTS, false, true));
        // The sibling receiving the push ends with cap - 1 items.
        assert_eq!(push_split(25, LEAF_SLOTS, LEAF_MIN, true, |_| false), 15);
        assert_eq!(push_split(25, LEAF_SLOTS, LEAF_MIN, false, |_| false), 10);
        assert_eq!(push_split(15, ARANGE_SLOTS, ARANGE_MIN, true, |_| false), 9);
        assert_eq!(
            push_split(15, ARANGE_SLOTS, ARANGE_MIN, false, |_| false),
            6
        );
        // Off a NULL range: to the right when the right keeps more than 6.
        assert_eq!(push_split(25, LEAF_SLOTS, LEAF_MIN, true, |i| i == 14), 16);
        assert_eq!(push_split(21, LEAF_SLOTS, LEAF_MIN, true, |i| i == 14), 14);
        assert_eq!(push_split(25, LEAF_SLOTS, LEAF_MIN, false, |i| i == 9), 11);
    }

    #[test]
    fn leaf_buffer_merges_adjacent_nulls() {
        let mut b = LeafBuf::<u8>::new();
        b.push(4, None);
        b.push(9, None);
        b.push(12, Some(1));
        b.push(15, Some(1));
        assert_eq!(b.n, 3, "equal entries stay separate, NULLs merge");
        let l = b.to_leaf(0, b.n);
        assert_eq!((l.len(), l.pivots[0], l.pivots[1]), (3, 9, 12));
    }
}
