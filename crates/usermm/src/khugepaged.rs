//! `MADV_COLLAPSE`: PTE-mapped pages (or a range of a shmem file) become one PMD-mapped THP.
//!
//! Linux counterpart: `mm/khugepaged.c` (`madvise_collapse`, `hpage_collapse_scan_pmd`,
//! `collapse_huge_page`, `__collapse_huge_page_copy`, `madvise_collapse_errno`). For each
//! PMD-aligned 2 MiB block inside the advised range:
//!
//! - a block already PMD-mapped (a THP or the huge zero page) counts as collapsed;
//! - a block without a PTE table is `SCAN_PMD_NULL` (the call goes on, then fails `EINVAL`);
//! - otherwise every entry is scanned: empty entries and the zero page are allowed however
//!   many there are (MADV_COLLAPSE ignores `max_ptes_none`/`max_ptes_shared`), a page that is
//!   not anonymous is `EINVAL` at once, one with references beyond its mappings (a pin) is
//!   `SCAN_PAGE_COUNT` (`EAGAIN` in the end, the call goes on);
//! - then a new PMD-sized folio is allocated (`ENOMEM` at once if none), filled page by page
//!   (copies of the mapped pages, zeroes for empty entries and the zero page), the old entries
//!   cleared with their rmap, the emptied PTE table deposited for a later split, and the folio
//!   mapped by a dirty PMD, writable if the VMA is (`maybe_pmd_mkwrite(pmd_mkdirty)`); RSS
//!   becomes 512 pages. Old pages another process still maps (after fork) stay there.
//!
//! The VMA must allow a THP (not `VM_NOHUGEPAGE`, and hold a PMD-aligned 2 MiB block: else
//! `EINVAL` before anything is done; the sysfs `enabled` knobs do not matter for
//! MADV_COLLAPSE) and have an anon_vma (`hugepage_vma_revalidate`'s `SCAN_PAGE_ANON`: a range
//! only ever read has none, and fails `EINVAL`). All of this was probed on 6.18 (see the
//! `anon-selftest-khugepaged-*.scn` oracle files).
//!
//! Shared memory (tmpfs files, shared anonymous memory, and private mappings of them) goes
//! through `collapse_file` instead (`collapse_shmem`): the 512 file pages of the block
//! (holes included, even past the end of the file) are copied into a new PMD-sized page-cache
//! folio that replaces them; every mapping of the old pages, in every process, is unmapped;
//! `retract_page_tables` frees the emptied PTE tables of mappings without anonymous pages,
//! so later faults map the new folio with a PMD; and the caller's block is mapped by a PMD at
//! once (`collapse_pte_mapped_thp`). A tmpfs mounted huge=never still collapses (only
//! `deny` forbids). All probed on 6.18 (`files-selftest-khugepaged-collapse-shmem.scn`).
//!
//! A disk file is `EINVAL`: `file_thp_enabled` wants a regular file that nobody has open for
//! writing, and a scenario's files are open read-write (measured on 6.18 with an ext4 file).
//!
//! Deliberate differences: no khugepaged daemon (nothing collapses on its own); the
//! read-only-file collapse (`CONFIG_READ_ONLY_THP_FOR_FS`) is not modelled, since no
//! scenario can open a file read-only; the anonymous collapse runs
//! under the mmap write lock the caller holds (Linux drops to the read lock for the scan and
//! allocation, which no scenario can observe).

use crate::errno::{Errno, SysResult};
use crate::filemap::cache::{delete_from_page_cache, file_range_in};
use crate::filemap::Inode;
use crate::huge_memory::{add_new_pmd_folio, do_set_pmd};
use crate::machine::Cpu;
use crate::mlock::{folio_add_lru, munlock_folio, munlocks_at_unmap};
use crate::mm::{Mm, RssKind};
use crate::pgtable::cursor::{PmdKind, PmdLock, PteLock};
use crate::pgtable::PMD_SIZE;
use crate::phys::{FolioKind, PageFlag, Pfn, Zeroing, HPAGE_PMD_ORDER};
use crate::rmap;
use crate::stats::Ev;
use crate::tlb::{FlushScope, TlbFlushPending};
use crate::truncate::unmap_mapping_range;
use crate::vaddr::VirtAddr;
use crate::vm_fault::folio_node;
use crate::vma::{VmFlags, Vma};
use crate::zap::{free_empty_pte_table, GatherScope, MmuGather, ZapDetails};

/// `thp_vma_allowable_order(…, TVA_FORCED_COLLAPSE, PMD_ORDER)`: not VM_NOHUGEPAGE, and the
/// VMA holds a PMD-aligned 2 MiB block at its end (for a file, at an address congruent with
/// its file offset). The sysfs `enabled` policy does not matter to MADV_COLLAPSE.
/// The PMD-aligned 2 MiB blocks wholly inside `[start, end)`, by address.
fn pmd_blocks(start: VirtAddr, end: VirtAddr) -> impl Iterator<Item = VirtAddr> {
    (start.val().next_multiple_of(PMD_SIZE)..end.pmd_align_down().val())
        .step_by(PMD_SIZE as usize)
        .map(VirtAddr::new)
}

fn collapse_allowed(vma: &Vma) -> bool {
    if vma.flags.has(VmFlags::NOHUGEPAGE) || vma.end - vma.start < PMD_SIZE {
        return false;
    }
    let haddr = (vma.end - PMD_SIZE) & !(PMD_SIZE - 1);
    let congruent =
        vma.file.is_none() || ((vma.start >> 12).wrapping_sub(vma.pgoff)).is_multiple_of(512);
    haddr >= vma.start && congruent
}

/// What the scan or the collapse of one block came to (`enum scan_result`, the cases that
/// matter here).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scan {
    /// Collapsed now (`SCAN_SUCCEED`) or already PMD-mapped (`SCAN_PMD_MAPPED`).
    Collapsed,
    /// No PTE table (`SCAN_PMD_NULL`): go on, `EINVAL` in the end.
    NoTable,
    /// A page with extra references or off the LRU (`SCAN_PAGE_COUNT`, `SCAN_PAGE_LRU`): go
    /// on, `EAGAIN` in the end.
    Busy,
    /// Stop now with this errno (`SCAN_PAGE_ANON`, `SCAN_ADDRESS_RANGE`, allocation failure).
    Fail(Errno),
}

/// `madvise_collapse` over `[start, end)` of `vma` (one VMA; the caller holds the mmap
/// write lock).
///
/// # Errors
/// `EINVAL` (the VMA cannot have a THP, has no anon_vma, or a block had no page table),
/// `EAGAIN` (a page was pinned), `ENOMEM` (no folio for the THP).
pub(crate) fn madvise_collapse<'m>(
    cpu: &Cpu<'m>,
    mm: &Mm,
    vma: &Vma,
    start: VirtAddr,
    end: VirtAddr,
) -> SysResult<()> {
    if !collapse_allowed(vma) || !vma.is_anon_private() {
        return Err(Errno::EINVAL);
    }
    cpu.lru_add_drain_all();
    let mut last_fail = None;
    for haddr in pmd_blocks(start, end) {
        match collapse_block(cpu, mm, vma, haddr) {
            Scan::Collapsed => {}
            Scan::NoTable => last_fail = Some(Errno::EINVAL),
            Scan::Busy => last_fail = Some(Errno::EAGAIN),
            Scan::Fail(e) => return Err(e),
        }
    }
    last_fail.map_or(Ok(()), Err)
}

/// The blocks of `[start, end)` that MADV_COLLAPSE of shared memory works on, as (address,
/// file index); `EINVAL` if the VMA cannot have a PMD-sized folio at all. The collapse
/// itself ([`collapse_shmem`]) runs once the mmap lock is dropped.
pub(crate) fn shmem_collapse_blocks<'m>(
    cpu: &Cpu<'m>,
    vma: &Vma,
    start: VirtAddr,
    end: VirtAddr,
) -> SysResult<Vec<(VirtAddr, u64)>> {
    let deny = cpu.m.tunables().shmem.top == crate::tunables::ShmemHuge::Deny;
    if deny || !collapse_allowed(vma) || !vma.file.as_ref().is_some_and(|f| f.kind.is_shmem()) {
        return Err(Errno::EINVAL);
    }
    Ok(pmd_blocks(start, end)
        .map(|a| (a, vma.pgoff_at(a)))
        .collect())
}

/// `collapse_file` of the shmem block at file index `idx` (a multiple of 512), then
/// `collapse_pte_mapped_thp` for the caller's mapping of it at `haddr`.
///
/// # Context
/// No mmap lock held (the old pages are unmapped from every process).
///
/// # Errors
/// `EAGAIN` (a page is pinned or otherwise held), `ENOMEM` (no folio).
pub(crate) fn collapse_shmem<'m>(
    cpu: &Cpu<'m>,
    mm: &Mm,
    inode: &Inode,
    haddr: VirtAddr,
    idx: u64,
) -> SysResult<()> {
    let c = cpu.c();
    let phys = &cpu.m.phys;
    let mem = &phys.memmap;
    let nr = 1u64 << HPAGE_PMD_ORDER;
    let huge = |cache: &crate::filemap::xarray::XArray| {
        cache
            .get(idx)
            .is_some_and(|p| mem.order(mem.folio_of(p)) == HPAGE_PMD_ORDER)
    };
    cpu.lru_add_drain_all();
    if !huge(&inode.pages.lock()) {
        // `hpage_collapse_scan_file`'s `is_refcount_suitable`: the cache's references and
        // one per mapping, nothing more (a pin makes it EAGAIN before anything changes).
        let held = {
            let cache = inode.pages.lock();
            let mut heads: Vec<Pfn> = cache
                .range(idx..idx + nr)
                .map(|(_, p)| mem.folio_of(p))
                .collect();
            heads.dedup();
            heads
                .into_iter()
                .any(|h| mem.refcount(h) != (1 << mem.order(h)) + mem.folio_mapcount(h))
        };
        if held {
            return Err(Errno::EAGAIN);
        }
        // Every mapping of the old pages goes first, in every process.
        unmap_mapping_range(cpu, inode, idx, idx + nr, ZapDetails::FilePagesOnly);
        cpu.lru_add_drain_all();
        let mut cache = inode.pages.lock();
        let old: Vec<(u64, Pfn)> = cache.range(idx..idx + nr).collect();
        // Only the page cache may hold the old folios now (`SCAN_PAGE_COUNT`).
        let mut heads: Vec<Pfn> = old.iter().map(|&(_, p)| mem.folio_of(p)).collect();
        heads.dedup();
        if heads
            .iter()
            .any(|&h| mem.refcount(h) != 1 << mem.order(h) || mem.test(h, PageFlag::Mlocked))
        {
            return Err(Errno::EAGAIN);
        }
        let new = phys
            .alloc_folio(
                c,
                HPAGE_PMD_ORDER,
                cpu.id % phys.nr_nodes().max(1),
                FolioKind::Shmem,
                Zeroing::Zero,
            )
            .ok_or(Errno::ENOMEM)?;
        for &(i, p) in &old {
            phys.arena.copy_frame(new.add(i - idx), p);
        }
        for &(i, _) in &old {
            cache.remove(i);
        }
        for &(_, p) in &old {
            delete_from_page_cache(cpu, p);
        }
        crate::rmap::folio_ref_add(c, phys.memmap.folio(new), nr as i32 - 1);
        mem.set_mapping(new, inode.id);
        mem.set_index(new, idx);
        mem.set(new, PageFlag::Uptodate);
        mem.set(new, PageFlag::Dirty);
        for i in 0..nr {
            cache.insert(idx + i, new.add(i));
        }
        drop(cache);
        c.add(Ev::PageCacheAdd, 1);
        folio_add_lru(cpu, cpu.m.phys.memmap.folio(new));
        c.add(Ev::ThpCollapseAlloc, 1);
        retract_page_tables(cpu, inode, idx);
    }
    collapse_pte_mapped_thp(cpu, mm, inode, haddr, idx);
    Ok(())
}

/// `collapse_pte_mapped_thp(install_pmd)`: the caller's mapping of the block is mapped
/// by a PMD now, where its VMA covers the block and its PMD slot is empty (retracted, or
/// never populated), past the end of the file too (measured on 6.18: a 1 MiB file
/// collapsed through a 2 MiB mapping is PMD-mapped whole).
fn collapse_pte_mapped_thp<'m>(cpu: &Cpu<'m>, mm: &Mm, inode: &Inode, haddr: VirtAddr, idx: u64) {
    let c = cpu.c();
    let phys = &cpu.m.phys;
    c.add(Ev::LockMmap, 1);
    let st = mm.lock.read_recursive();
    let Some(id) = st.vmas.find(haddr.val()) else {
        return;
    };
    let vma = st.vmas.get(id);
    if file_range_in(vma, inode, idx, idx + 512) != Some((haddr, haddr.add(PMD_SIZE))) {
        return;
    }
    let Some(page) = inode.pages.lock().get(idx) else {
        return;
    };
    let head = phys.memmap.folio_of(page);
    if phys.memmap.order(head) != HPAGE_PMD_ORDER {
        return;
    }
    let pt = cpu.tables(mm);
    let Ok(pmd_table) = pt.alloc_pmd_table(c, &mm.page_table_lock, haddr) else {
        return;
    };
    let pmd_idx = haddr.pmd_index();
    rmap::folio_ref_add(c, phys.memmap.folio(head), 1);
    if !do_set_pmd(
        cpu,
        mm,
        vma,
        pmd_table,
        pmd_idx,
        head,
        crate::pgtable::Access::Read,
    ) {
        phys.put_folio(c, head, 1);
    }
}

/// `retract_page_tables`: in every process, a mapping of the block at file index `idx`
/// that covers its aligned 2 MiB and has no anonymous pages (no anon_vma) loses its now
/// empty PTE table, so that its next fault maps the new folio with a PMD.
fn retract_page_tables<'m>(cpu: &Cpu<'m>, inode: &Inode, idx: u64) {
    let c = cpu.c();
    for task in cpu.m.tasks() {
        let mm = &task.mm;
        c.add(Ev::LockMmap, 1);
        let st = mm.lock.read_recursive();
        let pt = cpu.tables(mm);
        let mut tlb = MmuGather::new(cpu, mm, GatherScope::Range);
        for id in st.vmas.all() {
            let vma = st.vmas.get(id);
            let Some((addr, end)) = file_range_in(vma, inode, idx, idx + 512) else {
                continue;
            };
            if vma.anon_vma().is_some()
                || !addr.is_pmd_aligned()
                || end.offset_from(addr) != PMD_SIZE
            {
                continue;
            }
            if let Some(step) = pt.pmd_walk(addr, end).next() {
                free_empty_pte_table(cpu, &mut tlb, mm, &step);
            }
        }
        tlb.finish();
    }
}

/// Scans the block at `haddr` and collapses it (`hpage_collapse_scan_pmd`, then
/// `collapse_huge_page`).
fn collapse_block<'m>(cpu: &Cpu<'m>, mm: &Mm, vma: &Vma, haddr: VirtAddr) -> Scan {
    if haddr < vma.vm_start() || haddr.add(PMD_SIZE) > vma.vm_end() {
        return Scan::Fail(Errno::EINVAL);
    }
    let c = cpu.c();
    let pt = cpu.tables(mm);
    let phys = &cpu.m.phys;
    let mem = &phys.memmap;
    let Some(step) = pt.pmd_walk(haddr, haddr.add(PMD_SIZE)).next() else {
        return Scan::NoTable;
    };
    let table = match step.kind {
        PmdKind::Huge(_) => return Scan::Collapsed,
        PmdKind::Table(t) => t,
    };
    // The scan: what each entry maps.
    let mut src = [None::<Pfn>; 512];
    {
        let ptes = PteLock::lock(pt, c, table);
        for (i, slot) in src.iter_mut().enumerate() {
            let e = ptes.get(i);
            if pt.arch.is_swap_pte(e) {
                // Deliberate difference: Linux swaps up to `max_ptes_swap` (64) pages in
                // first (`__collapse_huge_page_swapin`); the engine leaves a block with
                // swapped-out pages alone, as Linux does past that limit
                // (`SCAN_EXCEED_SWAP_PTE`).
                return Scan::Busy;
            }
            if e.is_none() || !pt.arch.present(e) {
                continue;
            }
            let pfn = pt.arch.pfn(e);
            if phys.is_zero_pfn(pfn) {
                continue;
            }
            let Some(head) = pt.vm_normal_folio(e) else {
                return Scan::Fail(Errno::EINVAL);
            };
            if !mem.test(head, PageFlag::Anon) {
                return Scan::Fail(Errno::EINVAL);
            }
            if !mem.test(head, PageFlag::Lru) || mem.refcount(head) != mem.folio_mapcount(head) {
                return Scan::Busy;
            }
            *slot = Some(pfn);
        }
    }
    let Some(anon_vma) = vma.anon_vma() else {
        return Scan::Fail(Errno::EINVAL);
    };
    let Some(head) = phys.alloc_folio(
        c,
        HPAGE_PMD_ORDER,
        folio_node(cpu, haddr, HPAGE_PMD_ORDER),
        FolioKind::Anon,
        Zeroing::NoZero,
    ) else {
        return Scan::Fail(Errno::ENOMEM);
    };
    // `__collapse_huge_page_copy`: every subpage is written.
    for (i, s) in src.iter().enumerate() {
        match s {
            Some(pfn) => phys.arena.copy_frame(head.add(i as u64), *pfn),
            None => phys.arena.zero_frame(head.add(i as u64)),
        }
    }
    let mut pmdl = PmdLock::lock(pt, c, step.table);
    let mut old = Vec::new();
    let mut flush = TlbFlushPending::none();
    let munlock = munlocks_at_unmap(cpu, vma);
    {
        let mut ptes = PteLock::lock(pt, c, table);
        for (i, s) in src.iter().enumerate() {
            if ptes.get(i).is_none() {
                continue;
            }
            flush.merge(ptes.clear(i, 1).1);
            if let Some(pfn) = *s {
                let folio = mem.folio_of(pfn);
                rmap::remove_ptes(phys, c, phys.memmap.folio(folio), pfn, 1, mm.id);
                if munlock {
                    // `munlock_vma_folio`.
                    munlock_folio(cpu, cpu.m.phys.memmap.folio(folio));
                }
                old.push(folio);
            }
        }
    }
    // The emptied table stays with the PMD mapping, for a later split
    // (`pgtable_trans_huge_deposit`).
    mm.deposited.deposit(&pmdl, haddr, table);
    add_new_pmd_folio(cpu, mm, vma, head, haddr, anon_vma);
    let arch = pt.arch;
    let mut entry = arch.mkdirty(arch.mk_pmd_leaf(head, vma.page_prot()));
    if vma.flags.has(VmFlags::WRITE) {
        entry = arch.mkwrite(entry);
    }
    flush.merge(pmdl.replace(step.idx, entry));
    drop(pmdl);
    mm.rss_add(RssKind::Anon, (1 << HPAGE_PMD_ORDER) - old.len() as i64);
    // `pmdp_collapse_flush`, then the old pages go.
    flush.flushed(cpu.flush_tlb(mm, FlushScope::Range(haddr, haddr.add(PMD_SIZE))));
    for folio in old {
        phys.put_folio(c, folio, 1);
    }
    c.add(Ev::ThpCollapseAlloc, 1);
    Scan::Collapsed
}
