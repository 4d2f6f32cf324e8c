//! The PMD-level faults of `mm/huge_memory.c`: a PMD-sized anonymous THP or the huge zero
//! page on a first touch (`do_huge_pmd_anonymous_page`, `set_huge_zero_folio`), a write to a
//! read-only huge PMD (`do_huge_pmd_wp_page`: reuse, or split and fall back to PTEs), and a
//! PMD-sized shmem folio mapped whole (`finish_fault`'s PMD case). [`crate::fault`]'s
//! `handle_mm_fault` calls them when the PMD is empty or a huge leaf; the THP primitives
//! they build on (the deposit, `do_set_pmd`, `split_huge_pmd`) are [`super`]'s.

use crate::filemap::io::filemap_fault;
use crate::huge_memory::{add_new_pmd_folio, alloc_deposit, do_set_pmd, split_huge_pmd};
use crate::machine::Cpu;
use crate::mm::RssKind;
use crate::pgtable::cursor::PmdLock;
use crate::pgtable::{Access, Pmd, PMD_SIZE};
use crate::phys::{FolioKind, PageFlag, Zeroing, HPAGE_PMD_ORDER};
use crate::stats::Ev;
use crate::tlb::FlushScope;
use crate::vaddr::VirtAddr;
use crate::vm_fault::{anon_vma_prepare, count_file_fault, folio_node, FaultCtx, FaultOutcome};
use crate::vma::{VmFlags, Vma};

/// Whether a fault at `addr` may map a PMD-sized shmem folio with a PMD (`do_set_pmd`'s
/// `thp_vma_suitable_order`): a shmem VMA covering the aligned 2 MiB, with file and
/// address congruent. A write to a private mapping copies a page instead (`do_cow_fault`).
pub(crate) fn shmem_pmd_suitable(vma: &Vma, addr: VirtAddr, access: Access) -> bool {
    let haddr = addr.pmd_align_down();
    (vma.flags.has(VmFlags::SHARED) || access == Access::Read)
        && !vma.flags.has(VmFlags::NOHUGEPAGE)
        && vma.file.as_ref().is_some_and(|f| f.kind.is_shmem())
        && haddr >= vma.vm_start()
        && haddr.add(PMD_SIZE) <= vma.vm_end()
        && ((vma.start >> 12).wrapping_sub(vma.pgoff)).is_multiple_of(1 << HPAGE_PMD_ORDER)
}

/// A fault on an empty PMD of a shared shmem mapping: when the page it needs is (or
/// becomes) part of a PMD-sized folio, map that folio with one PMD (`do_set_pmd`, reached
/// from `finish_fault` or from fault-around's `filemap_map_pmd`). `None`: map with PTEs.
pub(crate) fn do_shmem_pmd_fault<'m>(
    cpu: &Cpu<'m>,
    vmf: &FaultCtx<'_, 'm>,
) -> Option<FaultOutcome> {
    let (mm, vma, pmd_table, pmd_idx, addr, access) = (
        vmf.mm,
        vmf.vma,
        vmf.pmd_table,
        vmf.pmd_idx,
        vmf.addr,
        vmf.access,
    );
    let c = cpu.c();
    let phys = &cpu.m.phys;
    let inode = vma.file.clone()?;
    // A shmem object: no readahead, no I/O, so never a retry.
    let at = crate::vm_fault::FaultAttempt::first(vmf.src);
    let (page, lookup) = match filemap_fault(cpu, &inode, vma, addr, vmf.pgoff, at) {
        Ok(r) => (r.pfn, r.lookup),
        Err(o) => return Some(o),
    };
    let head = phys.memmap.folio_of(page);
    // Even a folio reaching past the end of the file is PMD-mapped: shmem is exempt from
    // the end-of-file rule (`Inode::may_map_whole`).
    if phys.memmap.order(head) != HPAGE_PMD_ORDER {
        // Mapped with PTEs by the normal path, which finds the page in the cache.
        phys.put_folio(c, head, 1);
        return None;
    }
    if !do_set_pmd(cpu, mm, vma, pmd_table, pmd_idx, head, access) {
        phys.put_folio(c, head, 1);
        return Some(FaultOutcome::Completed);
    }
    count_file_fault(cpu, &inode, lookup);
    Some(FaultOutcome::Completed)
}

/// A first touch of an empty PMD in a VMA where a PMD-sized THP may go
/// (`do_huge_pmd_anonymous_page`): the huge zero page for a read (with `use_zero_page`), else
/// a new THP mapped by one PMD, with a page table deposited for a later split. `None`: no
/// memory for it, fall back to PTEs.
pub(crate) fn do_huge_pmd_anonymous_page<'m>(
    cpu: &Cpu<'m>,
    vmf: &FaultCtx<'_, 'm>,
) -> Option<FaultOutcome> {
    let (mm, vma, pmd_table, pmd_idx, addr, access) = (
        vmf.mm,
        vmf.vma,
        vmf.pmd_table,
        vmf.pmd_idx,
        vmf.addr,
        vmf.access,
    );
    let c = cpu.c();
    let phys = &cpu.m.phys;
    let arch = cpu.m.arch;
    let haddr = addr.pmd_align_down();
    let pt = vmf.pt;
    let use_zero = vmf.tun.thp.use_zero_page;
    // The anon_vma comes first, even for the huge zero page (6.18: after a huge-zero read
    // fault and a fork, the child's VMA is an anon_vma child and no longer merges).
    let anon_vma = anon_vma_prepare(cpu, mm, vma);
    if access == Access::Read && use_zero {
        let hz = phys.huge_zero_pfn()?;
        let deposit = alloc_deposit(cpu)?;
        let entry = arch.mkspecial(arch.mk_pmd_leaf(hz, vma.page_prot()));
        let mut pmdl = PmdLock::lock(pt, c, pmd_table);
        if !pmdl.get(pmd_idx).is_none() {
            drop(pmdl);
            phys.put_folio(c, deposit, 1);
            return Some(FaultOutcome::Completed);
        }
        mm.deposited.deposit(&pmdl, haddr, deposit);
        pmdl.install(pmd_idx, entry);
        c.add(Ev::FaultZeroPage, 1);
        return Some(FaultOutcome::Completed);
    }
    let head = phys.alloc_folio(
        c,
        HPAGE_PMD_ORDER,
        folio_node(cpu, haddr, HPAGE_PMD_ORDER),
        FolioKind::Anon,
        Zeroing::Zero,
    )?;
    let Some(deposit) = alloc_deposit(cpu) else {
        phys.put_folio(c, head, 1);
        return None;
    };
    let mut pmdl = PmdLock::lock(pt, c, pmd_table);
    if !pmdl.get(pmd_idx).is_none() {
        drop(pmdl);
        phys.put_folio(c, head, 1);
        phys.put_folio(c, deposit, 1);
        return Some(FaultOutcome::Completed);
    }
    mm.deposited.deposit(&pmdl, haddr, deposit);
    add_new_pmd_folio(cpu, mm, vma, head, haddr, anon_vma);
    let mut entry = arch.mk_pmd_leaf(head, vma.page_prot());
    if vma.flags.has(VmFlags::WRITE) {
        entry = arch.mkwrite(arch.mkdirty(entry));
    }
    pmdl.install(pmd_idx, entry);
    c.add(Ev::FaultAnonPmd, 1);
    mm.rss_add(RssKind::Anon, 1 << HPAGE_PMD_ORDER);
    Some(FaultOutcome::Completed)
}

/// Write fault on a read-only huge PMD: reuse when exclusive, replace the huge zero page
/// with a new THP, otherwise split and let the PTE path copy one page.
pub(crate) fn do_huge_pmd_wp_page<'m>(
    cpu: &Cpu<'m>,
    vmf: &FaultCtx<'_, 'm>,
) -> Option<FaultOutcome> {
    let (mm, vma, pmd_table, pmd_idx, addr) =
        (vmf.mm, vmf.vma, vmf.pmd_table, vmf.pmd_idx, vmf.addr);
    let c = cpu.c();
    c.add(Ev::FaultWp, 1);
    let phys = &cpu.m.phys;
    let arch = cpu.m.arch;
    let pt = vmf.pt;
    let haddr = addr.pmd_align_down();
    let mut pmdl = PmdLock::lock(pt, c, pmd_table);
    let pmd = pmdl.get(pmd_idx);
    if !arch.is_pmd_leaf(pmd) || arch.write(pmd) {
        return Some(FaultOutcome::Completed);
    }
    let pfn = arch.pfn(pmd);
    if phys.is_zero_pfn(pfn) {
        drop(pmdl);
        return huge_zero_wp(cpu, vmf, haddr, pmd);
    }
    let mem = &phys.memmap;
    if !mem.test(pfn, PageFlag::Anon) {
        // A page-cache folio (`wp_huge_pmd` for file VMAs): drop the PMD and let the
        // write fault again on PTEs (a shared mapping dirties the page, a private one
        // copies it).
        drop(pmdl);
        split_huge_pmd(cpu, mm, vma, pmd_table, pmd_idx, haddr);
        return None;
    }
    if mem.test(pfn, PageFlag::AnonExclusive) || mem.refcount(pfn) == 1 {
        mem.set(pfn, PageFlag::AnonExclusive);
        pmdl.replace_no_flush(pmd_idx, arch.mkyoung(arch.mkdirty(arch.mkwrite(pmd))));
        c.add(Ev::CowReuse, 1);
        return Some(FaultOutcome::Completed);
    }
    drop(pmdl);
    split_huge_pmd(cpu, mm, vma, pmd_table, pmd_idx, haddr);
    None
}

/// A write to the huge zero page mapped at `haddr` by the PMD `old`: a new zeroed THP
/// replaces it, break before make (`do_huge_zero_wp_pmd`); without memory, the PMD is split
/// and the PTE path copies one page.
fn huge_zero_wp<'m>(
    cpu: &Cpu<'m>,
    vmf: &FaultCtx<'_, 'm>,
    haddr: VirtAddr,
    old: Pmd,
) -> Option<FaultOutcome> {
    let (mm, vma, pmd_table, pmd_idx) = (vmf.mm, vmf.vma, vmf.pmd_table, vmf.pmd_idx);
    let c = cpu.c();
    let phys = &cpu.m.phys;
    let arch = cpu.m.arch;
    let pt = vmf.pt;
    let anon_vma = anon_vma_prepare(cpu, mm, vma);
    let Some(head) = phys.alloc_folio(
        c,
        HPAGE_PMD_ORDER,
        folio_node(cpu, haddr, HPAGE_PMD_ORDER),
        FolioKind::Anon,
        Zeroing::Zero,
    ) else {
        split_huge_pmd(cpu, mm, vma, pmd_table, pmd_idx, haddr);
        return None;
    };
    let mut pmdl = PmdLock::lock(pt, c, pmd_table);
    if pmdl.get(pmd_idx) != old {
        drop(pmdl);
        phys.put_folio(c, head, 1);
        return Some(FaultOutcome::Completed);
    }
    add_new_pmd_folio(cpu, mm, vma, head, haddr, anon_vma);
    let entry = arch.mkwrite(arch.mkdirty(arch.mk_pmd_leaf(head, vma.page_prot())));
    // Break before make: the huge zero page leaves every TLB before the THP appears.
    let (_, flush) = pmdl.clear(pmd_idx);
    flush.flushed(cpu.flush_tlb(mm, FlushScope::Range(haddr, haddr.add(PMD_SIZE))));
    pmdl.install(pmd_idx, entry);
    c.add(Ev::FaultAnonPmd, 1);
    mm.rss_add(RssKind::Anon, 1 << HPAGE_PMD_ORDER);
    Some(FaultOutcome::Completed)
}
