//! What a scenario runs on: the engine or the host kernel.
//!
//! A [`Backend`] performs the system calls and memory accesses of a scenario and reports what
//! a user can observe (`/proc/PID/maps`, `smaps`, `status`, `pagemap`, `kpageflags`). The
//! runner drives one backend; the oracle drives two in lockstep and compares what they report.

use crate::ast::{Advice, FileKind, MlockallFlags, MsyncMode, Outcome, Prot, Sharing};

/// Why an operation did not succeed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fail {
    /// The errno or signal Linux would report.
    Outcome(Outcome),
    /// This backend cannot perform the operation (not implemented, not observable here).
    Unsupported(String),
}

/// Result of a backend operation.
pub type Res<T> = Result<T, Fail>;

/// A process handle of a backend.
pub type ProcId = u32;

/// Placement of an `mmap`, with addresses resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// The kernel chooses.
    Anywhere,
    /// A hint.
    Hint(u64),
    /// `MAP_FIXED`.
    Fixed(u64),
    /// `MAP_FIXED_NOREPLACE`.
    FixedNoreplace(u64),
}

/// An `mmap` request with addresses resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmapReq {
    /// Length.
    pub len: u64,
    /// Protection.
    pub prot: Prot,
    /// Private or shared.
    pub sharing: Sharing,
    /// MAP_POPULATE.
    pub populate: bool,
    /// MAP_LOCKED.
    pub locked: bool,
    /// MAP_NORESERVE.
    pub noreserve: bool,
    /// Placement.
    pub place: Place,
    /// A file and the offset of the mapping in it (`None`: MAP_ANONYMOUS).
    pub file: Option<(FileId, u64)>,
}

/// A file handle of a backend (v2).
pub type FileId = u32;

/// The flags of an `mremap`, with the fixed address resolved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MremapOpts {
    /// `MREMAP_MAYMOVE`.
    pub maymove: bool,
    /// `MREMAP_DONTUNMAP`.
    pub dontunmap: bool,
    /// `MREMAP_FIXED` with its address.
    pub fixed: Option<u64>,
}

/// The mlock family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockOp {
    /// `mlock`.
    Mlock,
    /// `mlock2(MLOCK_ONFAULT)`.
    Mlock2Onfault,
    /// `munlock`.
    Munlock,
}

/// The smaps fields, in bytes: the engine's [`usermm::views::Smaps`], which the host side
/// fills from `/proc/PID/smaps` text (one struct for both sides).
pub type SmapsView = usermm::views::Smaps;

/// The host's Pss split by folio kind, where the VMA's kind and its `Anonymous` line
/// settle it: a private anonymous VMA holds only anonymous folios; a shared mapping only
/// the object's folios (shmem for shared anonymous memory and tmpfs, file for a disk
/// file); a private file mapping only the file's folios while `Anonymous` is 0 and only
/// COW copies when `Anonymous` equals `Rss`. Otherwise unknown (`None`).
pub fn split_pss_by_kind(s: &mut SmapsView, kind: VmaKind, shared: bool) {
    let object = match kind {
        VmaKind::Anon => None,
        VmaKind::SharedAnon | VmaKind::TmpfsFile => Some(2),
        VmaKind::DiskFile => Some(1),
    };
    let mut split = [0u64; 3];
    let slot = match object {
        None => Some(0),
        Some(o) if shared || s.anonymous == 0 => Some(o),
        Some(_) if s.anonymous == s.rss => Some(0),
        Some(_) => None,
    };
    s.pss_by_kind = slot.map(|i| {
        split[i] = s.pss;
        split
    });
}

/// One VMA as `/proc/PID/smaps` shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VmaView {
    /// Start.
    pub start: u64,
    /// End.
    pub end: u64,
    /// `rw-p` etc.
    pub perms: String,
    /// The VM_LOCKED flag (`lo` in smaps VmFlags).
    pub locked: bool,
    /// What the VMA maps (RssFile and RssShmem follow from it).
    pub kind: VmaKind,
    /// The smaps fields.
    pub smaps: SmapsView,
}

/// The `/proc/PID/smaps` name column of a VMA: what it maps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum VmaKind {
    /// Private anonymous memory (or the heap).
    #[default]
    Anon,
    /// Shared anonymous memory (`/dev/zero (deleted)`): a shmem object.
    SharedAnon,
    /// A scenario file on tmpfs (shmem).
    TmpfsFile,
    /// A scenario file on disk.
    DiskFile,
}

/// `/proc/PID/status` lines that do not depend on the process's other mappings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatusView {
    /// VmPin.
    pub vm_pin: u64,
}

/// What pagemap and kpageflags say about one page.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PageView {
    /// pagemap bit 63.
    pub present: bool,
    /// pagemap bit 56: the page is mapped once. Linux 6.18 sets it on present pages only
    /// (`pte_to_pagemap_entry` tests the mapcount under PM_PRESENT): clear on a swap entry.
    pub exclusive: bool,
    /// pagemap bit 62: a swap entry (`pte_to_pagemap_entry`'s PM_SWAP).
    pub swapped: bool,
    /// `/proc/kpageflags` word, when readable.
    pub kpageflags: Option<u64>,
    /// Order of the folio, when it can be determined.
    pub folio_order: Option<u32>,
}

/// A system the scenario runs on.
pub trait Backend {
    /// "engine" or "host".
    fn name(&self) -> &'static str;
    /// Applies THP policy settings (sysfs meaning).
    fn set_thp(&mut self, settings: &[crate::ast::ThpSetting]) -> Res<()>;
    /// Applies an engine setting (memory, nodes, cpus, arch, tunable); the host ignores them.
    fn set_engine(&mut self, setting: &crate::ast::Setting) -> Res<()>;
    /// Sets the NUMA policy for later faults.
    fn set_mempolicy(&mut self, interleave: bool) -> Res<()>;
    /// Runs process `p`'s next statements on CPU `cpu` (`on cpuN`; cpu0 unless a statement
    /// says otherwise): the engine's CPU slot, whose TLB and per-CPU batches it then uses;
    /// the host pins the process to that host CPU.
    fn on_cpu(&mut self, p: ProcId, cpu: u32) -> Res<()>;
    /// A new process.
    fn spawn(&mut self, privileged: bool, rlimit_memlock: Option<u64>) -> Res<ProcId>;
    /// fork.
    fn fork(&mut self, p: ProcId) -> Res<ProcId>;
    /// exit.
    fn exit(&mut self, p: ProcId) -> Res<()>;
    /// mmap of anonymous memory.
    fn mmap(&mut self, p: ProcId, req: &MmapReq) -> Res<u64>;
    /// munmap.
    fn munmap(&mut self, p: ProcId, addr: u64, len: u64) -> Res<()>;
    /// mprotect.
    fn mprotect(&mut self, p: ProcId, addr: u64, len: u64, prot: Prot) -> Res<()>;
    /// mremap.
    fn mremap(&mut self, p: ProcId, addr: u64, old: u64, new: u64, opts: MremapOpts) -> Res<u64>;
    /// The raw brk system call: returns the break after the call.
    fn brk(&mut self, p: ProcId, new: u64) -> Res<u64>;
    /// madvise.
    fn madvise(&mut self, p: ProcId, addr: u64, len: u64, advice: Advice) -> Res<()>;
    /// `reclaim`: free up to `len` bytes of the machine's (the host: the scenario cgroup's)
    /// memory by reclaim, as kswapd would.
    fn reclaim(&mut self, _p: ProcId, _len: u64) -> Res<()> {
        Err(Fail::Unsupported(format!(
            "{}: reclaim is not supported",
            self.name()
        )))
    }
    /// mlock, mlock2(onfault), munlock.
    fn mlock(&mut self, p: ProcId, addr: u64, len: u64, op: LockOp) -> Res<()>;
    /// mlockall.
    fn mlockall(&mut self, p: ProcId, flags: MlockallFlags) -> Res<()>;
    /// munlockall.
    fn munlockall(&mut self, p: ProcId) -> Res<()>;
    /// Long-term pin.
    fn pin(&mut self, p: ProcId, addr: u64, len: u64) -> Res<()>;
    /// Release a pin.
    fn unpin(&mut self, p: ProcId, addr: u64, len: u64) -> Res<()>;
    /// Applies shmem_enabled settings (sysfs meaning).
    fn set_shmem(&mut self, _settings: &[crate::ast::ShmemSetting]) -> Res<()> {
        Err(Fail::Unsupported("set shmem".into()))
    }
    /// A new file of `size` bytes, zero-filled or filled with `pattern` (v2).
    fn file_create(&mut self, _size: u64, _kind: FileKind, _pattern: Option<u8>) -> Res<FileId> {
        Err(Fail::Unsupported("files".into()))
    }
    /// pwrite(2) of `len` bytes of `byte` at `offset`.
    fn pwrite(&mut self, _p: ProcId, _f: FileId, _offset: u64, _len: u64, _byte: u8) -> Res<()> {
        Err(Fail::Unsupported("files".into()))
    }
    /// pread(2) of up to `len` bytes at `offset`: the bytes read (short at the end of file).
    fn pread(&mut self, _p: ProcId, _f: FileId, _offset: u64, _len: u64) -> Res<Vec<u8>> {
        Err(Fail::Unsupported("files".into()))
    }
    /// ftruncate(2).
    fn ftruncate(&mut self, _p: ProcId, _f: FileId, _size: u64) -> Res<()> {
        Err(Fail::Unsupported("files".into()))
    }
    /// fallocate(2): mode 0, or PUNCH_HOLE|KEEP_SIZE when `punch`.
    fn fallocate(&mut self, _p: ProcId, _f: FileId, _off: u64, _len: u64, _punch: bool) -> Res<()> {
        Err(Fail::Unsupported("files".into()))
    }
    /// msync(2).
    fn msync(&mut self, _p: ProcId, _addr: u64, _len: u64, _mode: MsyncMode) -> Res<()> {
        Err(Fail::Unsupported("files".into()))
    }
    /// fsync(2).
    fn fsync(&mut self, _p: ProcId, _f: FileId) -> Res<()> {
        Err(Fail::Unsupported("files".into()))
    }
    /// Bytes of the file range `offset..offset+len` in the page cache (mincore of a mapping).
    fn fincore(&mut self, _p: ProcId, _f: FileId, _offset: u64, _len: u64) -> Res<u64> {
        Err(Fail::Unsupported("files".into()))
    }
    /// Fill with a byte.
    fn write(&mut self, p: ProcId, addr: u64, len: u64, byte: u8) -> Res<()>;
    /// One access per page.
    fn touch(&mut self, p: ProcId, addr: u64, len: u64, write: bool) -> Res<()>;
    /// Reads and returns the first byte that differs from `byte` (offset, value).
    fn check(&mut self, p: ProcId, addr: u64, len: u64, byte: u8) -> Res<Option<(u64, u8)>>;
    /// Every VMA of the process with its smaps fields.
    fn vmas(&mut self, p: ProcId) -> Res<Vec<VmaView>>;
    /// Status lines.
    fn status(&mut self, p: ProcId) -> Res<StatusView>;
    /// pagemap / kpageflags / folio order of one page.
    fn page(&mut self, p: ProcId, addr: u64) -> Res<PageView>;
    /// Every engine counter by name, since the machine was made (`expect counters`; the host
    /// has none of the engine's counters).
    fn counters(&mut self) -> Res<Vec<(&'static str, u64)>> {
        Err(Fail::Unsupported(
            "engine counters exist on the engine only".into(),
        ))
    }
    /// The text of `dump`: VMAs, page-table entries and folios of a range (engine only).
    fn dump(&mut self, _p: ProcId, _addr: u64, _len: u64) -> Res<String> {
        Err(Fail::Unsupported(
            "dump shows the engine's structures only".into(),
        ))
    }
}
