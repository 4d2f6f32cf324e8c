//! usermm: the Linux virtual-memory core as a fast, instrumented user-space engine.
//!
//! A [`Machine`] is one simulated computer: physical memory (an arena of frames with a
//! `struct page`-like memmap and buddy allocators per node), CPUs (host threads) with software
//! TLBs and per-CPU counters, and processes whose address spaces have VMAs in a maple-like
//! range tree and real x86-64 or arm64 page tables in arena frames. System calls
//! (`mmap`, `munmap`, `mprotect`, `mremap`, `brk`, `madvise`, `fork`, `exit`, pins) follow
//! Linux's semantics and errno; memory accesses go through the TLB, the page-table walk and the
//! fault handler, on real bytes.
//!
//! ```
//! use usermm::{Machine, MachineConfig, Privilege, MmapArgs, Prot};
//! let m = Machine::new(MachineConfig { memory: 64 << 20, ..Default::default() });
//! let cpu = m.enter_cpu(0).unwrap();
//! let p = cpu.spawn(Privilege::Ordinary, 8 << 20).unwrap();
//! let rw = Prot::RW;
//! let a = cpu.mmap(p, MmapArgs::anon(1 << 20, rw)).unwrap();
//! cpu.write_fill(p, a, 1 << 20, 0xa5).unwrap();
//! let c = cpu.fork(p).unwrap();
//! cpu.write_fill(c, a, 4096, 0x5a).unwrap();
//! assert_eq!(cpu.find_mismatch(p, a, 1 << 20, 0xa5).unwrap(), None);
//! m.validate().unwrap();
//! ```

#![warn(unreachable_pub)]

pub(crate) mod access;
pub mod dump;
pub(crate) mod errno;
pub(crate) mod fault;
pub(crate) mod filemap;
pub(crate) mod huge_memory;
pub(crate) mod khugepaged;
pub mod kmap;
pub mod machine;
pub(crate) mod mlock;
pub(crate) mod mm;
pub(crate) mod munlock_2013;
pub(crate) mod ops;
pub(crate) mod page_writeback;
pub mod pgtable;
pub mod phys;
pub(crate) mod readahead;
pub mod rmap;
pub(crate) mod rmap_walk;
pub mod sharing;
pub(crate) mod shmem;
pub(crate) mod stats;
pub(crate) mod swap_fault;
pub(crate) mod swap_state;
pub mod swapfile;
pub(crate) mod tlb;
pub(crate) mod truncate;
pub mod tunables;
pub mod units;
pub(crate) mod vaddr;
pub(crate) mod validate;
pub mod views;
pub(crate) mod vm_fault;
pub mod vma;
pub(crate) mod vmscan;
pub(crate) mod workingset;
pub(crate) mod zap;

pub use access::Signal;
pub use errno::{Errno, SysResult};
pub use filemap::InodeKind;
pub use machine::{Cpu, FileId, Machine, MachineConfig};
pub use mm::{Pid, Privilege};
pub use ops::file::MsyncFlags;
pub use ops::madvise::Advice;
pub use ops::mlock::{MlockallFlags, MLOCK_ONFAULT};
pub use ops::mmap::{MapFlags, MmapArgs, Placement, Sharing};
pub use ops::mremap::MremapFlags;
pub use pgtable::{Access, Arch, Prot};
pub use phys::Pfn;
pub use stats::{Ev, Snapshot};
pub use tunables::{ShmemHuge, ThpPolicy, Tunables};
