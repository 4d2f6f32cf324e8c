//! `madvise`.
//!
//! Linux counterpart: `mm/madvise.c` (`do_madvise`, `madvise_walk_vmas`,
//! `madvise_vma_behavior`, `madvise_dontneed_single_vma`, `madvise_update_vma`). Unlike
//! mprotect, madvise visits every VMA in the range, skipping holes, and reports `ENOMEM` for
//! the holes at the end.

use super::{aligned, page_align};
use crate::errno::{Errno, SysResult};
use crate::machine::Cpu;
use crate::mm::{MmState, Pid};
use crate::stats::Ev;
use crate::vma::{merge, VmFlags, VmaId};
use crate::zap::{GatherScope, MmuGather};

/// Advice values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Advice {
    /// `MADV_DONTNEED`: drop the pages; private anon reads zero afterwards.
    DontNeed,
    /// `MADV_HUGEPAGE`.
    HugePage,
    /// `MADV_NOHUGEPAGE`.
    NoHugePage,
    /// `MADV_DONTFORK`.
    DontFork,
    /// `MADV_DOFORK`.
    DoFork,
    /// `MADV_WIPEONFORK`.
    WipeOnFork,
    /// `MADV_KEEPONFORK`.
    KeepOnFork,
}

impl<'m> Cpu<'m> {
    /// Gives advice about `[addr, addr+len)` of process `pid`.
    ///
    /// # Errors
    /// `EINVAL` (unaligned, overflow, advice not valid for the VMA), `ENOMEM` (holes),
    /// `EAGAIN` (a VMA split hit the map-count limit).
    pub fn madvise(&self, pid: Pid, addr: u64, len: u64, advice: Advice) -> SysResult<()> {
        let task = self.m.task(pid)?;
        if !aligned(addr) {
            return Err(Errno::EINVAL);
        }
        let alen = page_align(len).ok_or(Errno::EINVAL)?;
        if len != 0 && alen == 0 {
            return Err(Errno::EINVAL);
        }
        let end = addr.checked_add(alen).ok_or(Errno::EINVAL)?;
        if end == addr {
            return Ok(());
        }
        self.c().add(Ev::LockMmap, 1);
        let mut st = task.mm.lock.write();
        let mut start = addr;
        let mut unmapped = false;
        loop {
            let Some(id) = st.vmas.find_after(start) else {
                return Err(Errno::ENOMEM);
            };
            let (vs, ve) = (st.vmas.get(id).start, st.vmas.get(id).end);
            if vs >= end {
                unmapped = true;
                break;
            }
            if start < vs {
                unmapped = true;
                start = vs;
            }
            let tmp = ve.min(end);
            self.madvise_vma(&task.mm, &mut st, id, start, tmp, advice)?;
            start = tmp;
            if start >= end {
                break;
            }
        }
        if unmapped {
            Err(Errno::ENOMEM)
        } else {
            Ok(())
        }
    }

    fn madvise_vma(
        &self,
        mm: &crate::mm::Mm,
        st: &mut MmState,
        id: VmaId,
        start: u64,
        end: u64,
        advice: Advice,
    ) -> SysResult<()> {
        let vma = st.vmas.get(id);
        let f = vma.flags.0;
        let newflags = match advice {
            Advice::DontNeed => {
                if vma.flags.has(VmFlags::LOCKED) {
                    return Err(Errno::EINVAL);
                }
                let mut tlb = MmuGather::new(self, mm, GatherScope::Range);
                self.zap_vma_range(&mut tlb, mm, vma, start, end);
                tlb.finish();
                return Ok(());
            }
            Advice::HugePage => (f | VmFlags::HUGEPAGE) & !VmFlags::NOHUGEPAGE,
            Advice::NoHugePage => (f | VmFlags::NOHUGEPAGE) & !VmFlags::HUGEPAGE,
            Advice::DontFork => f | VmFlags::DONTCOPY,
            Advice::DoFork => f & !VmFlags::DONTCOPY,
            Advice::WipeOnFork => {
                if vma.shmem.is_some() || vma.flags.has(VmFlags::SHARED) {
                    return Err(Errno::EINVAL);
                }
                f | VmFlags::WIPEONFORK
            }
            Advice::KeepOnFork => f & !VmFlags::WIPEONFORK,
        };
        if newflags == f {
            return Ok(());
        }
        let max = self.m.tunables().max_map_count;
        match merge::modify_flags(&mut st.vmas, id, start, end, VmFlags(newflags), max) {
            Ok(_) => Ok(()),
            Err(Errno::ENOMEM) => Err(Errno::EAGAIN),
            Err(e) => Err(e),
        }
    }
}
