//! Structural checks (Linux `mt_validate`) and shape dumps.

use core::fmt::Debug;

use crate::node::{
    range_size, Node, NodeId, ARANGE_MIN, ARANGE_SLOTS, LEAF_MIN, LEAF_SLOTS, MAX_HEIGHT,
};
use crate::MapleTree;

struct Ctx {
    seen: Vec<bool>,
    visited: usize,
    entries: usize,
    /// Whether the previous range (in index order) was NULL.
    prev_null: Option<bool>,
    leaf_depth: usize,
}

/// Checks that `pivots` (the explicit bounds of a node with `len` slots) are
/// strictly ascending and leave every slot a non-empty range in `[min, max]`.
fn check_pivots(id: NodeId, pivots: &[u64], min: u64, max: u64) -> Result<(), String> {
    let mut lo = min;
    for (i, &p) in pivots.iter().enumerate() {
        if p < lo {
            return Err(format!("node {id}: pivot[{i}] = {p:#x} below {lo:#x}"));
        }
        if p >= max {
            return Err(format!(
                "node {id}: pivot[{i}] = {p:#x} not below node max {max:#x}"
            ));
        }
        lo = p + 1;
    }
    Ok(())
}

impl<T: Copy + Eq + Debug> MapleTree<T> {
    fn check_node(
        &self,
        id: NodeId,
        min: u64,
        max: u64,
        depth: usize,
        ctx: &mut Ctx,
    ) -> Result<u64, String> {
        let slot = ctx
            .seen
            .get_mut(id as usize)
            .ok_or(format!("node {id} outside the arena"))?;
        if *slot {
            return Err(format!("node {id} referenced twice"));
        }
        *slot = true;
        ctx.visited += 1;
        let is_root = depth == 0;
        match &self.nodes[id as usize] {
            Node::Free => Err(format!("node {id} is on the free list but referenced")),
            Node::Leaf(n) => {
                if depth != ctx.leaf_depth {
                    return Err(format!(
                        "leaf {id} at depth {depth}, expected {}",
                        ctx.leaf_depth
                    ));
                }
                let len = n.len();
                if len == 0 || len > LEAF_SLOTS {
                    return Err(format!("leaf {id}: bad length {len}"));
                }
                if !is_root && len < LEAF_MIN {
                    return Err(format!(
                        "leaf {id} [{min:#x}, {max:#x}]: {len} < {LEAF_MIN} ranges"
                    ));
                }
                check_pivots(id, &n.pivots[..len - 1], min, max)?;
                for i in 0..len {
                    let null = n.slots[i].is_none();
                    if null && ctx.prev_null == Some(true) {
                        return Err(format!(
                            "leaf {id}: NULL range at {:#x} follows a NULL range",
                            n.start(i, min)
                        ));
                    }
                    ctx.prev_null = Some(null);
                    if !null {
                        ctx.entries += 1;
                    }
                }
                Ok(n.max_gap(min, max))
            }
            Node::Arange(n) => {
                if depth >= ctx.leaf_depth {
                    return Err(format!("internal node {id} at leaf depth {depth}"));
                }
                let len = n.len();
                let min_len = if is_root { 2 } else { ARANGE_MIN };
                if len < min_len || len > ARANGE_SLOTS {
                    return Err(format!(
                        "internal node {id} [{min:#x}, {max:#x}]: {len} children"
                    ));
                }
                check_pivots(id, &n.pivots[..len - 1], min, max)?;
                for i in 0..len {
                    let (cmin, cmax) = n.bounds(i, min, max);
                    let gap = self.check_node(n.slots[i], cmin, cmax, depth + 1, ctx)?;
                    if gap != n.gaps[i] {
                        return Err(format!(
                            "internal node {id}: gap[{i}] = {:#x}, recomputed {gap:#x}",
                            n.gaps[i]
                        ));
                    }
                }
                Ok(n.max_gap())
            }
        }
    }

    /// Checks every structural invariant, returning a description of the
    /// first violation: pivots strictly ascending inside each node's bounds,
    /// child bounds consistent, recorded gaps equal to a recomputation, no
    /// two adjacent NULL ranges (also across nodes), minimum occupancy of
    /// non-root nodes, all leaves at the same depth, and `len` / node counts
    /// matching the content.
    pub fn validate(&self) -> Result<(), String> {
        if self.height == 0 || self.height as usize > MAX_HEIGHT {
            return Err(format!("bad height {}", self.height));
        }
        let mut ctx = Ctx {
            seen: vec![false; self.nodes.len()],
            visited: 0,
            entries: 0,
            prev_null: None,
            leaf_depth: self.height as usize - 1,
        };
        let gap = self.check_node(self.root, 0, u64::MAX, 0, &mut ctx)?;
        if ctx.entries != self.len {
            return Err(format!(
                "len is {} but the leaves hold {} entries",
                self.len, ctx.entries
            ));
        }
        if ctx.visited != self.live {
            return Err(format!(
                "{} live nodes but {} reachable",
                self.live, ctx.visited
            ));
        }
        if self.live + self.free.len() != self.nodes.len() {
            return Err("arena accounting mismatch".to_string());
        }
        for &f in &self.free {
            if !matches!(self.nodes[f as usize], Node::Free) || ctx.seen[f as usize] {
                return Err(format!("free-list node {f} is in use"));
            }
        }
        let expected_total = match self
            .iter()
            .try_fold((0u64, 0u64), |(end, best), (s, e, _)| {
                (s >= end).then(|| {
                    (
                        e,
                        best.max(if s > end { range_size(end, s - 1) } else { 0 }),
                    )
                })
            }) {
            Some((end, best)) => best.max(range_size(end, u64::MAX)),
            None => return Err("iteration is not ascending".to_string()),
        };
        if gap != expected_total {
            return Err(format!(
                "root gap {gap:#x}, largest NULL range {expected_total:#x}"
            ));
        }
        Ok(())
    }

    /// The node layout, level by level from the root: each node's
    /// `(min, max)` (inclusive) in index order.
    pub fn shape(&self) -> Vec<Vec<(u64, u64)>> {
        let mut levels = Vec::with_capacity(self.height as usize);
        let mut current: Vec<(NodeId, u64, u64)> = vec![(self.root, 0, u64::MAX)];
        while !current.is_empty() {
            levels.push(current.iter().map(|&(_, min, max)| (min, max)).collect());
            let mut next = Vec::new();
            for &(id, min, max) in &current {
                if let Node::Arange(n) = &self.nodes[id as usize] {
                    for i in 0..n.len() {
                        let (cmin, cmax) = n.bounds(i, min, max);
                        next.push((n.slots[i], cmin, cmax));
                    }
                }
            }
            current = next;
        }
        levels
    }
}
