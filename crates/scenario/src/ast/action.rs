//! The action statements of a scenario: what a task does (map, unmap, protect, advise,
//! lock, fork, access, file and page-cache calls…), each also the subject of `expect ACTION
//! = OUTCOME`.

use super::*;

/// An action statement (also the subject of `expect ACTION = OUTCOME`).
///
/// `task` is always a name bound to a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// `spawn [privileged]`: a new process with an empty address space.
    Spawn {
        /// Root's capabilities (CAP_IPC_LOCK, CAP_SYS_RAWIO).
        privileged: bool,
    },
    /// `file SIZE [disk] [pattern=0xNN]`: a new file (v2), bound to a name.
    File {
        /// Its size in bytes.
        size: u64,
        /// tmpfs or disk.
        kind: FileKind,
        /// The byte its contents are filled with (`None`: a sparse, zero-filled file).
        pattern: Option<u8>,
    },
    /// `TASK fork`.
    Fork {
        /// The parent.
        task: Name,
    },
    /// `TASK exit`.
    Exit {
        /// The exiting process.
        task: Name,
    },
    /// `TASK mmap SIZE PROT private|shared anon [options]`.
    Mmap {
        /// The process.
        task: Name,
        /// The arguments.
        mmap: Mmap,
    },
    /// `TASK munmap ADDR SIZE`.
    Munmap {
        /// The process.
        task: Name,
        /// Start.
        addr: AddrExpr,
        /// Length in bytes.
        len: u64,
    },
    /// `TASK mprotect ADDR SIZE PROT`.
    Mprotect {
        /// The process.
        task: Name,
        /// Start.
        addr: AddrExpr,
        /// Length in bytes.
        len: u64,
        /// New protection.
        prot: Prot,
    },
    /// `TASK mremap ADDR OLD NEW [maymove] [dontunmap] [fixed ADDR]`.
    Mremap {
        /// The process.
        task: Name,
        /// Old address.
        addr: AddrExpr,
        /// Old length in bytes.
        old_len: u64,
        /// New length in bytes.
        new_len: u64,
        /// MREMAP_MAYMOVE.
        maymove: bool,
        /// MREMAP_DONTUNMAP (an addition to SCENARIO.md).
        dontunmap: bool,
        /// MREMAP_FIXED with this new address.
        fixed: Option<AddrExpr>,
    },
    /// `TASK brk +SIZE` / `TASK brk -SIZE`.
    Brk {
        /// The process.
        task: Name,
        /// How the break moves.
        delta: BrkDelta,
    },
    /// `TASK madvise ADDR SIZE ADVICE`.
    Madvise {
        /// The process.
        task: Name,
        /// Start.
        addr: AddrExpr,
        /// Length in bytes.
        len: u64,
        /// The advice.
        advice: Advice,
    },
    /// `TASK reclaim SIZE` (v3): run reclaim, as kswapd does, until SIZE bytes are freed or
    /// nothing more can be; the host reclaims from the scenario's memory cgroup.
    Reclaim {
        /// The process (on the host: whose cgroup is reclaimed; all of them share one).
        task: Name,
        /// Bytes to free.
        len: u64,
    },
    /// `TASK mlock ADDR SIZE`.
    Mlock {
        /// The process.
        task: Name,
        /// Start.
        addr: AddrExpr,
        /// Length in bytes.
        len: u64,
    },
    /// `TASK mlock2 ADDR SIZE [onfault]`.
    Mlock2 {
        /// The process.
        task: Name,
        /// Start.
        addr: AddrExpr,
        /// Length in bytes.
        len: u64,
        /// MLOCK_ONFAULT.
        onfault: bool,
    },
    /// `TASK munlock ADDR SIZE`.
    Munlock {
        /// The process.
        task: Name,
        /// Start.
        addr: AddrExpr,
        /// Length in bytes.
        len: u64,
    },
    /// `TASK mlockall FLAG...` (flags separated by spaces or `|`).
    Mlockall {
        /// The process.
        task: Name,
        /// MCL_* flags (at least one set).
        flags: MlockallFlags,
    },
    /// `TASK munlockall`.
    Munlockall {
        /// The process.
        task: Name,
    },
    /// `TASK pin ADDR SIZE`: long-term pin (FOLL_PIN | FOLL_LONGTERM).
    Pin {
        /// The process.
        task: Name,
        /// Start.
        addr: AddrExpr,
        /// Length in bytes.
        len: u64,
    },
    /// `TASK unpin ADDR SIZE`.
    Unpin {
        /// The process.
        task: Name,
        /// Start.
        addr: AddrExpr,
        /// Length in bytes.
        len: u64,
    },
    /// `TASK write ADDR SIZE pattern=0xNN`: fill with a byte.
    Write {
        /// The process.
        task: Name,
        /// Start.
        addr: AddrExpr,
        /// Length in bytes.
        len: u64,
        /// The byte written.
        pattern: u8,
    },
    /// `TASK touch ADDR SIZE read|write`: one access per page.
    Touch {
        /// The process.
        task: Name,
        /// Start.
        addr: AddrExpr,
        /// Length in bytes.
        len: u64,
        /// Read or write access.
        access: Access,
    },
    /// `TASK read ADDR SIZE`: read without checking the contents.
    Read {
        /// The process.
        task: Name,
        /// Start.
        addr: AddrExpr,
        /// Length in bytes.
        len: u64,
    },
    /// `TASK pwrite FILE OFFSET SIZE pattern=0xNN`: write(2) through the page cache.
    Pwrite {
        /// The process.
        task: Name,
        /// The file.
        file: Name,
        /// File offset.
        offset: u64,
        /// Length in bytes.
        len: u64,
        /// The byte written.
        pattern: u8,
    },
    /// `TASK pread FILE OFFSET SIZE`: read(2) without checking the contents.
    Pread {
        /// The process.
        task: Name,
        /// The file.
        file: Name,
        /// File offset.
        offset: u64,
        /// Length in bytes.
        len: u64,
    },
    /// `TASK ftruncate FILE SIZE`.
    Ftruncate {
        /// The process.
        task: Name,
        /// The file.
        file: Name,
        /// The new size.
        size: u64,
    },
    /// `TASK fallocate FILE OFFSET SIZE [punch]`: allocate, or punch a hole
    /// (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE).
    Fallocate {
        /// The process.
        task: Name,
        /// The file.
        file: Name,
        /// File offset.
        offset: u64,
        /// Length in bytes.
        len: u64,
        /// Punch a hole instead of allocating.
        punch: bool,
    },
    /// `TASK msync ADDR SIZE sync|async|invalidate`.
    Msync {
        /// The process.
        task: Name,
        /// Start.
        addr: AddrExpr,
        /// Length in bytes.
        len: u64,
        /// The mode.
        mode: MsyncMode,
    },
    /// `TASK fsync FILE`.
    Fsync {
        /// The process.
        task: Name,
        /// The file.
        file: Name,
    },
}

impl Action {
    /// The verb (`"mmap"`, `"spawn"`, ...).
    pub fn verb(&self) -> &'static str {
        match self {
            Action::Spawn { .. } => "spawn",
            Action::Fork { .. } => "fork",
            Action::Exit { .. } => "exit",
            Action::Mmap { .. } => "mmap",
            Action::Munmap { .. } => "munmap",
            Action::Mprotect { .. } => "mprotect",
            Action::Mremap { .. } => "mremap",
            Action::Brk { .. } => "brk",
            Action::Madvise { .. } => "madvise",
            Action::Reclaim { .. } => "reclaim",
            Action::Mlock { .. } => "mlock",
            Action::Mlock2 { .. } => "mlock2",
            Action::Munlock { .. } => "munlock",
            Action::Mlockall { .. } => "mlockall",
            Action::Munlockall { .. } => "munlockall",
            Action::Pin { .. } => "pin",
            Action::Unpin { .. } => "unpin",
            Action::Write { .. } => "write",
            Action::Touch { .. } => "touch",
            Action::Read { .. } => "read",
            Action::File { .. } => "file",
            Action::Pwrite { .. } => "pwrite",
            Action::Pread { .. } => "pread",
            Action::Ftruncate { .. } => "ftruncate",
            Action::Fallocate { .. } => "fallocate",
            Action::Msync { .. } => "msync",
            Action::Fsync { .. } => "fsync",
        }
    }

    /// The process acting (`None` for `spawn`).
    pub fn task(&self) -> Option<&Name> {
        match self {
            Action::Spawn { .. } | Action::File { .. } => None,
            Action::Fork { task }
            | Action::Exit { task }
            | Action::Mmap { task, .. }
            | Action::Munmap { task, .. }
            | Action::Mprotect { task, .. }
            | Action::Mremap { task, .. }
            | Action::Brk { task, .. }
            | Action::Madvise { task, .. }
            | Action::Reclaim { task, .. }
            | Action::Mlock { task, .. }
            | Action::Mlock2 { task, .. }
            | Action::Munlock { task, .. }
            | Action::Mlockall { task, .. }
            | Action::Munlockall { task }
            | Action::Pin { task, .. }
            | Action::Unpin { task, .. }
            | Action::Write { task, .. }
            | Action::Touch { task, .. }
            | Action::Read { task, .. }
            | Action::Pwrite { task, .. }
            | Action::Pread { task, .. }
            | Action::Ftruncate { task, .. }
            | Action::Fallocate { task, .. }
            | Action::Msync { task, .. }
            | Action::Fsync { task, .. } => Some(task),
        }
    }

    /// The file the action names, if any.
    pub fn file(&self) -> Option<&Name> {
        match self {
            Action::Pwrite { file, .. }
            | Action::Pread { file, .. }
            | Action::Ftruncate { file, .. }
            | Action::Fallocate { file, .. }
            | Action::Fsync { file, .. } => Some(file),
            Action::Mmap { mmap, .. } => match &mmap.backing {
                Backing::File { file, .. } => Some(file),
                Backing::Anon => None,
            },
            _ => None,
        }
    }

    /// What a binding `NAME = ACTION` binds, or `None` if the action returns
    /// nothing bindable.
    pub fn yields(&self) -> Option<NameKind> {
        match self {
            Action::Spawn { .. } | Action::Fork { .. } => Some(NameKind::Process),
            Action::Mmap { .. } | Action::Mremap { .. } | Action::Brk { .. } => {
                Some(NameKind::Mapping)
            }
            Action::File { .. } => Some(NameKind::File),
            _ => None,
        }
    }

    /// True for memory accesses (`read`, `write`, `touch`), which fail with a
    /// signal; every other action fails with an errno.
    pub fn is_access(&self) -> bool {
        matches!(
            self,
            Action::Read { .. } | Action::Write { .. } | Action::Touch { .. }
        )
    }
}
