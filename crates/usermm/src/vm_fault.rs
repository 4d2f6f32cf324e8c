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
use crate::rmap::AnonVmaId;
use crate::stats::Ev;
use crate::tunables::{ThpSettings, Tunables};
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

/// Who takes a fault. That decides what happens when a fault had to drop the mmap lock to
/// wait for I/O (`VM_FAULT_RETRY`): whether it is retried, and whether the retry carries
/// `FAULT_FLAG_TRIED`, under which `filemap_fault` neither counts a page-cache hit against
/// `mmap_miss` nor starts asynchronous readahead (6.18; [`FaultAttempt`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FaultSource {
    /// An access by the CPU (`do_user_addr_fault` on x86): the first attempt runs under the
    /// VMA lock; its retry runs under the mmap lock, with `FAULT_FLAG_TRIED` only when the
    /// first attempt was a major fault (a miss), and a third attempt always with it.
    User,
    /// `__mm_populate` (MAP_POPULATE, mlock, mlockall): after a retry the walk starts again
    /// at the faulting page with flags that never include `FAULT_FLAG_TRIED`.
    Populate,
    /// `__get_user_pages_locked` (MADV_POPULATE_READ/WRITE, pins): the page is retried with
    /// `FOLL_TRIED`.
    Gup,
    /// `populate_vma_page_range` with no lock to give up (mprotect making a locked VMA
    /// writable): `FAULT_FLAG_ALLOW_RETRY` is not set, so the fault waits for its I/O in
    /// place and is never retried.
    NoRetry,
}

/// One attempt at a file fault: its number and whether it runs with `FAULT_FLAG_TRIED`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FaultAttempt {
    /// Who takes the fault.
    pub(crate) src: FaultSource,
    /// 1 for the first attempt.
    pub(crate) n: u32,
    /// `FAULT_FLAG_TRIED`.
    pub(crate) tried: bool,
}

impl FaultAttempt {
    /// The first attempt of a fault taken by `src`.
    pub(crate) fn first(src: FaultSource) -> FaultAttempt {
        FaultAttempt {
            src,
            n: 1,
            tried: false,
        }
    }

    /// Whether waiting for I/O drops the mmap lock and ends this attempt with
    /// `VM_FAULT_RETRY` (`maybe_unlock_mmap_for_io`: `FAULT_FLAG_ALLOW_RETRY` without
    /// `FAULT_FLAG_TRIED`).
    pub(crate) fn may_drop_lock(self) -> bool {
        self.src != FaultSource::NoRetry && !self.tried
    }

    /// The attempt after this one returned `VM_FAULT_RETRY`, with `VM_FAULT_MAJOR` when it
    /// missed the page cache (see [`FaultSource`]).
    pub(crate) fn retry(self, major: bool) -> FaultAttempt {
        let tried = match self.src {
            FaultSource::User => self.n >= 2 || major,
            FaultSource::Populate => false,
            FaultSource::Gup | FaultSource::NoRetry => true,
        };
        FaultAttempt {
            src: self.src,
            n: self.n + 1,
            tried,
        }
    }
}

/// Retries a fault may take before it goes on with what it has: Linux has no bound, but a
/// page that a retry found is not missed again (a bound against an engine bug, not a rule).
pub(crate) const MAX_FAULT_ATTEMPTS: u32 = 4;

/// One fault (Linux's `struct vm_fault`): where it happened, what it asked, the page-table
/// slots found on the way down, and the tunables it reads. Built once by `handle_mm_fault`
/// when the PMD table is there; the PMD-level handlers take it as it is, the PTE-level ones
/// once the PTE table is there too ([`FaultCtx::table`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct FaultCtx<'a, 'm> {
    pub(crate) mm: &'a Mm,
    pub(crate) vma: &'a Vma,
    pub(crate) pt: PageTables<'m>,
    /// The PMD table covering `addr` and the entry's index in it (`vmf->pmd`).
    pub(crate) pmd_table: Pfn,
    /// The faulting PMD entry's index in `pmd_table`.
    pub(crate) pmd_idx: usize,
    /// The PTE table covering `addr` (`vmf->pte`'s table), once allocated.
    pub(crate) pte_table: Option<Pfn>,
    /// The faulting address (`vmf->real_address`: not rounded to its page).
    pub(crate) addr: VirtAddr,
    /// `FAULT_FLAG_WRITE` or not.
    pub(crate) access: Access,
    /// The page offset of `addr` in the VMA's file (`vmf->pgoff`, `linear_page_index`).
    pub(crate) pgoff: u64,
    /// The tunables this fault reads, taken once ([`FaultTunables::snapshot`]).
    pub(crate) tun: FaultTunables,
    /// Who takes the fault (how a fault that dropped the mmap lock is retried).
    pub(crate) src: FaultSource,
}

/// The tunables a fault reads, copied under one acquisition of the tunables lock when the
/// fault starts (Linux reads the sysfs knobs as it goes; a change racing with a fault may
/// be seen by it or not, either way).
#[derive(Clone, Copy, Debug)]
pub(crate) struct FaultTunables {
    /// The THP policies (`transparent_hugepage/enabled`, per size, `use_zero_page`).
    pub(crate) thp: ThpSettings,
    /// `fault_around_bytes`.
    pub(crate) fault_around_bytes: u64,
}

impl FaultTunables {
    /// Copies what a fault reads out of the tunables.
    pub(crate) fn snapshot(t: &Tunables) -> FaultTunables {
        FaultTunables {
            thp: t.thp,
            fault_around_bytes: t.fault_around_bytes,
        }
    }
}

/// Gives `vma` an anon_vma if it has none (`__anon_vma_prepare`): a new one. A compatible
/// neighbour's (`find_mergeable_anon_vma`) was already taken by `handle_mm_fault`, which
/// has the VMA tree at hand.
pub(crate) fn anon_vma_prepare<'m>(cpu: &Cpu<'m>, mm: &Mm, st_vma: &Vma) -> AnonVmaId {
    if let Some(av) = st_vma.anon_vma() {
        return av;
    }
    let _g = mm.page_table_lock.lock(cpu.c());
    match st_vma.anon_vma() {
        Some(av) => av,
        None => {
            let av = cpu.m.alloc_anon_vma();
            st_vma.set_anon_vma(av, 1);
            av
        }
    }
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

    /// The PTE table covering the faulting address.
    ///
    /// # Panics
    /// Before `handle_mm_fault` allocated it: only the PTE-level handlers call this.
    pub(crate) fn table(&self) -> Pfn {
        self.pte_table
            .expect("invariant: PTE-level handlers run once the PTE table is allocated")
    }
}
