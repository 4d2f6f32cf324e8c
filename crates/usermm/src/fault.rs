//! Page faults: anonymous, file (read, COW, shared), write-protect (COW).
//!
//! Linux counterpart: the fault half of `mm/memory.c` (`handle_mm_fault`, `__handle_mm_fault`,
//! `handle_pte_fault`, `do_anonymous_page`, `alloc_anon_folio`, `do_fault`, `do_read_fault`,
//! `do_cow_fault`, `do_shared_fault`, `finish_fault`, `do_fault_around`, `do_wp_page`,
//! `wp_page_copy`, `wp_page_reuse`). The PMD level (`do_huge_pmd_anonymous_page`,
//! `do_huge_pmd_wp_page`, the shmem PMD fault, `split_huge_pmd`) is in
//! [`crate::huge_memory`], as in Linux; `filemap_fault` in [`crate::filemap::cache`]. A fault
//! is not an error: it returns a [`FaultOutcome`].
//!
//! # Context
//! The mmap lock is held for reading; PTEs are changed under the table's split PTL.
//!
//! Deliberate difference (until the sharing issue lands): a write to a shared large anon folio
//! page that is not PageAnonExclusive always copies; Linux 6.15+ may reuse it when the folio
//! is mapped exclusively by this mm.

use crate::filemap::io::filemap_fault;
use crate::filemap::{CacheLookup, Inode, PAGE_SIZE};
use crate::huge_memory::fault::{
    do_huge_pmd_anonymous_page, do_huge_pmd_wp_page, do_shmem_pmd_fault, shmem_pmd_suitable,
};
use crate::huge_memory::thp_pmd_eligible;
use crate::machine::Cpu;
use crate::mlock::{folio_add_lru_vma, mlock_vma_file_folio, mlock_vma_folio, munlock_vma_folio};
use crate::mm::{mm_counter_file, Mm, MmState, RssKind};
use crate::pgtable::cursor::PteLock;
use crate::pgtable::{Access, Pte, PMD_SIZE};
use crate::phys::{FolioKind, PageFlag, Pfn, Zeroing, HPAGE_PMD_ORDER};
use crate::readahead::mmap_miss_hits;
use crate::rmap::{self, Level};
use crate::stats::Ev;
use crate::tlb::FlushScope;
use crate::vaddr::VirtAddr;
use crate::vm_fault::{
    anon_vma_prepare, count_file_fault, folio_node, FaultAttempt, FaultCtx, FaultOutcome,
    FaultSource, FaultTunables, MAX_FAULT_ATTEMPTS,
};
use crate::vma::VmFlags;
use crate::vmscan::reclaim_for;

/// Handles a fault at `addr` in `mm`, taken by `src`. A file fault that Linux would retry
/// after dropping the mmap lock for I/O runs its retries here ([`FaultAttempt`]).
///
/// # Context
/// `st` is the mm's state under the mmap lock (read).
pub(crate) fn handle_mm_fault<'m>(
    cpu: &Cpu<'m>,
    mm: &Mm,
    st: &MmState,
    addr: VirtAddr,
    access: Access,
    src: FaultSource,
) -> FaultOutcome {
    let c = cpu.c();
    c.add(Ev::Fault, 1);
    let Some(id) = st.vmas.find(addr.val()) else {
        return segv(cpu);
    };
    let vma = st.vmas.get(id);
    let allowed = match access {
        Access::Read => vma.flags.has(VmFlags::READ),
        Access::Write => vma.flags.has(VmFlags::WRITE),
    };
    if !allowed {
        return segv(cpu);
    }
    let pt = cpu.tables(mm);
    let Ok(pmd_table) = pt.alloc_pmd_table(c, &mm.page_table_lock, addr) else {
        return oom(cpu);
    };
    let pmd_idx = addr.pmd_index();
    let mut vmf = FaultCtx {
        mm,
        vma,
        pt,
        pmd_table,
        pmd_idx,
        pte_table: None,
        addr,
        access,
        pgoff: vma.pgoff_at(addr),
        tun: FaultTunables::snapshot(&cpu.m.tunables()),
        src,
    };
    let huge =
        pt.pmdp_get(pmd_table, pmd_idx).is_none() && thp_pmd_eligible(&vmf.tun.thp, vma, addr);
    if vma.anon_vma().is_none() && vma.is_anon_private() && (access == Access::Write || huge) {
        // This fault will prepare the anon_vma: Linux first looks for a neighbour's to
        // share (`find_mergeable_anon_vma`), which later lets the two VMAs merge.
        if let Some(av) = st.vmas.mergeable_anon_vma(id) {
            let _g = mm.page_table_lock.lock(c);
            if vma.anon_vma().is_none() {
                vma.set_anon_vma(av, 1);
            }
        }
    }
    if huge {
        // `None`: fall back to PTEs.
        if let Some(o) = do_huge_pmd_anonymous_page(cpu, &vmf) {
            return o;
        }
    }
    if pt.pmdp_get(pmd_table, pmd_idx).is_none() && shmem_pmd_suitable(vma, addr, access) {
        if let Some(o) = do_shmem_pmd_fault(cpu, &vmf) {
            return o;
        }
    }
    let pmd = pt.pmdp_get(pmd_table, pmd_idx);
    if !pmd.is_none() && !pt.arch.is_table(pmd) {
        if access == Access::Write && !pt.arch.write(pmd) {
            if let Some(o) = do_huge_pmd_wp_page(cpu, &vmf) {
                return o;
            }
        } else {
            return FaultOutcome::Completed;
        }
    }
    let table = match pt.alloc_pte_table(c, &mm.page_table_lock, addr) {
        Ok(Some(t)) => t,
        Ok(None) => return FaultOutcome::Completed, // a PMD leaf appeared meanwhile: retry
        Err(_) => return oom(cpu),
    };
    vmf.pte_table = Some(table);
    handle_pte_fault(cpu, &vmf)
}

fn segv<'m>(cpu: &Cpu<'m>) -> FaultOutcome {
    cpu.c().add(Ev::FaultSigsegv, 1);
    FaultOutcome::Sigsegv
}

fn oom<'m>(cpu: &Cpu<'m>) -> FaultOutcome {
    cpu.c().add(Ev::FaultSigbus, 1);
    FaultOutcome::Oom
}

fn handle_pte_fault<'m>(cpu: &Cpu<'m>, vmf: &FaultCtx<'_, 'm>) -> FaultOutcome {
    let mut ptes = PteLock::lock(vmf.pt, cpu.c(), vmf.table());
    let idx = vmf.idx();
    let pte = ptes.get_raw(idx);
    if pte.is_none() {
        drop(ptes);
        return match &vmf.vma.file {
            Some(_) => do_fault(cpu, vmf),
            None => do_anonymous_page(cpu, vmf),
        };
    }
    if vmf.pt.arch.is_swap_pte(pte) {
        drop(ptes);
        return crate::swap_fault::do_swap_page(cpu, vmf, pte);
    }
    if vmf.access == Access::Write && !vmf.pt.arch.write(pte) {
        return do_wp_page(cpu, vmf, ptes, pte);
    }
    // Spurious: only the accessed/dirty bits were missing.
    let new = vmf.pt.arch.hw_access(pte, vmf.access);
    if new != pte {
        ptes.set_access_flags(idx, new);
    }
    FaultOutcome::Completed
}

fn do_anonymous_page<'m>(cpu: &Cpu<'m>, vmf: &FaultCtx<'_, 'm>) -> FaultOutcome {
    let c = cpu.c();
    let (mm, vma, pt) = (vmf.mm, vmf.vma, vmf.pt);
    let arch = pt.arch;
    if vmf.access == Access::Read {
        let entry = arch.mkspecial(arch.mk_pte(cpu.m.phys.zero_pfn(), vma.page_prot()));
        let mut ptes = PteLock::lock(pt, c, vmf.table());
        let idx = vmf.idx();
        if ptes.peek_raw(idx).is_none() {
            ptes.set_ptes(idx, entry, 1);
            c.add(Ev::FaultZeroPage, 1);
        }
        return FaultOutcome::Completed;
    }
    let anon_vma = anon_vma_prepare(cpu, mm, vma);
    reclaim_for(cpu, 1);
    let Some((head, order, start)) = alloc_anon_folio(cpu, vmf) else {
        return oom(cpu);
    };
    let nr = 1u64 << order;
    let first_idx = start.pte_index();
    let mut ptes = PteLock::lock(pt, c, vmf.table());
    if (first_idx..first_idx + nr as usize).any(|i| !ptes.peek_raw(i).is_none()) {
        drop(ptes);
        cpu.m.phys.put_folio(c, head, 1);
        return FaultOutcome::Completed; // raced with another fault: retry
    }
    if nr > 1 {
        rmap::folio_ref_add(c, cpu.m.phys.memmap.folio(head), nr as i32 - 1);
    }
    rmap::add_new_anon(
        &cpu.m.phys,
        c,
        cpu.m.phys.memmap.folio(head),
        nr,
        Level::Pte,
        anon_vma,
        mm.id,
    );
    cpu.m.phys.memmap.set_index(head, vma.pgoff_at(start));
    folio_add_lru_vma(cpu, cpu.m.phys.memmap.folio(head), vma);
    let mut entry = arch.mk_pte(head, vma.page_prot());
    if vma.flags.has(VmFlags::WRITE) {
        entry = arch.mkwrite(arch.mkdirty(entry));
    }
    ptes.set_ptes(first_idx, entry, nr as usize);
    mm.rss_add(RssKind::Anon, nr as i64);
    c.add(
        if order > 0 {
            Ev::FaultAnonMthp
        } else {
            Ev::FaultAnon
        },
        1,
    );
    FaultOutcome::Completed
}

/// Picks the largest enabled mTHP order whose aligned range lies inside the VMA and has
/// only empty PTEs, and allocates it (falling back order by order); order 0 last.
fn alloc_anon_folio<'m>(cpu: &Cpu<'m>, vmf: &FaultCtx<'_, 'm>) -> Option<(Pfn, u32, VirtAddr)> {
    let c = cpu.c();
    let (vma, pt, table, addr) = (vmf.vma, vmf.pt, vmf.table(), vmf.addr);
    let thp = &vmf.tun.thp;
    let huge_ok = !vma.flags.has(VmFlags::NOHUGEPAGE);
    for order in (2..HPAGE_PMD_ORDER).rev() {
        if !huge_ok || !thp.order_allowed(order, vma.flags.has(VmFlags::HUGEPAGE)) {
            continue;
        }
        let size = 4096u64 << order;
        let start = addr.align_down(size);
        if start < vma.vm_start() || start.add(size) > vma.vm_end() {
            continue;
        }
        let i0 = start.pte_index();
        if (i0..i0 + (1 << order)).any(|i| !pt.ptep_get_raw(table, i).is_none()) {
            continue;
        }
        if let Some(h) = cpu.m.phys.alloc_folio(
            c,
            order,
            folio_node(cpu, addr, order),
            FolioKind::Anon,
            Zeroing::Zero,
        ) {
            return Some((h, order, start));
        }
    }
    let h = cpu.m.phys.alloc_folio(
        c,
        0,
        folio_node(cpu, addr, 0),
        FolioKind::Anon,
        Zeroing::Zero,
    )?;
    Some((h, 0, addr.page_align_down()))
}

/// `do_fault`: an empty PTE in a file VMA (tmpfs, disk, or shared anonymous memory).
fn do_fault<'m>(cpu: &Cpu<'m>, vmf: &FaultCtx<'_, 'm>) -> FaultOutcome {
    let Some(inode) = vmf.vma.file.clone() else {
        return segv(cpu);
    };
    if vmf.access == Access::Read {
        do_read_fault(cpu, vmf, &inode)
    } else if !vmf.vma.flags.has(VmFlags::SHARED) {
        do_cow_fault(cpu, vmf, &inode)
    } else {
        do_shared_fault(cpu, vmf, &inode)
    }
}

/// `do_read_fault`: fault-around first; if it did not map the faulting page, find or read
/// the page and map it read-only (or writable-clean in a shared mapping without dirty
/// tracking, as `vm_page_prot` says).
///
/// An attempt that dropped the mmap lock for I/O (a miss of a disk file, or a hit that
/// started asynchronous readahead) is taken again, as Linux returns `VM_FAULT_RETRY` and
/// the fault is retried: fault-around then finds the pages the I/O brought in (measured on
/// 6.18: a cold read fault in a 512K file maps the whole 64K window), and counts them as
/// `mmap_miss` hits again.
fn do_read_fault<'m>(cpu: &Cpu<'m>, vmf: &FaultCtx<'_, 'm>, inode: &Inode) -> FaultOutcome {
    let mut at = FaultAttempt::first(vmf.src);
    let mut counted = false;
    loop {
        if vmf.tun.fault_around_bytes > PAGE_SIZE && do_fault_around(cpu, vmf, inode) {
            if !counted {
                count_file_fault(cpu, inode, CacheLookup::Hit);
            }
            return FaultOutcome::Completed;
        }
        let page = match filemap_fault(cpu, inode, vmf.vma, vmf.addr, vmf.pgoff, at) {
            Ok(r) => r,
            Err(o) => return o,
        };
        if !counted {
            count_file_fault(cpu, inode, page.lookup);
            counted = true;
        }
        if page.retry && at.n < MAX_FAULT_ATTEMPTS {
            let phys = &cpu.m.phys;
            phys.put_folio(cpu.c(), phys.memmap.folio_of(page.pfn), 1);
            at = at.retry(page.lookup == CacheLookup::Miss);
            continue;
        }
        return finish_fault(cpu, vmf, page.pfn, false);
    }
}

/// `__do_fault` for a write fault: `filemap_fault` until an attempt did not drop the mmap
/// lock (as [`do_read_fault`] retries, without fault-around). Returns the page, with a
/// reference, and the first attempt's lookup (a miss is a major fault even if its retry
/// found the page).
fn write_fault_page<'m>(
    cpu: &Cpu<'m>,
    vmf: &FaultCtx<'_, 'm>,
    inode: &Inode,
) -> Result<(Pfn, CacheLookup), FaultOutcome> {
    let mut at = FaultAttempt::first(vmf.src);
    let mut first = None;
    loop {
        let page = filemap_fault(cpu, inode, vmf.vma, vmf.addr, vmf.pgoff, at)?;
        let lookup = *first.get_or_insert(page.lookup);
        if page.retry && at.n < MAX_FAULT_ATTEMPTS {
            let phys = &cpu.m.phys;
            phys.put_folio(cpu.c(), phys.memmap.folio_of(page.pfn), 1);
            at = at.retry(page.lookup == CacheLookup::Miss);
            continue;
        }
        return Ok((page.pfn, lookup));
    }
}

/// `do_cow_fault`: a write to an empty PTE of a private file mapping copies the file's
/// page into a new anonymous page; the page-cache page is not mapped.
fn do_cow_fault<'m>(cpu: &Cpu<'m>, vmf: &FaultCtx<'_, 'm>, inode: &Inode) -> FaultOutcome {
    let c = cpu.c();
    let (mm, vma, addr) = (vmf.mm, vmf.vma, vmf.addr);
    let phys = &cpu.m.phys;
    let anon_vma = anon_vma_prepare(cpu, mm, vma);
    let (old, lookup) = match write_fault_page(cpu, vmf, inode) {
        Ok(r) => r,
        Err(o) => return o,
    };
    let new = phys.alloc_folio(
        c,
        0,
        folio_node(cpu, addr, 0),
        FolioKind::Anon,
        Zeroing::NoZero,
    );
    let Some(new) = new else {
        phys.put_folio(c, phys.memmap.folio_of(old), 1);
        return oom(cpu);
    };
    phys.arena.copy_frame(new, old);
    c.add(Ev::PagesCopied, 1);
    phys.put_folio(c, phys.memmap.folio_of(old), 1);
    let idx = vmf.idx();
    let arch = vmf.pt.arch;
    let mut ptes = PteLock::lock(vmf.pt, c, vmf.table());
    if !ptes.peek_raw(idx).is_none() {
        drop(ptes);
        phys.put_folio(c, new, 1);
        return FaultOutcome::Completed;
    }
    rmap::add_new_anon(
        phys,
        c,
        phys.memmap.folio(new),
        1,
        Level::Pte,
        anon_vma,
        mm.id,
    );
    phys.memmap
        .set_index(new, vma.pgoff_at(addr.page_align_down()));
    folio_add_lru_vma(cpu, cpu.m.phys.memmap.folio(new), vma);
    let entry = arch.mkwrite(arch.mkdirty(arch.mk_pte(new, vma.page_prot())));
    ptes.set_ptes(idx, entry, 1);
    mm.rss_add(RssKind::Anon, 1);
    count_file_fault(cpu, inode, lookup);
    c.add(Ev::FaultFileCow, 1);
    FaultOutcome::Completed
}

/// `do_shared_fault`: a write to an empty PTE of a shared file mapping maps the page
/// writable and dirty and dirties the folio (`fault_dirty_shared_page`; a disk file's
/// `page_mkwrite` has nothing more to do here).
fn do_shared_fault<'m>(cpu: &Cpu<'m>, vmf: &FaultCtx<'_, 'm>, inode: &Inode) -> FaultOutcome {
    let (pfn, lookup) = match write_fault_page(cpu, vmf, inode) {
        Ok(r) => r,
        Err(o) => return o,
    };
    count_file_fault(cpu, inode, lookup);
    let mem = &cpu.m.phys.memmap;
    mem.set(mem.folio_of(pfn), PageFlag::Dirty);
    finish_fault(cpu, vmf, pfn, true)
}

/// `finish_fault` / `set_pte_range`: maps page-cache page `pfn` (whose folio reference
/// the lookup took) at the fault address; a large shmem folio is mapped whole when it lies
/// inside the VMA and the PTE table and its entries are all empty (6.18 maps whole folios
/// for shmem only; other files fault page by page).
fn finish_fault<'m>(cpu: &Cpu<'m>, vmf: &FaultCtx<'_, 'm>, pfn: Pfn, write: bool) -> FaultOutcome {
    let c = cpu.c();
    let (mm, vma) = (vmf.mm, vmf.vma);
    let phys = &cpu.m.phys;
    let arch = vmf.pt.arch;
    let head = phys.memmap.folio_of(pfn);
    let folio_pages = 1usize << phys.memmap.order(head);
    let idx = vmf.idx();
    let mut ptes = PteLock::lock(vmf.pt, c, vmf.table());
    if !ptes.peek_raw(idx).is_none() {
        drop(ptes);
        phys.put_folio(c, head, 1);
        return FaultOutcome::Completed;
    }
    let mut first_page = pfn;
    let mut first_idx = idx;
    let mut nr = 1usize;
    // 6.18 maps the whole file folio when it fits the VMA and the page table (commit
    // "try to map the entire file folio in finish_fault()"), shmem or not.
    if folio_pages > 1 && vma.file.is_some() {
        let in_folio = pfn.offset_from(head) as usize;
        let vma_off = (vmf.addr.offset_from(vma.vm_start()) >> 12) as usize;
        let vma_pages = (vma.len() >> 12) as usize;
        let in_file = vma
            .file
            .as_ref()
            .is_some_and(|f| f.may_map_whole(phys.memmap.index(head), folio_pages as u64));
        let fits = vma_off >= in_folio
            && vma_off + (folio_pages - in_folio) <= vma_pages
            && idx >= in_folio
            && idx + (folio_pages - in_folio) <= 512
            && in_file;
        if fits
            && (idx - in_folio..idx - in_folio + folio_pages).all(|i| ptes.peek_raw(i).is_none())
        {
            first_page = head;
            first_idx = idx - in_folio;
            nr = folio_pages;
            rmap::folio_ref_add(c, phys.memmap.folio(head), nr as i32 - 1);
        }
    }
    rmap::add_ptes(
        phys,
        c,
        phys.memmap.folio(head),
        first_page,
        nr as u64,
        mm.id,
    );
    mlock_vma_file_folio(cpu, cpu.m.phys.memmap.folio(head), vma, nr as u64);
    let mut entry = arch.mk_pte(first_page, vma.page_prot());
    if write {
        entry = arch.mkwrite(arch.mkdirty(entry));
    }
    ptes.set_ptes(first_idx, entry, nr);
    mm.rss_add(mm_counter_file(vma), nr as i64);
    FaultOutcome::Completed
}

/// `do_fault_around` with `filemap_map_pages`: a read fault maps the pages of the
/// surrounding `fault_around_bytes` window (inside the VMA, the PMD and the file) that are
/// already in the page cache, uptodate and not a readahead marker. A large folio met in the
/// window is mapped whole when all of it lies inside the VMA, the PTE table and the file
/// (6.18 maps entire large folios on fault-around). Returns whether the faulting page
/// itself got mapped.
///
/// Every page of every folio the walk looks at, mapped now or before, counts as an
/// `mmap_miss` hit unless its folio is `PG_workingset` (`filemap_map_folio_range`; a
/// folio mapped whole counts all its pages); the count is taken from the file's
/// `mmap_miss` at the end ([`mmap_miss_hits`]).
fn do_fault_around<'m>(cpu: &Cpu<'m>, vmf: &FaultCtx<'_, 'm>, inode: &Inode) -> bool {
    let c = cpu.c();
    let (mm, vma, pt, addr) = (vmf.mm, vmf.vma, vmf.pt, vmf.addr);
    let mem = &cpu.m.phys.memmap;
    let window = vmf.tun.fault_around_bytes;
    let pmd_start = addr.pmd_align_down();
    let file_end = inode.size_pages();
    // The window starts at the aligned block or the VMA's start, whichever is later, and
    // runs `window` bytes from there (clipped to the VMA and the page table): a VMA that
    // begins inside the block shifts the window right (`do_fault_around`'s from_pte and
    // to_pte; measured on 6.18: a fault 2 pages into a 10-page VMA that starts 13 pages
    // into its 64K block maps all 10).
    let start = addr.align_down(window).max(vma.vm_start()).max(pmd_start);
    let end = start
        .add(window)
        .min(vma.vm_end())
        .min(pmd_start.add(PMD_SIZE));
    let cache = inode.pages.lock();
    // The table is locked at the first page found to map, not before: a window with
    // nothing cached leaves the PTL to the fault proper (`filemap_map_pages` maps the
    // table only once `next_uptodate_folio` returned a folio).
    let mut ptes: Option<PteLock> = None;
    let mut mapped_fault = false;
    let mut map_page = |ptes: &mut Option<_>, a: VirtAddr, pfn: Pfn| -> bool {
        let ptes = ptes.get_or_insert_with(|| PteLock::lock(pt, c, vmf.table()));
        let idx = a.pte_index();
        if !ptes.peek_raw(idx).is_none() {
            return false;
        }
        let head = mem.folio_of(pfn);
        rmap::folio_ref_add(c, cpu.m.phys.memmap.folio(head), 1);
        rmap::add_ptes(&cpu.m.phys, c, cpu.m.phys.memmap.folio(head), pfn, 1, mm.id);
        mlock_vma_folio(cpu, cpu.m.phys.memmap.folio(head), vma);
        ptes.set_ptes(idx, pt.arch.mk_pte(pfn, vma.page_prot()), 1);
        mm.rss_add(mm_counter_file(vma), 1);
        if a == addr.page_align_down() {
            mapped_fault = true;
        } else {
            c.add(Ev::FaultAroundPages, 1);
        }
        true
    };
    // One ordered walk over the cached pages of the window (Linux: `next_uptodate_folio`
    // over the xarray), not a lookup per address: a sparse window costs one search.
    let first_pgoff = vma.pgoff_at(start);
    let last_pgoff = vma.pgoff_at(end.sub(4096));
    let mut whole_done: Option<(VirtAddr, VirtAddr)> = None;
    let mut hits = 0u64;
    for (pgoff, pfn) in cache.range(first_pgoff..=last_pgoff) {
        let a = start.add((pgoff - first_pgoff) * 4096);
        let head = mem.folio_of(pfn);
        if pgoff >= file_end
            || !mem.test(head, PageFlag::Uptodate)
            || mem.test(head, PageFlag::Readahead)
            || whole_done.is_some_and(|(s, e)| s <= a && a < e)
        {
            continue;
        }
        let nr = 1u64 << mem.order(head);
        let hit = u64::from(!mem.test(head, PageFlag::Workingset));
        if nr > 1 {
            let first = a.sub(pfn.offset_from(head) * 4096);
            let last = first.add(nr * 4096);
            let in_file = inode.may_map_whole(mem.index(head), nr);
            if first >= vma.vm_start()
                && last <= vma.vm_end()
                && first >= pmd_start
                && last <= pmd_start.add(PMD_SIZE)
                && in_file
            {
                let mapped = (0..nr)
                    .filter(|&i| map_page(&mut ptes, first.add(i * 4096), head.add(i)))
                    .count() as u64;
                // One rmap call covered the whole folio: it is mlocked in a locked VMA.
                mlock_vma_file_folio(cpu, cpu.m.phys.memmap.folio(head), vma, mapped);
                whole_done = Some((first, last));
                hits += nr * hit;
                continue;
            }
        }
        map_page(&mut ptes, a, pfn);
        hits += hit;
    }
    drop(ptes);
    drop(cache);
    mmap_miss_hits(inode, hits);
    mapped_fault
}

fn do_wp_page<'m>(
    cpu: &Cpu<'m>,
    vmf: &FaultCtx<'_, 'm>,
    mut ptes: PteLock<'_>,
    pte: Pte,
) -> FaultOutcome {
    let c = cpu.c();
    c.add(Ev::FaultWp, 1);
    let (mm, vma) = (vmf.mm, vmf.vma);
    let arch = vmf.pt.arch;
    let idx = vmf.idx();
    let mem = &cpu.m.phys.memmap;
    let pfn = arch.pfn(pte);
    let zero = vmf.pt.vm_normal_folio(pte).is_none();
    if !zero && vma.flags.has(VmFlags::SHARED) {
        // wp_page_shared: a page-cache page written through a shared mapping that tracks
        // dirtying (or one made read-only by mprotect) becomes writable and dirty.
        let new = arch.mkyoung(arch.mkdirty(arch.mkwrite(pte)));
        ptes.replace_no_flush(idx, new);
        mem.set(mem.folio_of(pfn), PageFlag::Dirty);
        return FaultOutcome::Completed;
    }
    if !zero && mem.test(mem.folio_of(pfn), PageFlag::Anon) {
        let head = mem.folio_of(pfn);
        let large = mem.test(head, PageFlag::Head);
        let exclusive = mem.test(pfn, PageFlag::AnonExclusive);
        let reusable = if large {
            can_reuse_large_anon_folio(cpu, mm, head)
        } else {
            can_reuse_small_anon_folio(cpu, head)
        };
        if exclusive || reusable {
            if !exclusive {
                mem.set(pfn, PageFlag::AnonExclusive);
                c.add(Ev::FolioAtomic, 1);
            }
            let new = arch.mkyoung(arch.mkdirty(arch.mkwrite(pte)));
            ptes.replace_no_flush(idx, new);
            c.add(Ev::CowReuse, 1);
            return FaultOutcome::Completed;
        }
    }
    drop(ptes);
    wp_page_copy(cpu, vmf, pte, zero)
}

/// `wp_can_reuse_anon_folio` for a small folio: no other reference (a reference held by this
/// CPU's LRU batch is drained away first).
fn can_reuse_small_anon_folio<'m>(cpu: &Cpu<'m>, head: Pfn) -> bool {
    let mem = &cpu.m.phys.memmap;
    if mem.refcount(head) > 3 {
        return false;
    }
    if !mem.test(head, PageFlag::Lru) {
        cpu.lru_add_drain();
    }
    // The swap cache's reference does not count against reuse when its slot can be given
    // up (no other swap PTE names it).
    let cached = i32::from(mem.test(head, PageFlag::SwapCache));
    if mem.refcount(head) > 1 + cached {
        return false;
    }
    if cached == 1 {
        crate::swap_state::folio_free_swap(cpu, head);
    }
    mem.refcount(head) == 1
}

/// `__wp_can_reuse_large_anon_folio` (Linux 6.15+, MM owner tracking): reuse when this mm
/// provably holds every mapping and every reference of the PTE-mapped folio.
fn can_reuse_large_anon_folio<'m>(cpu: &Cpu<'m>, mm: &Mm, head: Pfn) -> bool {
    use crate::sharing::SharingTracker;
    let phys = &cpu.m.phys;
    let mem = &phys.memmap;
    match phys.sharing.tracker() {
        // Before 6.15 (and with the first-page estimates) large folios were always copied.
        SharingTracker::Estimate | SharingTracker::Mapcount => false,
        // Owner slots exist only on folios allocated while owner tracking was on.
        SharingTracker::Owner if !mem.test(head, PageFlag::OwnerTracked) => false,
        SharingTracker::Owner => {
            let mapcount = mem.large_mapcount(head);
            let quick = mapcount > 1
                && !rmap::owner::maybe_mapped_shared(phys.memmap.folio(head))
                && mem.entire_mapcount(head) == 0
                && mapcount == mem.refcount(head);
            if !quick {
                return false;
            }
            let _g = mem.lock_large_mapcount(head);
            !rmap::owner::maybe_mapped_shared(phys.memmap.folio(head))
                && mem.large_mapcount(head) == mem.refcount(head)
        }
        SharingTracker::RmapId(_) | SharingTracker::RmapIdSq => {
            phys.sharing
                .cow_reusable(head, mem.order(head), mm.id, |m| {
                    mem.entire_mapcount(head) == 0 && mem.refcount(head) as u64 == m
                })
        }
    }
}

/// `wp_page_copy`: a private copy of the page `old` maps (a zeroed page for the zero
/// page) replaces it, with a flush in between (`ptep_clear_flush`).
fn wp_page_copy<'m>(cpu: &Cpu<'m>, vmf: &FaultCtx<'_, 'm>, old: Pte, zero: bool) -> FaultOutcome {
    let c = cpu.c();
    let (mm, vma, addr, idx) = (vmf.mm, vmf.vma, vmf.addr, vmf.idx());
    let arch = vmf.pt.arch;
    let phys = &cpu.m.phys;
    let anon_vma = anon_vma_prepare(cpu, mm, vma);
    let zeroing = if zero { Zeroing::Zero } else { Zeroing::NoZero };
    let Some(new) = phys.alloc_folio(c, 0, folio_node(cpu, addr, 0), FolioKind::Anon, zeroing)
    else {
        return oom(cpu);
    };
    let old_pfn = arch.pfn(old);
    if !zero {
        phys.arena.copy_frame(new, old_pfn);
        c.add(Ev::PagesCopied, 1);
    }
    let mut ptes = PteLock::lock(vmf.pt, c, vmf.table());
    if ptes.peek_raw(idx) != old {
        drop(ptes);
        phys.put_folio(c, new, 1);
        return FaultOutcome::Completed;
    }
    rmap::add_new_anon(
        phys,
        c,
        phys.memmap.folio(new),
        1,
        Level::Pte,
        anon_vma,
        mm.id,
    );
    phys.memmap
        .set_index(new, vma.pgoff_at(addr.page_align_down()));
    folio_add_lru_vma(cpu, cpu.m.phys.memmap.folio(new), vma);
    let mut entry = arch.mk_pte(new, vma.page_prot());
    entry = arch.mkwrite(arch.mkdirty(entry));
    // ptep_clear_flush, then install the copy.
    let (_, flush) = ptes.clear(idx, 1);
    flush.flushed(cpu.flush_tlb(mm, FlushScope::Page(addr.page_align_down())));
    ptes.set_ptes(idx, entry, 1);
    drop(ptes);
    if zero {
        mm.rss_add(RssKind::Anon, 1);
    } else {
        let head = phys.memmap.folio_of(old_pfn);
        if !phys.memmap.test(head, PageFlag::Anon) {
            // A page-cache page of a private file mapping gives way to an anon copy.
            mm.rss_add(mm_counter_file(vma), -1);
            mm.rss_add(RssKind::Anon, 1);
            c.add(Ev::FaultFileCow, 1);
        }
        rmap::remove_ptes(phys, c, phys.memmap.folio(head), old_pfn, 1, mm.id);
        munlock_vma_folio(cpu, cpu.m.phys.memmap.folio(head), vma);
        phys.put_folio(c, head, 1);
    }
    c.add(Ev::CowCopy, 1);
    FaultOutcome::Completed
}
