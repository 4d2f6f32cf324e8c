//! Virtual memory areas and the per-mm set of them.
//!
//! Linux counterparts: `struct vm_area_struct` (`include/linux/mm_types.h`), `mm/vma.c`
//! (split, merge, modify), `mm/mmap.c`. VMAs are named by [`VmaId`] handles stored in the
//! maple-like range tree of the crate `maple`; the VMA bodies live in a slab owned by the mm.
//! Everything here runs under the mmap lock: read for lookups, write for changes. The only
//! field a fault may change under the read lock is the anon_vma (set once, like Linux does
//! under `page_table_lock` in `__anon_vma_prepare`), hence the atomics.

pub(crate) mod merge;

use crate::filemap::Inode;
use crate::pgtable::Prot;
use crate::rmap::AnonVmaId;
use crate::vaddr::VirtAddr;
use maple::MapleTree;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

/// VMA flags with Linux's values (`include/linux/mm.h`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct VmFlags(pub(crate) u64);

#[allow(missing_docs)]
impl VmFlags {
    pub(crate) const READ: u64 = 0x1;
    pub(crate) const WRITE: u64 = 0x2;
    pub(crate) const EXEC: u64 = 0x4;
    pub(crate) const SHARED: u64 = 0x8;
    pub(crate) const MAYREAD: u64 = 0x10;
    pub(crate) const MAYWRITE: u64 = 0x20;
    pub(crate) const MAYEXEC: u64 = 0x40;
    pub(crate) const MAYSHARE: u64 = 0x80;
    pub(crate) const GROWSDOWN: u64 = 0x100;
    pub(crate) const SEQ_READ: u64 = 0x8000;
    pub(crate) const RAND_READ: u64 = 0x10000;
    pub const LOCKED: u64 = 0x2000;
    pub const DONTCOPY: u64 = 0x20000;
    pub const DONTEXPAND: u64 = 0x40000;
    pub(crate) const LOCKONFAULT: u64 = 0x80000;
    pub(crate) const ACCOUNT: u64 = 0x100000;
    pub(crate) const NORESERVE: u64 = 0x200000;
    pub const WIPEONFORK: u64 = 0x2000000;
    pub(crate) const DONTDUMP: u64 = 0x4000000;
    pub(crate) const MERGEABLE: u64 = 0x80000000;
    pub(crate) const SOFTDIRTY: u64 = 0x8000000;
    pub const HUGEPAGE: u64 = 0x20000000;
    pub const NOHUGEPAGE: u64 = 0x40000000;
    /// Flags that do not prevent a merge (`VM_IGNORE_MERGE`).
    pub(crate) const IGNORE_MERGE: u64 = Self::SOFTDIRTY;
    /// Access flags (`VM_ACCESS_FLAGS`), ignored by `anon_vma_compatible`.
    pub(crate) const ACCESS: u64 = Self::READ | Self::WRITE | Self::EXEC;

    /// Tests any of `bits`.
    #[inline]
    pub(crate) fn has(self, bits: u64) -> bool {
        self.0 & bits != 0
    }

    /// The page protection of the VMA's PTEs (`vm_page_prot`): private writable mappings
    /// are mapped read-only until a write fault makes a page exclusive (COW).
    pub(crate) fn page_prot(self) -> Prot {
        let write = self.has(Self::WRITE) && self.has(Self::SHARED);
        Prot {
            read: self.has(Self::READ),
            write,
            exec: self.has(Self::EXEC),
        }
    }

    /// The `rwxp` column of `/proc/PID/maps`.
    pub(crate) fn perms(self) -> String {
        let mut s = String::with_capacity(4);
        s.push(if self.has(Self::READ) { 'r' } else { '-' });
        s.push(if self.has(Self::WRITE) { 'w' } else { '-' });
        s.push(if self.has(Self::EXEC) { 'x' } else { '-' });
        s.push(if self.has(Self::MAYSHARE) { 's' } else { 'p' });
        s
    }
}

/// Handle of a VMA in its mm's slab.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct VmaId(pub(crate) u32);

/// A VMA's anon_vma and the length of its anon_vma chain (`vma->anon_vma` and the length of
/// `vma->anon_vma_chain`): what decides whether two anonymous VMAs may merge.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct AnonLink {
    /// The anon_vma, if any.
    pub(crate) id: Option<AnonVmaId>,
    /// The chain length: 1 for a VMA that owns its anon_vma, +1 per fork generation.
    pub(crate) chain: u32,
}

/// A virtual memory area.
#[derive(Debug)]
pub(crate) struct Vma {
    /// First address.
    pub(crate) start: u64,
    /// One past the last address.
    pub(crate) end: u64,
    /// Flags.
    pub(crate) flags: VmFlags,
    /// Page offset (anon private: `start >> PAGE_SHIFT` at creation; file: offset in the object).
    pub(crate) pgoff: u64,
    /// The anon_vma's [`AnonVmaId`] number (0 = none yet). Set once by the first fault.
    anon_vma: AtomicU32,
    /// Length of the anon_vma chain (1 for a VMA that owns its anon_vma; +1 per fork generation).
    anon_vma_chain: AtomicU32,
    /// The file mapped (`vm_file`): a disk or tmpfs file, or the shmem object of a shared
    /// anonymous mapping. `None` for private anonymous memory.
    pub(crate) file: Option<Arc<Inode>>,
    /// Swap readahead state (`swap_readahead_info`): the last swap fault's page number,
    /// its window and the readahead hits since, packed by [`crate::swap_fault`].
    pub(crate) swap_ra: AtomicU64,
}

impl Clone for Vma {
    fn clone(&self) -> Self {
        Vma {
            start: self.start,
            end: self.end,
            flags: self.flags,
            pgoff: self.pgoff,
            anon_vma: AtomicU32::new(self.anon_vma.load(Relaxed)),
            anon_vma_chain: AtomicU32::new(self.anon_vma_chain()),
            file: self.file.clone(),
            swap_ra: AtomicU64::new(self.swap_ra.load(Relaxed)),
        }
    }
}

impl Vma {
    /// A new VMA without an anon_vma.
    pub(crate) fn new(
        start: u64,
        end: u64,
        flags: VmFlags,
        pgoff: u64,
        file: Option<Arc<Inode>>,
    ) -> Vma {
        Vma {
            start,
            end,
            flags,
            pgoff,
            anon_vma: AtomicU32::new(0),
            anon_vma_chain: AtomicU32::new(0),
            file,
            swap_ra: AtomicU64::new(0),
        }
    }

    /// The anon_vma (`vma->anon_vma`), if the VMA has one.
    pub(crate) fn anon_vma(&self) -> Option<AnonVmaId> {
        AnonVmaId::new(self.anon_vma.load(Relaxed))
    }

    /// The anon_vma chain length.
    pub(crate) fn anon_vma_chain(&self) -> u32 {
        self.anon_vma_chain.load(Relaxed)
    }

    /// The anon_vma with its chain length, as merge compares them.
    pub(crate) fn anon_link(&self) -> AnonLink {
        AnonLink {
            id: self.anon_vma(),
            chain: self.anon_vma_chain(),
        }
    }

    /// Sets the anon_vma and chain length.
    ///
    /// # Context
    /// mmap write lock, or `page_table_lock` when attaching the first anon_vma in a fault.
    pub(crate) fn set_anon_vma(&self, id: AnonVmaId, chain: u32) {
        self.anon_vma.store(id.mapping_word(), Relaxed);
        self.anon_vma_chain.store(chain, Relaxed);
    }

    /// Drops the anon_vma link (a `MADV_WIPEONFORK` child starts without one; so does the
    /// source left behind by `MREMAP_DONTUNMAP`).
    pub(crate) fn clear_anon_vma(&self) {
        self.anon_vma.store(0, Relaxed);
        self.anon_vma_chain.store(0, Relaxed);
    }

    /// Whether the VMA is private anonymous memory.
    pub(crate) fn is_anon_private(&self) -> bool {
        self.file.is_none()
    }

    /// Whether shared writes must fault so the page gets dirtied (`vma_wants_writenotify`): a
    /// shared writable mapping of a file with writeback (disk). tmpfs and shared anonymous
    /// memory have no dirty accounting, so their PTEs are writable from the first fault.
    pub(crate) fn wants_writenotify(&self) -> bool {
        self.flags.has(VmFlags::SHARED)
            && self.flags.has(VmFlags::WRITE)
            && self
                .file
                .as_ref()
                .is_some_and(|f| f.kind == crate::filemap::InodeKind::Disk)
    }

    /// The protection of the VMA's new PTEs (`vm_page_prot`): read-only for private writable
    /// mappings (COW) and for shared mappings that track dirtying ([`Vma::wants_writenotify`]).
    pub(crate) fn page_prot(&self) -> crate::pgtable::Prot {
        let mut p = self.flags.page_prot();
        if self.wants_writenotify() {
            p.write = false;
        }
        p
    }

    /// Whether writes copy on write (`is_cow_mapping`).
    pub(crate) fn is_cow(&self) -> bool {
        self.flags.0 & (VmFlags::SHARED | VmFlags::MAYWRITE) == VmFlags::MAYWRITE
    }

    /// The first address (`vm_start`), typed. The field stays a `u64`: the VMA tree (the
    /// `maple` crate), the merge and split code and the views handle it as a number.
    #[inline]
    pub(crate) fn vm_start(&self) -> VirtAddr {
        VirtAddr::new(self.start)
    }

    /// One past the last address (`vm_end`), typed; see [`Vma::vm_start`].
    #[inline]
    pub(crate) fn vm_end(&self) -> VirtAddr {
        VirtAddr::new(self.end)
    }

    /// Size in bytes.
    pub(crate) fn len(&self) -> u64 {
        self.end - self.start
    }

    /// The page offset corresponding to `addr` (`linear_page_index`).
    #[inline]
    pub(crate) fn pgoff_at(&self, addr: VirtAddr) -> u64 {
        self.pgoff + (addr.offset_from(self.vm_start()) >> 12)
    }
}

/// The VMAs of one mm: the range tree plus the slab of bodies.
#[derive(Debug, Default)]
pub struct VmaSet {
    /// Range tree: address range -> VMA handle.
    pub tree: MapleTree<VmaId>,
    slab: Vec<Option<Vma>>,
    free: Vec<u32>,
}

impl VmaSet {
    /// The VMA body of a handle.
    ///
    /// # Panics
    /// If the handle is stale (an invariant violation).
    #[inline]
    pub(crate) fn get(&self, id: VmaId) -> &Vma {
        self.slab[id.0 as usize]
            .as_ref()
            .expect("invariant: live VMA handle")
    }

    /// Mutable VMA body.
    #[inline]
    pub(crate) fn get_mut(&mut self, id: VmaId) -> &mut Vma {
        self.slab[id.0 as usize]
            .as_mut()
            .expect("invariant: live VMA handle")
    }

    /// Adds a body to the slab (not yet in the tree).
    pub(crate) fn alloc(&mut self, vma: Vma) -> VmaId {
        if let Some(i) = self.free.pop() {
            self.slab[i as usize] = Some(vma);
            VmaId(i)
        } else {
            self.slab.push(Some(vma));
            VmaId(self.slab.len() as u32 - 1)
        }
    }

    /// Removes a body from the slab (after it left the tree).
    pub(crate) fn release(&mut self, id: VmaId) -> Vma {
        let v = self.slab[id.0 as usize]
            .take()
            .expect("invariant: live VMA handle");
        self.free.push(id.0);
        v
    }

    /// The VMA containing `addr`.
    #[inline]
    pub(crate) fn find(&self, addr: u64) -> Option<VmaId> {
        self.tree.load(addr)
    }

    /// The first VMA ending after `addr` (Linux `find_vma`).
    pub(crate) fn find_after(&self, addr: u64) -> Option<VmaId> {
        self.tree.find_after(addr).map(|(_, _, id)| id)
    }

    /// `find_mergeable_anon_vma`: the anon_vma of an adjacent VMA that `id` could share,
    /// the next one first, then the previous one. Two VMAs are compatible when they touch,
    /// differ in flags only by access bits and soft-dirty, map the same object (anonymous)
    /// and their page offsets continue; the neighbour's anon_vma is reusable when it is
    /// its only one (a chain of one: not a fork child's).
    pub(crate) fn mergeable_anon_vma(&self, id: VmaId) -> Option<AnonVmaId> {
        let v = self.get(id);
        let ignored = VmFlags::READ | VmFlags::WRITE | VmFlags::EXEC | VmFlags::SOFTDIRTY;
        let compatible = |a: &Vma, b: &Vma| {
            a.end == b.start
                && a.file.is_none()
                && b.file.is_none()
                && (a.flags.0 ^ b.flags.0) & !ignored == 0
                && b.pgoff == a.pgoff + ((b.start - a.start) >> 12)
        };
        let reusable = |n: &Vma| n.anon_vma().filter(|_| n.anon_vma_chain() == 1);
        if let Some(next) = self.find(v.end).map(|n| self.get(n)) {
            if let Some(av) = compatible(v, next).then(|| reusable(next)).flatten() {
                return Some(av);
            }
        }
        let prev = v
            .start
            .checked_sub(1)
            .and_then(|a| self.find(a))
            .map(|p| self.get(p))?;
        compatible(prev, v).then(|| reusable(prev)).flatten()
    }

    /// VMAs overlapping `[start, end)`, in order.
    pub(crate) fn overlapping(&self, start: u64, end: u64) -> Vec<VmaId> {
        if start >= end {
            return Vec::new();
        }
        self.tree.range(start, end).map(|(_, _, id)| id).collect()
    }

    /// Every VMA in order.
    pub(crate) fn all(&self) -> Vec<VmaId> {
        self.tree.iter().map(|(_, _, id)| id).collect()
    }

    /// Number of VMAs (`map_count`).
    pub(crate) fn count(&self) -> usize {
        self.tree.len()
    }

    /// Live slab entries (for validation).
    pub(crate) fn slab_live(&self) -> usize {
        self.slab.iter().filter(|v| v.is_some()).count()
    }
}

impl VmaSet {
    /// Builds this (empty) set as a structural copy of `parent`'s tree (`__mt_dup`), then
    /// replaces every entry with the VMA `f` makes from the parent's (`None` drops it, as
    /// `VM_DONTCOPY` does).
    ///
    /// # Errors
    /// On a node allocation failure the set is left empty: no slot ever points at a parent VMA.
    pub(crate) fn dup_from(
        &mut self,
        parent: &VmaSet,
        mut f: impl FnMut(&Vma) -> Option<Vma>,
    ) -> Result<(), maple::MapleError> {
        self.tree = parent.tree.dup_structure()?;
        let slab = &mut self.slab;
        let res = self.tree.replace_entries(|_, _, pid| {
            let child = f(parent.get(pid))?;
            slab.push(Some(child));
            Some(VmaId(slab.len() as u32 - 1))
        });
        if let Err(e) = res {
            self.tree = MapleTree::new();
            self.drop_unlinked();
            return Err(e);
        }
        Ok(())
    }

    /// Drops every VMA of a set whose tree never got them (a failed copy), returning their
    /// shmem references.
    fn drop_unlinked(&mut self) {
        for v in self.slab.drain(..).flatten() {
            if let Some(s) = v.file {
                s.put();
            }
        }
        self.free.clear();
    }

    /// Builds this (empty) set from `parent`'s VMAs the way `dup_mmap()` did before
    /// `__mt_dup` (Linux 6.1–6.5): the tree's nodes for `parent.count()` (`map_count`)
    /// entries are preallocated (`mas_expected_entries`), then every VMA `f` makes from the
    /// parent's, in address order, is appended in bulk mode (`None` skips it, as
    /// `VM_DONTCOPY` does) and the unused nodes are freed (`mas_destroy`). `f` is only
    /// called once the preallocation succeeded.
    ///
    /// # Errors
    /// On a node allocation failure the set is left empty: the VMAs already made are
    /// dropped (their shmem references returned) and the tree is untouched.
    pub(crate) fn bulk_from(
        &mut self,
        parent: &VmaSet,
        mut f: impl FnMut(&Vma) -> Option<Vma>,
    ) -> Result<(), maple::MapleError> {
        let slab = &mut self.slab;
        let entries = parent.tree.iter().filter_map(|(start, end, pid)| {
            let child = f(parent.get(pid))?;
            slab.push(Some(child));
            Some((start, end, VmaId(slab.len() as u32 - 1)))
        });
        let res = self.tree.load_sorted_bulk(entries, parent.count());
        if let Err(e) = res {
            self.drop_unlinked();
            return Err(e);
        }
        Ok(())
    }

    /// Sets the tree's node-allocation fail point (the n-th allocation from now fails).
    pub(crate) fn set_fail_point(&mut self, n: Option<u64>) {
        self.tree.set_fail_point(n);
    }
}
