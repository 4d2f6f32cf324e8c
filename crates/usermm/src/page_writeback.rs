//! Writeback: dirty cache folios to the device, their mappings cleaned and write-protected.
//!
//! Linux counterparts: `mm/page-writeback.c` (`write_cache_pages`,
//! `folio_clear_dirty_for_io`) and `mm/rmap.c` (`folio_mkclean`, `page_mkclean_one`).
//! Writeback completes synchronously (PG_writeback set and cleared within one call).

use crate::filemap::cache::file_range_in;
use crate::filemap::{Inode, InodeKind, PAGE_SIZE};
use crate::machine::Cpu;
use crate::mm::Mm;
use crate::pgtable::cursor::{PmdKind, PteLock};
use crate::phys::{PageFlag, Pfn};
use crate::stats::Ev;
use crate::tlb::FlushScope;
use crate::vaddr::VirtAddr;
use crate::vma::VmFlags;

/// `write_cache_pages` over pages `first..last` of a disk file: each dirty page is cleaned
/// in every mapping (`folio_clear_dirty_for_io` → `folio_mkclean`: write-protected and
/// clean, so the next write faults and dirties it again), written to the device and left
/// clean and mapped to disk. One write I/O per run of consecutive pages.
pub(crate) fn writeback_range<'m>(cpu: &Cpu<'m>, inode: &Inode, first: u64, last: u64) {
    if inode.kind != InodeKind::Disk {
        return;
    }
    let mem = &cpu.m.phys.memmap;
    let dirty: Vec<(u64, Pfn)> = inode
        .pages
        .lock()
        .range(first..last)
        .filter(|&(_, p)| mem.test(p, PageFlag::Dirty))
        .collect();
    if dirty.is_empty() {
        return;
    }
    for &(idx, _) in &dirty {
        folio_mkclean(cpu, inode, idx);
    }
    let mut buf = vec![0u8; PAGE_SIZE as usize];
    let size = inode.size();
    let mut disk = inode.disk.lock();
    let mut prev = None;
    for &(idx, p) in &dirty {
        mem.set(p, PageFlag::Writeback);
        mem.clear(p, PageFlag::Dirty);
        if idx == size / PAGE_SIZE && !size.is_multiple_of(PAGE_SIZE) {
            // ext4 zeroes the part of the page past i_size in the cache at every
            // writeback (`ext4_bio_write_folio`): stores there through a mapping vanish.
            let tail = size % PAGE_SIZE;
            cpu.m
                .phys
                .arena
                .fill(p, tail as usize, (PAGE_SIZE - tail) as usize, 0);
        }
        cpu.m.phys.arena.read(p, 0, &mut buf);
        disk.write(idx, &buf);
        if prev.is_none_or(|q: u64| q + 1 != idx) {
            cpu.c().add(Ev::DiskWrites, 1);
        }
        prev = Some(idx);
        cpu.c().add(Ev::DiskWriteBytes, PAGE_SIZE);
        mem.set(p, PageFlag::MappedToDisk);
        mem.clear(p, PageFlag::Writeback);
    }
}

/// `folio_mkclean`: write-protects and cleans every shared mapping of file page `idx`,
/// folding the PTE's dirty bit into the folio first (the caller then clears it for I/O).
pub(crate) fn folio_mkclean<'m>(cpu: &Cpu<'m>, inode: &Inode, idx: u64) {
    for task in cpu.m.tasks() {
        let mm = &task.mm;
        let st = mm.lock.read_recursive();
        for id in st.vmas.all() {
            let vma = st.vmas.get(id);
            if !vma.flags.has(VmFlags::SHARED) {
                continue;
            }
            let Some((addr, _)) = file_range_in(vma, inode, idx, idx + 1) else {
                continue;
            };
            mkclean_one(cpu, mm, addr);
        }
    }
}

pub(crate) fn mkclean_one<'m>(cpu: &Cpu<'m>, mm: &Mm, addr: VirtAddr) {
    let pt = cpu.tables(mm);
    let arch = pt.arch;
    for step in pt.pmd_walk(addr, addr.add(PAGE_SIZE)) {
        let PmdKind::Table(table) = step.kind else {
            continue;
        };
        let mut ptes = PteLock::lock(pt, cpu.c(), table);
        let (i0, _) = step.pte_indexes();
        let e = ptes.get(i0);
        if e.is_none() || !arch.present(e) || !(arch.write(e) || arch.dirty(e)) {
            continue;
        }
        let flush = ptes.replace(i0, arch.mkclean(arch.wrprotect(e)));
        drop(ptes);
        flush.flushed(cpu.flush_tlb(mm, FlushScope::Page(addr)));
    }
}
