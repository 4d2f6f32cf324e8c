//! `exit`: tear the address space down.
//!
//! Linux counterparts: `kernel/exit.c` (`exit_mm`), `mm/mmap.c` (`exit_mmap`): unmap every
//! VMA with a full-mm gather (one TLB flush), free every page table, release pins (io_uring
//! unregisters its buffers when the ring closes) and shmem users.

use crate::errno::SysResult;
use crate::machine::Cpu;
use crate::mm::{Mm, Pid};
use crate::pgtable::TASK_SIZE;
use crate::stats::Ev;
use crate::vaddr::VirtAddr;
use crate::zap::{GatherScope, MmuGather};

impl<'m> Cpu<'m> {
    /// Ends process `pid`; every frame only it used is freed.
    pub fn exit(&self, pid: Pid) -> SysResult<()> {
        self.c().add(crate::stats::Ev::Syscall, 1);
        let task = self.m.task(pid)?;
        self.m.remove_task(pid);
        self.teardown_mm(&task.mm);
        Ok(())
    }

    /// Unmaps everything in `mm` and frees its page tables (`exit_mmap`).
    pub(crate) fn teardown_mm(&self, mm: &Mm) {
        self.c().add(Ev::LockMmap, 1);
        let mut st = mm.lock.write();
        for rec in std::mem::take(&mut st.pins) {
            self.release_pin(&rec);
        }
        st.pinned_vm = 0;
        let ids = st.vmas.all();
        self.lru_add_drain();
        let _ = st.vmas.tree.erase_range(0, u64::MAX);
        self.munlock_before_unmap(mm, &st, &ids, 0, u64::MAX);
        let mut tlb = MmuGather::new(self, mm, GatherScope::FullMm);
        for &id in &ids {
            let v = st.vmas.get(id);
            self.zap_vma_range(&mut tlb, mm, v, v.vm_start(), v.vm_end());
        }
        for &id in &ids {
            self.release_vma(&mut st, id);
        }
        let (start, end) = (VirtAddr::new(0), VirtAddr::new(TASK_SIZE + 4096));
        self.free_pgtables(&mut tlb, mm, &st, start, end);
        tlb.finish();
        self.lru_add_drain();
        for (_, t) in mm.deposited.lock().drain() {
            self.m.phys.put_folio(self.c(), t, 1);
        }
        if self.m.phys.memmap.pt_entries(mm.pgd) == 0 && self.m.phys.memmap.refcount(mm.pgd) > 0 {
            self.m.phys.put_folio(self.c(), mm.pgd, 1);
        }
    }
}
