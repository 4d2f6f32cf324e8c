//! One simulated computer: physical memory, CPUs with their TLBs and counters, processes.
//!
//! Host threads act as CPUs: [`Machine::enter_cpu`] claims a CPU slot and returns a [`Cpu`]
//! handle through which every system call and memory access is made; per-CPU state (the TLB,
//! the counters) is indexed by that slot.

use crate::errno::{Errno, SysResult};
use crate::mm::{Mm, MmState, Pid, Privilege, Task};
use crate::pgtable::{Arch, PageTables};
use crate::phys::{FolioKind, PhysMem, Zeroing};
use crate::rmap::AnonVmaId;
use crate::stats::{CpuCounters, Snapshot};
use crate::tlb::{self, FlushScope, Tlb, TlbFlushed};
use crate::tunables::Tunables;
use parking_lot::{Mutex, RwLock, RwLockReadGuard};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

/// NUMA placement of new folios (`set_mempolicy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemPolicy {
    /// The faulting CPU's node (`MPOL_DEFAULT`).
    Default,
    /// Round-robin by offset over all nodes (`MPOL_INTERLEAVE`).
    Interleave,
}

/// How to build a machine.
#[derive(Clone, Debug)]
pub struct MachineConfig {
    /// Simulated RAM in bytes (default 4 GiB).
    pub memory: u64,
    /// Size of the swap area in bytes (0, the default: no swap, as this host).
    pub swap: u64,
    /// The swap area is on a solid-state device, so large folios may be swapped out whole
    /// (default false: rotational, as this host's virtio disk, where 6.18 splits them).
    pub swap_ssd: bool,
    /// NUMA nodes.
    pub nodes: u32,
    /// CPU slots.
    pub cpus: usize,
    /// Page-table format.
    pub arch: Arch,
    /// Runtime switches.
    pub tunables: Tunables,
}

impl Default for MachineConfig {
    fn default() -> Self {
        MachineConfig {
            memory: 4 << 30,
            swap: 0,
            swap_ssd: false,
            nodes: 1,
            cpus: 2,
            arch: Arch::X86_64,
            tunables: Tunables::default(),
        }
    }
}

/// Error claiming a CPU slot.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CpuError {
    /// No such slot.
    #[error("cpu {0} does not exist")]
    NoSuchCpu(usize),
    /// Another thread holds it.
    #[error("cpu {0} is in use by another thread")]
    Busy(usize),
}

/// Per-CPU state.
#[derive(Debug, Default)]
pub(crate) struct CpuSlot {
    busy: AtomicBool,
    /// Event counters of this CPU.
    pub(crate) counters: CpuCounters,
    /// This CPU's TLB.
    pub(crate) tlb: Tlb,
    /// This CPU's folio batches (lru_add, mlock).
    pub(crate) batches: Mutex<crate::phys::lru::CpuBatches>,
}

/// RLIMIT_MEMLOCK default (8 MiB).
pub const DEFAULT_RLIMIT_MEMLOCK: u64 = 8 << 20;
/// `vm.mmap_min_addr`.
pub(crate) const MMAP_MIN_ADDR: u64 = 4096;
/// Top of the mmap area (below a notional stack).
pub(crate) const MMAP_BASE: u64 = 0x7fff_f000_0000;
/// Start of the heap.
pub const START_BRK: u64 = 0x5555_5600_0000;

/// The simulated machine.
#[derive(Debug)]
pub struct Machine {
    /// Physical memory.
    pub phys: PhysMem,
    /// The swap area, if the machine has one (`swapon`).
    pub swap: Option<crate::swapfile::SwapInfo>,
    /// Page-table format.
    pub arch: Arch,
    cpus: Vec<CpuSlot>,
    tunables: RwLock<Tunables>,
    check_tlb: AtomicBool,
    /// Processes by pid: read-locked by every access, written by spawn, fork and exit.
    tasks: RwLock<BTreeMap<Pid, Arc<Task>>>,
    next_pid: AtomicU32,
    next_mm: AtomicU32,
    next_anon_vma: AtomicU64,
    next_shmem: AtomicU32,
    /// Pages charged to overcommit (`vm_committed_as`).
    pub committed: AtomicI64,
    /// Fail point for the next fork's VMA-tree node allocations (0 = off).
    vma_tree_fail: AtomicU64,
    /// Interleave policy in force (`set mempolicy`).
    interleave: AtomicBool,
    /// Open files by [`FileId`]: the scenario's files, each holding a user of its inode so
    /// it outlives the processes that map it.
    files: RwLock<Vec<Arc<crate::filemap::Inode>>>,
}

/// A handle of an open file of the machine (`file_create`).
pub type FileId = u32;

impl Machine {
    /// Builds a machine.
    pub fn new(cfg: MachineConfig) -> Machine {
        Machine::new_reusing(cfg, None)
    }

    /// Builds a machine on the simulated RAM of `old` (dropped first), when it is the same
    /// size: the host has already backed those frames, so a run on the new machine does not
    /// pay the host kernel's first touch of each one (a replay of a short trace is otherwise
    /// mostly that). Nothing else carries over; frame contents do not matter, since every
    /// allocation zeroes its frames or writes them whole.
    pub fn new_reusing(cfg: MachineConfig, old: Option<Machine>) -> Machine {
        let arena = old
            .map(|mut m| std::mem::take(&mut m.phys.arena))
            .unwrap_or_default();
        let check = cfg.tunables.check_tlb;
        let phys = PhysMem::with_arena(cfg.memory, cfg.nodes, arena);
        phys.sharing
            .select(cfg.tunables.sharing, cfg.tunables.sharing_shadow);
        Machine {
            phys,
            swap: crate::swapfile::SwapInfo::new(cfg.swap, cfg.swap_ssd),
            arch: cfg.arch,
            cpus: (0..cfg.cpus.max(1))
                .map(|_| CpuSlot {
                    counters: CpuCounters::new(cfg.nodes.max(1) as usize),
                    ..CpuSlot::default()
                })
                .collect(),
            tunables: RwLock::new(cfg.tunables),
            check_tlb: AtomicBool::new(check),
            tasks: RwLock::new(BTreeMap::new()),
            next_pid: AtomicU32::new(1),
            next_mm: AtomicU32::new(1),
            next_anon_vma: AtomicU64::new(1),
            next_shmem: AtomicU32::new(1),
            committed: AtomicI64::new(0),
            vma_tree_fail: AtomicU64::new(0),
            interleave: AtomicBool::new(false),
            files: RwLock::new(Vec::new()),
        }
    }

    /// The open file `id` (`EBADF` if there is none).
    pub(crate) fn file(&self, id: FileId) -> SysResult<Arc<crate::filemap::Inode>> {
        self.files
            .read()
            .get(id as usize)
            .cloned()
            .ok_or(crate::errno::Errno::EBADF)
    }

    /// Every open file.
    pub fn files(&self) -> Vec<Arc<crate::filemap::Inode>> {
        self.files.read().clone()
    }

    pub(crate) fn add_file(&self, f: Arc<crate::filemap::Inode>) -> FileId {
        let mut files = self.files.write();
        files.push(f);
        (files.len() - 1) as FileId
    }

    /// Claims CPU slot `id` for the calling thread.
    pub fn enter_cpu(&self, id: usize) -> Result<Cpu<'_>, CpuError> {
        let slot = self.cpus.get(id).ok_or(CpuError::NoSuchCpu(id))?;
        if slot.busy.swap(true, Relaxed) {
            return Err(CpuError::Busy(id));
        }
        Ok(Cpu { m: self, id })
    }

    /// Number of CPU slots.
    pub fn nr_cpus(&self) -> usize {
        self.cpus.len()
    }

    /// The tunables (read).
    pub fn tunables(&self) -> RwLockReadGuard<'_, Tunables> {
        self.tunables.read()
    }

    /// Changes tunables.
    pub fn update_tunables(&self, f: impl FnOnce(&mut Tunables)) {
        let mut t = self.tunables.write();
        f(&mut t);
        self.check_tlb.store(t.check_tlb, Relaxed);
        self.phys.sharing.select(t.sharing, t.sharing_shadow);
    }

    /// Sets the NUMA policy of folios faulted from now on.
    pub fn set_mempolicy(&self, p: MemPolicy) {
        self.interleave.store(p == MemPolicy::Interleave, Relaxed);
    }

    /// The NUMA policy in force.
    pub(crate) fn mempolicy(&self) -> MemPolicy {
        if self.interleave.load(Relaxed) {
            MemPolicy::Interleave
        } else {
            MemPolicy::Default
        }
    }

    /// Whether TLB hits are verified against page tables.
    #[inline]
    pub(crate) fn check_tlb(&self) -> bool {
        self.check_tlb.load(Relaxed)
    }

    /// Counters summed over CPUs.
    pub fn counters(&self) -> Snapshot {
        Snapshot::sum(self.cpus.iter().map(|c| &c.counters))
    }

    /// `NR_MLOCK` (pages): every node's folded counter plus every CPU's unfolded diff, exact
    /// when no CPU is changing it.
    pub fn nr_mlock(&self) -> i64 {
        let diffs: i64 = (0..self.phys.nr_nodes())
            .map(|n| {
                self.cpus
                    .iter()
                    .map(|c| c.counters.vmstat_diff(n))
                    .sum::<i64>()
            })
            .sum();
        self.phys.nr_mlock_folded() + diffs
    }

    /// The folio batches of CPU `cpu`.
    pub fn cpu_batches(&self, cpu: usize) -> &Mutex<crate::phys::lru::CpuBatches> {
        &self.cpus[cpu].batches
    }

    /// Every TLB.
    pub fn tlbs(&self) -> Vec<&Tlb> {
        self.cpus.iter().map(|c| &c.tlb).collect()
    }

    /// Makes the `n`-th VMA-tree node allocation of the next fork fail (`None` disarms).
    pub fn fail_next_fork_tree_alloc(&self, n: Option<u64>) {
        self.vma_tree_fail.store(n.unwrap_or(0), Relaxed);
    }

    pub(crate) fn take_vma_tree_fail_point(&self) -> Option<u64> {
        let n = self.vma_tree_fail.swap(0, Relaxed);
        (n != 0).then_some(n)
    }

    /// Looks up a live process.
    pub fn task(&self, pid: Pid) -> SysResult<Arc<Task>> {
        self.tasks.read().get(&pid).cloned().ok_or(Errno::ESRCH)
    }

    /// Every live process.
    pub fn tasks(&self) -> Vec<Arc<Task>> {
        self.tasks.read().values().cloned().collect()
    }

    pub(crate) fn insert_task(&self, t: Arc<Task>) {
        self.tasks.write().insert(t.pid, t);
    }

    pub(crate) fn remove_task(&self, pid: Pid) -> Option<Arc<Task>> {
        self.tasks.write().remove(&pid)
    }

    pub(crate) fn alloc_pid(&self) -> Pid {
        self.next_pid.fetch_add(1, Relaxed)
    }

    pub(crate) fn alloc_mm_id(&self) -> u32 {
        self.next_mm.fetch_add(1, Relaxed)
    }

    /// A fresh anon_vma identifier (`anon_vma_alloc`).
    pub(crate) fn alloc_anon_vma(&self) -> AnonVmaId {
        // The counter is 64 bits so it cannot wrap back to ids in use; the id must fit the
        // folio's 32-bit mapping word, checked here once per anon_vma instead of truncated
        // at every folio that records it.
        let n = self.next_anon_vma.fetch_add(1, Relaxed);
        u32::try_from(n)
            .ok()
            .and_then(AnonVmaId::new)
            .expect("anon_vma ids exhausted: the memmap's mapping word holds 32 bits")
    }

    pub(crate) fn alloc_shmem_id(&self) -> u32 {
        self.next_shmem.fetch_add(1, Relaxed)
    }
}

/// A CPU held by the calling thread: the entry point of every operation.
///
/// Its methods are the system-call table (`mmap`, `fork`, `madvise`, the accesses, the
/// `/proc` views…) and the CPU's own state (its counters, TLB and folio batches). Everything
/// below a system call is a free function taking the CPU it runs on (`cpu: &Cpu<'m>`) in the
/// engine file of its Linux file: `fault::handle_mm_fault`, `huge_memory::split_huge_pmd`,
/// `filemap::io::filemap_fault` (see `docs/architecture.md`).
#[derive(Debug)]
pub struct Cpu<'m> {
    /// The machine.
    pub(crate) m: &'m Machine,
    /// Slot index.
    pub(crate) id: usize,
}

impl Drop for Cpu<'_> {
    fn drop(&mut self) {
        self.m.cpus[self.id].busy.store(false, Relaxed);
    }
}

impl<'m> Cpu<'m> {
    /// This CPU's counters.
    #[inline]
    pub(crate) fn c(&self) -> &'m CpuCounters {
        &self.m.cpus[self.id].counters
    }

    /// This CPU's TLB.
    #[inline]
    pub(crate) fn tlb(&self) -> &'m Tlb {
        &self.m.cpus[self.id].tlb
    }

    /// This CPU's folio batches.
    #[inline]
    pub(crate) fn batches(&self) -> &'m Mutex<crate::phys::lru::CpuBatches> {
        &self.m.cpus[self.id].batches
    }

    /// The page tables of `mm`.
    #[inline]
    pub(crate) fn tables(&self, mm: &Mm) -> PageTables<'m> {
        PageTables {
            phys: &self.m.phys,
            arch: self.m.arch,
            pgd: mm.pgd,
        }
    }

    /// Shoots down translations of `mm` (unless the test switch suppresses flushes); the
    /// receipt settles the [`crate::tlb::TlbFlushPending`] of the changes it covers.
    pub(crate) fn flush_tlb(&self, mm: &Mm, scope: FlushScope) -> TlbFlushed {
        let t = self.m.tunables();
        if t.test_skip_tlb_flush {
            return TlbFlushed::skipped_for_test();
        }
        if t.test_local_flush_only {
            drop(t);
            return tlb::flush(&[self.tlb()], self.c(), mm.id, scope);
        }
        drop(t);
        tlb::flush(&self.m.tlbs(), self.c(), mm.id, scope)
    }

    /// Creates a process with an empty address space.
    ///
    /// # Errors
    /// `ENOMEM` if the root page table cannot be allocated.
    pub fn spawn(&self, privilege: Privilege, rlimit_memlock: u64) -> SysResult<Pid> {
        let mm = self.new_mm()?;
        let pid = self.m.alloc_pid();
        self.m.insert_task(Arc::new(Task {
            pid,
            mm: Arc::new(mm),
            privilege,
            rlimit_memlock,
        }));
        Ok(pid)
    }

    pub(crate) fn new_mm(&self) -> SysResult<Mm> {
        let pgd = self
            .m
            .phys
            .alloc_folio(self.c(), 0, 0, FolioKind::Pgtable, Zeroing::Zero)
            .ok_or(Errno::ENOMEM)?;
        let state = MmState {
            start_brk: START_BRK,
            brk: START_BRK,
            mmap_base: MMAP_BASE,
            ..MmState::default()
        };
        Ok(Mm::new(self.m.alloc_mm_id(), pgd, state))
    }
}
