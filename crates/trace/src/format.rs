//! The trace file format, version 2 (byte by byte in `docs/trace-format.md`; the reader
//! also reads version 1, which has no `Cache` event).
//!
//! A file is a 12-byte preamble (`b"UMMTRACE"`, the version as u16 LE, reserved u16 0)
//! followed by one zstd frame with a content checksum (the reader refuses a frame without
//! one, and one whose payload does not match it). The decompressed payload is the [`Header`] and then the
//! [`Event`]s, each a tag byte and LEB128 varints, ended by the `End` tag. Fault addresses
//! are page numbers stored as the zigzag delta from the previous fault; an event names its
//! process only when it differs from the previous event's (tag bit `0x20`).
//!
//! The reader checks every length against a bound and never panics on malformed input: an
//! error names the byte offset, in the file (preamble, zstd frame) or in the decompressed
//! payload.

mod decode;
mod encode;

pub use decode::*;
pub use encode::*;

/// The first 8 bytes of a trace file.
pub const MAGIC: &[u8; 8] = b"UMMTRACE";
/// The format version this crate writes.
pub const VERSION: u16 = 2;
/// The oldest version this crate reads (version 1 is version 2 without `Cache` events).
pub const MIN_VERSION: u16 = 1;
/// Bytes before the zstd frame.
pub const PREAMBLE: usize = 12;
/// Largest decompressed payload the reader accepts.
pub const MAX_PAYLOAD: u64 = 1 << 30;
/// Longest string (path, host name, one argument).
pub const MAX_STRING: u64 = 4096;
/// Most command arguments in a header.
pub const MAX_ARGS: u64 = 1024;
/// Most VMAs in one exec image.
pub const MAX_VMAS: u64 = 65_536;
/// Most present pages in one exec image.
pub const MAX_PAGES: u64 = 1 << 24;
/// Most folios in one `Cache` event (a 16 GiB file cached in 4 KiB folios).
pub const MAX_CACHE_FOLIOS: u64 = 1 << 22;
/// Largest folio order in a `Cache` event (`MAX_PAGECACHE_ORDER` with 4 KiB pages: the PMD's).
pub const MAX_CACHE_ORDER: u8 = 9;
/// zstd compression level used by the writer.
pub const ZSTD_LEVEL: i32 = 19;

/// An error reading a trace, with the byte offset where it was found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    /// The preamble or zstd frame (offset in the file).
    #[error("file byte {offset}: {what}")]
    File {
        /// Byte offset in the file.
        offset: u64,
        /// What is wrong.
        what: String,
    },
    /// The decompressed payload (offset in the payload).
    #[error("payload byte {offset}: {what}")]
    Payload {
        /// Byte offset in the decompressed payload.
        offset: u64,
        /// What is wrong.
        what: String,
    },
    /// A valid trace that asks for more than the reader's [`Budget`](crate::Budget) (offset in the payload).
    #[error("payload byte {offset}: {what}")]
    Budget {
        /// Byte offset in the decompressed payload.
        offset: u64,
        /// Which budget, and how to raise it.
        what: String,
    },
}

/// What was known about the recording.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Header {
    /// Host name.
    pub host: String,
    /// Kernel release (`uname -r`).
    pub kernel: String,
    /// The command and its arguments.
    pub command: Vec<String>,
    /// The host's THP policy during the recording (e.g. `top=never sizes=never`).
    pub policy: String,
    /// Seconds since the epoch when the recording started.
    pub recorded_at: u64,
}

/// A mapping of an exec image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageVma {
    /// Start address (page-aligned).
    pub start: u64,
    /// End address (page-aligned, above `start`).
    pub end: u64,
    /// `PROT_*` bits (read 1, write 2, exec 4).
    pub prot: u8,
    /// [`IMG_SHARED`], [`IMG_STACK`], [`IMG_SPECIAL`].
    pub flags: u8,
    /// The file (id of a [`Event::File`]) for a file mapping.
    pub file: Option<u32>,
    /// Byte offset in the file.
    pub offset: u64,
}

/// `ImageVma::flags`: a shared mapping.
pub const IMG_SHARED: u8 = 1;
/// `ImageVma::flags`: the main stack (`[stack]`, grows down).
pub const IMG_STACK: u8 = 2;
/// `ImageVma::flags`: a kernel special mapping (`[vdso]`, `[vvar]`).
pub const IMG_SPECIAL: u8 = 4;

/// The address space a process has right after `execve`, before its first instruction:
/// the mappings, and the pages the kernel made present (arguments on the stack, bss zeroing).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Image {
    /// Mappings in address order.
    pub vmas: Vec<ImageVma>,
    /// Present pages: (page address, written). Written pages are anonymous (a private copy);
    /// the others are file or zero pages.
    pub pages: Vec<(u64, bool)>,
}

/// A folio of a file's page cache (`Event::Cache`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CachedFolio {
    /// Page index of its first page in the file (a multiple of `1 << order`).
    pub index: u64,
    /// Its order (at most [`MAX_CACHE_ORDER`]).
    pub order: u8,
    /// It carries `PG_readahead`: the access that reaches it starts the next asynchronous
    /// readahead window, and fault-around leaves it unmapped.
    pub readahead: bool,
}

impl CachedFolio {
    /// The page index after its last page.
    pub fn end(&self) -> u64 {
        self.index.saturating_add(1 << self.order.min(63))
    }

    /// Whether the reader takes it after a folio ending at page `end`: an order of at most
    /// [`MAX_CACHE_ORDER`], an index aligned to it, at or past `end`, and an end that does
    /// not overflow (the writer keeps only such folios).
    pub fn fits_after(&self, end: u64) -> bool {
        self.order <= MAX_CACHE_ORDER
            && self.index >= end
            && self.index.is_multiple_of(1 << self.order)
            && self.index.checked_add(1 << self.order).is_some()
    }
}

/// `Fork::flags`: the child shares the parent's address space (`CLONE_VM`, e.g. vfork).
pub const FORK_SHARES_VM: u8 = 1;

/// One recorded event. `pid` is always the thread-group id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// The root process exists (before its first exec).
    Spawn {
        /// Process.
        pid: u32,
    },
    /// `fork`/`clone`/`vfork` of a new process.
    Fork {
        /// Parent.
        parent: u32,
        /// Child.
        child: u32,
        /// [`FORK_SHARES_VM`].
        flags: u8,
    },
    /// `execve` succeeded: the process has a new address space, `image`.
    Exec {
        /// Process.
        pid: u32,
        /// The new address space.
        image: Image,
    },
    /// The process exited.
    Exit {
        /// Process.
        pid: u32,
    },
    /// A file that mappings refer to (defined before its first use).
    File {
        /// Id used by mappings.
        id: u32,
        /// Device (major << 20 | minor).
        dev: u64,
        /// Inode.
        ino: u64,
        /// Size in bytes at record time.
        size: u64,
        /// Path at record time.
        path: String,
    },
    /// The host's page cache of a file (of an earlier `File` event) when the recording first
    /// saw the file mapped: its cached folios, in index order, not overlapping.
    Cache {
        /// The file.
        file: u32,
        /// Its cached folios.
        folios: Vec<CachedFolio>,
    },
    /// `mmap`.
    Mmap {
        /// Process.
        pid: u32,
        /// Address argument.
        addr: u64,
        /// Length.
        len: u64,
        /// `PROT_*`.
        prot: u32,
        /// `MAP_*`.
        flags: u32,
        /// File descriptor argument.
        fd: i32,
        /// Offset argument (bytes).
        offset: u64,
        /// The mapped file, when it could be identified.
        file: Option<u32>,
        /// Result: the address, or `-errno`.
        ret: i64,
    },
    /// `munmap`.
    Munmap {
        /// Process.
        pid: u32,
        /// Address.
        addr: u64,
        /// Length.
        len: u64,
        /// 0 or `-errno`.
        ret: i64,
    },
    /// `mprotect`.
    Mprotect {
        /// Process.
        pid: u32,
        /// Address.
        addr: u64,
        /// Length.
        len: u64,
        /// `PROT_*`.
        prot: u32,
        /// 0 or `-errno`.
        ret: i64,
    },
    /// `mremap`.
    Mremap {
        /// Process.
        pid: u32,
        /// Old address.
        addr: u64,
        /// Old length.
        old_len: u64,
        /// New length.
        new_len: u64,
        /// `MREMAP_*`.
        flags: u32,
        /// New address argument (with `MREMAP_FIXED`).
        new_addr: u64,
        /// The new address, or `-errno`.
        ret: i64,
    },
    /// `brk`.
    Brk {
        /// Process.
        pid: u32,
        /// Requested break (0 queries).
        brk: u64,
        /// The break after the call.
        ret: i64,
    },
    /// `madvise`.
    Madvise {
        /// Process.
        pid: u32,
        /// Address.
        addr: u64,
        /// Length.
        len: u64,
        /// `MADV_*`.
        advice: u32,
        /// 0 or `-errno`.
        ret: i64,
    },
    /// `mlock` (flags 0) or `mlock2`.
    Mlock {
        /// Process.
        pid: u32,
        /// Address.
        addr: u64,
        /// Length.
        len: u64,
        /// `MLOCK_ONFAULT` (mlock2).
        flags: u32,
        /// 0 or `-errno`.
        ret: i64,
    },
    /// `munlock`.
    Munlock {
        /// Process.
        pid: u32,
        /// Address.
        addr: u64,
        /// Length.
        len: u64,
        /// 0 or `-errno`.
        ret: i64,
    },
    /// `mlockall`.
    Mlockall {
        /// Process.
        pid: u32,
        /// `MCL_*`.
        flags: u32,
        /// 0 or `-errno`.
        ret: i64,
    },
    /// `munlockall`.
    Munlockall {
        /// Process.
        pid: u32,
        /// 0 or `-errno`.
        ret: i64,
    },
    /// A page fault on a user address.
    Fault {
        /// Process.
        pid: u32,
        /// Page address (the faulting address rounded down to 4K).
        addr: u64,
        /// A write access.
        write: bool,
        /// Raised in user mode (else by the kernel, e.g. `copy_to_user`).
        user: bool,
    },
    /// The host answered a fault with a signal: the kernel sent the process `SIGSEGV` or
    /// `SIGBUS` for an access (a JVM's polling page and stack banging do this on purpose).
    /// It follows the fault it answers.
    Signal {
        /// Process.
        pid: u32,
        /// `SIGSEGV` (11) or `SIGBUS` (7).
        signo: u8,
        /// The faulting address (`si_addr`).
        addr: u64,
    },
    /// The process's memory when it exited (read at its exit, before its mm was torn down).
    Validate {
        /// Process.
        pid: u32,
        /// `RssAnon` (kB).
        rss_anon_kb: u64,
        /// `RssFile` (kB).
        rss_file_kb: u64,
        /// `AnonHugePages` of smaps_rollup (kB).
        anon_huge_kb: u64,
    },
    /// The kernel dropped this many records (ring buffer full): the trace is incomplete.
    Lost {
        /// Records lost.
        count: u64,
    },
}

/// Tag values (low 5 bits of the tag byte).
mod tag {
    pub const END: u8 = 0;
    pub const SPAWN: u8 = 1;
    pub const FORK: u8 = 2;
    pub const EXEC: u8 = 3;
    pub const EXIT: u8 = 4;
    pub const FILE: u8 = 5;
    pub const MMAP: u8 = 6;
    pub const MUNMAP: u8 = 7;
    pub const MPROTECT: u8 = 8;
    pub const MREMAP: u8 = 9;
    pub const BRK: u8 = 10;
    pub const MADVISE: u8 = 11;
    pub const MLOCK: u8 = 12;
    pub const MUNLOCK: u8 = 13;
    pub const MLOCKALL: u8 = 14;
    pub const MUNLOCKALL: u8 = 15;
    pub const FAULT_RU: u8 = 16;
    pub const FAULT_WU: u8 = 17;
    pub const FAULT_RK: u8 = 18;
    pub const FAULT_WK: u8 = 19;
    pub const VALIDATE: u8 = 20;
    pub const LOST: u8 = 21;
    pub const SIGNAL: u8 = 22;
    pub const CACHE: u8 = 23;
    /// Tag bit: same process as the previous event (no pid follows).
    pub const SAME_PID: u8 = 0x20;
    /// Tag bits that must be zero.
    pub const RESERVED: u8 = 0xc0;
}

impl Event {
    /// The process the event belongs to.
    pub fn pid(&self) -> Option<u32> {
        use Event::*;
        match *self {
            Spawn { pid }
            | Exec { pid, .. }
            | Exit { pid }
            | Mmap { pid, .. }
            | Munmap { pid, .. }
            | Mprotect { pid, .. }
            | Mremap { pid, .. }
            | Brk { pid, .. }
            | Madvise { pid, .. }
            | Mlock { pid, .. }
            | Munlock { pid, .. }
            | Mlockall { pid, .. }
            | Munlockall { pid, .. }
            | Fault { pid, .. }
            | Signal { pid, .. }
            | Validate { pid, .. } => Some(pid),
            Fork { parent, .. } => Some(parent),
            File { .. } | Cache { .. } | Lost { .. } => None,
        }
    }

    /// A short name of the kind of event (`stats`).
    pub fn kind(&self) -> &'static str {
        use Event::*;
        match self {
            Spawn { .. } => "spawn",
            Fork { .. } => "fork",
            Exec { .. } => "exec",
            Exit { .. } => "exit",
            File { .. } => "file",
            Cache { .. } => "cache",
            Mmap { .. } => "mmap",
            Munmap { .. } => "munmap",
            Mprotect { .. } => "mprotect",
            Mremap { .. } => "mremap",
            Brk { .. } => "brk",
            Madvise { .. } => "madvise",
            Mlock { .. } => "mlock",
            Munlock { .. } => "munlock",
            Mlockall { .. } => "mlockall",
            Munlockall { .. } => "munlockall",
            Fault {
                write: false,
                user: true,
                ..
            } => "fault-read-user",
            Fault {
                write: true,
                user: true,
                ..
            } => "fault-write-user",
            Fault {
                write: false,
                user: false,
                ..
            } => "fault-read-kernel",
            Fault {
                write: true,
                user: false,
                ..
            } => "fault-write-kernel",
            Signal { .. } => "signal",
            Validate { .. } => "validate",
            Lost { .. } => "lost",
        }
    }
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> (Header, Vec<Event>) {
        let h = Header {
            host: "h".into(),
            kernel: "6.18".into(),
            command: vec!["sh".into(), "-c".into(), "true".into()],
            policy: "top=never".into(),
            recorded_at: 1,
        };
        let ev = vec![
            Event::Spawn { pid: 10 },
            Event::File {
                id: 0,
                dev: 8 << 20 | 1,
                ino: 42,
                size: 8192,
                path: "/bin/sh".into(),
            },
            Event::Exec {
                pid: 10,
                image: Image {
                    vmas: vec![ImageVma {
                        start: 0x400000,
                        end: 0x402000,
                        prot: 5,
                        flags: 0,
                        file: Some(0),
                        offset: 0,
                    }],
                    pages: vec![(0x7ffff000, true), (0x400000, false)],
                },
            },
            Event::Fault {
                pid: 10,
                addr: 0x401000,
                write: false,
                user: true,
            },
            Event::Mmap {
                pid: 10,
                addr: 0,
                len: 4096,
                prot: 3,
                flags: 0x22,
                fd: -1,
                offset: 0,
                file: None,
                ret: -12,
            },
            Event::Exit { pid: 10 },
        ];
        (h, ev)
    }

    #[test]
    fn round_trip_and_truncation_is_an_error_with_offset() {
        let (h, ev) = sample();
        let bytes = write(&h, &ev).unwrap();
        let t = read(&bytes).unwrap();
        assert_eq!(t.header, h);
        assert_eq!(t.events, ev);
        // A payload cut anywhere before the end tag is an error naming an offset inside it.
        let mut w = Writer::new(&h);
        ev.iter().for_each(|e| w.push(e));
        let mut payload = w.buf.clone();
        payload.push(0);
        for cut in 0..payload.len() - 1 {
            match decode(&payload[..cut]) {
                Err(FormatError::Payload { offset, .. }) => assert!(offset <= cut as u64),
                other => panic!("cut at {cut}: {other:?}"),
            }
        }
        // A flipped magic byte or a future version is refused with the file offset.
        let mut bad = bytes.clone();
        bad[0] = b'X';
        assert!(matches!(
            read(&bad),
            Err(FormatError::File { offset: 0, .. })
        ));
        let mut bad = bytes;
        bad[8] = 9;
        assert!(matches!(
            read(&bad),
            Err(FormatError::File { offset: 8, .. })
        ));
    }
}
