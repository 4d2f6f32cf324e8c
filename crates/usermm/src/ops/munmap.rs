//! `munmap`, and the unmap primitive other calls reuse.
//!
//! Linux counterparts: `mm/vma.c` (`do_vmi_munmap`, `do_vmi_align_munmap`,
//! `vms_gather_munmap_vmas`, `vms_complete_munmap_vmas`), `mm/mmap.c` (`__vm_munmap`).

use super::{aligned, page_align, user_range_ok};
use crate::errno::{Errno, SysResult};
use crate::machine::Cpu;
use crate::mm::{Mm, MmState, Pid};
use crate::munlock_2013::munlock_vma_pages_range_2013;
use crate::ops::vm_unacct;
use crate::stats::Ev;
use crate::truncate::drop_cache_pages;
use crate::vaddr::VirtAddr;
use crate::vma::{merge, VmFlags};
use crate::zap::{free_pgtables, zap_vma_range, GatherScope, MmuGather};

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
        do_munmap(self, &task.mm, &mut st, addr, addr + len)
    }
}

/// Removes every mapping in `[start, end)`: splits the VMAs at the edges, zaps the pages,
/// frees the page tables, and releases the VMAs.
///
/// # Context
/// mmap lock held for writing.
pub(crate) fn do_munmap<'m>(
    cpu: &Cpu<'m>,
    mm: &Mm,
    st: &mut MmState,
    start: u64,
    end: u64,
) -> SysResult<()> {
    if split_range_edges(cpu, st, start, end)? {
        unmap_and_release(cpu, mm, st, start, end)
    } else {
        Ok(())
    }
}

/// The VMA splits at `start` and `end` that an unmap of `[start, end)` starts with
/// (`vms_gather_munmap_vmas`); false when nothing is mapped there. They stay when a later
/// step fails (`vms_abort_munmap_vmas` puts the gathered VMAs back, split).
pub(crate) fn split_range_edges<'m>(
    cpu: &Cpu<'m>,
    st: &mut MmState,
    start: u64,
    end: u64,
) -> SysResult<bool> {
    let vmas = st.vmas.overlapping(start, end);
    let Some(&first) = vmas.first() else {
        return Ok(false);
    };
    let max = cpu.m.tunables().max_map_count;
    let (fs, fe) = (st.vmas.get(first).start, st.vmas.get(first).end);
    if fs < start {
        if end < fe && st.vmas.count() as u64 >= max {
            return Err(Errno::ENOMEM);
        }
        merge::split(&mut st.vmas, cpu.c(), first, start, u64::MAX)?;
    }
    let last = *vmas.last().unwrap_or(&first);
    let last = if last == first && fs < start {
        st.vmas.find(start).unwrap_or(first)
    } else {
        last
    };
    if st.vmas.get(last).end > end && st.vmas.get(last).start < end {
        merge::split(&mut st.vmas, cpu.c(), last, end, u64::MAX)?;
    }
    Ok(true)
}

/// Zaps and releases the VMAs exactly covering `[start, end)` (already split at the edges).
///
/// # Errors
/// `ENOMEM` if the tree cannot allocate for the erase; nothing has changed then.
pub(crate) fn unmap_and_release<'m>(
    cpu: &Cpu<'m>,
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
    cpu.c().add(Ev::VmaDetached, ids.len() as u64);
    munlock_before_unmap(cpu, mm, st, &ids, start, end);
    cpu.lru_add_drain();
    let (s, e) = (VirtAddr::new(start), VirtAddr::new(end));
    let mut tlb = MmuGather::new(cpu, mm, GatherScope::Range);
    for &id in &ids {
        zap_vma_range(cpu, &mut tlb, mm, st.vmas.get(id), s, e);
    }
    for &id in &ids {
        release_vma(cpu, st, id);
    }
    free_pgtables(cpu, &mut tlb, mm, st, s, e);
    tlb.finish();
    cpu.lru_add_drain();
    Ok(())
}

/// The 2013 designs munlock a locked VMA's pages before unmapping it
/// (`munlock_vma_pages_all`); the current design does it in the rmap removal instead.
pub(crate) fn munlock_before_unmap<'m>(
    cpu: &Cpu<'m>,
    mm: &Mm,
    st: &MmState,
    ids: &[crate::vma::VmaId],
    start: u64,
    end: u64,
) {
    let design = cpu.m.tunables().munlock;
    if design == crate::tunables::MunlockDesign::Modern {
        return;
    }
    for &id in ids {
        let v = st.vmas.get(id);
        if v.flags.has(VmFlags::LOCKED) {
            munlock_vma_pages_range_2013(
                cpu,
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
pub(crate) fn release_vma<'m>(cpu: &Cpu<'m>, st: &mut MmState, id: crate::vma::VmaId) {
    let v = st.vmas.release(id);
    cpu.c().add(Ev::VmaFreed, 1);
    if v.anon_vma().is_some() {
        cpu.c().add(Ev::AnonVmaUnlink, 1);
    }
    let pages = v.len() >> 12;
    if v.flags.has(VmFlags::ACCOUNT) {
        vm_unacct(cpu, pages);
    }
    if v.flags.has(VmFlags::LOCKED) {
        st.locked_vm = st.locked_vm.saturating_sub(pages);
    }
    if let Some(s) = v.file {
        if s.put() {
            crate::swap_state::shmem_free_swap(cpu, &s, 0, u64::MAX);
            drop_cache_pages(cpu, s.take_pages());
        }
    }
}
