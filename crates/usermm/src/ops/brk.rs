//! `brk`.
//!
//! Linux counterpart: `mm/mmap.c` (`SYSCALL_DEFINE1(brk)`, `check_brk_limits`) and
//! `mm/vma.c` (`do_brk_flags`). Like the system call, it returns the resulting break: the old
//! one when the request is refused.

use super::page_align;
use crate::errno::SysResult;
use crate::machine::Cpu;
use crate::mm::Pid;
use crate::ops::mmap::{mlock_future_ok, populate};
use crate::ops::munmap::do_munmap;
use crate::ops::{vm_enough_memory, vm_unacct};
use crate::stats::Ev;
use crate::vma::merge::{self, Proposal};
use crate::vma::{AnonLink, VmFlags};

/// Gap kept between the heap and the next mapping above it (`stack_guard_gap` is only for
/// stacks; Linux checks one page).
const BRK_GAP: u64 = 4096;

impl<'m> Cpu<'m> {
    /// Sets the break of process `pid` to `brk` (0 queries it).
    ///
    /// # Returns
    /// The break after the call.
    pub fn brk(&self, pid: Pid, brk: u64) -> SysResult<u64> {
        self.c().add(crate::stats::Ev::Syscall, 1);
        let task = self.m.task(pid)?;
        let mm = &task.mm;
        self.c().add(Ev::LockMmap, 1);
        let mut st = mm.lock.write();
        let orig = st.brk;
        if brk < st.start_brk {
            return Ok(orig);
        }
        let (Some(newbrk), Some(oldbrk)) = (page_align(brk), page_align(st.brk)) else {
            return Ok(orig);
        };
        if oldbrk == newbrk {
            st.brk = brk;
            return Ok(brk);
        }
        if brk <= st.brk {
            // Shrinking needs the heap VMA to reach into the range being given back.
            let heap = st.vmas.overlapping(newbrk, oldbrk);
            if heap
                .first()
                .is_none_or(|&id| st.vmas.get(id).start >= oldbrk)
            {
                return Ok(orig);
            }
            return match do_munmap(self, mm, &mut st, newbrk, oldbrk) {
                Ok(()) => {
                    st.brk = brk;
                    Ok(brk)
                }
                Err(_) => Ok(orig),
            };
        }
        let len = newbrk - oldbrk;
        if !st.vmas.overlapping(oldbrk, newbrk + BRK_GAP).is_empty() {
            return Ok(orig);
        }
        let flags = VmFlags::READ
            | VmFlags::WRITE
            | VmFlags::MAYREAD
            | VmFlags::MAYWRITE
            | VmFlags::MAYEXEC
            | st.def_flags;
        if flags & VmFlags::LOCKED != 0 && mlock_future_ok(&task, &st, len).is_err() {
            return Ok(orig);
        }
        if st.vmas.count() as u64 > self.m.tunables().max_map_count
            || vm_enough_memory(self, len >> 12).is_err()
        {
            return Ok(orig);
        }
        let flags = VmFlags(flags | VmFlags::ACCOUNT | VmFlags::SOFTDIRTY);
        let p = Proposal {
            start: oldbrk,
            end: newbrk,
            flags,
            pgoff: oldbrk >> 12,
            anon_vma: AnonLink::default(),
            file: None,
        };
        let heap = merge::MergeWith::HeapFrom(st.start_brk);
        if merge::insert_new_with(&mut st.vmas, self.c(), p, heap).is_err() {
            vm_unacct(self, len >> 12);
            return Ok(orig);
        }
        if flags.has(VmFlags::LOCKED) {
            st.locked_vm += len >> 12;
        }
        st.brk = brk;
        drop(st);
        if flags.has(VmFlags::LOCKED) {
            populate(self, mm, oldbrk, newbrk, flags);
        }
        Ok(brk)
    }
}
