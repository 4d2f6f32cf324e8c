//! tmpfs and shared anonymous memory: reads of holes, and the order of a new shmem folio.
//!
//! Linux counterpart: `mm/shmem.c` (`shmem_file_read_iter`, `shmem_allowable_huge_orders`,
//! `shmem_huge_global_enabled`, `shmem_get_folio_gfp`'s order choice). The file operations
//! shared with disk files are in [`crate::filemap::cache`].

use crate::filemap::cache::{cache_alloc, folio_mark_accessed};
use crate::filemap::xarray::XArray;
use crate::filemap::{Inode, InodeKind, PAGE_SIZE};
use crate::machine::Cpu;
use crate::phys::PageFlag;
use crate::vaddr::VirtAddr;
use crate::vma::{VmFlags, Vma};

/// `shmem_file_read_iter`: holes (and fallocated pages never written) read as zeroes
/// without creating pages; a page is marked accessed when the read starts at its
/// beginning.
pub(crate) fn shmem_read<'m>(cpu: &Cpu<'m>, inode: &Inode, offset: u64, end: u64, out: &mut [u8]) {
    let mut pos = offset;
    while pos < end {
        let idx = pos / PAGE_SIZE;
        let in_page = pos % PAGE_SIZE;
        let n = (PAGE_SIZE - in_page).min(end - pos);
        let dst = &mut out[(pos - offset) as usize..(pos - offset + n) as usize];
        let mem = &cpu.m.phys.memmap;
        // SGP_READ: a fallocated page not yet written (not uptodate) reads as a hole and
        // is not touched; a page out on swap is read back in first.
        let page = {
            let mut cache = inode.pages.lock();
            if cache.get(idx).is_none() && inode.swapped.lock().contains_key(&idx) {
                cache_alloc(cpu, inode, &mut cache, idx);
            }
            cache
                .get(idx)
                .filter(|&p| mem.test(mem.folio_of(p), PageFlag::Uptodate))
        };
        match page {
            Some(p) => {
                cpu.m.phys.arena.read(p, in_page as usize, dst);
                if in_page == 0 {
                    folio_mark_accessed(cpu, mem.folio_of(p));
                }
            }
            None => dst.fill(0),
        }
        pos += n;
    }
}

/// The folio order `write(2)` and `fallocate` allocate at page `idx` of a shmem file
/// (`shmem_allowable_huge_orders` without a VMA): a tmpfs mounted `huge=never` gets huge
/// folios only when the top level is `force`, then PMD-sized where no page of the aligned
/// range is cached yet. Measured on 6.18: a 4K pwrite under `force` caches 2 MiB.
///
/// `force` is [`shmem_force`], read once by the caller's loop.
pub(crate) fn shmem_nofault_order(inode: &Inode, idx: u64, cache: &XArray, force: bool) -> u32 {
    if inode.kind != InodeKind::Tmpfs || !force {
        return 0;
    }
    let order = crate::phys::HPAGE_PMD_ORDER;
    let first = idx & !((1u64 << order) - 1);
    if cache.range(first..first + (1 << order)).next().is_some() {
        return 0;
    }
    order
}

/// Whether the top-level `shmem_enabled` is `force` (a snapshot for page-by-page loops).
pub(crate) fn shmem_force<'m>(cpu: &Cpu<'m>) -> bool {
    cpu.m.tunables().shmem.top == crate::tunables::ShmemHuge::Force
}

/// The largest folio order a shmem fault at `addr` (page `pgoff`) may allocate: allowed
/// by `shmem_enabled` ([`crate::tunables::ShmemSettings::fault_orders`]), naturally
/// aligned inside the VMA with file and address congruent (`thp_vma_suitable_order`), and
/// with no page of the aligned range cached yet (`shmem_suitable_orders`).
pub(crate) fn shmem_fault_order<'m>(
    cpu: &Cpu<'m>,
    inode: &Inode,
    vma: &Vma,
    addr: VirtAddr,
    pgoff: u64,
    cache: &XArray,
) -> u32 {
    if vma.flags.has(VmFlags::NOHUGEPAGE) {
        return 0;
    }
    let mask = cpu.m.tunables().shmem.fault_orders(
        inode.kind == InodeKind::ShmemAnon,
        vma.flags.has(VmFlags::HUGEPAGE),
        pgoff,
        inode.size_pages(),
    );
    for order in (2..=crate::phys::HPAGE_PMD_ORDER).rev() {
        if mask & (1 << order) == 0 {
            continue;
        }
        let nr = 1u64 << order;
        let size = nr * PAGE_SIZE;
        let haddr = addr.align_down(size);
        let first = pgoff & !(nr - 1);
        let congruent = ((vma.start >> 12).wrapping_sub(vma.pgoff)).is_multiple_of(nr);
        if congruent
            && haddr >= vma.vm_start()
            && haddr.add(size) <= vma.vm_end()
            && cache.range(first..first + nr).next().is_none()
        {
            return order;
        }
    }
    0
}
