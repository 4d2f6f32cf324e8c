//! `mremap`: shrink, grow in place, move.
//!
//! Linux counterpart: `mm/mremap.c` (`do_mremap`, `check_mremap_params`, `mremap_to`,
//! `vma_expandable`, `move_vma`, `copy_vma`, `move_page_tables`). A move keeps the folios
//! and moves their page-table entries (PMD leaves whole when both sides are PMD aligned), so
//! mapcounts and RSS do not change; the new VMA keeps the old page offset and therefore only
//! merges with neighbours whose offsets continue it.

use super::{aligned, page_align};
use crate::errno::{Errno, SysResult};
use crate::machine::Cpu;
use crate::mm::{Mm, MmState, Pid, Task};
use crate::ops::mmap::AreaRequest;
use crate::pgtable::{index, PtlGuard, Walk, PMD_SIZE, TASK_SIZE};
use crate::stats::Ev;
use crate::tlb::FlushScope;
use crate::vma::merge::{self, Proposal};
use crate::vma::VmFlags;

/// mremap flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct MremapFlags {
    /// `MREMAP_MAYMOVE`.
    pub maymove: bool,
    /// `MREMAP_FIXED` with the new address.
    pub fixed: Option<u64>,
}

impl<'m> Cpu<'m> {
    /// Resizes or moves `[addr, addr+old_len)` of process `pid` to `new_len` bytes.
    ///
    /// # Errors
    /// `EINVAL` (bad flags, alignment, lengths, overlapping fixed target), `EFAULT` (the old
    /// range is not inside one VMA), `ENOMEM` (cannot grow in place without `maymove`, no
    /// space, map count).
    pub fn mremap(
        &self,
        pid: Pid,
        addr: u64,
        old_len: u64,
        new_len: u64,
        flags: MremapFlags,
    ) -> SysResult<u64> {
        let task = self.m.task(pid)?;
        if !aligned(addr) {
            return Err(Errno::EINVAL);
        }
        let old_len = page_align(old_len).ok_or(Errno::EINVAL)?;
        let new_len = page_align(new_len).unwrap_or(0);
        if new_len == 0 || new_len > TASK_SIZE {
            return Err(Errno::EINVAL);
        }
        if let Some(na) = flags.fixed {
            if na > TASK_SIZE - new_len || !aligned(na) || !flags.maymove {
                return Err(Errno::EINVAL);
            }
            if na < addr.saturating_add(old_len) && addr < na + new_len {
                return Err(Errno::EINVAL);
            }
        }
        self.c().add(Ev::LockMmap, 1);
        let mut st = task.mm.lock.write();
        let id = st.vmas.find(addr).ok_or(Errno::EFAULT)?;
        if old_len == 0 {
            return self.mremap_dup_shared(&task, &mut st, id, addr, new_len, flags);
        }
        if let Some(na) = flags.fixed {
            return self.mremap_to(&task, &mut st, addr, old_len, new_len, na);
        }
        // Shrinking only unmaps the tail: the old range may span several VMAs.
        if new_len <= old_len {
            if new_len < old_len {
                self.do_munmap(&task.mm, &mut st, addr + new_len, addr + old_len)?;
            }
            return Ok(addr);
        }
        if old_len > st.vmas.get(id).end - addr {
            return Err(Errno::EFAULT);
        }
        let vend = st.vmas.get(id).end;
        if addr + old_len == vend && self.vma_expandable(&st, vend, new_len - old_len) {
            self.expand_in_place(&task, &mut st, id, addr + new_len)?;
            return Ok(addr);
        }
        if !flags.maymove {
            return Err(Errno::ENOMEM);
        }
        let dst = self.get_unmapped_area(&task, &st, AreaRequest::Hint(0), new_len, false)?;
        self.move_vma(&task, &mut st, addr, old_len, new_len, dst)
    }

    /// `old_len == 0` on a shared mapping: a second mapping of the same object at a new
    /// address (the "duplicate shm area" case); private mappings get `EINVAL`.
    fn mremap_dup_shared(
        &self,
        task: &Task,
        st: &mut MmState,
        id: crate::vma::VmaId,
        addr: u64,
        new_len: u64,
        flags: MremapFlags,
    ) -> SysResult<u64> {
        let v = st.vmas.get(id);
        if !v.flags.has(VmFlags::MAYSHARE) {
            return Err(Errno::EINVAL);
        }
        if !flags.maymove {
            return Err(Errno::ENOMEM);
        }
        let (vflags, pgoff, shmem) = (v.flags, v.pgoff_at(addr), v.shmem.clone());
        let dst = match flags.fixed {
            Some(na) => {
                self.do_munmap(&task.mm, st, na, na + new_len)?;
                na
            }
            None => self.get_unmapped_area(task, st, AreaRequest::Hint(0), new_len, false)?,
        };
        let p = Proposal {
            start: dst,
            end: dst + new_len,
            flags: vflags,
            pgoff,
            anon_vma: (0, 0),
            shmem: shmem.as_ref(),
        };
        merge::insert_new(&mut st.vmas, p)?;
        Ok(dst)
    }

    fn vma_expandable(&self, st: &MmState, from: u64, delta: u64) -> bool {
        let Some(to) = from.checked_add(delta) else {
            return false;
        };
        to <= TASK_SIZE && st.vmas.overlapping(from, to).is_empty()
    }

    fn expand_in_place(
        &self,
        task: &Task,
        st: &mut MmState,
        id: crate::vma::VmaId,
        new_end: u64,
    ) -> SysResult<()> {
        let vma = st.vmas.get(id);
        let (old_end, flags) = (vma.end, vma.flags);
        let delta = new_end - old_end;
        if flags.has(VmFlags::LOCKED) {
            self.mlock_future_ok(task, st, delta)?;
        }
        if flags.has(VmFlags::ACCOUNT) {
            self.vm_enough_memory(delta >> 12)?;
        }
        let p = Proposal {
            start: old_end,
            end: new_end,
            flags,
            pgoff: vma.pgoff_at(old_end),
            anon_vma: (vma.anon_vma(), vma.anon_vma_chain()),
            shmem: None,
        };
        let shmem = vma.shmem.clone();
        let p = Proposal {
            shmem: shmem.as_ref(),
            ..p
        };
        if let Err(e) = merge::insert_new(&mut st.vmas, p) {
            if flags.has(VmFlags::ACCOUNT) {
                self.vm_unacct(delta >> 12);
            }
            return Err(e);
        }
        if flags.has(VmFlags::LOCKED) {
            st.locked_vm += delta >> 12;
        }
        Ok(())
    }

    fn mremap_to(
        &self,
        task: &Task,
        st: &mut MmState,
        addr: u64,
        old_len: u64,
        new_len: u64,
        na: u64,
    ) -> SysResult<u64> {
        // `mremap_to`: room for the unmap of the target and the old range splitting (two more
        // VMAs) with three to spare; checked on Linux 6.18 by moving to a fixed address with
        // vm.max_map_count at map_count + 5 (ENOMEM) and + 6 (moved).
        let max = self.m.tunables().max_map_count;
        if st.vmas.count() as u64 + 2 >= max.saturating_sub(3) {
            return Err(Errno::ENOMEM);
        }
        self.do_munmap(&task.mm, st, na, na + new_len)?;
        let old_len = if old_len > new_len {
            self.do_munmap(&task.mm, st, addr + new_len, addr + old_len)?;
            new_len
        } else {
            old_len
        };
        let vma = st.vmas.find(addr).ok_or(Errno::EFAULT)?;
        if old_len > st.vmas.get(vma).end - addr {
            return Err(Errno::EFAULT);
        }
        self.get_unmapped_area(task, st, AreaRequest::Fixed(na), new_len, false)?;
        self.move_vma(task, st, addr, old_len, new_len, na)
    }

    /// Moves `[addr, addr+old_len)` to `dst` with a new length (`move_vma`).
    fn move_vma(
        &self,
        task: &Task,
        st: &mut MmState,
        addr: u64,
        old_len: u64,
        new_len: u64,
        dst: u64,
    ) -> SysResult<u64> {
        let mm = &task.mm;
        // `move_vma`: map_count >= max - 3 is ENOMEM (checked on Linux 6.18: a growing move
        // fails at max = map_count + 3 and succeeds at + 4).
        let max = self.m.tunables().max_map_count;
        if st.vmas.count() as u64 + 3 >= max {
            return Err(Errno::ENOMEM);
        }
        let id = st.vmas.find(addr).ok_or(Errno::EFAULT)?;
        let vma = st.vmas.get(id);
        let (flags, pgoff, anon) = (
            vma.flags,
            vma.pgoff_at(addr),
            (vma.anon_vma(), vma.anon_vma_chain()),
        );
        let shmem = vma.shmem.clone();
        let delta = new_len.saturating_sub(old_len);
        if flags.has(VmFlags::LOCKED) && delta > 0 {
            self.mlock_future_ok(task, st, delta)?;
        }
        if flags.has(VmFlags::ACCOUNT) && delta > 0 {
            self.vm_enough_memory(delta >> 12)?;
        }
        self.prealloc_tables(mm, addr, dst, old_len.min(new_len))?;
        let p = Proposal {
            start: dst,
            end: dst + new_len,
            flags,
            pgoff,
            anon_vma: anon,
            shmem: shmem.as_ref(),
        };
        merge::insert_new(&mut st.vmas, p)?;
        let old = st.vmas.find(addr).ok_or(Errno::EFAULT)?;
        self.move_page_tables(mm, st.vmas.get(old), addr, dst, old_len.min(new_len));
        // The old range no longer maps anything; its accounting moves with the VMA.
        let (s, e) = (addr, addr + old_len);
        if flags.has(VmFlags::ACCOUNT) {
            self.m
                .committed
                .fetch_add((old_len >> 12) as i64, std::sync::atomic::Ordering::Relaxed);
        }
        if flags.has(VmFlags::LOCKED) {
            st.locked_vm += old_len >> 12;
        }
        self.do_munmap(mm, st, s, e)?;
        if flags.has(VmFlags::LOCKED) && delta > 0 {
            st.locked_vm += delta >> 12;
        }
        Ok(dst)
    }

    /// Allocates every destination table the move will need before anything moves, so that a
    /// failure leaves the mapping untouched (Linux moves back what it moved; nothing moved here).
    fn prealloc_tables(&self, mm: &Mm, src: u64, dst: u64, len: u64) -> SysResult<()> {
        let pt = self.tables(mm);
        let mut a = dst;
        while a < dst + len {
            let chunk_end = ((a & !(PMD_SIZE - 1)) + PMD_SIZE).min(dst + len);
            let s = src + (a - dst);
            let whole_leaf = a.is_multiple_of(PMD_SIZE)
                && s.is_multiple_of(PMD_SIZE)
                && chunk_end - a == PMD_SIZE;
            let needs_ptes = !whole_leaf
                && (s..s + (chunk_end - a))
                    .step_by(4096)
                    .any(|x| !matches!(pt.walk(x), Walk::NoPmd | Walk::PmdNone { .. }));
            if needs_ptes {
                pt.alloc_pte_table(self.c(), &mm.page_table_lock, a)
                    .map_err(|_| Errno::ENOMEM)?;
            } else {
                pt.alloc_pmd_table(self.c(), &mm.page_table_lock, a)
                    .map_err(|_| Errno::ENOMEM)?;
            }
            a = chunk_end;
        }
        Ok(())
    }

    /// Moves page-table entries from `src` to `dst` for `len` bytes (`move_page_tables`).
    fn move_page_tables(&self, mm: &Mm, vma: &crate::vma::Vma, src: u64, dst: u64, len: u64) {
        let c = self.c();
        let pt = self.tables(mm);
        let phys = &self.m.phys;
        let mut off = 0;
        let mut moved = false;
        while off < len {
            let (s, d) = (src + off, dst + off);
            if let Walk::PmdLeaf { table, idx, entry } = pt.walk(s) {
                let whole =
                    s & (PMD_SIZE - 1) == 0 && d & (PMD_SIZE - 1) == 0 && len - off >= PMD_SIZE;
                if whole {
                    if let Ok(dpmd) = pt.alloc_pmd_table(c, &mm.page_table_lock, d) {
                        let _g = PtlGuard::lock(phys, table, c);
                        pt.set(table, idx, 0);
                        phys.memmap.pt_entries_add(table, -1);
                        pt.set(dpmd, index(d, 21), entry);
                        phys.memmap.pt_entries_add(dpmd, 1);
                        c.add(Ev::PteWrite, 2);
                        let dep = mm.deposited.lock().remove(&s);
                        if let Some(t) = dep {
                            mm.deposited.lock().insert(d, t);
                        }
                        moved = true;
                        off += PMD_SIZE;
                        continue;
                    }
                }
                self.split_huge_pmd(mm, vma, table, idx, s & !(PMD_SIZE - 1));
            }
            if let Walk::Pte { table, idx, entry } = pt.walk(s) {
                if entry != 0 {
                    if let Ok(Some(dt)) = pt.alloc_pte_table(c, &mm.page_table_lock, d) {
                        let _g = PtlGuard::lock(phys, table, c);
                        let entry = pt.ptep_get(table, idx);
                        pt.clear_ptes(c, table, idx, 1);
                        phys.memmap.pt_entries_add(table, -1);
                        pt.set_pte(c, dt, index(d, 12), entry);
                        phys.memmap.pt_entries_add(dt, 1);
                        moved = true;
                    }
                }
            }
            off += 4096;
        }
        if moved {
            self.flush_tlb(mm, FlushScope::Range(src, src + len));
        }
    }
}
