//! `mprotect`, and `change_protection` on page tables.
//!
//! Linux counterparts: `mm/mprotect.c` (`do_mprotect_pkey`, `mprotect_fixup`,
//! `change_protection`, `change_pte_range`, `can_change_pte_writable`) and
//! `mm/huge_memory.c` (`change_huge_pmd`). Linux applies the change VMA by VMA and stops with
//! `ENOMEM` at the first hole, keeping what it already changed; so does this.

use super::{aligned, page_align};
use crate::access::gup_touch_page;
use crate::errno::{Errno, SysResult};
use crate::huge_memory::{split_huge_pmd, split_huge_pmd_boundaries};
use crate::machine::Cpu;
use crate::mm::{Mm, MmState, Pid};
use crate::ops::mmap::prot_flags;
use crate::ops::{vm_enough_memory, vm_unacct};
use crate::pgtable::batch::BatchFlags;
use crate::pgtable::contpte::pte_mknoncont;
use crate::pgtable::cursor::{PmdKind, PmdLock, PmdStep, PteLock};
use crate::pgtable::entry::LeafEntry;
use crate::pgtable::Prot;
use crate::phys::{PageFlag, Pfn};
use crate::stats::Ev;
use crate::tlb::{FlushScope, TlbFlushPending};
use crate::tunables::PteBatching;
use crate::vaddr::VirtAddr;
use crate::vma::{merge, VmFlags, Vma};

impl<'m> Cpu<'m> {
    /// Changes the protection of `[addr, addr+len)` of process `pid`.
    ///
    /// # Errors
    /// `EINVAL` (unaligned), `ENOMEM` (overflow, unmapped pages, map count), `EACCES` (write
    /// on a mapping that may not be written).
    pub fn mprotect(&self, pid: Pid, addr: u64, len: u64, prot: Prot) -> SysResult<()> {
        self.c().add(crate::stats::Ev::Syscall, 1);
        let task = self.m.task(pid)?;
        if !aligned(addr) {
            return Err(Errno::EINVAL);
        }
        if len == 0 {
            return Ok(());
        }
        let len = page_align(len).ok_or(Errno::ENOMEM)?;
        let end = addr.checked_add(len).ok_or(Errno::ENOMEM)?;
        self.c().add(Ev::LockMmap, 1);
        let mut st = task.mm.lock.write();
        let first = st.vmas.find_after(addr).ok_or(Errno::ENOMEM)?;
        if st.vmas.get(first).start > addr {
            return Err(Errno::ENOMEM);
        }
        let mut nstart = addr;
        loop {
            let Some(id) = st.vmas.find(nstart) else {
                return Err(Errno::ENOMEM);
            };
            let vma = st.vmas.get(id);
            let newflags = (vma.flags.0 & !VmFlags::ACCESS) | prot_flags(prot);
            if (newflags & !(newflags >> 4)) & VmFlags::ACCESS != 0 {
                return Err(Errno::EACCES);
            }
            let tmp = vma.end.min(end);
            mprotect_fixup(self, &task.mm, &mut st, id, nstart, tmp, VmFlags(newflags))?;
            nstart = tmp;
            if nstart >= end {
                return Ok(());
            }
        }
    }
}

fn mprotect_fixup<'m>(
    cpu: &Cpu<'m>,
    mm: &Mm,
    st: &mut MmState,
    id: crate::vma::VmaId,
    start: u64,
    end: u64,
    newflags: VmFlags,
) -> SysResult<()> {
    let vma = st.vmas.get(id);
    let old = vma.flags;
    if newflags == old {
        return Ok(());
    }
    let mut newflags = newflags;
    // Any private mapping that becomes writable is charged, file-backed ones too
    // (`mprotect_fixup`: not VM_ACCOUNT, VM_WRITE, VM_SHARED or VM_NORESERVE before).
    let charged = if newflags.has(VmFlags::WRITE)
        && !old.has(VmFlags::ACCOUNT | VmFlags::WRITE | VmFlags::NORESERVE | VmFlags::SHARED)
    {
        vm_enough_memory(cpu, (end - start) >> 12)?;
        newflags = VmFlags(newflags.0 | VmFlags::ACCOUNT);
        (end - start) >> 12
    } else {
        0
    };
    // Since 6.7 a never-faulted private anonymous VMA made read-only gives its commit
    // charge back (and can then merge with read-only neighbours).
    let uncharged = if !newflags.has(VmFlags::WRITE)
        && old.has(VmFlags::ACCOUNT)
        && vma.is_anon_private()
        && vma.anon_vma().is_none()
    {
        newflags = VmFlags(newflags.0 & !VmFlags::ACCOUNT);
        (end - start) >> 12
    } else {
        0
    };
    let max = cpu.m.tunables().max_map_count;
    split_huge_pmd_boundaries(cpu, mm, st, start, end);
    let target = match merge::modify_flags(&mut st.vmas, cpu.c(), id, start, end, newflags, max) {
        Ok(t) => t,
        Err(e) => {
            if charged > 0 {
                vm_unacct(cpu, charged);
            }
            return Err(e);
        }
    };
    if uncharged > 0 {
        vm_unacct(cpu, uncharged);
    }
    let vma = st.vmas.get(target);
    change_protection(cpu, mm, vma, VirtAddr::new(start), VirtAddr::new(end));
    // A locked private VMA that becomes writable is populated for write, so that its
    // pages stay resident and private (`populate_vma_page_range`; not for LOCKONFAULT).
    let lock_bits = old.0 & (VmFlags::WRITE | VmFlags::SHARED | VmFlags::LOCKED);
    if lock_bits == VmFlags::LOCKED
        && newflags.has(VmFlags::WRITE)
        && !newflags.has(VmFlags::LOCKONFAULT)
    {
        for a in (start..end).step_by(4096) {
            // `populate_vma_page_range` with no lock to drop: faults are never retried.
            let _ = gup_touch_page(
                cpu,
                mm,
                st,
                a,
                crate::pgtable::Access::Write,
                crate::vm_fault::FaultSource::NoRetry,
            );
        }
    }
    Ok(())
}

/// Rewrites the PTEs of `[start, end)` in `vma` to the VMA's protection; private anon pages
/// that are PageAnonExclusive stay (or become) writable when the VMA is writable.
pub(crate) fn change_protection<'m>(
    cpu: &Cpu<'m>,
    mm: &Mm,
    vma: &Vma,
    start: VirtAddr,
    end: VirtAddr,
) {
    let pt = cpu.tables(mm);
    let mut flush = TlbFlushPending::none();
    for step in pt.pmd_walk(start, end) {
        if let PmdKind::Huge(_) = step.kind {
            if step.whole() {
                flush.merge(change_huge_pmd(cpu, mm, vma, step.table, step.idx));
                continue;
            }
            split_huge_pmd(cpu, mm, vma, step.table, step.idx, step.haddr());
        }
        if let Some(table) = pt.pte_table_at(step.table, step.idx) {
            flush.merge(change_pte_range(cpu, mm, vma, table, &step));
        }
    }
    if flush.is_owed() {
        flush.flushed(cpu.flush_tlb(mm, FlushScope::Range(start, end)));
    }
}

/// The entry `e` (a PTE or a PMD leaf) becomes under the VMA's protection.
fn new_pte<'m, E: LeafEntry>(cpu: &Cpu<'m>, vma: &Vma, e: E) -> E {
    let arch = cpu.m.arch;
    let mut n = arch.modify(e, vma.page_prot());
    let try_writable = vma.flags.has(VmFlags::WRITE) && !vma.flags.has(VmFlags::SHARED);
    if try_writable && !arch.write(n) && !arch.special(e) && vma.file.is_none() {
        let pfn = arch.pfn(e);
        if cpu.m.phys.memmap.test(pfn, PageFlag::AnonExclusive) {
            n = arch.mkwrite(n);
        }
    }
    n
}

/// `change_pte_range`: since 6.17 the present entries go in batches
/// (`mprotect_folio_pte_batch`): a large folio's consecutive entries that agree on all but
/// dirty and accessed are one batch (the zero page and small folios are batches of one),
/// whose entries all get back the accessed and dirty bits any of them had
/// (`modify_prot_start_ptes` gathers them, `modify_prot_commit_ptes` writes each entry).
/// Whether each page may become writable is still asked page by page
/// (`commit_anon_folio_batch`).
fn change_pte_range<'m>(
    cpu: &Cpu<'m>,
    mm: &Mm,
    vma: &Vma,
    table: Pfn,
    step: &PmdStep,
) -> TlbFlushPending {
    let arch = cpu.m.arch;
    let mut ptes = PteLock::lock(cpu.tables(mm), cpu.c(), table);
    let (i0, i1) = step.pte_indexes();
    let flags = BatchFlags {
        respect_soft_dirty: true,
        respect_write: true,
        ..BatchFlags::default()
    };
    let mut flush = TlbFlushPending::none();
    let mut i = i0;
    while i < i1 {
        let e = ptes.get_raw(i);
        // A swap entry keeps no protection: the swap fault maps with the VMA's.
        if e.is_none() || arch.is_swap_pte(e) {
            i += 1;
            continue;
        }
        let nr = ptes.run(i, e, i1 - i, PteBatching::Batched, flags).nr;
        cpu.c().add(Ev::MprotectBatch, 1);
        // A batch of one (a small folio, the zero page) gathers nothing.
        let (mut young, mut dirty) = (false, false);
        if nr > 1 {
            for j in i..i + nr {
                let ej = ptes.peek_raw(j);
                young |= arch.young(ej);
                dirty |= arch.dirty(ej);
            }
        }
        for j in i..i + nr {
            let ej = ptes.peek_raw(j);
            let mut gathered = ej;
            if young {
                gathered = arch.mkyoung(gathered);
            }
            if dirty {
                gathered = arch.mkdirty(gathered);
            }
            let n = new_pte(cpu, vma, gathered);
            // `replace` unfolds a folded block: an entry that differs only in CONT is unchanged.
            if n != pte_mknoncont(arch, ej) {
                flush.merge(ptes.replace(j, n));
            }
        }
        i += nr;
    }
    flush
}

fn change_huge_pmd<'m>(
    cpu: &Cpu<'m>,
    mm: &Mm,
    vma: &Vma,
    table: Pfn,
    idx: usize,
) -> TlbFlushPending {
    let mut pmdl = PmdLock::lock(cpu.tables(mm), cpu.c(), table);
    let e = pmdl.get(idx);
    let n = new_pte(cpu, vma, e);
    if n != e {
        return pmdl.replace(idx, n);
    }
    TlbFlushPending::none()
}
