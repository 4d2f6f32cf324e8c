//! `exit`: tear the address space down.
//!
//! Linux counterparts: `kernel/exit.c` (`exit_mm`), `mm/mmap.c` (`exit_mmap`): unmap every
//! VMA with a full-mm gather (one TLB flush), free every page table, release pins (io_uring
//! unregisters its buffers when the ring closes) and shmem users.

use crate::errno::SysResult;
use crate::machine::Cpu;
use crate::mm::{Mm, Pid};
use crate::ops::munmap::{munlock_before_unmap, release_vma};
use crate::ops::pin::release_pin;
use crate::pgtable::TASK_SIZE;
use crate::stats::Ev;
use crate::vaddr::VirtAddr;
use crate::zap::{free_pgtables, zap_vma_range, GatherScope, MmuGather};

impl<'m> Cpu<'m> {
    /// Ends process `pid`; every frame only it used is freed.
    pub fn exit(&self, pid: Pid) -> SysResult<()> {
        self.c().add(crate::stats::Ev::Syscall, 1);
        let task = self.m.task(pid)?;
        self.m.remove_task(pid);
        teardown_mm(self, &task.mm);
        Ok(())
    }
}

/// Unmaps everything in `mm` and frees its page tables (`exit_mmap`).
pub(crate) fn teardown_mm<'m>(cpu: &Cpu<'m>, mm: &Mm) {
    cpu.c().add(Ev::LockMmap, 1);
    let mut st = mm.lock.write();
    for rec in std::mem::take(&mut st.pins) {
        release_pin(cpu, &rec);
    }
    st.pinned_vm = 0;
    let ids = st.vmas.all();
    cpu.lru_add_drain();
    let _ = st.vmas.tree.erase_range(0, u64::MAX);
    munlock_before_unmap(cpu, mm, &st, &ids, 0, u64::MAX);
    let mut tlb = MmuGather::new(cpu, mm, GatherScope::FullMm);
    for &id in &ids {
        let v = st.vmas.get(id);
        zap_vma_range(cpu, &mut tlb, mm, v, v.vm_start(), v.vm_end());
    }
    for &id in &ids {
        release_vma(cpu, &mut st, id);
    }
    let (start, end) = (VirtAddr::new(0), VirtAddr::new(TASK_SIZE + 4096));
    free_pgtables(cpu, &mut tlb, mm, &st, start, end);
    tlb.finish();
    cpu.lru_add_drain();
    for t in mm.deposited.drain() {
        cpu.m.phys.put_folio(cpu.c(), t, 1);
    }
    if cpu.m.phys.memmap.pt_entries(mm.pgd) == 0 && cpu.m.phys.memmap.refcount(mm.pgd) > 0 {
        cpu.m.phys.put_folio(cpu.c(), mm.pgd, 1);
    }
}
