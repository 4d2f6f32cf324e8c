//! What every fault handler shares: the fault's context ([`FaultCtx`], Linux's
//! `struct vm_fault`), its outcome ([`FaultOutcome`], `vm_fault_t`), and the helpers both
//! `mm/memory.c` ([`crate::fault`]) and `mm/huge_memory.c` ([`crate::huge_memory::fault`])
//! call: preparing the VMA's anon_vma (`__anon_vma_prepare`, `mm/rmap.c`), the node a new
//! folio comes from (the task's mempolicy, `mm/mempolicy.c`) and counting a file fault.
//!
//! Low in the map: the PTE-level and PMD-level handlers import it, it imports neither.

use crate::filemap::{CacheLookup, Inode, InodeKind};
use crate::machine::Cpu;
use crate::mm::Mm;
use crate::pgtable::{Access, PageTables};
use crate::phys::Pfn;
use crate::stats::Ev;
use crate::vaddr::VirtAddr;
use crate::vma::Vma;

/// Result of a fault (`vm_fault_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FaultOutcome {
    /// The access can be retried and will succeed.
    Completed,
    /// No VMA, or the VMA forbids the access.
    Sigsegv,
    /// Memory could not be allocated (the engine's policy: SIGBUS, see README).
    Oom,
    /// The access is beyond the backing object (`VM_FAULT_SIGBUS`).
    Sigbus,
}

/// One PTE-level fault (Linux's `struct vm_fault`): where it happened and what it asked.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FaultCtx<'a, 'm> {
    pub(crate) mm: &'a Mm,
    pub(crate) vma: &'a Vma,
    pub(crate) pt: PageTables<'m>,
    /// The PTE table covering `addr`.
    pub(crate) table: Pfn,
    /// The faulting address (`vmf->real_address`: not rounded to its page).
    pub(crate) addr: VirtAddr,
    pub(crate) access: Access,
}

/// Gives `vma` an anon_vma if it has none (`__anon_vma_prepare`): a new one. A compatible
/// neighbour's (`find_mergeable_anon_vma`) was already taken by `handle_mm_fault`, which
/// has the VMA tree at hand.
pub(crate) fn anon_vma_prepare<'m>(cpu: &Cpu<'m>, mm: &Mm, st_vma: &Vma) -> u64 {
    if st_vma.anon_vma() != 0 {
        return st_vma.anon_vma();
    }
    cpu.c().add(Ev::LockPageTable, 1);
    let _g = mm.page_table_lock.lock();
    if st_vma.anon_vma() == 0 {
        st_vma.set_anon_vma(cpu.m.alloc_anon_vma(), 1);
    }
    st_vma.anon_vma()
}

pub(crate) fn count_file_fault<'m>(cpu: &Cpu<'m>, inode: &Inode, lookup: CacheLookup) {
    let c = cpu.c();
    if inode.kind == InodeKind::ShmemAnon {
        c.add(Ev::FaultShared, 1);
    } else {
        c.add(Ev::FaultFile, 1);
        if lookup == CacheLookup::Miss && inode.kind == InodeKind::Disk {
            c.add(Ev::FaultFileMajor, 1);
        }
    }
}

/// The node a new folio for `addr` comes from: the CPU's node, or with the interleave
/// policy the node chosen by the folio's offset (consecutive folios alternate nodes).
pub(crate) fn folio_node<'m>(cpu: &Cpu<'m>, addr: VirtAddr, order: u32) -> usize {
    let nodes = cpu.m.phys.nr_nodes().max(1);
    match cpu.m.mempolicy() {
        crate::machine::MemPolicy::Interleave => ((addr.vpn() >> order) % nodes as u64) as usize,
        crate::machine::MemPolicy::Default => cpu.id % nodes,
    }
}

impl FaultCtx<'_, '_> {
    /// The faulting entry's index in its table.
    pub(crate) fn idx(&self) -> usize {
        self.addr.pte_index()
    }
}
