//! `fork`: duplicate the address space with copy-on-write.
//!
//! Linux counterparts: `mm/mmap.c` (`dup_mmap`), `mm/rmap.c` (`anon_vma_fork`),
//! `mm/memory.c` (`copy_page_range`, `copy_pte_range`, `copy_present_ptes`,
//! `copy_present_page`), `mm/huge_memory.c` (`copy_huge_pmd`), `lib/maple_tree.c`
//! (`__mt_dup`). The child's VMA tree is either duplicated node by node and its entries
//! replaced (seed 001, `vma_tree_dup=dup`) or built from scratch in the maple tree's bulk
//! mode, as Linux 6.1–6.5 did (the baseline, `vma_tree_dup=insert`). Page tables are copied one PTE at a time (the baseline,
//! `fork_pte_batch=per-pte`) or, for PTE-mapped large folios, one `folio_pte_batch` run at a
//! time (seed 000: one refcount add, one rmap dup, one `wrprotect_ptes`, one `set_ptes`). Each
//! present anon PTE takes one reference and one mapcount, the page loses PageAnonExclusive, and both
//! parent and child entries become read-only, so the first write on either side faults and
//! copies (or reuses). Pages of a maybe-pinned folio that are exclusive are copied for the
//! child at fork instead. The parent's TLB is flushed once at the end.

use crate::errno::{Errno, SysResult};
use crate::huge_memory::split_huge_pmd;
use crate::machine::Cpu;
use crate::mlock::folio_add_lru;
use crate::mm::{mm_counter_file, Mm, MmState, Pid, RssKind, Task};
use crate::ops::exit::teardown_mm;
use crate::ops::{vm_enough_memory, vm_unacct};
use crate::pgtable::batch::BatchFlags;
use crate::pgtable::cursor::{PmdKind, PmdLock, PmdStep, PteCopy, PteLock};
use crate::pgtable::{Arch, Pte};
use crate::phys::{FolioKind, Pfn, Zeroing, HPAGE_PMD_ORDER};
use crate::rmap::{self, AnonVmaId, Level};
use crate::rmap_walk::Held;
use crate::stats::Ev;
use crate::tlb::{FlushScope, TlbFlushPending};
use crate::tunables::{PteBatching, VmaTreeCopy};
use crate::vaddr::VirtAddr;
use crate::vma::{VmFlags, Vma};
use crate::vmscan::reclaim_for_held;
use std::cell::RefCell;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

/// The PTE tables one `copy_pte_range` copies between, locked, and what it copies for.
struct CopyPtes<'c, 'a> {
    ctx: &'c ForkCtx<'c>,
    vma: &'c Vma,
    tables: PteCopy<'a>,
}

/// The pair of mms a fork copies between.
struct ForkCtx<'a> {
    src: &'a Mm,
    dst: &'a Mm,
    needs_cow_for_dma: bool,
    skip_wrprotect: bool,
    batching: PteBatching,
    /// The flush the parent's write-protected entries owe: settled once, for the whole mm,
    /// when the copy ends (`dup_mmap`'s `flush_tlb_mm`).
    owed: RefCell<TlbFlushPending>,
}

impl ForkCtx<'_> {
    /// Adds a flush owed by a change to the parent's tables.
    #[inline]
    fn owe(&self, flush: TlbFlushPending) {
        self.owed.borrow_mut().merge(flush);
    }
}

impl<'m> Cpu<'m> {
    /// Forks process `pid`; returns the child's pid.
    ///
    /// # Errors
    /// `ENOMEM` if memory for the child's tables, VMAs or copied pages runs out; the child is
    /// then torn down completely and the parent is unchanged (apart from write-protected PTEs,
    /// as in Linux).
    pub fn fork(&self, pid: Pid) -> SysResult<Pid> {
        self.c().add(crate::stats::Ev::Syscall, 1);
        let parent = self.m.task(pid)?;
        let child_mm = Arc::new(self.new_mm()?);
        self.c().add(Ev::LockMmap, 2);
        let mut pst = parent.mm.lock.write();
        let res = {
            let mut cst = child_mm.lock.write();
            cst.start_brk = pst.start_brk;
            cst.brk = pst.brk;
            cst.mmap_base = pst.mmap_base;
            cst.def_flags = pst.def_flags & VmFlags::NOHUGEPAGE;
            let mut owed = TlbFlushPending::none();
            let r = dup_mmap(self, &parent.mm, &mut pst, &child_mm, &mut cst, &mut owed);
            owed.flushed(self.flush_tlb(&parent.mm, FlushScope::Mm));
            r
        };
        drop(pst);
        if let Err(e) = res {
            fork_failed(self, &child_mm);
            return Err(e);
        }
        let cpid = self.m.alloc_pid();
        self.m.insert_task(Arc::new(Task {
            pid: cpid,
            mm: child_mm,
            privilege: parent.privilege,
            rlimit_memlock: parent.rlimit_memlock,
        }));
        Ok(cpid)
    }
}

fn dup_mmap<'m>(
    cpu: &Cpu<'m>,
    src: &Mm,
    pst: &mut MmState,
    dst: &Mm,
    cst: &mut MmState,
    flush: &mut TlbFlushPending,
) -> SysResult<()> {
    let (skip_wrprotect, batching, mode) = {
        let t = cpu.m.tunables();
        (t.test_skip_fork_wrprotect, t.fork_pte_batch, t.vma_tree_dup)
    };
    let fail_nth = cpu.m.take_vma_tree_fail_point();
    cst.fork_charge = charge_child(cpu, pst)?;
    let ctx = ForkCtx {
        src,
        dst,
        needs_cow_for_dma: src.has_pinned.load(Relaxed),
        skip_wrprotect,
        batching,
        owed: RefCell::new(TlbFlushPending::none()),
    };
    let nodes_before = pst.vmas.tree.stats().allocated;
    let res = match mode {
        VmaTreeCopy::Insert => dup_tree_insert(cpu, pst, cst, fail_nth),
        VmaTreeCopy::Dup => dup_tree_structure(cpu, pst, cst, fail_nth),
    };
    // The child's tree allocates from the parent's node cache (shared counters); in the
    // insert baseline it has its own.
    let nodes = match mode {
        VmaTreeCopy::Dup => pst.vmas.tree.stats().allocated - nodes_before,
        VmaTreeCopy::Insert => cst.vmas.tree.stats().allocated,
    };
    cpu.c().add(Ev::VmaNodeAlloc, nodes);
    res?;
    cpu.c().add(Ev::VmaCopied, cst.vmas.count() as u64);
    // Reclaim during the copy sees both address spaces, as the rmap walk sees the child's
    // VMAs once `anon_vma_fork` linked them.
    let held = Held {
        mm: src,
        st: pst,
        also: Some((dst, cst)),
    };
    let mut copied = Ok(());
    for id in pst.vmas.all() {
        let vma = pst.vmas.get(id);
        let copy =
            !vma.flags.has(VmFlags::DONTCOPY | VmFlags::WIPEONFORK) && vma.anon_vma().is_some();
        if copy {
            copied = copy_page_range(cpu, &ctx, held, vma);
            if copied.is_err() {
                break;
            }
        }
    }
    // A failed copy owes the flush of what it write-protected as much as a finished one.
    flush.merge(ctx.owed.into_inner());
    copied
}

/// Undoes a failed fork: the child's VMAs uncharge themselves when torn down; the part of
/// the up-front charge for VMAs that were never created is returned here.
fn fork_failed<'m>(cpu: &Cpu<'m>, child: &Mm) {
    let (charged, created) = {
        let st = child.lock.read();
        let created: u64 = st
            .vmas
            .all()
            .into_iter()
            .map(|id| st.vmas.get(id))
            .filter(|v| v.flags.has(VmFlags::ACCOUNT))
            .map(|v| v.len() >> 12)
            .sum();
        (st.fork_charge, created)
    };
    vm_unacct(cpu, charged.saturating_sub(created));
    teardown_mm(cpu, child);
}

/// Charges the overcommit of every VMA the child will get.
fn charge_child<'m>(cpu: &Cpu<'m>, pst: &MmState) -> SysResult<u64> {
    let pages: u64 = pst
        .vmas
        .all()
        .into_iter()
        .map(|id| pst.vmas.get(id))
        .filter(|v| v.flags.has(VmFlags::ACCOUNT) && !v.flags.has(VmFlags::DONTCOPY))
        .map(|v| v.len() >> 12)
        .sum();
    vm_enough_memory(cpu, pages)?;
    Ok(pages)
}

/// The baseline (Linux 6.1–6.5 `dup_mmap`): build the child's tree from scratch in bulk
/// mode. `mas_expected_entries(map_count)` preallocates the nodes a tree of that many
/// entries (and a gap after each) needs, every copied VMA is then stored in address
/// order, appended to the rightmost leaf (leaves are kept full, not split evenly), and
/// `mas_destroy()` frees the unused preallocation (`VmaSet::bulk_from`,
/// `MapleTree::load_sorted_bulk`). The child's tree counts the preallocation as
/// allocated and the unused part as freed, so `allocated - freed` is its node count.
///
/// On ENOMEM no child VMA is left behind: those already made are dropped without
/// touching the overcommit accounting (none is in the child's tree, so `fork_failed`
/// returns the whole up-front charge).
fn dup_tree_insert<'m>(
    cpu: &Cpu<'m>,
    pst: &MmState,
    cst: &mut MmState,
    fail_nth: Option<u64>,
) -> SysResult<()> {
    cst.vmas.set_fail_point(fail_nth);
    let res = cst.vmas.bulk_from(&pst.vmas, |v| {
        (!v.flags.has(VmFlags::DONTCOPY)).then(|| dup_vma(cpu, v))
    });
    cst.vmas.set_fail_point(None);
    res.map_err(|_| Errno::ENOMEM)
}

/// Seed 001: copy the tree's structure, then swap each entry for the child's VMA.
fn dup_tree_structure<'m>(
    cpu: &Cpu<'m>,
    pst: &mut MmState,
    cst: &mut MmState,
    fail_nth: Option<u64>,
) -> SysResult<()> {
    pst.vmas.set_fail_point(fail_nth);
    let res = cst.vmas.dup_from(&pst.vmas, |v| {
        (!v.flags.has(VmFlags::DONTCOPY)).then(|| dup_vma(cpu, v))
    });
    pst.vmas.set_fail_point(None);
    res.map_err(|_| Errno::ENOMEM)
}

/// `vm_area_dup` + `anon_vma_fork`: the child's VMA, unlocked, with its own anon_vma
/// chained to the parent's (or none after `MADV_WIPEONFORK`).
fn dup_vma<'m>(cpu: &Cpu<'m>, vma: &Vma) -> Vma {
    let mut child = vma.clone();
    child.flags = VmFlags(child.flags.0 & !(VmFlags::LOCKED | VmFlags::LOCKONFAULT));
    if vma.flags.has(VmFlags::WIPEONFORK) {
        child.clear_anon_vma();
    } else if vma.anon_vma().is_some() {
        child.set_anon_vma(cpu.m.alloc_anon_vma(), vma.anon_vma_chain() + 1);
        cpu.c().add(Ev::AnonVmaFork, 1);
    }
    if let Some(s) = &child.file {
        s.get();
    }
    child
}

fn copy_page_range<'m>(
    cpu: &Cpu<'m>,
    ctx: &ForkCtx<'_>,
    held: Held<'_>,
    vma: &Vma,
) -> SysResult<()> {
    let spt = cpu.tables(ctx.src);
    for step in spt.pmd_walk(vma.vm_start(), vma.vm_end()) {
        // The child's tables come from a GFP_KERNEL allocation, which reclaims when memory
        // is short (the parent's own folios included: reclaim needs no mmap lock).
        reclaim_for_held(cpu, Some(held), 2);
        if let PmdKind::Huge(_) = step.kind {
            if copy_huge_pmd(cpu, ctx, vma, &step)? {
                continue;
            }
            // Split (maybe pinned): copy its PTEs below.
        }
        if let Some(table) = spt.pte_table_at(step.table, step.idx) {
            copy_pte_range(cpu, ctx, vma, table, &step)?;
        }
    }
    Ok(())
}

/// Copies one huge PMD; `Ok(false)` if it had to be split (maybe pinned) instead.
fn copy_huge_pmd<'m>(
    cpu: &Cpu<'m>,
    ctx: &ForkCtx<'_>,
    vma: &Vma,
    step: &PmdStep,
) -> SysResult<bool> {
    let c = cpu.c();
    let phys = &cpu.m.phys;
    let arch = cpu.m.arch;
    let spt = cpu.tables(ctx.src);
    let dpt = cpu.tables(ctx.dst);
    let (table, idx, haddr) = (step.table, step.idx, step.haddr());
    if spt
        .vm_normal_folio(spt.pmdp_get(table, idx))
        .is_some_and(|h| !phys.memmap.folio(h).is_anon())
    {
        // A page-cache folio: the child refaults it (`copy_huge_pmd` skips file VMAs).
        return Ok(true);
    }
    let dpmd = dpt
        .alloc_pmd_table(c, &ctx.dst.page_table_lock, haddr)
        .map_err(|_| Errno::ENOMEM)?;
    let deposit = phys
        .alloc_folio(c, 0, 0, FolioKind::Pgtable, Zeroing::Zero)
        .ok_or(Errno::ENOMEM)?;
    // The child's PMD lock, then the parent's, as `copy_huge_pmd`.
    let mut dst = PmdLock::lock(dpt, c, dpmd);
    let mut src = PmdLock::lock(spt, c, table);
    let pmd = src.get(idx);
    if let Some(pfn) = spt.vm_normal_folio(pmd) {
        c.add(Ev::PmdFolioVisit, 1);
        let needs = ctx.needs_cow_for_dma && vma.is_cow();
        if rmap::try_dup_anon_pmd(phys, c, phys.memmap.folio(pfn), needs, ctx.dst.id).is_err() {
            drop((src, dst));
            phys.put_folio(c, deposit, 1);
            split_huge_pmd(cpu, ctx.src, vma, table, idx, haddr);
            return Ok(false);
        }
        rmap::folio_ref_add(c, phys.memmap.folio(pfn), 1);
        ctx.dst.rss_add(RssKind::Anon, 1 << HPAGE_PMD_ORDER);
    }
    let mut e = pmd;
    if vma.is_cow() && arch.write(e) && !ctx.skip_wrprotect {
        ctx.owe(src.replace(idx, arch.wrprotect(e)));
    }
    if vma.is_cow() {
        e = arch.wrprotect(e);
    }
    dst.install(haddr.pmd_index(), arch.mkold(e));
    ctx.dst.deposited.deposit(&dst, haddr, deposit);
    Ok(true)
}

/// `copy_pte_range`: the part of `step` in source PTE table `src_t`, one folio run at a
/// time, with the child's table and then the parent's locked.
fn copy_pte_range<'m>(
    cpu: &Cpu<'m>,
    ctx: &ForkCtx<'_>,
    vma: &Vma,
    src_t: Pfn,
    step: &PmdStep,
) -> SysResult<()> {
    let c = cpu.c();
    let dpt = cpu.tables(ctx.dst);
    let dst_t = dpt
        .alloc_pte_table(c, &ctx.dst.page_table_lock, step.start)
        .map_err(|_| Errno::ENOMEM)?
        .ok_or(Errno::ENOMEM)?;
    let mut cp = CopyPtes {
        ctx,
        vma,
        tables: PteCopy::lock(cpu.tables(ctx.src), dpt, c, src_t, dst_t),
    };
    let (i0, iend) = step.pte_indexes();
    let mut rss = 0i64;
    let mut i = i0;
    while i < iend {
        let e = cp.tables.src.get(i);
        if e.is_none() {
            i += 1;
            continue;
        }
        if cp.tables.src.tables().arch.is_swap_pte(e) {
            copy_nonpresent_pte(cpu, &mut cp, i, e)?;
            i += 1;
            continue;
        }
        let at = step.start.add(((i - i0) as u64) * 4096);
        match copy_present_ptes(cpu, &mut cp, i, iend - i, e, at) {
            Ok((nr, added)) => {
                rss += added;
                i += nr;
            }
            Err(err) => {
                // Account what was already copied so the failed child tears down cleanly.
                ctx.dst
                    .rss_add(RssKind::Anon, copied_rss(&cp.tables.dst, i0, iend));
                return Err(err);
            }
        }
    }
    ctx.dst.rss_add(RssKind::Anon, rss);
    Ok(())
}

/// `copy_nonpresent_pte` for a swap entry: the slot gains the child's reference
/// (`swap_duplicate`), and a page that was exclusive is no longer: the flag is cleared in
/// the parent's entry too, so neither side reuses the page alone after swap-in.
fn copy_nonpresent_pte<'m>(
    cpu: &Cpu<'m>,
    cp: &mut CopyPtes<'_, '_>,
    i: usize,
    e: crate::pgtable::Pte,
) -> SysResult<()> {
    let arch = cpu.m.arch;
    let swap = cpu.m.swap.as_ref().ok_or(Errno::EIO)?;
    // A count at its limit is where Linux allocates a continuation page; failing that,
    // fork fails with ENOMEM.
    if !swap.duplicate(arch.swp_entry(e)) {
        return Err(Errno::ENOMEM);
    }
    let mut child = e;
    if arch.swp_exclusive(e) {
        child = arch.swp_clear_exclusive(e);
        // A swap entry: no TLB holds it.
        cp.tables.src.replace_no_flush(i, child);
    }
    cp.tables.dst.set_ptes(i, child, 1);
    cp.ctx.dst.rss_add(RssKind::Swap, 1);
    Ok(())
}

/// The anon RSS of the child's entries `[i0, iend)` after a failed copy.
fn copied_rss(dst: &PteLock<'_>, i0: usize, iend: usize) -> i64 {
    let pt = dst.tables();
    (i0..iend)
        .filter(|&i| {
            let e = dst.peek_raw(i);
            !e.is_none()
                && pt
                    .vm_normal_folio(e)
                    .is_some_and(|h| pt.phys.memmap.folio(h).is_anon())
        })
        .count() as i64
}

/// Copies the present entry at `i` and, when batching, the rest of its folio run
/// (`copy_present_ptes`). Returns (entries copied, anon RSS added to the child).
fn copy_present_ptes<'m>(
    cpu: &Cpu<'m>,
    cp: &mut CopyPtes<'_, '_>,
    i: usize,
    max_nr: usize,
    e: Pte,
    addr: VirtAddr,
) -> SysResult<(usize, i64)> {
    let c = cpu.c();
    let phys = &cpu.m.phys;
    let arch = cpu.m.arch;
    let vma = cp.vma;
    let flags = BatchFlags {
        respect_dirty: !vma.flags.has(VmFlags::SHARED),
        respect_soft_dirty: arch == Arch::X86_64 && !vma.flags.has(VmFlags::SOFTDIRTY),
        merge_write: true,
        ..BatchFlags::default()
    };
    let run = cp.tables.src.run(i, e, max_nr, cp.ctx.batching, flags);
    if let Some(head) = run.folio.filter(|&h| !phys.memmap.folio(h).is_anon()) {
        // A page-cache folio of a private file mapping that has anon pages too
        // (`folio_dup_file_rmap_ptes`): one more mapping of the same pages.
        let nr = run.nr as u64;
        rmap::folio_ref_add(c, phys.memmap.folio(head), nr as i32);
        rmap::add_ptes(phys, c, phys.memmap.folio(head), run.pfn, nr, cp.ctx.dst.id);
        c.add(Ev::ForkBatches, 1);
        if run.batched {
            c.add(Ev::ForkBatchesLarge, 1);
        }
        c.add(Ev::ForkPtes, nr);
        cp.ctx.dst.rss_add(mm_counter_file(vma), nr as i64);
        let first = if run.any_writable { arch.mkwrite(e) } else { e };
        write_copied_ptes(cpu, cp, i, first, run.nr);
        return Ok((run.nr, 0));
    }
    let (Some(head), true) = (run.folio, run.batched) else {
        return Ok((1, copy_present_pte(cpu, cp, i, e, addr)?));
    };
    let nr = run.nr as u64;
    rmap::folio_ref_add(c, phys.memmap.folio(head), nr as i32);
    let needs = cp.ctx.needs_cow_for_dma && vma.is_cow();
    if rmap::try_dup_anon_ptes(
        phys,
        c,
        phys.memmap.folio(head),
        run.pfn,
        nr,
        needs,
        cp.ctx.dst.id,
    )
    .is_err()
    {
        // A maybe-pinned folio with exclusive pages: Linux retries page by page, copying
        // the exclusive ones; the result is the same as the per-PTE path.
        rmap::folio_ref_add(c, phys.memmap.folio(head), -(nr as i32));
        let mut rss = 0;
        for j in 0..run.nr {
            let ej = cp.tables.src.peek(i + j);
            rss += copy_present_pte(cpu, cp, i + j, ej, addr.add(j as u64 * 4096))?;
        }
        return Ok((run.nr, rss));
    }
    c.add(Ev::ForkBatches, 1);
    c.add(Ev::ForkBatchesLarge, 1);
    c.add(Ev::ForkPtes, nr);
    let first = if run.any_writable { arch.mkwrite(e) } else { e };
    write_copied_ptes(cpu, cp, i, first, run.nr);
    Ok((run.nr, nr as i64))
}

/// `__copy_present_ptes`: write-protects `nr` parent entries of a COW mapping and writes the
/// child's entries (old, clean for shared mappings, without uffd-wp), `e` first.
fn write_copied_ptes<'m>(cpu: &Cpu<'m>, cp: &mut CopyPtes<'_, '_>, i: usize, e: Pte, nr: usize) {
    let arch = cpu.m.arch;
    let vma = cp.vma;
    let mut child = e;
    let mut wrprotect_parent = false;
    if vma.is_cow() && arch.write(child) {
        wrprotect_parent = !cp.ctx.skip_wrprotect;
        child = arch.wrprotect(child);
    }
    if vma.flags.has(VmFlags::SHARED) {
        child = arch.mkclean(child);
    }
    child = arch.clear_uffd_wp(arch.mkold(child));
    cp.ctx
        .owe(cp.tables.copy_run(i, child, nr, wrprotect_parent));
}

/// Copies one present PTE (the per-PTE path); returns the anon RSS it adds to the child.
fn copy_present_pte<'m>(
    cpu: &Cpu<'m>,
    cp: &mut CopyPtes<'_, '_>,
    i: usize,
    e: Pte,
    addr: VirtAddr,
) -> SysResult<i64> {
    let c = cpu.c();
    let phys = &cpu.m.phys;
    let arch = cpu.m.arch;
    let pfn = arch.pfn(e);
    let mut rss = 0;
    c.add(Ev::ForkPtes, 1);
    if let Some(head) = cp.tables.src.tables().vm_normal_folio(e) {
        rmap::folio_ref_add(c, phys.memmap.folio(head), 1);
        c.add(Ev::ForkBatches, 1);
        let needs = cp.ctx.needs_cow_for_dma && cp.vma.is_cow();
        if rmap::try_dup_anon_ptes(
            phys,
            c,
            phys.memmap.folio(head),
            pfn,
            1,
            needs,
            cp.ctx.dst.id,
        )
        .is_err()
        {
            rmap::folio_ref_add(c, phys.memmap.folio(head), -1);
            let copy = copy_present_page(cpu, cp.ctx.dst, cp.vma, pfn, addr)?;
            cp.tables.dst.set_ptes(i, copy, 1);
            return Ok(1);
        }
        rss = 1;
    }
    write_copied_ptes(cpu, cp, i, e, 1);
    Ok(rss)
}

/// The child's private copy of a maybe-pinned exclusive page (`copy_present_page`).
fn copy_present_page<'m>(
    cpu: &Cpu<'m>,
    dst: &Mm,
    vma: &Vma,
    pfn: Pfn,
    addr: VirtAddr,
) -> SysResult<Pte> {
    let c = cpu.c();
    let phys = &cpu.m.phys;
    let arch = cpu.m.arch;
    let new = phys
        .alloc_folio(c, 0, 0, FolioKind::Anon, Zeroing::NoZero)
        .ok_or(Errno::ENOMEM)?;
    phys.arena.copy_frame(new, pfn);
    c.add(Ev::PagesCopied, 1);
    c.add(Ev::ForkPinnedCopies, 1);
    // The copy records the source folio's anon_vma (a mapped anon folio always has one).
    let anon_vma = AnonVmaId::of_mapping_word(phys.memmap.mapping(phys.memmap.folio_of(pfn)))
        .expect("a mapped anonymous folio names its anon_vma");
    rmap::add_new_anon(
        phys,
        c,
        phys.memmap.folio(new),
        1,
        Level::Pte,
        anon_vma,
        dst.id,
    );
    phys.memmap.set_index(new, vma.pgoff_at(addr));
    folio_add_lru(cpu, cpu.m.phys.memmap.folio(new));
    let mut e = arch.mkdirty(arch.mk_pte(new, vma.page_prot()));
    if vma.flags.has(VmFlags::WRITE) {
        e = arch.mkwrite(e);
    }
    Ok(e)
}
