//! In-order iteration over the entries (Linux `mas_find` / `mt_for_each`).

use core::fmt::Debug;

use crate::node::{Path, Step};
use crate::MapleTree;

/// Iterator over the entries of a [`MapleTree`] in index order, yielding
/// `(start, end_exclusive, entry)`; built by [`MapleTree::iter`] and
/// [`MapleTree::range`].
pub struct Iter<'a, T> {
    tree: &'a MapleTree<T>,
    path: Path,
    /// Stop at the first range starting at or after this index.
    end: u64,
    done: bool,
}

impl<T> Debug for Iter<'_, T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Iter")
            .field("end", &self.end)
            .field("done", &self.done)
            .finish()
    }
}

impl<'a, T: Copy + Eq + Debug> Iter<'a, T> {
    /// Iterator over the ranges starting before `end`, beginning with the
    /// range that contains `start`.
    pub(crate) fn new(tree: &'a MapleTree<T>, start: u64, end: u64) -> Self {
        let mut path = Path::new();
        tree.walk(start, &mut path);
        Iter {
            tree,
            path,
            end,
            done: start >= end,
        }
    }

    /// Moves to the next leaf slot, climbing and descending as needed.
    fn advance(&mut self) {
        let s0 = &mut self.path.steps[0];
        if (s0.idx as usize) + 1 < self.tree.leaf(s0.node).len() {
            s0.idx += 1;
            return;
        }
        let top = self.tree.height as usize - 1;
        let mut j = 1;
        while j <= top
            && self.path.steps[j].idx as usize + 1
                >= self.tree.arange(self.path.steps[j].node).len()
        {
            j += 1;
        }
        if j > top {
            self.done = true;
            return;
        }
        self.path.steps[j].idx += 1;
        for k in (0..j).rev() {
            let parent = self.path.steps[k + 1];
            let n = self.tree.arange(parent.node);
            let i = parent.idx as usize;
            let (min, max) = n.bounds(i, parent.min, parent.max);
            self.path.steps[k] = Step {
                node: n.slots[i],
                idx: 0,
                min,
                max,
            };
        }
    }
}

impl<T: Copy + Eq + Debug> Iterator for Iter<'_, T> {
    type Item = (u64, u64, T);

    fn next(&mut self) -> Option<Self::Item> {
        while !self.done {
            let at = self.path.steps[0];
            let leaf = self.tree.leaf(at.node);
            let i = at.idx as usize;
            let start = leaf.start(i, at.min);
            if start >= self.end {
                self.done = true;
                return None;
            }
            let last = leaf.last(i, at.max);
            let entry = leaf.slots[i];
            self.advance();
            if let Some(t) = entry {
                return Some((start, last.saturating_add(1), t));
            }
        }
        None
    }
}
