//! The expectations of a scenario (`expect …`): what an action must return, what a
//! process, a range or the machine must show, and the `bench begin/end` marks.

use super::*;

/// An `expect` statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expect {
    /// `expect ACTION = OUTCOME`: the action fails this way. Accesses (`read`,
    /// `write`, `touch`) expect a signal, every other action an errno.
    Outcome {
        /// The action (never binds).
        action: Action,
        /// The expected failure.
        outcome: Outcome,
    },
    /// `expect TASK read ADDR SIZE pattern=0xNN`: every byte reads as `pattern`.
    Read {
        /// The process.
        task: Name,
        /// Start.
        addr: AddrExpr,
        /// Length in bytes.
        len: u64,
        /// The expected byte.
        pattern: u8,
    },
    /// `expect TASK smaps NAME Field=SIZE...`: sums over the VMAs overlapping
    /// NAME's range.
    Smaps {
        /// The process.
        task: Name,
        /// The mapping.
        mapping: Name,
        /// The fields checked (at least one, no repeats), in file order.
        fields: Vec<(SmapsField, u64)>,
    },
    /// `expect TASK status Field=SIZE...`.
    Status {
        /// The process.
        task: Name,
        /// The fields checked (at least one, no repeats), in file order.
        fields: Vec<(StatusField, u64)>,
    },
    /// `expect TASK maps count=N`: number of VMAs the scenario created.
    MapsCount {
        /// The process.
        task: Name,
        /// Expected count.
        count: u64,
    },
    /// `expect TASK maps ADDR START-END PERMS`: the VMA containing ADDR.
    MapsVma {
        /// The process.
        task: Name,
        /// An address inside the VMA (SCENARIO.md writes a NAME; any address
        /// expression is accepted).
        addr: AddrExpr,
        /// Expected start (absolute).
        start: u64,
        /// Expected end (absolute, greater than `start`).
        end: u64,
        /// Expected permissions.
        perms: Perms,
    },
    /// `expect TASK pagemap ADDR STATE...`: all listed states hold.
    Pagemap {
        /// The process.
        task: Name,
        /// The page's address.
        addr: AddrExpr,
        /// The states (at least one, no repeats), in file order.
        states: Vec<PagemapState>,
    },
    /// `expect TASK kpageflags ADDR [!]FLAG...`.
    Kpageflags {
        /// The process.
        task: Name,
        /// The page's address.
        addr: AddrExpr,
        /// The checks (at least one, each flag at most once), in file order.
        flags: Vec<FlagCheck>,
    },
    /// `expect TASK folio ADDR order=N`.
    Folio {
        /// The process.
        task: Name,
        /// The page's address.
        addr: AddrExpr,
        /// The expected folio order (0..=63).
        order: u32,
    },
    /// `expect TASK pread FILE OFFSET SIZE pattern=0xNN`: read(2) returns SIZE bytes of it.
    Pread {
        /// The process.
        task: Name,
        /// The file.
        file: Name,
        /// File offset.
        offset: u64,
        /// Length in bytes.
        len: u64,
        /// The expected byte.
        pattern: u8,
    },
    /// `expect counters NAME=N...`: engine counter deltas since the previous `expect
    /// counters` (or the start of the run); engine only, skipped on the host.
    Counters {
        /// The counters (names of [`usermm::Ev`], at least one, no repeats), in file order.
        values: Vec<(String, u64)>,
    },
    /// `expect TASK fincore FILE OFFSET SIZE BYTES`: bytes of the range in the page cache.
    Fincore {
        /// The process.
        task: Name,
        /// The file.
        file: Name,
        /// File offset.
        offset: u64,
        /// Length in bytes.
        len: u64,
        /// The expected cached bytes.
        bytes: u64,
    },
}

impl Expect {
    /// The process the expectation is about (`None` only for `expect spawn = ...`).
    pub fn task(&self) -> Option<&Name> {
        match self {
            Expect::Outcome { action, .. } => action.task(),
            Expect::Read { task, .. }
            | Expect::Smaps { task, .. }
            | Expect::Status { task, .. }
            | Expect::MapsCount { task, .. }
            | Expect::MapsVma { task, .. }
            | Expect::Pagemap { task, .. }
            | Expect::Kpageflags { task, .. }
            | Expect::Folio { task, .. }
            | Expect::Pread { task, .. }
            | Expect::Fincore { task, .. } => Some(task),
            Expect::Counters { .. } => None,
        }
    }
}

/// How an expected-to-fail action fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// A syscall error.
    Errno(Errno),
    /// A signal raised by a memory access.
    Signal(Signal),
}

keyword_enum! {
    /// A signal an access can raise.
    pub enum Signal {
        /// SIGSEGV: no mapping, or against its protection.
        Sigsegv = "SIGSEGV",
        /// SIGBUS.
        Sigbus = "SIGBUS",
    }
}

impl Signal {
    /// The Linux signal number.
    pub fn number(self) -> i32 {
        match self {
            Signal::Sigsegv => 11,
            Signal::Sigbus => 7,
        }
    }
}

keyword_enum! {
    /// An errno name (Linux asm-generic numbering).
    pub enum Errno {
        /// Operation not permitted.
        EPERM = "EPERM",
        /// No such file or directory.
        ENOENT = "ENOENT",
        /// No such process.
        ESRCH = "ESRCH",
        /// Interrupted system call.
        EINTR = "EINTR",
        /// I/O error.
        EIO = "EIO",
        /// No such device or address.
        ENXIO = "ENXIO",
        /// Argument list too long.
        E2BIG = "E2BIG",
        /// Bad file number.
        EBADF = "EBADF",
        /// Try again.
        EAGAIN = "EAGAIN",
        /// Out of memory.
        ENOMEM = "ENOMEM",
        /// Permission denied.
        EACCES = "EACCES",
        /// Bad address.
        EFAULT = "EFAULT",
        /// Device or resource busy.
        EBUSY = "EBUSY",
        /// File exists.
        EEXIST = "EEXIST",
        /// No such device.
        ENODEV = "ENODEV",
        /// Invalid argument.
        EINVAL = "EINVAL",
        /// File table overflow.
        ENFILE = "ENFILE",
        /// Too many open files.
        EMFILE = "EMFILE",
        /// File too large.
        EFBIG = "EFBIG",
        /// No space left on device.
        ENOSPC = "ENOSPC",
        /// Math result not representable.
        ERANGE = "ERANGE",
        /// Function not implemented.
        ENOSYS = "ENOSYS",
        /// Value too large for defined data type.
        EOVERFLOW = "EOVERFLOW",
        /// Operation not supported.
        EOPNOTSUPP = "EOPNOTSUPP",
        /// Memory page has hardware error.
        EHWPOISON = "EHWPOISON",
    }
}

impl Errno {
    /// The Linux errno number (x86_64 and arm64 agree).
    pub fn number(self) -> i32 {
        match self {
            Errno::EPERM => 1,
            Errno::ENOENT => 2,
            Errno::ESRCH => 3,
            Errno::EINTR => 4,
            Errno::EIO => 5,
            Errno::ENXIO => 6,
            Errno::E2BIG => 7,
            Errno::EBADF => 9,
            Errno::EAGAIN => 11,
            Errno::ENOMEM => 12,
            Errno::EACCES => 13,
            Errno::EFAULT => 14,
            Errno::EBUSY => 16,
            Errno::EEXIST => 17,
            Errno::ENODEV => 19,
            Errno::EINVAL => 22,
            Errno::ENFILE => 23,
            Errno::EMFILE => 24,
            Errno::EFBIG => 27,
            Errno::ENOSPC => 28,
            Errno::ERANGE => 34,
            Errno::ENOSYS => 38,
            Errno::EOVERFLOW => 75,
            Errno::EOPNOTSUPP => 95,
            Errno::EHWPOISON => 133,
        }
    }

    /// The errno with this number, if it is one of the listed ones.
    pub fn from_number(n: i32) -> Option<Errno> {
        Errno::ALL.iter().copied().find(|e| e.number() == n)
    }
}

keyword_enum! {
    /// Which end of the timed part of a scenario.
    pub enum BenchMark {
        /// Timing starts after this statement.
        Begin = "begin",
        /// Timing stops before this statement.
        End = "end",
    }
}
