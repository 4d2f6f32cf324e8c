//! The page-cache index: a radix tree of 64-slot nodes from page index to frame, as Linux's
//! `struct xarray` (`lib/xarray.c`) under `address_space::i_pages`.
//!
//! ```text
//!   XArray { shift: 18, len }           index bits: | 17..12 | 11..6 | 5..0 |
//!     root: Inner ─ slots[64] ─────────────────────────┘         │       │
//!             └─ Inner ─ slots[64] ──────────────────────────────┘       │
//!                  └─ Leaf ─ slots[64]: frame or EMPTY ──────────────────┘
//! ```
//!
//! The root covers indexes below `1 << shift`; it gains a level (the old root becomes slot 0
//! of a new one) when a larger index is stored, and nodes left empty by a removal are freed,
//! as Linux's `xas_expand` and `xas_delete_node` do. A lookup is one load per level (three
//! levels cover a 1 GiB file), where the `BTreeMap` it replaces searched keys in every node
//! on the way.
//!
//! Deliberate differences: every page of a large folio has its own slot holding its own
//! frame (Linux stores one multi-order entry plus sibling slots); values are frames, not
//! folio pointers, and there are no marks (dirty and writeback are folio flags here) and no
//! RCU readers (the inode's cache lock is always held).

use crate::phys::Pfn;
use std::ops::{Bound, RangeBounds};

const BITS: u32 = 6;
const FANOUT: usize = 1 << BITS;
const MASK: u64 = FANOUT as u64 - 1;
/// A leaf slot with nothing in it (no frame has this number).
const EMPTY: u64 = u64::MAX;

#[derive(Clone, Debug)]
enum Node {
    /// The last level: frames.
    Leaf {
        slots: Box<[u64; FANOUT]>,
        count: u32,
    },
    /// An inner level: children.
    Inner {
        slots: Box<[Option<Box<Node>>; FANOUT]>,
        count: u32,
    },
}

impl Node {
    fn leaf() -> Node {
        Node::Leaf {
            slots: Box::new([EMPTY; FANOUT]),
            count: 0,
        }
    }

    fn inner() -> Node {
        Node::Inner {
            slots: Box::new(std::array::from_fn(|_| None)),
            count: 0,
        }
    }

    fn count(&self) -> u32 {
        match self {
            Node::Leaf { count, .. } | Node::Inner { count, .. } => *count,
        }
    }
}

/// Page index → frame, ordered, with a radix tree's lookups.
#[derive(Clone, Debug, Default)]
pub struct XArray {
    root: Option<Box<Node>>,
    /// Index bits the root covers (a multiple of 6; 0 when empty).
    shift: u32,
    len: usize,
}

impl XArray {
    /// An empty index.
    pub(crate) fn new() -> XArray {
        XArray::default()
    }

    /// Entries stored.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Nothing stored.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn covers(&self, index: u64) -> bool {
        self.shift >= 64 || index >> self.shift == 0
    }

    /// The frame at `index` (`xa_load`).
    pub(crate) fn get(&self, index: u64) -> Option<Pfn> {
        if !self.covers(index) {
            return None;
        }
        let mut node = self.root.as_deref()?;
        let mut shift = self.shift;
        loop {
            shift -= BITS;
            let slot = ((index >> shift) & MASK) as usize;
            match node {
                Node::Leaf { slots, .. } => {
                    return (slots[slot] != EMPTY).then_some(Pfn::new(slots[slot]));
                }
                Node::Inner { slots, .. } => node = slots[slot].as_deref()?,
            }
        }
    }

    /// Whether `index` holds a frame.
    pub(crate) fn contains(&self, index: u64) -> bool {
        self.get(index).is_some()
    }

    /// Stores `frame` at `index` (`xa_store`); returns what was there.
    pub(crate) fn insert(&mut self, index: u64, frame: Pfn) -> Option<Pfn> {
        let frame = frame.val();
        debug_assert_ne!(frame, EMPTY, "no frame has number u64::MAX");
        if self.root.is_none() {
            self.root = Some(Box::new(Node::leaf()));
            self.shift = BITS;
        }
        while !self.covers(index) {
            // xas_expand: the old root becomes slot 0 of a new, taller root.
            let old = self.root.take();
            let mut top = Node::inner();
            if let (Node::Inner { slots, count }, Some(old)) = (&mut top, old) {
                if old.count() > 0 {
                    slots[0] = Some(old);
                    *count = 1;
                }
            }
            self.root = Some(Box::new(top));
            self.shift += BITS;
        }
        let mut shift = self.shift;
        let mut node = self.root.as_deref_mut()?;
        loop {
            shift -= BITS;
            let slot = ((index >> shift) & MASK) as usize;
            match node {
                Node::Leaf { slots, count } => {
                    let old = std::mem::replace(&mut slots[slot], frame);
                    if old == EMPTY {
                        *count += 1;
                        self.len += 1;
                        return None;
                    }
                    return Some(Pfn::new(old));
                }
                Node::Inner { slots, count } => {
                    if slots[slot].is_none() {
                        let child = if shift == BITS {
                            Node::leaf()
                        } else {
                            Node::inner()
                        };
                        slots[slot] = Some(Box::new(child));
                        *count += 1;
                    }
                    node = slots[slot].as_deref_mut()?;
                }
            }
        }
    }

    /// Removes the frame at `index` (`xa_erase`), freeing nodes left empty.
    pub(crate) fn remove(&mut self, index: u64) -> Option<Pfn> {
        if !self.covers(index) {
            return None;
        }
        let shift = self.shift;
        let root = self.root.as_deref_mut()?;
        let old = remove_in(root, shift, index)?;
        self.len -= 1;
        if root.count() == 0 {
            self.root = None;
            self.shift = 0;
        }
        Some(Pfn::new(old))
    }

    /// The first entry at or after `from` and before `end` (exclusive; `None`: no end), with
    /// the leaf it is in and that leaf's first index.
    fn next_entry(&self, from: u64, end: Option<u64>) -> Option<(LeafRef<'_>, u64)> {
        if end.is_some_and(|e| from >= e) || !self.covers(from) {
            return None;
        }
        let last = end.map_or(u64::MAX, |e| e - 1);
        first_in(self.root.as_deref()?, self.shift, 0, from, last)
    }

    /// Entries with an index in `range`, in index order (`xa_for_each_range`).
    pub(crate) fn range(&self, range: impl RangeBounds<u64>) -> Range<'_> {
        let next = match range.start_bound() {
            Bound::Included(&s) => Some(s),
            Bound::Excluded(&s) => s.checked_add(1),
            Bound::Unbounded => Some(0),
        };
        let end = match range.end_bound() {
            Bound::Included(&e) => e.checked_add(1),
            Bound::Excluded(&e) => Some(e),
            Bound::Unbounded => None,
        };
        Range {
            xa: self,
            next,
            end,
            leaf: None,
        }
    }

    /// Every entry, in index order.
    pub(crate) fn iter(&self) -> Range<'_> {
        self.range(..)
    }

    /// Removes and returns every entry at or after `from` (truncation).
    pub(crate) fn split_off(&mut self, from: u64) -> XArray {
        let moved: Vec<(u64, Pfn)> = self.range(from..).collect();
        let mut out = XArray::new();
        for (i, f) in moved {
            self.remove(i);
            out.insert(i, f);
        }
        out
    }
}

/// Removes `index` below `node` (which covers `shift` bits); frees children left empty.
fn remove_in(node: &mut Node, shift: u32, index: u64) -> Option<u64> {
    let shift = shift - BITS;
    let slot = ((index >> shift) & MASK) as usize;
    match node {
        Node::Leaf { slots, count } => {
            let old = std::mem::replace(&mut slots[slot], EMPTY);
            if old == EMPTY {
                return None;
            }
            *count -= 1;
            Some(old)
        }
        Node::Inner { slots, count } => {
            let child = slots[slot].as_deref_mut()?;
            let old = remove_in(child, shift, index)?;
            if child.count() == 0 {
                slots[slot] = None;
                *count -= 1;
            }
            Some(old)
        }
    }
}

/// A leaf's slots and the index of its slot 0.
type LeafRef<'a> = (&'a [u64; FANOUT], u64);

/// The first entry in `from..=last` below `node`, which covers `shift` bits from `base`: the
/// leaf that holds it and its index (the scan stops at `last`: a window's end costs nothing
/// past it).
fn first_in(
    node: &Node,
    shift: u32,
    base: u64,
    from: u64,
    last: u64,
) -> Option<(LeafRef<'_>, u64)> {
    let shift = shift - BITS;
    let slot_of = |i: u64| (i.saturating_sub(base) >> shift).min(MASK) as usize;
    let (first, end) = (slot_of(from), slot_of(last));
    match node {
        Node::Leaf { slots, .. } => (first..=end)
            .find(|&j| slots[j] != EMPTY)
            .map(|j| ((&**slots, base), base + j as u64)),
        Node::Inner { slots, .. } => (first..=end).find_map(|j| {
            let child = slots[j].as_deref()?;
            let cbase = base + ((j as u64) << shift);
            first_in(child, shift, cbase, from.max(cbase), last)
        }),
    }
}

/// Iterator over `(index, frame)` in index order: it scans the current leaf's slots and
/// goes back to the root only to find the next leaf.
#[derive(Clone, Debug)]
pub(crate) struct Range<'a> {
    xa: &'a XArray,
    /// The next index to look at; `None` when past the largest index.
    next: Option<u64>,
    end: Option<u64>,
    leaf: Option<LeafRef<'a>>,
}

impl Iterator for Range<'_> {
    type Item = (u64, Pfn);

    fn next(&mut self) -> Option<(u64, Pfn)> {
        let from = self.next?;
        if self.end.is_some_and(|e| from >= e) {
            self.next = None;
            return None;
        }
        if let Some((slots, base)) = self.leaf {
            if from >= base && from - base < FANOUT as u64 {
                let stop = self
                    .end
                    .map_or(FANOUT as u64, |e| (e - base).min(FANOUT as u64));
                let hit = (from - base..stop).find(|&j| slots[j as usize] != EMPTY);
                if let Some(j) = hit {
                    self.next = (base + j).checked_add(1);
                    return Some((base + j, Pfn::new(slots[j as usize])));
                }
                self.next = base.checked_add(FANOUT as u64);
                self.leaf = None;
                return self.next();
            }
        }
        match self.xa.next_entry(from, self.end) {
            Some(((slots, base), i)) => {
                self.leaf = Some((slots, base));
                self.next = i.checked_add(1);
                Some((i, Pfn::new(slots[(i - base) as usize])))
            }
            None => {
                self.next = None;
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    #[derive(Clone, Debug)]
    enum Op {
        Insert(u64, Pfn),
        Remove(u64),
        SplitOff(u64),
    }

    fn index() -> impl Strategy<Value = u64> {
        prop_oneof![
            0u64..200,
            0u64..5000,
            any::<u64>(),
            Just(u64::MAX),
            Just(1 << 36)
        ]
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (index(), 0u64..1 << 40).prop_map(|(i, f)| Op::Insert(i, Pfn::new(f))),
            2 => index().prop_map(Op::Remove),
            1 => index().prop_map(Op::SplitOff),
        ]
    }

    proptest! {
        /// Every operation gives what a BTreeMap gives, and so do lookups and ranges.
        #[test]
        fn behaves_as_an_ordered_map(ops in proptest::collection::vec(op(), 1..200),
                                     probe in index(), span in 0u64..300) {
            let mut xa = XArray::new();
            let mut map = BTreeMap::new();
            for o in ops {
                match o {
                    Op::Insert(i, f) => prop_assert_eq!(xa.insert(i, f), map.insert(i, f)),
                    Op::Remove(i) => prop_assert_eq!(xa.remove(i), map.remove(&i)),
                    Op::SplitOff(i) => {
                        let a: Vec<_> = xa.split_off(i).iter().collect();
                        let b: Vec<_> = map.split_off(&i).into_iter().collect();
                        prop_assert_eq!(a, b);
                    }
                }
                prop_assert_eq!(xa.len(), map.len());
            }
            prop_assert_eq!(xa.get(probe), map.get(&probe).copied());
            let end = probe.saturating_add(span);
            let a: Vec<_> = xa.range(probe..end).collect();
            let b: Vec<_> = map.range(probe..end).map(|(&i, &f)| (i, f)).collect();
            prop_assert_eq!(a, b);
            let a: Vec<_> = xa.range(probe..=u64::MAX).collect();
            let b: Vec<_> = map.range(probe..).map(|(&i, &f)| (i, f)).collect();
            prop_assert_eq!(a, b);
            let all: Vec<_> = xa.iter().collect();
            prop_assert_eq!(all, map.into_iter().collect::<Vec<_>>());
        }
    }

    #[test]
    fn nodes_are_freed_and_the_root_shrinks_to_nothing() {
        let mut xa = XArray::new();
        for i in [0, 63, 64, 4095, 4096, 1 << 30] {
            assert_eq!(xa.insert(i, Pfn::new(i + 7)), None);
        }
        assert_eq!(xa.shift, 36, "1 << 30 needs six levels of 6 bits");
        assert_eq!(xa.get(4096), Some(Pfn::new(4103)));
        assert_eq!(xa.get(4097), None);
        for i in [0, 63, 64, 4095, 4096, 1 << 30] {
            assert_eq!(xa.remove(i), Some(Pfn::new(i + 7)));
        }
        assert!(xa.root.is_none() && xa.is_empty() && xa.shift == 0);
    }
}
