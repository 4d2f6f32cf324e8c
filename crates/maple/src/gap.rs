//! Gap searches (Linux `mas_empty_area` / `mas_empty_area_rev`).
//!
//! Both searches descend from the root and skip every child whose recorded
//! gap (largest NULL range in its subtree) is smaller than the request or
//! whose range lies outside `[low, high)`. A NULL range never crosses a leaf
//! boundary, so the recorded gap is an exact upper bound of what a subtree
//! can offer.

use core::fmt::Debug;

use crate::node::{Node, NodeId};
use crate::MapleTree;

/// One gap query: a NULL range clipped to `[low, high_incl]` must hold at
/// least `size` indices.
#[derive(Clone, Copy)]
struct Query {
    low: u64,
    high_incl: u64,
    size: u64,
}

impl Query {
    /// The clipped part of the NULL range `[start, last]` if it is big enough.
    #[inline]
    fn fit(&self, start: u64, last: u64) -> Option<(u64, u64)> {
        let cs = start.max(self.low);
        let cl = last.min(self.high_incl);
        (cs <= cl && cl - cs >= self.size - 1).then_some((cs, cl))
    }
}

impl<T: Copy + Eq + Debug> MapleTree<T> {
    fn query(low: u64, high: u64, size: u64) -> Option<Query> {
        if size == 0 || high <= low || high - low < size {
            return None;
        }
        Some(Query {
            low,
            high_incl: high - 1,
            size,
        })
    }

    fn gap_fwd(&self, id: NodeId, min: u64, max: u64, q: &Query) -> Option<u64> {
        match &self.nodes[id as usize] {
            Node::Leaf(n) => {
                for i in 0..n.len() {
                    let last = n.last(i, max);
                    if last < q.low {
                        continue;
                    }
                    let start = n.start(i, min);
                    if start > q.high_incl {
                        break;
                    }
                    if n.slots[i].is_none() {
                        if let Some((cs, _)) = q.fit(start, last) {
                            return Some(cs);
                        }
                    }
                }
                None
            }
            Node::Arange(n) => {
                for i in 0..n.len() {
                    let (cmin, cmax) = n.bounds(i, min, max);
                    if cmax < q.low {
                        continue;
                    }
                    if cmin > q.high_incl {
                        break;
                    }
                    if n.gaps[i] < q.size {
                        continue;
                    }
                    if let Some(found) = self.gap_fwd(n.slots[i], cmin, cmax, q) {
                        return Some(found);
                    }
                }
                None
            }
            Node::Free => unreachable!("invariant: search reaches live nodes only"),
        }
    }

    fn gap_rev(&self, id: NodeId, min: u64, max: u64, q: &Query) -> Option<(u64, u64)> {
        match &self.nodes[id as usize] {
            Node::Leaf(n) => {
                for i in (0..n.len()).rev() {
                    let start = n.start(i, min);
                    if start > q.high_incl {
                        continue;
                    }
                    let last = n.last(i, max);
                    if last < q.low {
                        break;
                    }
                    if n.slots[i].is_none() {
                        if let Some(found) = q.fit(start, last) {
                            return Some(found);
                        }
                    }
                }
                None
            }
            Node::Arange(n) => {
                for i in (0..n.len()).rev() {
                    let (cmin, cmax) = n.bounds(i, min, max);
                    if cmin > q.high_incl {
                        continue;
                    }
                    if cmax < q.low {
                        break;
                    }
                    if n.gaps[i] < q.size {
                        continue;
                    }
                    if let Some(found) = self.gap_rev(n.slots[i], cmin, cmax, q) {
                        return Some(found);
                    }
                }
                None
            }
            Node::Free => unreachable!("invariant: search reaches live nodes only"),
        }
    }

    /// Lowest `s` such that `[s, s + size)` is free and inside `[low, high)`.
    ///
    /// Searches upwards from `low`, skipping subtrees whose recorded gap is
    /// smaller than `size` (Linux `mas_empty_area`). Returns `None` when no
    /// such range exists, and for `size == 0` or an empty window.
    pub fn empty_area(&self, low: u64, high: u64, size: u64) -> Option<u64> {
        let q = Self::query(low, high, size)?;
        self.gap_fwd(self.root, 0, u64::MAX, &q)
    }

    /// The highest free range clipped to `[low, high)` that still holds
    /// `size` indices, as `(gap_start, gap_end_exclusive)` (both clipped).
    ///
    /// Searches downwards from `high`, pruning subtrees by their recorded gap
    /// (Linux `mas_empty_area_rev`, the search behind `get_unmapped_area`
    /// top-down). A caller wanting the topmost placement uses
    /// `gap_end_exclusive - size`. Returns `None` for `size == 0`, an empty
    /// window or when nothing fits.
    pub fn empty_area_rev(&self, low: u64, high: u64, size: u64) -> Option<(u64, u64)> {
        let q = Self::query(low, high, size)?;
        self.gap_rev(self.root, 0, u64::MAX, &q)
            .map(|(s, l)| (s, l + 1))
    }
}
