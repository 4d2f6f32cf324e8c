//! VMA split and merge.
//!
//! Linux counterpart: `mm/vma.c` (`__split_vma`, `vma_merge_new_range`,
//! `vma_merge_existing_range`, `is_mergeable_anon_vma`, `vma_modify_flags`). The rules that
//! decide whether two adjacent VMAs merge: equal flags (ignoring soft-dirty), the same backing
//! object, contiguous page offsets, and compatible anon_vmas (equal, or one absent while the
//! other has never been forked: a chain of length one).

use super::{AnonLink, VmFlags, Vma, VmaId, VmaSet};
use crate::errno::{Errno, SysResult};
use crate::stats::{CpuCounters, Ev};
use crate::vaddr::VirtAddr;
use std::sync::Arc;

/// A proposed range with its attributes, used to test merges before anything changes.
#[derive(Debug, Clone)]
pub(crate) struct Proposal<'a> {
    /// Start.
    pub(crate) start: u64,
    /// End.
    pub(crate) end: u64,
    /// Flags.
    pub(crate) flags: VmFlags,
    /// Page offset of `start`.
    pub(crate) pgoff: u64,
    /// anon_vma and chain length.
    pub(crate) anon_vma: AnonLink,
    /// Backing shmem object.
    pub(crate) file: Option<&'a Arc<crate::filemap::Inode>>,
}

impl<'a> Proposal<'a> {
    /// The attributes of an existing VMA restricted to `[start, end)`, with new flags.
    pub(crate) fn of(vma: &'a Vma, start: u64, end: u64, flags: VmFlags) -> Proposal<'a> {
        Proposal {
            start,
            end,
            flags,
            pgoff: vma.pgoff_at(VirtAddr::new(start)),
            anon_vma: vma.anon_link(),
            file: vma.file.as_ref(),
        }
    }
}

fn anon_compatible(src: AnonLink, tgt: AnonLink) -> bool {
    match (src.id, tgt.id) {
        (None, None) => true,
        (None, Some(_)) => tgt.chain <= 1,
        (Some(_), None) => src.chain <= 1,
        (Some(a), Some(b)) => a == b,
    }
}

fn same_object(
    a: Option<&Arc<crate::filemap::Inode>>,
    b: Option<&Arc<crate::filemap::Inode>>,
) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(x), Some(y)) => Arc::ptr_eq(x, y),
        _ => false,
    }
}

/// Whether a merge of both neighbours into one VMA keeps anon_vmas compatible.
fn neighbours_compatible(set: &VmaSet, left: Option<VmaId>, right: Option<VmaId>) -> bool {
    match (left, right) {
        (Some(pv), Some(nx)) => {
            // `can_vma_merge_right`: each side already passed its own test against the
            // proposal (fork children included); the two only need one anon_vma between them.
            let (a, b) = (set.get(pv).anon_vma(), set.get(nx).anon_vma());
            a.is_none() || b.is_none() || a == b
        }
        _ => false,
    }
}

/// Whether `p` can merge with its left neighbour `prev` (which ends at `p.start`).
pub(crate) fn can_merge_after(prev: &Vma, p: &Proposal<'_>) -> bool {
    prev.end == p.start
        && prev.flags.0 & !VmFlags::IGNORE_MERGE == p.flags.0 & !VmFlags::IGNORE_MERGE
        && same_object(prev.file.as_ref(), p.file)
        && prev.pgoff + (prev.len() >> 12) == p.pgoff
        && anon_compatible(p.anon_vma, prev.anon_link())
}

/// Whether `p` can merge with its right neighbour `next` (which starts at `p.end`).
pub(crate) fn can_merge_before(p: &Proposal<'_>, next: &Vma) -> bool {
    next.start == p.end
        && next.flags.0 & !VmFlags::IGNORE_MERGE == p.flags.0 & !VmFlags::IGNORE_MERGE
        && same_object(next.file.as_ref(), p.file)
        && p.pgoff + ((p.end - p.start) >> 12) == next.pgoff
        && anon_compatible(p.anon_vma, next.anon_link())
}

fn store(set: &mut VmaSet, start: u64, end: u64, id: Option<VmaId>) -> SysResult<()> {
    set.tree
        .store_range(start, end, id)
        .map_err(|_| Errno::ENOMEM)
}

/// Splits `id` at `addr`; the original keeps `[start, addr)`, the returned VMA is `[addr, end)`.
///
/// # Errors
/// `ENOMEM` if the map count is at `max_map_count` or the tree cannot allocate.
pub(crate) fn split(
    set: &mut VmaSet,
    c: &CpuCounters,
    id: VmaId,
    addr: u64,
    max_map_count: u64,
) -> SysResult<VmaId> {
    if set.count() as u64 >= max_map_count {
        return Err(Errno::ENOMEM);
    }
    let mut upper = set.get(id).clone();
    upper.pgoff = upper.pgoff_at(VirtAddr::new(addr));
    upper.start = addr;
    if let Some(s) = &upper.file {
        s.get();
    }
    let (end, new) = (upper.end, set.alloc(upper));
    if let Err(e) = store(set, addr, end, Some(new)) {
        let v = set.release(new);
        if let Some(s) = v.file {
            s.put();
        }
        return Err(e);
    }
    set.get_mut(id).end = addr;
    c.add(Ev::VmaSplit, 1);
    Ok(new)
}

/// Removes a VMA that has been fully absorbed by a neighbour (its range is already re-stored).
fn drop_absorbed(set: &mut VmaSet, id: VmaId) {
    let v = set.release(id);
    if let Some(s) = v.file {
        s.put();
    }
}

/// Carries an anon_vma into a merge target that has none (`dup_anon_vma`).
fn inherit_anon(set: &VmaSet, tgt: VmaId, src: AnonLink) {
    let t = set.get(tgt);
    if let (None, Some(id)) = (t.anon_vma(), src.id) {
        t.set_anon_vma(id, src.chain);
    }
}

/// Applies `flags` to `[start, end)` of VMA `id`, merging with neighbours or splitting as
/// Linux's `vma_modify_flags` does.
///
/// # Returns
/// The VMA that now covers exactly `[start, end)` with the new flags (possibly larger after a
/// merge).
pub(crate) fn modify_flags(
    set: &mut VmaSet,
    c: &CpuCounters,
    id: VmaId,
    start: u64,
    end: u64,
    flags: VmFlags,
    max_map_count: u64,
) -> SysResult<VmaId> {
    let (vstart, vend) = (set.get(id).start, set.get(id).end);
    let prev = if start == vstart {
        set.find(vstart.wrapping_sub(1)).filter(|_| vstart > 0)
    } else {
        None
    };
    let next = if end == vend { set.find(vend) } else { None };
    let p = Proposal::of(set.get(id), start, end, flags);
    let (src, p_pgoff) = (p.anon_vma, p.pgoff);
    let left = prev.filter(|&pv| can_merge_after(set.get(pv), &p));
    let right = next.filter(|&nx| can_merge_before(&p, set.get(nx)));
    let both = neighbours_compatible(set, left, right);
    match (left, right) {
        (Some(pv), Some(nx)) if both => {
            let nend = set.get(nx).end;
            let pstart = set.get(pv).start;
            store(set, pstart, nend, Some(pv))?;
            let nx_anon = set.get(nx).anon_link();
            set.get_mut(pv).end = nend;
            inherit_anon(set, pv, src);
            inherit_anon(set, pv, nx_anon);
            drop_absorbed(set, id);
            drop_absorbed(set, nx);
            c.add(Ev::VmaMerge, 1);
            Ok(pv)
        }
        (Some(pv), _) => {
            let pstart = set.get(pv).start;
            store(set, pstart, end, Some(pv))?;
            set.get_mut(pv).end = end;
            inherit_anon(set, pv, src);
            if end == vend {
                drop_absorbed(set, id);
            } else {
                let v = set.get_mut(id);
                v.pgoff = v.pgoff_at(VirtAddr::new(end));
                v.start = end;
            }
            c.add(Ev::VmaMerge, 1);
            Ok(pv)
        }
        (None, Some(nx)) => {
            let nend = set.get(nx).end;
            store(set, start, nend, Some(nx))?;
            let n = set.get_mut(nx);
            n.start = start;
            n.pgoff = p_pgoff;
            inherit_anon(set, nx, src);
            if start == vstart {
                drop_absorbed(set, id);
            } else {
                set.get_mut(id).end = start;
            }
            c.add(Ev::VmaMerge, 1);
            Ok(nx)
        }
        (None, None) => {
            let mut target = id;
            if start > vstart {
                target = split(set, c, id, start, max_map_count)?;
            }
            if end < vend {
                split(set, c, target, end, max_map_count)?;
            }
            set.get_mut(target).flags = flags;
            Ok(target)
        }
    }
}

/// Inserts a new range, merging with the neighbours when possible (`vma_merge_new_range`),
/// else creating a VMA.
///
/// # Context
/// The range `[p.start, p.end)` must be empty in the tree.
pub(crate) fn insert_new(set: &mut VmaSet, c: &CpuCounters, p: Proposal<'_>) -> SysResult<VmaId> {
    insert_new_with(set, c, p, MergeWith::Neighbours)
}

/// Which neighbours a new range may merge with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MergeWith {
    /// The previous and the next VMA (`vma_merge_new_range`).
    Neighbours,
    /// Only a previous VMA that starts at or above this address: `do_brk_flags` expands the
    /// heap VMA that `vma_prev_limit(start_brk)` finds, never one below the heap's start, and
    /// never merges with the next (`just_expand`).
    HeapFrom(u64),
}

/// [`insert_new`] with a choice of neighbours.
///
/// # Context
/// The range `[p.start, p.end)` must be empty in the tree.
pub(crate) fn insert_new_with(
    set: &mut VmaSet,
    c: &CpuCounters,
    p: Proposal<'_>,
    with: MergeWith,
) -> SysResult<VmaId> {
    let prev = if p.start > 0 {
        set.find(p.start - 1)
    } else {
        None
    };
    let (prev, next) = match with {
        MergeWith::Neighbours => (prev, set.find(p.end)),
        MergeWith::HeapFrom(start_brk) => (prev.filter(|&pv| set.get(pv).start >= start_brk), None),
    };
    let left = prev.filter(|&pv| can_merge_after(set.get(pv), &p));
    let right = next.filter(|&nx| can_merge_before(&p, set.get(nx)));
    let both = neighbours_compatible(set, left, right);
    match (left, right) {
        (Some(pv), Some(nx)) if both => {
            let (pstart, nend) = (set.get(pv).start, set.get(nx).end);
            store(set, pstart, nend, Some(pv))?;
            let nx_anon = set.get(nx).anon_link();
            set.get_mut(pv).end = nend;
            inherit_anon(set, pv, p.anon_vma);
            inherit_anon(set, pv, nx_anon);
            drop_absorbed(set, nx);
            c.add(Ev::VmaMerge, 1);
            Ok(pv)
        }
        (Some(pv), _) => {
            let pstart = set.get(pv).start;
            store(set, pstart, p.end, Some(pv))?;
            set.get_mut(pv).end = p.end;
            inherit_anon(set, pv, p.anon_vma);
            c.add(Ev::VmaMerge, 1);
            Ok(pv)
        }
        (None, Some(nx)) => {
            let nend = set.get(nx).end;
            store(set, p.start, nend, Some(nx))?;
            let n = set.get_mut(nx);
            n.start = p.start;
            n.pgoff = p.pgoff;
            inherit_anon(set, nx, p.anon_vma);
            c.add(Ev::VmaMerge, 1);
            Ok(nx)
        }
        (None, None) => {
            let vma = Vma::new(p.start, p.end, p.flags, p.pgoff, p.file.cloned());
            if let Some(id) = p.anon_vma.id {
                vma.set_anon_vma(id, p.anon_vma.chain);
            }
            if let Some(s) = &vma.file {
                s.get();
            }
            let id = set.alloc(vma);
            if let Err(e) = store(set, p.start, p.end, Some(id)) {
                drop_absorbed(set, id);
                return Err(e);
            }
            Ok(id)
        }
    }
}
