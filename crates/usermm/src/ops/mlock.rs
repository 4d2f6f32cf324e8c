//! `mlock`, `mlock2`, `munlock`, `mlockall`, `munlockall`.
//!
//! Linux counterpart: `mm/mlock.c` (`do_mlock`, `apply_vma_lock_flags`, `mlock_fixup`,
//! `mlock_vma_pages_range`, `mlock_pte_range`, `apply_mlockall_flags`,
//! `count_mm_mlocked_page_nr`) and `mm/gup.c` (`__mm_populate`). Flags are applied VMA by
//! VMA (split/merge as needed); a hole stops the call with `ENOMEM` after the VMAs before it
//! were changed, as Linux does. Pages are then faulted in (except `MLOCK_ONFAULT` VMAs);
//! population errors map to `ENOMEM` (not mapped / not accessible) and `EAGAIN` (no memory).

use crate::access::gup_touch_page;
use crate::errno::{Errno, SysResult};
use crate::huge_memory::split_huge_pmd_boundaries;
use crate::machine::Cpu;
use crate::mlock::mlock_queue;
use crate::mm::{Mm, MmState, Pid, Privilege, Task};
use crate::munlock_2013::munlock_vma_pages_range_2013;
use crate::pgtable::batch::{folio_pte_batch, BatchFlags};
use crate::pgtable::cursor::{PmdKind, PmdLock, PmdStep, PteLock};
use crate::pgtable::Access;
use crate::phys::Pfn;
use crate::stats::Ev;
use crate::tunables::MunlockDesign;
use crate::vaddr::VirtAddr;
use crate::vm_fault::FaultSource;
use crate::vma::{merge, VmFlags, Vma, VmaId};

/// `VM_LOCKED_MASK`.
const LOCKED_MASK: u64 = VmFlags::LOCKED | VmFlags::LOCKONFAULT;

/// `mlockall` flags.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MlockallFlags {
    /// `MCL_CURRENT`.
    pub current: bool,
    /// `MCL_FUTURE`.
    pub future: bool,
    /// `MCL_ONFAULT`.
    pub onfault: bool,
}

/// `MLOCK_ONFAULT`, `mlock2`'s one flag (`uapi/asm-generic/mman-common.h`).
pub const MLOCK_ONFAULT: u32 = 0x01;

impl MlockallFlags {
    /// The flags of Linux's `mlockall` from its raw word (`MCL_CURRENT` 1, `MCL_FUTURE` 2,
    /// `MCL_ONFAULT` 4 on x86-64 and arm64: `uapi/asm-generic/mman.h`).
    pub fn from_bits(flags: u32) -> MlockallFlags {
        MlockallFlags {
            current: flags & 1 != 0,
            future: flags & 2 != 0,
            onfault: flags & 4 != 0,
        }
    }
}

/// Whether errors while faulting pages in are reported or ignored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PopulateErrors {
    Report,
    Ignore,
}

/// `can_do_mlock`.
pub(super) fn can_do_mlock(task: &Task) -> bool {
    task.rlimit_memlock != 0 || task.privilege == Privilege::Privileged
}

impl<'m> Cpu<'m> {
    /// `mlock(addr, len)`.
    ///
    /// # Errors
    /// `EPERM` (RLIMIT_MEMLOCK is 0), `ENOMEM` (over the limit, or a hole), `EINVAL`
    /// (overflow), `EAGAIN` (out of memory while faulting in).
    pub fn mlock(&self, pid: Pid, addr: u64, len: u64) -> SysResult<()> {
        self.c().add(crate::stats::Ev::Syscall, 1);
        do_mlock(self, pid, addr, len, VmFlags::LOCKED)
    }

    /// `mlock2(addr, len, MLOCK_ONFAULT)` when `onfault`, else like `mlock`.
    pub fn mlock2(&self, pid: Pid, addr: u64, len: u64, onfault: bool) -> SysResult<()> {
        self.c().add(crate::stats::Ev::Syscall, 1);
        let flags = if onfault {
            VmFlags::LOCKED | VmFlags::LOCKONFAULT
        } else {
            VmFlags::LOCKED
        };
        do_mlock(self, pid, addr, len, flags)
    }

    /// `munlock(addr, len)`.
    pub fn munlock(&self, pid: Pid, addr: u64, len: u64) -> SysResult<()> {
        self.c().add(crate::stats::Ev::Syscall, 1);
        let task = self.m.task(pid)?;
        let len = len.wrapping_add(addr & 4095).wrapping_add(4095) & !4095;
        let start = addr & !4095;
        self.c().add(Ev::LockMmap, 1);
        let mut st = task.mm.lock.write();
        apply_vma_lock_flags(self, &task.mm, &mut st, start, len, 0)
    }

    /// `mlockall(flags)`.
    ///
    /// # Errors
    /// `EINVAL` (no flag, or only `onfault`), `EPERM` (RLIMIT_MEMLOCK is 0), `ENOMEM`
    /// (`current` with more mapped than the limit).
    pub fn mlockall(&self, pid: Pid, flags: MlockallFlags) -> SysResult<()> {
        self.c().add(crate::stats::Ev::Syscall, 1);
        let task = self.m.task(pid)?;
        if !(flags.current || flags.future) {
            return Err(Errno::EINVAL);
        }
        if !can_do_mlock(&task) {
            return Err(Errno::EPERM);
        }
        self.c().add(Ev::LockMmap, 1);
        let mut st = task.mm.lock.write();
        let total: u64 = st
            .vmas
            .all()
            .into_iter()
            .map(|id| st.vmas.get(id).len() >> 12)
            .sum();
        if flags.current
            && total > task.rlimit_memlock >> 12
            && task.privilege != Privilege::Privileged
        {
            return Err(Errno::ENOMEM);
        }
        apply_mlockall_flags(self, &task.mm, &mut st, flags);
        drop(st);
        if flags.current {
            let _ = mm_populate(
                self,
                &task.mm,
                0,
                crate::pgtable::TASK_SIZE,
                PopulateErrors::Ignore,
            );
        }
        Ok(())
    }

    /// `munlockall()`.
    pub fn munlockall(&self, pid: Pid) -> SysResult<()> {
        self.c().add(crate::stats::Ev::Syscall, 1);
        let task = self.m.task(pid)?;
        self.c().add(Ev::LockMmap, 1);
        let mut st = task.mm.lock.write();
        apply_mlockall_flags(self, &task.mm, &mut st, MlockallFlags::default());
        Ok(())
    }
}

fn do_mlock<'m>(cpu: &Cpu<'m>, pid: Pid, addr: u64, len: u64, flags: u64) -> SysResult<()> {
    let task = cpu.m.task(pid)?;
    if !can_do_mlock(&task) {
        return Err(Errno::EPERM);
    }
    let len = len.wrapping_add(addr & 4095).wrapping_add(4095) & !4095;
    let start = addr & !4095;
    let limit = task.rlimit_memlock >> 12;
    cpu.c().add(Ev::LockMmap, 1);
    let mut st = task.mm.lock.write();
    let mut locked = (len >> 12) + st.locked_vm;
    let privileged = task.privilege == Privilege::Privileged;
    if locked > limit && !privileged {
        locked -= count_mlocked_pages(&st, start, len);
    }
    if locked > limit && !privileged {
        return Err(Errno::ENOMEM);
    }
    apply_vma_lock_flags(cpu, &task.mm, &mut st, start, len, flags)?;
    drop(st);
    mm_populate(
        cpu,
        &task.mm,
        start,
        start.wrapping_add(len),
        PopulateErrors::Report,
    )
}

fn apply_mlockall_flags<'m>(cpu: &Cpu<'m>, mm: &Mm, st: &mut MmState, flags: MlockallFlags) {
    st.def_flags &= !LOCKED_MASK;
    if flags.future {
        st.def_flags |= VmFlags::LOCKED;
        if flags.onfault {
            st.def_flags |= VmFlags::LOCKONFAULT;
        }
        if !flags.current {
            return;
        }
    }
    let mut to_add = 0;
    if flags.current {
        to_add = VmFlags::LOCKED
            | if flags.onfault {
                VmFlags::LOCKONFAULT
            } else {
                0
            };
    }
    let mut addr = 0;
    while let Some(id) = st.vmas.find_after(addr) {
        let v = st.vmas.get(id);
        let (s, e) = (v.start, v.end);
        let newflags = VmFlags((v.flags.0 & !LOCKED_MASK) | to_add);
        // Errors are ignored, as in Linux.
        let _ = mlock_fixup(cpu, mm, st, id, s, e, newflags);
        addr = e;
    }
}

/// Applies `flags` (a subset of `VM_LOCKED | VM_LOCKONFAULT`) to every VMA of
/// `[start, start+len)`; a hole gives `ENOMEM` after the VMAs before it were changed.
fn apply_vma_lock_flags<'m>(
    cpu: &Cpu<'m>,
    mm: &Mm,
    st: &mut MmState,
    start: u64,
    len: u64,
    flags: u64,
) -> SysResult<()> {
    let end = start.wrapping_add(len);
    if end < start {
        return Err(Errno::EINVAL);
    }
    if end == start {
        return Ok(());
    }
    let Some(first) = st.vmas.find(start) else {
        return Err(Errno::ENOMEM);
    };
    let mut nstart = start;
    let mut tmp = st.vmas.get(first).start;
    while nstart < end {
        let Some(id) = st.vmas.find_after(nstart) else {
            break;
        };
        let v = st.vmas.get(id);
        if v.start >= end {
            break;
        }
        if v.start != tmp {
            return Err(Errno::ENOMEM);
        }
        let newflags = VmFlags((v.flags.0 & !LOCKED_MASK) | flags);
        let upto = v.end.min(end);
        mlock_fixup(cpu, mm, st, id, nstart, upto, newflags)?;
        // The VMA now covering the range may have merged with its neighbours.
        tmp = st.vmas.find(upto - 1).map_or(upto, |m| st.vmas.get(m).end);
        nstart = tmp;
    }
    if tmp < end {
        return Err(Errno::ENOMEM);
    }
    Ok(())
}

/// `mlock_fixup`: sets the lock flags of `[start, end)` of one VMA and (un)mlocks its pages.
fn mlock_fixup<'m>(
    cpu: &Cpu<'m>,
    mm: &Mm,
    st: &mut MmState,
    id: VmaId,
    start: u64,
    end: u64,
    newflags: VmFlags,
) -> SysResult<()> {
    let old = st.vmas.get(id).flags;
    if newflags == old {
        return Ok(());
    }
    let max = cpu.m.tunables().max_map_count;
    split_huge_pmd_boundaries(cpu, mm, st, start, end);
    let target = merge::modify_flags(&mut st.vmas, cpu.c(), id, start, end, newflags, max)?;
    let pages = (end - start) >> 12;
    let (was, now) = (old.has(VmFlags::LOCKED), newflags.has(VmFlags::LOCKED));
    match (was, now) {
        (false, true) => st.locked_vm += pages,
        (true, false) => st.locked_vm -= pages.min(st.locked_vm),
        _ => {}
    }
    if was && now {
        return Ok(());
    }
    let vma = st.vmas.get(target);
    let design = cpu.m.tunables().munlock;
    cpu.lru_add_drain();
    let (va, va_end) = (VirtAddr::new(start), VirtAddr::new(end));
    match design {
        MunlockDesign::Stage(_) if !now => {
            munlock_vma_pages_range_2013(cpu, mm, st, vma, va, va_end, design)
        }
        _ => mlock_vma_pages_range(cpu, mm, vma, va, va_end, now),
    }
    cpu.lru_add_drain();
    Ok(())
}

/// Walks `[start, end)` of `vma` and mlocks (or munlocks) the folios mapped there
/// (`mlock_pte_range`): a large PTE-mapped folio is mlocked only if it lies wholly inside
/// the range and is mapped there entirely; munlock is always allowed.
fn mlock_vma_pages_range<'m>(
    cpu: &Cpu<'m>,
    mm: &Mm,
    vma: &Vma,
    start: VirtAddr,
    end: VirtAddr,
    lock: bool,
) {
    let pt = cpu.tables(mm);
    let phys = &cpu.m.phys;
    for step in pt.pmd_walk(start, end) {
        match step.kind {
            PmdKind::Huge(_) => {
                // `pmd_trans_huge_lock`: the leaf is read again, and the folio queued,
                // under the PMD table's split lock. A leaf split meanwhile (reclaim
                // splits under the folio and PMD locks, not the mmap lock) is walked as
                // the table it became.
                let pmdl = PmdLock::lock(pt, cpu.c(), step.table);
                let entry = pmdl.get(step.idx);
                let pfn = pt.arch.pfn(entry);
                if pt.arch.is_pmd_leaf(entry) && !phys.is_zero_pfn(pfn) {
                    cpu.c().add(Ev::PmdFolioVisit, 1);
                    mlock_queue(cpu).mlock_or_munlock(phys.memmap.folio(pfn), lock);
                }
                drop(pmdl);
                if pt.arch.is_table(entry) {
                    let table = pt.arch.table_pfn(entry);
                    mlock_pte_table(cpu, pt, table, vma, (start, end), &step, lock);
                }
            }
            PmdKind::Table(table) => {
                mlock_pte_table(cpu, pt, table, vma, (start, end), &step, lock)
            }
        }
    }
}

/// `mlock_pte_range` over the part of `step` in `table`: each entry is read (`ptep_get`)
/// and counted, a large folio's further entries by `folio_pte_batch` (`folio_mlock_step`),
/// as the other walks count theirs; large folios are always batched.
fn mlock_pte_table<'m>(
    cpu: &Cpu<'m>,
    pt: crate::pgtable::PageTables<'m>,
    table: Pfn,
    vma: &Vma,
    range: (VirtAddr, VirtAddr),
    step: &PmdStep,
    lock: bool,
) {
    let phys = &cpu.m.phys;
    let mem = &phys.memmap;
    let ptes = PteLock::lock(pt, cpu.c(), table);
    let (i0, i1) = step.pte_indexes();
    let mut queue = mlock_queue(cpu);
    let mut i = i0;
    while i < i1 {
        let e = ptes.get(i);
        if e.is_none() || !pt.arch.present(e) {
            i += 1;
            continue;
        }
        let Some(head) = pt.vm_normal_folio(e) else {
            i += 1;
            continue;
        };
        cpu.c().add(Ev::MlockPteFolio, 1);
        let folio = mem.folio(head);
        if !folio.is_large() {
            queue.mlock_or_munlock(folio, lock);
            i += 1;
            continue;
        }
        let pfn = pt.arch.pfn(e);
        let nr_pages = folio.nr_pages();
        let last = folio.pfn().add(nr_pages).sub(1);
        let n = folio_pte_batch(pt, table, i, e, last, i1 - i, BatchFlags::default()).nr;
        cpu.c().add(Ev::PteRead, n as u64 - 1);
        let folio_start = step.pte_addr(i).sub(pfn.offset_from(head) * 4096);
        let within = folio_start >= range.0.max(vma.vm_start())
            && folio_start.add(nr_pages * 4096) <= range.1.min(vma.vm_end());
        if !lock || (within && n as u64 == nr_pages) {
            queue.mlock_or_munlock(folio, lock);
        }
        i += n;
    }
}

/// `__mm_populate`: faults in every page of the locked (non-onfault) VMAs of the range.
fn mm_populate<'m>(
    cpu: &Cpu<'m>,
    mm: &Mm,
    start: u64,
    end: u64,
    errors: PopulateErrors,
) -> SysResult<()> {
    let st = mm.lock.read();
    let mut a = start;
    while a < end {
        let Some(id) = st.vmas.find_after(a) else {
            break;
        };
        let v = st.vmas.get(id);
        if v.start >= end {
            break;
        }
        let (s, e) = (a.max(v.start), v.end.min(end));
        a = e;
        if v.flags.has(VmFlags::LOCKONFAULT) || !v.flags.has(VmFlags::LOCKED) {
            continue;
        }
        let access = if v.flags.0 & (VmFlags::WRITE | VmFlags::SHARED) == VmFlags::WRITE {
            Access::Write
        } else {
            Access::Read
        };
        let accessible = v.flags.has(VmFlags::READ | VmFlags::WRITE | VmFlags::EXEC);
        let res = if accessible {
            populate_range(cpu, mm, &st, s, e, access)
        } else {
            Err(Errno::ENOMEM)
        };
        if let Err(err) = res {
            if errors == PopulateErrors::Report {
                return Err(err);
            }
        }
    }
    Ok(())
}

fn populate_range<'m>(
    cpu: &Cpu<'m>,
    mm: &Mm,
    st: &MmState,
    s: u64,
    e: u64,
    access: Access,
) -> SysResult<()> {
    let mut p = s;
    while p < e {
        // GUP reports a fault's SIGSEGV/SIGBUS as EFAULT, which mlock turns into ENOMEM;
        // only a real out-of-memory is EAGAIN (6.18).
        match gup_touch_page(cpu, mm, st, p, access, FaultSource::Populate) {
            Ok(_) => {}
            Err(crate::vm_fault::FaultOutcome::Oom) => return Err(Errno::EAGAIN),
            Err(_) => return Err(Errno::ENOMEM),
        }
        p += 4096;
    }
    Ok(())
}

/// `count_mm_mlocked_page_nr`: pages of `VM_LOCKED` VMAs inside `[start, start+len)`.
fn count_mlocked_pages(st: &MmState, start: u64, len: u64) -> u64 {
    let end = start.saturating_add(len);
    st.vmas
        .overlapping(start, end)
        .into_iter()
        .map(|id| st.vmas.get(id))
        .filter(|v| v.flags.has(VmFlags::LOCKED))
        .map(|v| (v.end.min(end) - v.start.max(start)) >> 12)
        .sum()
}
