//! `munmap`, and the unmap primitive other calls reuse.
//!
//! Linux counterparts: `mm/vma.c` (`do_vmi_munmap`, `do_vmi_align_munmap`,
//! `vms_gather_munmap_vmas`, `vms_complete_munmap_vmas`), `mm/mmap.c` (`__vm_munmap`).

use super::{aligned, page_align, user_range_ok};
use crate::errno::{Errno, SysResult};
use crate::machine::Cpu;
use crate::mm::{Mm, MmState, Pid};
use crate::stats::Ev;
use crate::vaddr::VirtAddr;
use crate::vma::{merge, VmFlags};
use crate::zap::{GatherScope, MmuGather};

impl<'m> Cpu<'m> {
    /// Unmaps `[addr, addr+len)` of process `pid`.
    ///
    /// # Errors
    /// `EINVAL` for an unaligned address, zero length or a range beyond the address space;
    /// `ENOMEM` when punching a hole would exceed `vm.max_map_count`.
    pub fn munmap(&self, pid: Pid, addr: u64, len: u64) -> SysResult<()> {
        self.c().add(crate::stats::Ev::Syscall, 1);
        let task = self.m.task(pid)?;
        if !aligned(addr) || len == 0 {
            return Err(Errno::EINVAL);
        }
        let len = page_align(len).ok_or(Errno::EINVAL)?;
        if !user_range_ok(addr, len) {
            return Err(Errno::EINVAL);
        }
        self.c().add(Ev::LockMmap, 1);
        let mut st = task.mm.lock.write();
        self.do_munmap(&task.mm, &mut st, addr, addr + len)
    }

    /// Removes every mapping in `[start, end)`: splits the VMAs at the edges, zaps the pages,
    /// frees the page tables, and releases the VMAs.
    ///
    /// # Context
    /// mmap lock held for writing.
    pub(crate) fn do_munmap(
        &self,
        mm: &Mm,
        st: &mut MmState,
        start: u64,
        end: u64,
    ) -> SysResult<()> {
        if self.split_range_edges(st, start, end)? {
            self.unmap_and_release(mm, st, start, end)
        } else {
            Ok(())
        }
    }

    /// The VMA splits at `start` and `end` that an unmap of `[start, end)` starts with
    /// (`vms_gather_munmap_vmas`); false when nothing is mapped there. They stay when a later
    /// step fails (`vms_abort_munmap_vmas` puts the gathered VMAs back, split).
    pub(crate) fn split_range_edges(
        &self,
        st: &mut MmState,
        start: u64,
        end: u64,
    ) -> SysResult<bool> {
        let vmas = st.vmas.overlapping(start, end);
        let Some(&first) = vmas.first() else {
            return Ok(false);
        };
        let max = self.m.tunables().max_map_count;
        let (fs, fe) = (st.vmas.get(first).start, st.vmas.get(first).end);
        if fs < start {
            if end < fe && st.vmas.count() as u64 >= max {
                return Err(Errno::ENOMEM);
            }
            merge::split(&mut st.vmas, self.c(), first, start, u64::MAX)?;
        }
        let last = *vmas.last().unwrap_or(&first);
        let last = if last == first && fs < start {
            st.vmas.find(start).unwrap_or(first)
        } else {
            last
        };
        if st.vmas.get(last).end > end && st.vmas.get(last).start < end {
            merge::split(&mut st.vmas, self.c(), last, end, u64::MAX)?;
        }
        Ok(true)
    }

    /// Zaps and releases the VMAs exactly covering `[start, end)` (already split at the edges).
    ///
    /// # Errors
    /// `ENOMEM` if the tree cannot allocate for the erase; nothing has changed then.
    pub(crate) fn unmap_and_release(
        &self,
        mm: &Mm,
        st: &mut MmState,
        start: u64,
        end: u64,
    ) -> SysResult<()> {
        let ids = st.vmas.overlapping(start, end);
        st.vmas
            .tree
            .erase_range(start, end)
            .map_err(|_| Errno::ENOMEM)?;
        self.munlock_before_unmap(mm, st, &ids, start, end);
        self.lru_add_drain();
        let (s, e) = (VirtAddr::new(start), VirtAddr::new(end));
        let mut tlb = MmuGather::new(self, mm, GatherScope::Range);
        for &id in &ids {
            self.zap_vma_range(&mut tlb, mm, st.vmas.get(id), s, e);
        }
        for &id in &ids {
            self.release_vma(st, id);
        }
        self.free_pgtables(&mut tlb, mm, st, s, e);
        tlb.finish();
        self.lru_add_drain();
        Ok(())
    }

    /// The 2013 designs munlock a locked VMA's pages before unmapping it
    /// (`munlock_vma_pages_all`); the current design does it in the rmap removal instead.
    pub(crate) fn munlock_before_unmap(
        &self,
        mm: &Mm,
        st: &MmState,
        ids: &[crate::vma::VmaId],
        start: u64,
        end: u64,
    ) {
        let design = self.m.tunables().munlock;
        if design == crate::tunables::MunlockDesign::Modern {
            return;
        }
        for &id in ids {
            let v = st.vmas.get(id);
            if v.flags.has(VmFlags::LOCKED) {
                self.munlock_vma_pages_range_2013(
                    mm,
                    st,
                    v,
                    VirtAddr::new(start).max(v.vm_start()),
                    VirtAddr::new(end).min(v.vm_end()),
                    design,
                );
            }
        }
    }

    /// Drops a VMA body that has left the tree: accounting, locked_vm, shmem users.
    pub(crate) fn release_vma(&self, st: &mut MmState, id: crate::vma::VmaId) {
        let v = st.vmas.release(id);
        self.c().add(Ev::VmaFreed, 1);
        if v.anon_vma() != 0 {
            self.c().add(Ev::AnonVmaUnlink, 1);
        }
        let pages = v.len() >> 12;
        if v.flags.has(VmFlags::ACCOUNT) {
            self.vm_unacct(pages);
        }
        if v.flags.has(VmFlags::LOCKED) {
            st.locked_vm = st.locked_vm.saturating_sub(pages);
        }
        if let Some(s) = v.file {
            if s.put() {
                self.drop_cache_pages(s.take_pages());
            }
        }
    }
}
