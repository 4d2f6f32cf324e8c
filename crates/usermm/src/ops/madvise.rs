//! `madvise`.
//!
//! Linux counterpart: `mm/madvise.c` (`do_madvise`, `madvise_walk_vmas`,
//! `madvise_vma_behavior`, `madvise_dontneed_single_vma`, `madvise_update_vma`). Unlike
//! mprotect, madvise visits every VMA in the range, skipping holes, and reports `ENOMEM` for
//! the holes at the end.

use super::{aligned, page_align};
use crate::access::gup_touch_page;
use crate::errno::{Errno, SysResult};
use crate::huge_memory::{split_anon_folio, split_huge_pmd_boundaries};
use crate::khugepaged::{collapse_shmem, madvise_collapse, shmem_collapse_blocks};
use crate::machine::Cpu;
use crate::mlock::lru_relist;
use crate::mm::{MmState, Pid};
use crate::phys::Pfn;
use crate::readahead::madvise_willneed_file;
use crate::rmap_walk::Held;
use crate::stats::Ev;
use crate::swap_state::{folio_free_swap, free_swap_and_cache};
use crate::tlb::TlbFlushPending;
use crate::truncate::{punch_hole, split_folio_to_order0};
use crate::vaddr::VirtAddr;
use crate::vm_fault::FaultSource;
use crate::vma::{merge, VmFlags, VmaId};
use crate::vmscan::anon::{isolate, putback, reclaim_anon_folio};
use crate::vmscan::pageout_file_folio;
use crate::zap::{free_empty_pte_table, zap_vma_range, GatherScope, MmuGather};

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
    /// `MADV_NORMAL`.
    Normal,
    /// `MADV_RANDOM`.
    Random,
    /// `MADV_SEQUENTIAL`.
    Sequential,
    /// `MADV_WILLNEED` (anonymous memory: nothing to read ahead without swap).
    WillNeed,
    /// `MADV_DONTDUMP`.
    DontDump,
    /// `MADV_DODUMP`.
    DoDump,
    /// `MADV_MERGEABLE` (KSM).
    Mergeable,
    /// `MADV_UNMERGEABLE`.
    Unmergeable,
    /// `MADV_COLD`: deactivate.
    Cold,
    /// `MADV_PAGEOUT`: reclaim (no swap device: anonymous pages stay).
    PageOut,
    /// `MADV_FREE`: lazily free private anonymous pages.
    Free,
    /// `MADV_REMOVE`: punch a hole in shared memory.
    Remove,
    /// `MADV_DONTNEED_LOCKED`: like `DontNeed`, also on locked VMAs.
    DontNeedLocked,
    /// `MADV_POPULATE_READ`.
    PopulateRead,
    /// `MADV_POPULATE_WRITE`.
    PopulateWrite,
    /// `MADV_COLLAPSE`: make PMD-mapped THPs of the range now (anonymous and shmem memory;
    /// see `khugepaged`).
    Collapse,
}

/// The advice and its `MADV_*` number (include/uapi/asm-generic/mman-common.h): the
/// workspace's one table.
const ADVICE_NUMBERS: [(Advice, i32); 23] = [
    (Advice::Normal, 0),
    (Advice::Random, 1),
    (Advice::Sequential, 2),
    (Advice::WillNeed, 3),
    (Advice::DontNeed, 4),
    (Advice::Free, 8),
    (Advice::Remove, 9),
    (Advice::DontFork, 10),
    (Advice::DoFork, 11),
    (Advice::Mergeable, 12),
    (Advice::Unmergeable, 13),
    (Advice::HugePage, 14),
    (Advice::NoHugePage, 15),
    (Advice::DontDump, 16),
    (Advice::DoDump, 17),
    (Advice::WipeOnFork, 18),
    (Advice::KeepOnFork, 19),
    (Advice::Cold, 20),
    (Advice::PageOut, 21),
    (Advice::PopulateRead, 22),
    (Advice::PopulateWrite, 23),
    (Advice::DontNeedLocked, 24),
    (Advice::Collapse, 25),
];

impl Advice {
    /// The advice of `MADV_*` number `n`, `None` for a number this engine does not know.
    pub fn from_number(n: i64) -> Option<Advice> {
        ADVICE_NUMBERS
            .iter()
            .find(|&&(_, k)| i64::from(k) == n)
            .map(|&(a, _)| a)
    }

    /// The `MADV_*` number. A `const fn` so that the host side (bench's regions) names its
    /// advice constants from this table instead of writing the numbers again.
    pub const fn number(self) -> i32 {
        let mut i = 0;
        while i < ADVICE_NUMBERS.len() {
            let (a, n) = ADVICE_NUMBERS[i];
            // A fieldless enum's discriminant: `==` of the derived `PartialEq` is not const.
            if a as u8 == self as u8 {
                return n;
            }
            i += 1;
        }
        // Every variant is in the table (tested); -1 is no advice the kernel knows.
        -1
    }
}

/// Work that walks other mms, done once the mmap lock is dropped.
enum Deferred {
    /// `MADV_REMOVE`: the hole to punch (file, offset, length).
    Punch(std::sync::Arc<crate::filemap::Inode>, u64, u64),
    /// COLD/PAGEOUT of part of a large page-cache folio: `split_folio` (file, head).
    Split(std::sync::Arc<crate::filemap::Inode>, Pfn),
    /// MADV_COLLAPSE of a shmem block: `collapse_file` (file, address, file index).
    Collapse(std::sync::Arc<crate::filemap::Inode>, VirtAddr, u64),
}

impl<'m> Cpu<'m> {
    /// Gives advice about `[addr, addr+len)` of process `pid`.
    ///
    /// # Errors
    /// `EINVAL` (unaligned, overflow, advice not valid for the VMA), `ENOMEM` (holes),
    /// `EAGAIN` (a VMA split hit the map-count limit).
    pub fn madvise(&self, pid: Pid, addr: u64, len: u64, advice: Advice) -> SysResult<()> {
        self.c().add(crate::stats::Ev::Syscall, 1);
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
        if matches!(advice, Advice::PopulateRead | Advice::PopulateWrite) {
            return madvise_populate(self, &task.mm, addr, end, advice == Advice::PopulateWrite);
        }
        self.c().add(Ev::LockMmap, 1);
        let mut st = task.mm.lock.write();
        let mut removes = Vec::new();
        let mut res = madvise_walk(self, &task.mm, &mut st, addr, end, advice, &mut removes);
        drop(st);
        for d in removes {
            match d {
                Deferred::Punch(inode, offset, len) => {
                    punch_hole(self, &inode, offset, offset + len)
                }
                Deferred::Split(inode, head) => split_folio_to_order0(self, &inode, head),
                Deferred::Collapse(inode, haddr, idx) => {
                    if let Err(e) = collapse_shmem(self, &task.mm, &inode, haddr, idx) {
                        res = res.and(Err(e));
                    }
                }
            }
        }
        res
    }
}

/// `zap_pte_range` with `reclaim_pt` (MADV_DONTNEED; `CONFIG_PT_RECLAIM`, set on this
/// host's 6.18): a PTE table whose whole 2 MiB the range covers and that the zap left
/// empty is freed (`try_get_and_clear_pmd`, `free_pte`), so a later fault may map a PMD
/// there (measured: DONTNEED of a PTE-mapped 2M block, then a write fault, gives a THP).
fn reclaim_empty_pte_tables<'m>(
    cpu: &Cpu<'m>,
    tlb: &mut MmuGather<'_, 'm>,
    mm: &crate::mm::Mm,
    start: VirtAddr,
    end: VirtAddr,
) {
    for step in cpu.tables(mm).pmd_walk(start, end) {
        if step.whole() {
            free_empty_pte_table(cpu, tlb, mm, &step);
        }
    }
}

/// `madvise_walk_vmas`: every VMA of `[addr, end)`, `ENOMEM` for holes.
fn madvise_walk<'m>(
    cpu: &Cpu<'m>,
    mm: &crate::mm::Mm,
    st: &mut MmState,
    addr: u64,
    end: u64,
    advice: Advice,
    removes: &mut Vec<Deferred>,
) -> SysResult<()> {
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
        madvise_vma(cpu, mm, st, id, start..tmp, advice, removes)?;
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

/// `madvise_vma_behavior`: applies `advice` to `range` of the VMA `id`.
fn madvise_vma<'m>(
    cpu: &Cpu<'m>,
    mm: &crate::mm::Mm,
    st: &mut MmState,
    id: VmaId,
    range: std::ops::Range<u64>,
    advice: Advice,
    removes: &mut Vec<Deferred>,
) -> SysResult<()> {
    let (start, end) = (range.start, range.end);
    // The page-table walkers' view of the range.
    let (va, va_end) = (VirtAddr::new(start), VirtAddr::new(end));
    let vma = st.vmas.get(id);
    let f = vma.flags.0;
    let newflags = match advice {
        Advice::DontNeed | Advice::DontNeedLocked => {
            if advice == Advice::DontNeed && vma.flags.has(VmFlags::LOCKED) {
                return Err(Errno::EINVAL);
            }
            let mut tlb = MmuGather::new(cpu, mm, GatherScope::Range);
            zap_vma_range(cpu, &mut tlb, mm, vma, va, va_end);
            reclaim_empty_pte_tables(cpu, &mut tlb, mm, va, va_end);
            tlb.finish();
            return Ok(());
        }
        Advice::WillNeed => {
            madvise_willneed_file(cpu, vma, va, va_end);
            return Ok(());
        }
        Advice::PopulateRead | Advice::PopulateWrite => return Ok(()),
        Advice::Collapse => {
            let Some(file) = vma.file.as_ref() else {
                return madvise_collapse(cpu, mm, vma, va, va_end);
            };
            if !file.kind.is_shmem() {
                // `file_thp_enabled` wants a regular file nobody has open for writing;
                // a scenario's files are open read-write (measured on 6.18: EINVAL for
                // shared and private mappings of an ext4 file open O_RDWR).
                return Err(Errno::EINVAL);
            }
            for (haddr, idx) in shmem_collapse_blocks(cpu, vma, va, va_end)? {
                removes.push(Deferred::Collapse(file.clone(), haddr, idx));
            }
            return Ok(());
        }
        Advice::Cold | Advice::PageOut => {
            if vma.flags.has(VmFlags::LOCKED) {
                return Err(Errno::EINVAL);
            }
            if vma.is_anon_private() {
                let held = Held::one(mm, st);
                madvise_cold_or_pageout_anon(cpu, held, vma, va, va_end, advice);
            }
            if vma.file.is_some() {
                madvise_cold_or_pageout_file(cpu, mm, vma, va, va_end, advice, removes);
            }
            return Ok(());
        }
        Advice::Free => {
            if vma.flags.has(VmFlags::LOCKED) || vma.file.is_some() {
                return Err(Errno::EINVAL);
            }
            madvise_free(cpu, mm, vma, va, va_end);
            return Ok(());
        }
        Advice::Remove => {
            let Some(file) = vma
                .file
                .as_ref()
                .filter(|_| !vma.flags.has(VmFlags::LOCKED))
            else {
                return Err(Errno::EINVAL);
            };
            if !vma.flags.has(VmFlags::SHARED) || !vma.flags.has(VmFlags::MAYWRITE) {
                return Err(Errno::EACCES);
            }
            // `vfs_fallocate(PUNCH_HOLE)` runs after the mmap lock is dropped.
            removes.push(Deferred::Punch(
                file.clone(),
                vma.pgoff_at(va) << 12,
                end - start,
            ));
            return Ok(());
        }
        Advice::Normal => f & !(VmFlags::SEQ_READ | VmFlags::RAND_READ),
        Advice::Random => (f & !VmFlags::SEQ_READ) | VmFlags::RAND_READ,
        Advice::Sequential => (f & !VmFlags::RAND_READ) | VmFlags::SEQ_READ,
        Advice::DontDump => f | VmFlags::DONTDUMP,
        Advice::DoDump => f & !VmFlags::DONTDUMP,
        // KSM cannot handle shared memory: `ksm_madvise` leaves such a VMA alone.
        Advice::Mergeable if f & (VmFlags::SHARED | VmFlags::MAYSHARE) != 0 => return Ok(()),
        Advice::Mergeable => f | VmFlags::MERGEABLE,
        Advice::Unmergeable => f & !VmFlags::MERGEABLE,
        Advice::HugePage => (f | VmFlags::HUGEPAGE) & !VmFlags::NOHUGEPAGE,
        Advice::NoHugePage => (f | VmFlags::NOHUGEPAGE) & !VmFlags::HUGEPAGE,
        Advice::DontFork => f | VmFlags::DONTCOPY,
        Advice::DoFork => f & !VmFlags::DONTCOPY,
        Advice::WipeOnFork => {
            if vma.file.is_some() || vma.flags.has(VmFlags::SHARED) {
                return Err(Errno::EINVAL);
            }
            f | VmFlags::WIPEONFORK
        }
        Advice::KeepOnFork => f & !VmFlags::WIPEONFORK,
    };
    if newflags == f {
        return Ok(());
    }
    let max = cpu.m.tunables().max_map_count;
    split_huge_pmd_boundaries(cpu, mm, st, start, end);
    match merge::modify_flags(
        &mut st.vmas,
        cpu.c(),
        id,
        start,
        end,
        VmFlags(newflags),
        max,
    ) {
        Ok(_) => Ok(()),
        Err(Errno::ENOMEM) => Err(Errno::EAGAIN),
        Err(e) => Err(e),
    }
}

/// `MADV_POPULATE_(READ|WRITE)`: fault every page in; a hole gives `ENOMEM`, a VMA that
/// does not allow the access `EINVAL`, a fault that would signal `EFAULT`.
fn madvise_populate<'m>(
    cpu: &Cpu<'m>,
    mm: &crate::mm::Mm,
    start: u64,
    end: u64,
    write: bool,
) -> SysResult<()> {
    cpu.c().add(Ev::LockMmap, 1);
    let st = mm.lock.read();
    let access = if write {
        crate::pgtable::Access::Write
    } else {
        crate::pgtable::Access::Read
    };
    let mut a = start;
    while a < end {
        let Some(id) = st.vmas.find(a) else {
            return Err(Errno::ENOMEM);
        };
        let v = st.vmas.get(id);
        let allowed = if write {
            v.flags.has(VmFlags::WRITE)
        } else {
            v.flags.has(VmFlags::READ)
        };
        if !allowed {
            return Err(Errno::EINVAL);
        }
        let stop = v.end.min(end);
        while a < stop {
            // As `madvise_populate`: out of memory is ENOMEM; SIGBUS (beyond a shared
            // object) and SIGSEGV are EFAULT.
            gup_touch_page(cpu, mm, &st, a, access, FaultSource::Gup).map_err(|o| match o {
                crate::vm_fault::FaultOutcome::Oom => Errno::ENOMEM,
                _ => Errno::EFAULT,
            })?;
            a += 4096;
        }
    }
    Ok(())
}

/// `MADV_FREE` on private anonymous memory (`madvise_free_huge_pmd`,
/// `madvise_free_pte_range`): the entries become clean and old and the folios lazily
/// freeable (no longer swap-backed); their data stays until reclaim, which discards them
/// unless they are written again. A folio that is dirty or in the swap cache is only freed
/// when this mapping maps it wholly and alone (and a swap-cache one gives up its slots); a
/// clean one is freed even if other processes map it too. A large folio the range covers
/// in part is split first ([`crate::huge_memory::split_anon_folio`]) and its pages in the
/// range then freed as small folios. A swapped-out page is dropped with its slot.
fn madvise_free<'m>(
    cpu: &Cpu<'m>,
    mm: &crate::mm::Mm,
    vma: &crate::vma::Vma,
    start: VirtAddr,
    end: VirtAddr,
) {
    cpu.lru_add_drain();
    let mut flush = TlbFlushPending::none();
    let splits = madvise_free_range(cpu, mm, vma, start, end, &mut flush);
    split_and_revisit(cpu, mm, vma, splits, (start, end), |s, e| {
        let _ = madvise_free_range(cpu, mm, vma, s, e, &mut flush);
    });
    flush.flushed(cpu.flush_tlb(mm, crate::tlb::FlushScope::Range(start, end)));
}

/// Splits each large folio of `splits` (head, first address, pages) with
/// [`crate::huge_memory::split_anon_folio`] and hands the part of `range` it covered back to `revisit`:
/// the PTE walks of MADV_FREE/COLD/PAGEOUT go back over the pages of a folio they split.
fn split_and_revisit<'m>(
    cpu: &Cpu<'m>,
    mm: &crate::mm::Mm,
    vma: &crate::vma::Vma,
    splits: Vec<(Pfn, VirtAddr, u64)>,
    (start, end): (VirtAddr, VirtAddr),
    mut revisit: impl FnMut(VirtAddr, VirtAddr),
) {
    for (head, first, nr) in splits {
        if split_anon_folio(cpu, mm, vma, head, first) {
            revisit(first.max(start), first.add(nr * 4096).min(end));
        }
    }
}

/// One pass of [`madvise_free`]; returns the large folios to split (head, first
/// address, pages). The entries it makes old and clean add to `flush`.
fn madvise_free_range<'m>(
    cpu: &Cpu<'m>,
    mm: &crate::mm::Mm,
    vma: &crate::vma::Vma,
    start: VirtAddr,
    end: VirtAddr,
    flush: &mut TlbFlushPending,
) -> Vec<(Pfn, VirtAddr, u64)> {
    use crate::pgtable::cursor::{PmdKind, PmdLock, PteLock};
    use crate::phys::PageFlag;
    let pt = cpu.tables(mm);
    let mem = &cpu.m.phys.memmap;
    let mut splits: Vec<(Pfn, VirtAddr, u64)> = Vec::new();
    for step in pt.pmd_walk(start, end) {
        let table = match step.kind {
            PmdKind::Huge(e) => {
                let Some(head) = pt.vm_normal_folio(e) else {
                    continue; // the huge zero page
                };
                if !mem.test(head, PageFlag::Anon) || mem.folio_mapcount(head) != 1 {
                    continue; // `folio_maybe_mapped_shared`
                }
                if !step.whole() {
                    splits.push((head, step.haddr(), 1 << mem.order(head)));
                    continue;
                }
                let mut pmdl = PmdLock::lock(pt, cpu.c(), step.table);
                flush.merge(pmdl.replace(step.idx, pt.arch.mkclean(pt.arch.mkold(e))));
                drop(pmdl);
                folio_mark_lazyfree(cpu, head);
                continue;
            }
            PmdKind::Table(table) => table,
        };
        let mut ptes = PteLock::lock(pt, cpu.c(), table);
        let (i0, i1) = step.pte_indexes();
        for i in i0..i1 {
            let entry = ptes.get(i);
            if pt.arch.is_swap_pte(entry) {
                // A swapped-out page is freed with its slot (`free_swap_and_cache_nr`).
                ptes.clear_nonpresent(i);
                mm.rss_add(crate::mm::RssKind::Swap, -1);
                if let Some(swap) = cpu.m.swap.as_ref() {
                    free_swap_and_cache(cpu, swap, pt.arch.swp_entry(entry), 1);
                }
                continue;
            }
            if entry.is_none() || !pt.arch.present(entry) {
                continue;
            }
            let Some(head) = pt.vm_normal_folio(entry) else {
                continue;
            };
            let a = step.pte_addr(i);
            let pfn = pt.arch.pfn(entry);
            let nr = 1u64 << mem.order(head);
            let folio_start = a.sub(pfn.offset_from(head) * 4096);
            if nr > 1 {
                let covered =
                    folio_start >= start.max(vma.vm_start()) && folio_start.add(nr * 4096) <= end;
                if !covered {
                    if splits.last().is_none_or(|s| s.0 != head) {
                        splits.push((head, folio_start, nr));
                    }
                    continue;
                }
            }
            // A dirty or swap-cache folio is only freed when this mapping is all that maps
            // it (a large one: by as many entries as it has pages), and a swap-cache one
            // only if its slots can be given up; a clean one always.
            let cached = mem.test(head, PageFlag::SwapCache);
            let eligible = !(cached || mem.test(head, PageFlag::Dirty))
                || (mem.folio_mapcount(head) == nr as i32
                    && (!cached || folio_free_swap(cpu, head)));
            if eligible {
                flush.merge(ptes.replace(i, pt.arch.mkclean(pt.arch.mkold(entry))));
                folio_mark_lazyfree(cpu, head);
            }
        }
    }
    splits
}

/// `MADV_COLD` and `MADV_PAGEOUT` of private anonymous memory
/// (`madvise_cold_or_pageout_pte_range`): only folios on the LRU that this mapping alone
/// maps, wholly, are handled; a large folio the range covers in part is split first
/// ([`crate::huge_memory::split_anon_folio`]) and its pages in the range handled as small
/// folios. COLD clears PG_referenced and deactivates. PAGEOUT clears PG_referenced and
/// reclaims the folio at once (`reclaim_pages`, [`reclaim_anon_folio`] without looking at
/// references): swapped out when there is swap; without swap, or with no run of slots
/// its size, a large swap-backed folio is split (`THP_SWPOUT_FALLBACK`; measured on 6.18
/// without swap: order 4 and 9 folios end as order 0) and its pages, like any small one
/// that cannot be written out, go back on the active list (`active lru swapbacked`, Rss
/// unchanged). A lazily freed (MADV_FREE, not swap-backed) folio needs no swap: it is
/// discarded when still clean and nothing else holds it; written again, it is made
/// swap-backed again and kept.
fn madvise_cold_or_pageout_anon<'m>(
    cpu: &Cpu<'m>,
    held: Held<'_>,
    vma: &crate::vma::Vma,
    start: VirtAddr,
    end: VirtAddr,
    advice: Advice,
) {
    use crate::phys::PageFlag;
    let mm = held.mm;
    let mem = &cpu.m.phys.memmap;
    cpu.lru_add_drain();
    let (mut folios, mut splits) = anon_folios_in(cpu, mm, start, end);
    if advice == Advice::PageOut {
        // Large folios that no run of swap slots fits are split before reclaim sees them.
        let fits = |head: Pfn| {
            !mem.test(head, PageFlag::SwapBacked)
                || mem.test(head, PageFlag::SwapCache)
                || cpu
                    .m
                    .swap
                    .as_ref()
                    .is_some_and(|s| s.has_free_run(mem.order(head)))
        };
        let (whole, split): (Vec<_>, Vec<_>) = folios
            .into_iter()
            .partition(|&(head, _, _)| mem.order(head) == 0 || fits(head));
        folios = whole;
        for (head, addr, _) in split {
            if cpu.m.swap.is_some() {
                cpu.c().add(crate::stats::Ev::ThpSwpOutFallback, 1);
            }
            splits.push((head, addr, 1 << mem.order(head)));
        }
    }
    let mut todo = vec![folios];
    split_and_revisit(cpu, mm, vma, splits, (start, end), |s, e| {
        todo.push(anon_folios_in(cpu, mm, s, e).0)
    });
    let mut aged = TlbFlushPending::none();
    for (head, addr, _) in todo.into_iter().flatten() {
        let nr = 1u64 << mem.order(head);
        match advice {
            Advice::PageOut => {
                mem.clear(head, PageFlag::Referenced);
                if isolate(cpu, head) {
                    let outcome = reclaim_anon_folio(cpu, Some(held), head, false);
                    putback(cpu, head, outcome);
                }
            }
            _ => {
                // COLD makes the entries old too (`clear_young_dirty_ptes(CYDP_CLEAR_YOUNG)`,
                // a PMD by `pmd_mkold`): with PG_referenced cleared, nothing of the folio's
                // recent use is left for reclaim's `folio_referenced` (measured on 6.18:
                // smaps Referenced drops by the advised folios).
                aged.merge(make_old(cpu, mm, addr, addr.add(nr * 4096)));
                anon_deactivate(cpu, head);
            }
        }
    }
    if aged.is_owed() {
        aged.flushed(cpu.flush_tlb(mm, crate::tlb::FlushScope::Range(start, end)));
    }
}

/// Clears the accessed bit of every present entry mapping `[start, end)`; the flush owed if
/// one was young (the caller flushes the TLB then, as `tlb_remove_tlb_entries` does).
fn make_old(cpu: &Cpu<'_>, mm: &crate::mm::Mm, start: VirtAddr, end: VirtAddr) -> TlbFlushPending {
    use crate::pgtable::cursor::{PmdKind, PmdLock, PteLock};
    let pt = cpu.tables(mm);
    let mut aged = TlbFlushPending::none();
    for step in pt.pmd_walk(start, end) {
        match step.kind {
            PmdKind::Huge(e) => {
                if pt.arch.young(e) {
                    let mut pmdl = PmdLock::lock(pt, cpu.c(), step.table);
                    aged.merge(pmdl.replace(step.idx, pt.arch.mkold(e)));
                }
            }
            PmdKind::Table(table) => {
                let mut ptes = PteLock::lock(pt, cpu.c(), table);
                let (i0, i1) = step.pte_indexes();
                for i in i0..i1 {
                    let e = ptes.get(i);
                    if !e.is_none() && pt.arch.present(e) && pt.arch.young(e) {
                        aged.merge(ptes.replace(i, pt.arch.mkold(e)));
                    }
                }
            }
        }
    }
    aged
}

/// The anonymous folios of `[start, end)` that this mapping alone maps wholly and that are
/// on the LRU, as (head, first address, any entry dirty), and the large ones it covers in
/// part and maps alone, to split, as (head, first address, pages).
#[allow(clippy::type_complexity)]
fn anon_folios_in<'m>(
    cpu: &Cpu<'m>,
    mm: &crate::mm::Mm,
    start: VirtAddr,
    end: VirtAddr,
) -> (Vec<(Pfn, VirtAddr, bool)>, Vec<(Pfn, VirtAddr, u64)>) {
    use crate::pgtable::cursor::{PmdKind, PteLock};
    use crate::phys::PageFlag;
    let pt = cpu.tables(mm);
    let mem = &cpu.m.phys.memmap;
    // (head, first address seen, pages seen in the range, any entry dirty, whole PMD)
    let mut seen: Vec<(Pfn, VirtAddr, u64, bool, bool)> = Vec::new();
    for step in pt.pmd_walk(start, end) {
        match step.kind {
            PmdKind::Huge(e) => {
                if let Some(head) = pt.vm_normal_folio(e) {
                    let n = if step.whole() { 512 } else { 0 };
                    seen.push((head, step.haddr(), n, pt.arch.dirty(e), true));
                }
            }
            PmdKind::Table(table) => {
                let ptes = PteLock::lock(pt, cpu.c(), table);
                let (i0, i1) = step.pte_indexes();
                for i in i0..i1 {
                    let e = ptes.get(i);
                    if e.is_none() || !pt.arch.present(e) {
                        continue;
                    }
                    let Some(head) = pt.vm_normal_folio(e) else {
                        continue;
                    };
                    let dirty = pt.arch.dirty(e);
                    match seen.last_mut() {
                        Some(f) if f.0 == head => {
                            f.2 += 1;
                            f.3 |= dirty;
                        }
                        _ => {
                            let a = step.pte_addr(i);
                            let first = a.sub(pt.arch.pfn(e).offset_from(head) * 4096);
                            seen.push((head, first, 1, dirty, false));
                        }
                    }
                }
            }
        }
    }
    let (mut whole, mut split) = (Vec::new(), Vec::new());
    for (head, first, n, dirty, pmd) in seen {
        if !mem.test(head, PageFlag::Anon) || !mem.test(head, PageFlag::Lru) {
            continue;
        }
        let nr = 1u64 << mem.order(head);
        // A PMD mapping counts once in the folio's mapcount, each PTE once.
        let own = if pmd { 1 } else { nr as i32 };
        if mem.folio_mapcount(head) != own {
            continue; // mapped elsewhere too: `folio_maybe_mapped_shared`
        }
        if n == nr {
            whole.push((head, first, dirty));
        } else if nr > 1 {
            split.push((head, first, nr));
        }
    }
    (whole, split)
}

/// COLD of one folio: PG_referenced cleared, moved to the inactive list
/// (`folio_deactivate`).
fn anon_deactivate<'m>(cpu: &Cpu<'m>, head: Pfn) {
    use crate::phys::PageFlag;
    let mem = &cpu.m.phys.memmap;
    mem.clear(head, PageFlag::Referenced);
    if mem.test(head, PageFlag::Active) {
        lru_relist(cpu, cpu.m.phys.memmap.folio(head), |_| {
            mem.clear(head, PageFlag::Active)
        });
    }
}

fn folio_mark_lazyfree<'m>(cpu: &Cpu<'m>, head: Pfn) {
    use crate::phys::PageFlag;
    let phys = &cpu.m.phys;
    let mem = &phys.memmap;
    mem.clear(head, PageFlag::Dirty);
    if !mem.test(head, PageFlag::SwapBacked) {
        return;
    }
    lru_relist(cpu, cpu.m.phys.memmap.folio(head), |_| {
        mem.clear(head, PageFlag::SwapBacked);
        mem.clear(head, PageFlag::Active);
        mem.clear(head, PageFlag::Referenced);
    });
}

/// `madvise_cold_or_pageout_pte_range` for the page-cache pages of a file mapping that
/// only this mapping maps: the PTE is made old, the folio loses PG_referenced and is
/// deactivated (`COLD`) or reclaimed (`PAGEOUT`: see [`crate::vmscan::pageout_file_folio`]). A
/// PMD-mapped folio the range covers only in part, and that no one else maps, is split
/// once the mmap lock is dropped ([`crate::truncate::split_folio_to_order0`]).
fn madvise_cold_or_pageout_file<'m>(
    cpu: &Cpu<'m>,
    mm: &crate::mm::Mm,
    vma: &crate::vma::Vma,
    start: VirtAddr,
    end: VirtAddr,
    advice: Advice,
    deferred: &mut Vec<Deferred>,
) {
    use crate::pgtable::cursor::{PmdKind, PteLock};
    use crate::phys::PageFlag;
    let pt = cpu.tables(mm);
    let phys = &cpu.m.phys;
    let mem = &phys.memmap;
    cpu.lru_add_drain();
    let mut found = Vec::new();
    // What COLD's aging owes (PAGEOUT changes no entry here).
    let mut flush = TlbFlushPending::none();
    for step in pt.pmd_walk(start, end) {
        if let PmdKind::Huge(e) = step.kind {
            // A PMD-mapped folio only partly advised and mapped by no one else is split
            // (`split_folio`: unmapped everywhere, order-0 pages; shmem keeps them).
            if let Some(head) = pt.vm_normal_folio(e) {
                let partial = !step.whole();
                let shared = mem.entire_mapcount(head) > 1 || mem.large_mapcount(head) > 1;
                if partial && !shared && !mem.test(head, PageFlag::Anon) {
                    if let Some(inode) = &vma.file {
                        deferred.push(Deferred::Split(inode.clone(), head));
                    }
                }
            }
            continue;
        }
        let PmdKind::Table(table) = step.kind else {
            continue;
        };
        let mut ptes = PteLock::lock(pt, cpu.c(), table);
        let (i0, i1) = step.pte_indexes();
        let mut i = i0;
        while i < i1 {
            let e = ptes.get(i);
            let at = i;
            i += 1;
            if e.is_none() || !pt.arch.present(e) {
                continue;
            }
            let Some(head) = pt.vm_normal_folio(e) else {
                continue;
            };
            if mem.test(head, PageFlag::Anon) {
                continue;
            }
            let nr = 1u64 << mem.order(head);
            let addr = step.pte_addr(at);
            if nr > 1 {
                // A large folio: the PTEs that map it in order from here (within the
                // range and this table) must cover all of it, or it is split first
                // (`split_folio`: unmapped everywhere, order-0 pages kept in the cache,
                // none of them paged out this time), unless others map it too.
                let first = pt.arch.pfn(e);
                let batch = (at..i1)
                    .take_while(|&j| {
                        let f = ptes.get(j);
                        !f.is_none()
                            && pt.arch.present(f)
                            && pt.arch.pfn(f) == first.add((j - at) as u64)
                            && mem.folio_of(pt.arch.pfn(f)) == head
                    })
                    .count() as u64;
                let shared = if mem.test(head, PageFlag::OwnerTracked) {
                    crate::rmap::owner::maybe_mapped_shared(phys.memmap.folio(head))
                } else {
                    mem.large_mapcount(head) as u64 > batch
                };
                i = at + batch as usize;
                if shared {
                    continue;
                }
                if first != head || batch < nr {
                    if let Some(inode) = &vma.file {
                        deferred.push(Deferred::Split(inode.clone(), head));
                    }
                    continue;
                }
                if advice == Advice::Cold {
                    for j in at..i {
                        let f = ptes.get(j);
                        if pt.arch.young(f) {
                            flush.merge(ptes.replace(j, pt.arch.mkold(f)));
                        }
                    }
                }
                found.push((addr, head));
                continue;
            }
            if crate::rmap::page_mapcount(phys, head) > 1 {
                continue;
            }
            if advice == Advice::Cold && pt.arch.young(e) {
                flush.merge(ptes.replace(at, pt.arch.mkold(e)));
            }
            found.push((addr, head));
        }
    }
    if advice == Advice::Cold {
        flush.flushed(cpu.flush_tlb(mm, crate::tlb::FlushScope::Range(start, end)));
    }
    for (addr, head) in found {
        mem.clear(head, PageFlag::Referenced);
        if advice == Advice::PageOut {
            pageout_file_folio(cpu, mm, vma, addr, head);
        } else if mem.test(head, PageFlag::Active) && !mem.test(head, PageFlag::Unevictable) {
            lru_relist(cpu, cpu.m.phys.memmap.folio(head), |_| {
                mem.clear(head, PageFlag::Active)
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Advice, ADVICE_NUMBERS};

    #[test]
    fn numbers_round_trip_and_are_distinct() {
        for (i, &(a, n)) in ADVICE_NUMBERS.iter().enumerate() {
            assert_eq!(a.number(), n);
            assert_eq!(Advice::from_number(n.into()), Some(a));
            assert!(ADVICE_NUMBERS[..i].iter().all(|&(b, k)| b != a && k != n));
        }
        for n in [-1, 5, 6, 7, 26, 100, i64::MIN, i64::MAX] {
            assert_eq!(Advice::from_number(n), None, "{n}");
        }
    }
}
