//! `MADV_COLLAPSE` of private anonymous memory: PTE-mapped pages become one PMD-mapped THP.
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
//! The VMA must allow a THP (not `VM_NOHUGEPAGE`; the sysfs `enabled` knobs do not matter for
//! MADV_COLLAPSE) and have an anon_vma (`hugepage_vma_revalidate`'s `SCAN_PAGE_ANON`: a range
//! only ever read has none, and fails `EINVAL`). All of this was probed on 6.18 (see the
//! `anon-madv-collapse*.scn` oracle files).
//!
//! Deliberate differences: no khugepaged daemon (nothing collapses on its own); file and shmem
//! collapse (`collapse_file`) are not modelled: the scenario layer reports them as not
//! implemented rather than guessing; the whole collapse runs under the mmap write lock the
//! caller holds (Linux drops to the read lock for the scan and allocation, which no scenario
//! can observe).

use crate::errno::{Errno, SysResult};
use crate::machine::Cpu;
use crate::mm::{Mm, RssKind};
use crate::pgtable::cursor::{PmdKind, PmdLock, PteLock};
use crate::pgtable::PMD_SIZE;
use crate::phys::{FolioKind, PageFlag, Zeroing, HPAGE_PMD_ORDER};
use crate::rmap;
use crate::stats::Ev;
use crate::tlb::FlushScope;
use crate::vma::{VmFlags, Vma};

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

impl<'m> Cpu<'m> {
    /// `madvise_collapse` over `[start, end)` of `vma` (one VMA; the caller holds the mmap
    /// write lock).
    ///
    /// # Errors
    /// `EINVAL` (the VMA cannot have a THP, has no anon_vma, or a block had no page table),
    /// `EAGAIN` (a page was pinned), `ENOMEM` (no folio for the THP).
    pub(crate) fn madvise_collapse(
        &self,
        mm: &Mm,
        vma: &Vma,
        start: u64,
        end: u64,
    ) -> SysResult<()> {
        if vma.flags.has(VmFlags::NOHUGEPAGE) || !vma.is_anon_private() {
            return Err(Errno::EINVAL);
        }
        self.lru_add_drain_all();
        let hstart = start.next_multiple_of(PMD_SIZE);
        let hend = end & !(PMD_SIZE - 1);
        let mut last_fail = None;
        let mut haddr = hstart;
        while haddr < hend {
            match self.collapse_block(mm, vma, haddr) {
                Scan::Collapsed => {}
                Scan::NoTable => last_fail = Some(Errno::EINVAL),
                Scan::Busy => last_fail = Some(Errno::EAGAIN),
                Scan::Fail(e) => return Err(e),
            }
            haddr += PMD_SIZE;
        }
        last_fail.map_or(Ok(()), Err)
    }

    /// Scans the block at `haddr` and collapses it (`hpage_collapse_scan_pmd`, then
    /// `collapse_huge_page`).
    fn collapse_block(&self, mm: &Mm, vma: &Vma, haddr: u64) -> Scan {
        if haddr < vma.start || haddr + PMD_SIZE > vma.end {
            return Scan::Fail(Errno::EINVAL);
        }
        let c = self.c();
        let pt = self.tables(mm);
        let phys = &self.m.phys;
        let mem = &phys.memmap;
        let Some(step) = pt.pmd_walk(haddr, haddr + PMD_SIZE).next() else {
            return Scan::NoTable;
        };
        let table = match step.kind {
            PmdKind::Huge(_) => return Scan::Collapsed,
            PmdKind::Table(t) => t,
        };
        // The scan: what each entry maps.
        let mut src = [None::<u64>; 512];
        {
            let ptes = PteLock::lock(pt, c, table);
            for (i, slot) in src.iter_mut().enumerate() {
                let e = ptes.get(i);
                if e == 0 || !pt.arch.present(e) {
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
                if !mem.test(head, PageFlag::Lru) || mem.refcount(head) != mem.folio_mapcount(head)
                {
                    return Scan::Busy;
                }
                *slot = Some(pfn);
            }
        }
        if vma.anon_vma() == 0 {
            return Scan::Fail(Errno::EINVAL);
        }
        let Some(head) = phys.alloc_folio(
            c,
            HPAGE_PMD_ORDER,
            self.folio_node(haddr, HPAGE_PMD_ORDER),
            FolioKind::Anon,
            Zeroing::NoZero,
        ) else {
            return Scan::Fail(Errno::ENOMEM);
        };
        // `__collapse_huge_page_copy`: every subpage is written.
        for (i, s) in src.iter().enumerate() {
            match s {
                Some(pfn) => phys.arena.copy_frame(head + i as u64, *pfn),
                None => phys.arena.zero_frame(head + i as u64),
            }
        }
        let mut pmdl = PmdLock::lock(pt, c, step.table);
        let mut old = Vec::new();
        {
            let mut ptes = PteLock::lock(pt, c, table);
            for (i, s) in src.iter().enumerate() {
                if ptes.get(i) == 0 {
                    continue;
                }
                let _ = ptes.clear(i, 1);
                if let Some(pfn) = *s {
                    let folio = mem.folio_of(pfn);
                    rmap::remove_ptes(phys, c, folio, pfn, 1, mm.id);
                    self.munlock_vma_folio(folio, vma);
                    old.push(folio);
                }
            }
        }
        // The emptied table stays with the PMD mapping, for a later split
        // (`pgtable_trans_huge_deposit`).
        self.deposit_table(mm, haddr, table);
        self.add_new_pmd_folio(mm, vma, head, haddr, vma.anon_vma() as u32);
        let arch = pt.arch;
        let mut entry = arch.mkdirty(arch.mk_pte(head, vma.page_prot(), true));
        if vma.flags.has(VmFlags::WRITE) {
            entry = arch.mkwrite(entry);
        }
        pmdl.replace(step.idx, entry);
        drop(pmdl);
        mm.rss_add(RssKind::Anon, (1 << HPAGE_PMD_ORDER) - old.len() as i64);
        // `pmdp_collapse_flush`, then the old pages go.
        self.flush_tlb(mm, FlushScope::Range(haddr, haddr + PMD_SIZE));
        for folio in old {
            phys.put_folio(c, folio, 1);
        }
        c.add(Ev::ThpCollapseAlloc, 1);
        Scan::Collapsed
    }
}
