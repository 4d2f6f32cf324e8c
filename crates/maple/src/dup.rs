//! Fork support: duplicating a tree's structure (Linux `__mt_dup`, used by
//! `dup_mmap()` since "fork: use __mt_dup() to duplicate maple tree in
//! dup_mmap()") and rewriting the copied entries in place.

use core::fmt::Debug;
use std::sync::Arc;

use crate::node::{Node, NodeId, ARANGE_SLOTS};
use crate::{MapleError, MapleTree, StoreWork};

impl<T: Copy + Eq + Debug> MapleTree<T> {
    /// Duplicates the tree node by node.
    ///
    /// The copy is built top-down in DFS pre-order: the root is copied, then
    /// for every internal node all its children are allocated at once
    /// (all-or-nothing) and each is copied verbatim (pivots, gaps, entries)
    /// before its own children are handled; only child pointers are
    /// rewritten. The cost is one copy per node, no walks and no splits.
    ///
    /// The copy shares this tree's node cache (so allocation statistics and
    /// the fail point are common to both). On allocation failure everything
    /// built so far is freed and `Err(NoMemory)` is returned; `self` is never
    /// modified.
    pub fn dup_structure(&self) -> Result<MapleTree<T>, MapleError> {
        let mut new = MapleTree {
            nodes: Vec::with_capacity(self.live),
            free: Vec::new(),
            root: 0,
            height: self.height,
            len: self.len,
            live: 0,
            cache: Arc::clone(&self.cache),
            work: StoreWork::default(),
        };
        new.root = new.alloc_node(self.nodes[self.root as usize])?;
        let mut stack: Vec<NodeId> = Vec::with_capacity(4 * self.height as usize);
        stack.push(new.root);
        while let Some(id) = stack.pop() {
            let Node::Arange(mut node) = new.nodes[id as usize] else {
                continue;
            };
            let n = node.len();
            let mut copies: [NodeId; ARANGE_SLOTS] = [0; ARANGE_SLOTS];
            for i in 0..n {
                match new.alloc_node(self.nodes[node.slots[i] as usize]) {
                    Ok(c) => copies[i] = c,
                    Err(e) => {
                        // Give back this node's batch, then everything else.
                        for &c in &copies[..i] {
                            new.free_node(c);
                        }
                        new.free_all();
                        return Err(e);
                    }
                }
            }
            node.slots[..n].copy_from_slice(&copies[..n]);
            new.nodes[id as usize] = Node::Arange(node);
            for &c in copies[..n].iter().rev() {
                if matches!(new.nodes[c as usize], Node::Arange(_)) {
                    stack.push(c);
                }
            }
        }
        Ok(new)
    }

    /// Frees every live node (used to tear down a failed duplicate).
    fn free_all(&mut self) {
        for id in 0..self.nodes.len() {
            if !matches!(self.nodes[id], Node::Free) {
                self.free_node(id as NodeId);
            }
        }
    }

    /// Walks the entries in index order and replaces each one with
    /// `f(start, end_exclusive, entry)`.
    ///
    /// `Some(new)` overwrites the slot in place (no allocation). `None`
    /// turns the range into NULL; as adjacent NULL ranges must be coalesced
    /// (and the affected nodes may then need rebalancing) those ranges are
    /// cleared afterwards with ordinary NULL stores, which may allocate.
    /// `f` is called exactly once per entry.
    ///
    /// On `Err(NoMemory)` the tree is still valid and every `Some` result has
    /// been applied, but ranges for which `f` returned `None` and that could
    /// not be cleared still hold their previous entry; the caller is expected
    /// to discard the tree (as a failing `dup_mmap()` does).
    pub fn replace_entries(
        &mut self,
        mut f: impl FnMut(u64, u64, T) -> Option<T>,
    ) -> Result<(), MapleError> {
        let mut cleared: Vec<(u64, u64)> = Vec::new();
        let mut stack: Vec<(NodeId, u64, u64)> = Vec::with_capacity(4 * self.height as usize);
        stack.push((self.root, 0, u64::MAX));
        while let Some((id, min, max)) = stack.pop() {
            match &mut self.nodes[id as usize] {
                Node::Arange(n) => {
                    for i in (0..n.len()).rev() {
                        let (cmin, cmax) = n.bounds(i, min, max);
                        stack.push((n.slots[i], cmin, cmax));
                    }
                }
                Node::Leaf(leaf) => {
                    for i in 0..leaf.len() {
                        if let Some(t) = leaf.slots[i] {
                            let start = leaf.start(i, min);
                            let last = leaf.last(i, max);
                            match f(start, last.saturating_add(1), t) {
                                Some(new) => leaf.slots[i] = Some(new),
                                None => cleared.push((start, last)),
                            }
                        }
                    }
                }
                Node::Free => unreachable!("invariant: walk reaches live nodes only"),
            }
        }
        for (start, last) in cleared {
            self.store_incl(start, last, None)?;
        }
        Ok(())
    }

    /// Builds a tree by storing the given `(start, end_exclusive, entry)`
    /// ranges one after the other with [`MapleTree::store_range`] (the
    /// pre-`__mt_dup` way `dup_mmap()` rebuilt the child's tree).
    pub fn from_sorted_insert(
        entries: impl IntoIterator<Item = (u64, u64, T)>,
    ) -> Result<Self, MapleError> {
        let mut tree = Self::new();
        for (start, end, entry) in entries {
            tree.store_range(start, end, Some(entry))?;
        }
        Ok(tree)
    }
}
