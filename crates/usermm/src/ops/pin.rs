//! Long-term pins (`FOLL_PIN | FOLL_LONGTERM | FOLL_WRITE`), as io_uring fixed buffers take.
//!
//! Linux counterparts: `mm/gup.c` (`pin_user_pages`, `try_grab_folio`, `unpin_user_pages`),
//! `io_uring/rsrc.c` (buffer registration and its memlock charge). A pin faults the pages in
//! for writing (so they are exclusive), then raises the folio's pincount (large folios) or
//! its refcount by `GUP_PIN_COUNTING_BIAS` (small folios), and marks the mm `MMF_HAS_PINNED`,
//! which is what makes a later fork copy these pages for the child.

use crate::access::{gup_fast_page, gup_touch_page};
use crate::errno::{Errno, SysResult};
use crate::machine::Cpu;
use crate::mm::{Pid, PinRecord, Privilege};
use crate::pgtable::Access;
use crate::phys::PageFlag;
use crate::rmap::GUP_PIN_COUNTING_BIAS;
use crate::stats::Ev;
use crate::vm_fault::{FaultOutcome, FaultSource};
use std::sync::atomic::Ordering::Relaxed;

/// io_uring's limit on one registered buffer (`SZ_1G` in `io_buffer_validate`): longer ones
/// are `EFAULT`. It also bounds what one pin allocates here.
const PIN_MAX_LEN: u64 = 1 << 30;

impl<'m> Cpu<'m> {
    /// Pins the pages of `[addr, addr+len)` of process `pid` until [`Cpu::unpin`].
    ///
    /// The checks are io_uring's buffer registration (`io_buffer_validate`): the address need
    /// not be page aligned (the pages the range touches are pinned), a buffer is at most 1 GiB.
    ///
    /// # Errors
    /// `EFAULT` (null address, zero or over-1-GiB length, not mapped, not writable, or beyond
    /// a shared mapping's object: the fault's SIGBUS), `EOVERFLOW` (the range wraps),
    /// `ENOMEM` (memlock charge above RLIMIT_MEMLOCK for an ordinary process, or out of
    /// memory).
    pub fn pin(&self, pid: Pid, addr: u64, len: u64) -> SysResult<()> {
        self.c().add(crate::stats::Ev::Syscall, 1);
        let task = self.m.task(pid)?;
        if addr == 0 || len == 0 || len > PIN_MAX_LEN {
            return Err(Errno::EFAULT);
        }
        // io_uring's own check (`io_buffer_validate`) sees the pointer as given.
        if addr.checked_add(len).is_none() {
            return Err(Errno::EOVERFLOW);
        }
        // `gup_fast_fallback` untags the start (arm64 drops a top-byte tag) and refuses a range
        // ending past the user address space before it walks anything: `EFAULT`. Without it
        // a non-canonical alias of a mapped page would be pinned.
        let arch = self.m.arch;
        let addr = arch.untagged_addr(addr);
        let end = match addr.checked_add(len) {
            Some(e) if e <= arch.user_va_limit() => e + 4095,
            _ => return Err(Errno::EFAULT),
        };
        let first = addr & !4095;
        let pages = (end >> 12) - (addr >> 12);
        let mm = &task.mm;
        self.c().add(Ev::LockMmap, 1);
        let mut st = mm.lock.write();
        if task.privilege == Privilege::Ordinary
            && (st.pinned_vm + pages) << 12 > task.rlimit_memlock
        {
            return Err(Errno::ENOMEM);
        }
        let mut pfns = Vec::with_capacity(pages as usize);
        let mut slow = false;
        for i in 0..pages {
            let a = first + i * 4096;
            // `writable_file_mapping_allowed`: a long-term writable pin of a shared mapping
            // whose file tracks dirtying (a disk file) is refused before any fault.
            if st
                .vmas
                .find(a)
                .is_some_and(|id| st.vmas.get(id).wants_writenotify())
            {
                return Err(Errno::EFAULT);
            }
            // `gup_fast_fallback`: the fast walk takes pages as they are up to the first one
            // it cannot (absent, read-only); from there on the slow path faults and touches
            // every page (FOLL_TOUCH marks each folio accessed).
            if !slow {
                if let Some(pfn) = gup_fast_page(self, mm, a, Access::Write) {
                    pfns.push(pfn);
                    continue;
                }
                slow = true;
            }
            // As GUP's fault-in: out of memory is ENOMEM, SIGSEGV and SIGBUS are EFAULT.
            match gup_touch_page(self, mm, &st, a, Access::Write, FaultSource::Gup) {
                Ok(pfn) => pfns.push(pfn),
                Err(FaultOutcome::Oom) => return Err(Errno::ENOMEM),
                Err(_) => return Err(Errno::EFAULT),
            }
        }
        let phys = &self.m.phys;
        for &pfn in &pfns {
            let head = phys.memmap.folio_of(pfn);
            if phys.memmap.test(head, PageFlag::Head) {
                phys.memmap.pincount_add(head, 1);
                phys.memmap.ref_add(head, 1);
            } else {
                phys.memmap.ref_add(head, GUP_PIN_COUNTING_BIAS);
            }
            self.c().add(Ev::RefcountAtomic, 1);
            self.c().add(Ev::FolioAtomic, 1);
        }
        mm.has_pinned.store(true, Relaxed);
        st.pinned_vm += pages;
        st.pins.push(PinRecord {
            start: addr,
            len,
            pfns,
        });
        Ok(())
    }

    /// Releases the pin taken with exactly `(addr, len)`.
    ///
    /// # Errors
    /// `EINVAL` if there is no such pin.
    pub fn unpin(&self, pid: Pid, addr: u64, len: u64) -> SysResult<()> {
        self.c().add(crate::stats::Ev::Syscall, 1);
        let task = self.m.task(pid)?;
        self.c().add(Ev::LockMmap, 1);
        let mut st = task.mm.lock.write();
        let i = st
            .pins
            .iter()
            .position(|p| p.start == addr && p.len == len)
            .ok_or(Errno::EINVAL)?;
        let rec = st.pins.remove(i);
        st.pinned_vm -= rec.pfns.len() as u64;
        drop(st);
        release_pin(self, &rec);
        Ok(())
    }
}

pub(crate) fn release_pin<'m>(cpu: &Cpu<'m>, rec: &PinRecord) {
    let phys = &cpu.m.phys;
    for &pfn in &rec.pfns {
        let head = phys.memmap.folio_of(pfn);
        if phys.memmap.test(head, PageFlag::Head) {
            phys.memmap.pincount_add(head, -1);
            phys.put_folio(cpu.c(), head, 1);
        } else {
            phys.put_folio(cpu.c(), head, GUP_PIN_COUNTING_BIAS);
        }
    }
}
