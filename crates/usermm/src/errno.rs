//! Errno values returned by the system-call surface.
//!
//! Linux counterpart: `include/uapi/asm-generic/errno-base.h`. Every user-visible operation
//! returns `Result<T, Errno>` so that the oracle can compare errno-level behaviour with the
//! host kernel.

use std::fmt;

/// A Linux errno (the subset the mm system calls return).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[allow(missing_docs)]
pub enum Errno {
    EPERM = 1,
    ENOENT = 2,
    ESRCH = 3,
    EINTR = 4,
    EIO = 5,
    EBADF = 9,
    EAGAIN = 11,
    ENOMEM = 12,
    EACCES = 13,
    EFAULT = 14,
    EBUSY = 16,
    EEXIST = 17,
    ENODEV = 19,
    EINVAL = 22,
    ENFILE = 23,
    EMFILE = 24,
    EFBIG = 27,
    ENOSPC = 28,
    EOVERFLOW = 75,
}

impl Errno {
    /// The symbolic name, e.g. `"EINVAL"`.
    pub fn name(self) -> &'static str {
        match self {
            Errno::EPERM => "EPERM",
            Errno::ENOENT => "ENOENT",
            Errno::ESRCH => "ESRCH",
            Errno::EINTR => "EINTR",
            Errno::EIO => "EIO",
            Errno::EBADF => "EBADF",
            Errno::EAGAIN => "EAGAIN",
            Errno::ENOMEM => "ENOMEM",
            Errno::EACCES => "EACCES",
            Errno::EFAULT => "EFAULT",
            Errno::EBUSY => "EBUSY",
            Errno::EEXIST => "EEXIST",
            Errno::ENODEV => "ENODEV",
            Errno::EINVAL => "EINVAL",
            Errno::ENFILE => "ENFILE",
            Errno::EMFILE => "EMFILE",
            Errno::EFBIG => "EFBIG",
            Errno::ENOSPC => "ENOSPC",
            Errno::EOVERFLOW => "EOVERFLOW",
        }
    }

    /// The numeric value.
    pub fn code(self) -> i32 {
        self as i32
    }

    /// Maps a numeric errno back to the enum.
    pub fn from_code(code: i32) -> Option<Errno> {
        ALL.iter().copied().find(|e| e.code() == code)
    }

    /// Every errno the engine returns.
    pub const ALL: &'static [Errno] = &ALL;
}

const ALL: [Errno; 19] = [
    Errno::EPERM,
    Errno::ENOENT,
    Errno::ESRCH,
    Errno::EINTR,
    Errno::EIO,
    Errno::EBADF,
    Errno::EAGAIN,
    Errno::ENOMEM,
    Errno::EACCES,
    Errno::EFAULT,
    Errno::EBUSY,
    Errno::EEXIST,
    Errno::ENODEV,
    Errno::EINVAL,
    Errno::ENFILE,
    Errno::EMFILE,
    Errno::EFBIG,
    Errno::ENOSPC,
    Errno::EOVERFLOW,
];

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::error::Error for Errno {}

/// Result of a system call.
pub type SysResult<T> = Result<T, Errno>;
