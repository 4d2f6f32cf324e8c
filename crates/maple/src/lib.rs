//! # maple — a range B-tree modelled on Linux's maple tree
//!
//! User-space counterpart of `lib/maple_tree.c` and
//! `include/linux/maple_tree.h`, written from the published design (not from
//! the kernel source), for holding the VMAs of an address space.
//!
//! ## Model
//!
//! The tree maps the whole index space `[0, u64::MAX]` as consecutive
//! ranges; every range holds an entry `T` or nothing (NULL). Adjacent NULL
//! ranges are always coalesced, even across node boundaries, so a NULL range
//! is always followed and preceded by an entry.
//!
//! ## Node layout
//!
//! ```text
//!                    arange (internal) node, bounds [min, max]
//!   +---------+---------+---------+-----+---------+
//!   | pivot 0 | pivot 1 | pivot 2 | ... | pivot 8 |   9 pivots (inclusive)
//!   +---------+---------+---------+-----+---------+---------+
//!   | child 0 | child 1 | child 2 | ... | child 8 | child 9 |  10 children
//!   | gap 0   | gap 1   | gap 2   | ... | gap 8   | gap 9   |  largest NULL
//!   +----+----+---------+---------+-----+---------+---------+  range below
//!        |
//!        v   child 0 covers [min, pivot 0], child i [pivot i-1 + 1, pivot i],
//!            the last used child [pivot n-2 + 1, max]
//!   +---------+---------+-----+----------+
//!   | pivot 0 | pivot 1 | ... | pivot 14 |              15 pivots
//!   +---------+---------+-----+----------+----------+
//!   | slot 0  | slot 1  | ... | slot 14  | slot 15  |   16 Option<T>
//!   +---------+---------+-----+----------+----------+
//!                   leaf node
//! ```
//!
//! Nodes carry neither their bounds nor a parent pointer: bounds are
//! inherited while walking down (as in Linux's `ma_state`). Nodes live in an
//! arena (`Vec` + free list, `u32` ids); every allocation goes through one
//! function that consults the fail point ([`MapleTree::set_fail_point`]).
//! Non-root leaves hold at least 6 ranges and non-root internal nodes at
//! least 4 children (Linux `mt_min_slots`); stores split, rebalance, grow
//! and shrink the tree as needed, see the `store` module.
//!
//! Besides single stores, a tree can be built in one go from ranges in
//! ascending order ([`MapleTree::from_sorted_bulk`]), shaped as Linux's bulk
//! mode (`mas_expected_entries` + in-order stores + `mas_destroy`) shapes it,
//! see the `bulk` module.
//!
//! The public API uses exclusive ends (`start..end`), as an address space
//! does; internally pivots are inclusive. Consequently index `u64::MAX`
//! can never hold an entry.

mod bulk;
mod dup;
mod gap;
mod iter;
mod node;
mod store;
mod validate;

use core::fmt::{self, Debug};
use std::sync::Arc;

pub use bulk::{bulk_prealloc_nodes, StoreWork};
pub use iter::Iter;
use node::{Leaf, Node, NodeCache, NodeId};

/// Errors of tree updates.
#[derive(Debug, thiserror::Error, PartialEq, Eq, Clone, Copy)]
pub enum MapleError {
    /// A node allocation failed (the fail point fired).
    #[error("node allocation failed")]
    NoMemory,
    /// `start >= end`, or (bulk loads) a range starting below the end of
    /// the previous one.
    #[error("invalid range {start:#x}..{end:#x}")]
    InvalidRange {
        /// Requested start.
        start: u64,
        /// Requested exclusive end.
        end: u64,
    },
}

/// Node accounting of a tree.
///
/// `allocated` and `freed` are cumulative counters of the node cache, which
/// a tree shares with the trees duplicated from it (like Linux's global
/// `maple_node_cache`); `allocated - freed` is the number of nodes alive in
/// all of them. `nodes` is this tree's current node count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TreeStats {
    /// Nodes allocated so far.
    pub allocated: u64,
    /// Nodes freed so far.
    pub freed: u64,
    /// Nodes currently in this tree.
    pub nodes: usize,
}

/// A range B-tree over `[0, u64::MAX]` in the style of Linux's maple tree.
pub struct MapleTree<T> {
    /// The node arena.
    pub(crate) nodes: Vec<Node<T>>,
    /// Free arena cells.
    pub(crate) free: Vec<NodeId>,
    pub(crate) root: NodeId,
    /// Number of levels; 1 when the root is a leaf.
    pub(crate) height: u32,
    /// Number of non-NULL ranges.
    pub(crate) len: usize,
    /// Number of live nodes.
    pub(crate) live: usize,
    pub(crate) cache: Arc<NodeCache>,
    /// Work done by this tree's bulk-load stores so far.
    pub(crate) work: StoreWork,
}

impl<T: Copy + Eq + Debug> MapleTree<T> {
    /// An empty tree: a single leaf holding one NULL range.
    pub fn new() -> Self {
        let mut tree = MapleTree {
            nodes: Vec::new(),
            free: Vec::new(),
            root: 0,
            height: 1,
            len: 0,
            live: 0,
            cache: Arc::new(NodeCache::default()),
            work: StoreWork::default(),
        };
        tree.root = tree
            .alloc_node(Node::Leaf(Leaf::empty()))
            .expect("invariant: a fresh node cache has no fail point armed");
        tree
    }

    /// The entry covering `index`, if any (Linux `mtree_load`).
    #[inline]
    pub fn load(&self, index: u64) -> Option<T> {
        self.range_at(index).2.copied()
    }

    /// `(start, end_exclusive, entry)` of the entry covering `index`.
    #[inline]
    pub fn find(&self, index: u64) -> Option<(u64, u64, T)> {
        let (start, last, entry) = self.range_at(index);
        entry.map(|&t| (start, last.saturating_add(1), t))
    }

    /// The first entry ending after `index`: the one containing `index`, or
    /// else the next one above it (Linux `find_vma` semantics).
    pub fn find_after(&self, index: u64) -> Option<(u64, u64, T)> {
        let (start, last, entry) = self.range_at(index);
        if let Some(&t) = entry {
            return Some((start, last.saturating_add(1), t));
        }
        if last == u64::MAX {
            return None;
        }
        // NULL ranges are coalesced, so the next range holds an entry.
        self.find(last + 1)
    }

    /// The last entry starting before `index` (Linux `find_vma_prev`-like).
    pub fn find_before(&self, index: u64) -> Option<(u64, u64, T)> {
        if index == 0 {
            return None;
        }
        let (start, last, entry) = self.range_at(index - 1);
        if let Some(&t) = entry {
            return Some((start, last.saturating_add(1), t));
        }
        if start == 0 {
            return None;
        }
        self.find(start - 1)
    }

    /// All entries in index order as `(start, end_exclusive, entry)`.
    pub fn iter(&self) -> Iter<'_, T> {
        Iter::new(self, 0, u64::MAX)
    }

    /// Entries overlapping `[start, end)`, in order and not clipped.
    pub fn range(&self, start: u64, end: u64) -> Iter<'_, T> {
        Iter::new(self, start, end)
    }

    /// Stores `entry` (or NULL for `None`) over `[start, end)`.
    ///
    /// Entries partially covered are trimmed, their remaining parts keeping
    /// the same value. On error the tree is unchanged.
    pub fn store_range(
        &mut self,
        start: u64,
        end: u64,
        entry: Option<T>,
    ) -> Result<(), MapleError> {
        if start >= end {
            return Err(MapleError::InvalidRange { start, end });
        }
        self.store_incl(start, end - 1, entry)
    }

    /// Makes `[start, end)` NULL; the same as `store_range(start, end, None)`.
    pub fn erase_range(&mut self, start: u64, end: u64) -> Result<(), MapleError> {
        self.store_range(start, end, None)
    }

    /// Number of non-NULL ranges.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the tree holds no entry.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of levels (1 when the root is a leaf).
    #[inline]
    pub fn height(&self) -> u32 {
        self.height
    }

    /// Number of nodes in the tree.
    #[inline]
    pub fn node_count(&self) -> usize {
        self.live
    }

    /// Allocation statistics, see [`TreeStats`].
    pub fn stats(&self) -> TreeStats {
        let (allocated, freed) = self.cache.counters();
        TreeStats {
            allocated,
            freed,
            nodes: self.live,
        }
    }

    /// The work this tree's bulk loads did store by store, see
    /// [`StoreWork`] (kept apart from [`TreeStats`], whose fields are the
    /// node accounting). Other updates leave it unchanged; a duplicated tree
    /// starts at zero.
    pub fn store_work(&self) -> StoreWork {
        self.work
    }

    /// Arms a fail point: the `n`-th node allocation (1-based, counted from
    /// this call) fails with [`MapleError::NoMemory`]; later ones succeed.
    /// `None` (or `Some(0)`) disarms it. The fail point belongs to the node
    /// cache shared with duplicated trees.
    pub fn set_fail_point(&mut self, fail_nth: Option<u64>) {
        self.cache.set_fail_point(fail_nth);
    }
}

impl<T: Copy + Eq + Debug> Default for MapleTree<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Drop for MapleTree<T> {
    fn drop(&mut self) {
        self.cache.uncharge(self.live as u64);
    }
}

/// Debug helper listing the entries of a tree.
struct Entries<'a, T>(&'a MapleTree<T>);

impl<T: Debug> Debug for Entries<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tree = self.0;
        let mut list = f.debug_map();
        let mut stack: Vec<(NodeId, u64, u64)> = vec![(tree.root, 0, u64::MAX)];
        while let Some((id, min, max)) = stack.pop() {
            match &tree.nodes[id as usize] {
                Node::Arange(n) => {
                    for i in (0..n.len()).rev() {
                        let (cmin, cmax) = n.bounds(i, min, max);
                        stack.push((n.slots[i], cmin, cmax));
                    }
                }
                Node::Leaf(n) => {
                    for i in 0..n.len() {
                        if let Some(t) = &n.slots[i] {
                            let (s, l) = (n.start(i, min), n.last(i, max));
                            list.entry(&format_args!("{s:#x}..{:#x}", l.saturating_add(1)), t);
                        }
                    }
                }
                Node::Free => {}
            }
        }
        list.finish()
    }
}

impl<T: Debug> Debug for MapleTree<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MapleTree")
            .field("len", &self.len)
            .field("height", &self.height)
            .field("nodes", &self.live)
            .field("entries", &Entries(self))
            .finish()
    }
}
