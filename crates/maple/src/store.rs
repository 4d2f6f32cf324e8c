//! Writes: storing an entry (or NULL) over a range.
//!
//! Counterpart of Linux's `mas_store_gfp` family in `lib/maple_tree.c`
//! (`mas_wr_node_store`, `mas_wr_spanning_store`, `mas_split`,
//! `mas_rebalance`, `mas_spanning_rebalance`), re-derived rather than
//! translated.
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
//! * otherwise the content is split evenly into 1..=3 fresh nodes, which
//!   become part of the parent level's content (the parents' ranges before
//!   and after the run are kept, those between are covered).
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

/// Splits `n` items into the fewest nodes of capacity `cap`, evenly.
fn split(n: usize, cap: usize) -> (usize, [usize; 3]) {
    let k = n.div_ceil(cap);
    debug_assert!((1..=3).contains(&k), "content of {n} needs {k} nodes");
    let base = n / k;
    let rem = n % k;
    let mut sizes = [0; 3];
    for (i, s) in sizes.iter_mut().enumerate().take(k) {
        *s = base + usize::from(i < rem);
    }
    (k, sizes)
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

    /// Stores `entry` over the inclusive range `[s, l]`.
    pub(crate) fn store_incl(
        &mut self,
        s: u64,
        l: u64,
        entry: Option<T>,
    ) -> Result<(), MapleError> {
        debug_assert!(s <= l);
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
            let (k, sizes) = split(buf.n, LEAF_SLOTS);
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
            let (k, sizes) = split(ab.n, ARANGE_SLOTS);
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

    #[test]
    fn split_is_even_and_respects_minimums() {
        assert_eq!(split(16, LEAF_SLOTS), (1, [16, 0, 0]));
        assert_eq!(split(17, LEAF_SLOTS), (2, [9, 8, 0]));
        assert_eq!(split(33, LEAF_SLOTS), (3, [11, 11, 11]));
        assert_eq!(split(11, ARANGE_SLOTS), (2, [6, 5, 0]));
        for n in LEAF_SLOTS + 1..=2 * LEAF_SLOTS + 1 {
            let (k, sizes) = split(n, LEAF_SLOTS);
            assert!(sizes[..k]
                .iter()
                .all(|&s| (LEAF_MIN..=LEAF_SLOTS).contains(&s)));
        }
        for n in ARANGE_SLOTS + 1..=2 * ARANGE_SLOTS + 3 {
            let (k, sizes) = split(n, ARANGE_SLOTS);
            assert!(sizes[..k]
                .iter()
                .all(|&s| (ARANGE_MIN..=ARANGE_SLOTS).contains(&s)));
        }
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
