//! The trace file format, version 1 (byte by byte in `docs/trace-format.md`).
//!
//! A file is a 12-byte preamble (`b"UMMTRACE"`, the version as u16 LE, reserved u16 0)
//! followed by one zstd frame. The decompressed payload is the [`Header`] and then the
//! [`Event`]s, each a tag byte and LEB128 varints, ended by the `End` tag. Fault addresses
//! are page numbers stored as the zigzag delta from the previous fault; an event names its
//! process only when it differs from the previous event's (tag bit `0x20`).
//!
//! The reader checks every length against a bound and never panics on malformed input: an
//! error names the byte offset, in the file (preamble, zstd frame) or in the decompressed
//! payload.

use crate::Budget;
use std::collections::HashSet;
use std::io::{BufRead, Read};
use std::path::Path;
use std::time::Instant;

/// The first 8 bytes of a trace file.
pub const MAGIC: &[u8; 8] = b"UMMTRACE";
/// The format version this crate writes and reads.
pub const VERSION: u16 = 1;
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
    /// A valid trace that asks for more than the reader's [`Budget`] (offset in the payload).
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
            | Validate { pid, .. } => Some(pid),
            Fork { parent, .. } => Some(parent),
            File { .. } | Lost { .. } => None,
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

/// Encodes events into a payload (then [`Writer::finish`] compresses it).
///
/// The writer never produces what the reader refuses: whatever the events hold, it writes
/// only what decodes with the format's bounds (not the reader's work [`Budget`], which a
/// user raises for a big trace). What does not fit is left out and counted
/// ([`Writer::dropped`]): arguments past the 1023rd (the last argument written then says how
/// many were dropped), VMAs past [`MAX_VMAS`] or with an empty or wrapping range, pages past
/// [`MAX_PAGES`], a reference to a file no `File` event defined (written as none: replayed as
/// anonymous), a second `File` event for an id, and every event that would take the payload
/// past [`MAX_PAYLOAD`] (those are written as one `Lost` event at the end).
#[derive(Debug, Default)]
pub struct Writer {
    buf: Vec<u8>,
    last_pid: Option<u32>,
    last_fault: u64,
    events: u64,
    files: std::collections::HashSet<u32>,
    dropped: u64,
    overflowed: u64,
}

/// Payload bytes kept free for the final `Lost` event and the end tag (tag, 10-byte varint,
/// end tag).
const PAYLOAD_RESERVE: u64 = 12;

impl Writer {
    /// A writer that starts with `header`.
    pub fn new(header: &Header) -> Writer {
        let mut w = Writer::default();
        w.string(&header.host);
        w.string(&header.kernel);
        let max = MAX_ARGS as usize;
        if header.command.len() > max {
            // The reader takes at most MAX_ARGS strings: keep the first MAX_ARGS − 1 and say
            // in the last how many were left out (a recording of `xargs`-sized command lines
            // must still be readable; the trace never re-runs the command).
            let extra = header.command.len() - (max - 1);
            w.varint(MAX_ARGS);
            for a in &header.command[..max - 1] {
                w.string(a);
            }
            w.string(&format!("[{extra} more arguments not recorded]"));
            w.dropped += extra as u64;
        } else {
            w.varint(header.command.len() as u64);
            for a in &header.command {
                w.string(a);
            }
        }
        w.string(&header.policy);
        w.varint(header.recorded_at);
        w
    }

    /// Fields and events left out because the format could not hold them (see [`Writer`]).
    pub fn dropped(&self) -> u64 {
        self.dropped.saturating_add(self.overflowed)
    }

    fn file_ref(&mut self, f: Option<u32>) {
        match f {
            Some(f) if self.files.contains(&f) => self.varint(f as u64 + 1),
            Some(_) => {
                self.dropped += 1;
                self.varint(0);
            }
            None => self.varint(0),
        }
    }

    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.buf.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.buf.push(v as u8);
    }

    fn signed(&mut self, v: i64) {
        self.varint(zigzag(v));
    }

    fn string(&mut self, s: &str) {
        let b = s.as_bytes();
        let b = &b[..b.len().min(MAX_STRING as usize)];
        // Cut at a character boundary so the reader gets valid UTF-8.
        let cut = std::str::from_utf8(b)
            .map(str::len)
            .unwrap_or_else(|e| e.valid_up_to());
        self.varint(cut as u64);
        self.buf.extend_from_slice(&b[..cut]);
    }

    fn tag(&mut self, t: u8, pid: Option<u32>) {
        match pid {
            Some(p) if self.last_pid == Some(p) => self.buf.push(t | tag::SAME_PID),
            Some(p) => {
                self.buf.push(t);
                self.varint(p as u64);
                self.last_pid = Some(p);
            }
            None => self.buf.push(t),
        }
    }

    /// Events written so far.
    pub fn events(&self) -> u64 {
        self.events
    }

    /// Appends one event (or counts it as dropped, see [`Writer`]).
    pub fn push(&mut self, e: &Event) {
        if self.overflowed > 0 {
            // Once one event did not fit, later ones are lost too: a trace with a hole in
            // the middle would replay wrongly.
            self.overflowed += 1;
            return;
        }
        let (len, pid, fault, dropped) =
            (self.buf.len(), self.last_pid, self.last_fault, self.dropped);
        let new_file = match e {
            Event::File { id, .. } => Some(*id),
            _ => None,
        };
        self.encode(e);
        if self.buf.len() as u64 > MAX_PAYLOAD - PAYLOAD_RESERVE {
            self.buf.truncate(len);
            (self.last_pid, self.last_fault, self.dropped) = (pid, fault, dropped);
            if let Some(id) = new_file {
                self.files.remove(&id);
            }
            self.overflowed = 1;
            return;
        }
        self.events += 1;
    }

    fn encode(&mut self, e: &Event) {
        use Event::*;
        match e {
            Spawn { pid } => self.tag(tag::SPAWN, Some(*pid)),
            Fork {
                parent,
                child,
                flags,
            } => {
                self.tag(tag::FORK, Some(*parent));
                self.varint(*child as u64);
                self.varint(*flags as u64);
            }
            Exec { pid, image } => {
                self.tag(tag::EXEC, Some(*pid));
                let vmas: Vec<&ImageVma> = image
                    .vmas
                    .iter()
                    .filter(|v| v.end > v.start)
                    .take(MAX_VMAS as usize)
                    .collect();
                self.dropped += (image.vmas.len() - vmas.len()) as u64;
                self.varint(vmas.len() as u64);
                let mut prev = 0u64;
                for v in vmas {
                    self.signed(v.start.wrapping_sub(prev) as i64);
                    self.varint(v.end - v.start);
                    self.varint(v.prot as u64);
                    self.varint(v.flags as u64);
                    self.file_ref(v.file);
                    self.varint(v.offset);
                    prev = v.end;
                }
                let n = image.pages.len().min(MAX_PAGES as usize);
                self.dropped += (image.pages.len() - n) as u64;
                self.varint(n as u64);
                let mut prev = 0u64;
                for &(a, w) in &image.pages[..n] {
                    let page = a >> 12;
                    self.varint(zigzag(page.wrapping_sub(prev) as i64) << 1 | w as u64);
                    prev = page;
                }
            }
            Exit { pid } => self.tag(tag::EXIT, Some(*pid)),
            File {
                id,
                dev,
                ino,
                size,
                path,
            } => {
                if !self.files.insert(*id) {
                    // The first definition stands (the reader refuses a second one).
                    self.dropped += 1;
                    return;
                }
                self.tag(tag::FILE, None);
                self.varint(*id as u64);
                self.varint(*dev);
                self.varint(*ino);
                self.varint(*size);
                self.string(path);
            }
            Mmap {
                pid,
                addr,
                len,
                prot,
                flags,
                fd,
                offset,
                file,
                ret,
            } => {
                self.tag(tag::MMAP, Some(*pid));
                self.varint(*addr);
                self.varint(*len);
                self.varint(*prot as u64);
                self.varint(*flags as u64);
                self.signed(*fd as i64);
                self.varint(*offset);
                self.file_ref(*file);
                self.signed(*ret);
            }
            Munmap {
                pid,
                addr,
                len,
                ret,
            } => {
                self.tag(tag::MUNMAP, Some(*pid));
                self.varint(*addr);
                self.varint(*len);
                self.signed(*ret);
            }
            Mprotect {
                pid,
                addr,
                len,
                prot,
                ret,
            } => {
                self.tag(tag::MPROTECT, Some(*pid));
                self.varint(*addr);
                self.varint(*len);
                self.varint(*prot as u64);
                self.signed(*ret);
            }
            Mremap {
                pid,
                addr,
                old_len,
                new_len,
                flags,
                new_addr,
                ret,
            } => {
                self.tag(tag::MREMAP, Some(*pid));
                self.varint(*addr);
                self.varint(*old_len);
                self.varint(*new_len);
                self.varint(*flags as u64);
                self.varint(*new_addr);
                self.signed(*ret);
            }
            Brk { pid, brk, ret } => {
                self.tag(tag::BRK, Some(*pid));
                self.varint(*brk);
                self.signed(*ret);
            }
            Madvise {
                pid,
                addr,
                len,
                advice,
                ret,
            } => {
                self.tag(tag::MADVISE, Some(*pid));
                self.varint(*addr);
                self.varint(*len);
                self.varint(*advice as u64);
                self.signed(*ret);
            }
            Mlock {
                pid,
                addr,
                len,
                flags,
                ret,
            } => {
                self.tag(tag::MLOCK, Some(*pid));
                self.varint(*addr);
                self.varint(*len);
                self.varint(*flags as u64);
                self.signed(*ret);
            }
            Munlock {
                pid,
                addr,
                len,
                ret,
            } => {
                self.tag(tag::MUNLOCK, Some(*pid));
                self.varint(*addr);
                self.varint(*len);
                self.signed(*ret);
            }
            Mlockall { pid, flags, ret } => {
                self.tag(tag::MLOCKALL, Some(*pid));
                self.varint(*flags as u64);
                self.signed(*ret);
            }
            Munlockall { pid, ret } => {
                self.tag(tag::MUNLOCKALL, Some(*pid));
                self.signed(*ret);
            }
            Fault {
                pid,
                addr,
                write,
                user,
            } => {
                let t = match (*write, *user) {
                    (false, true) => tag::FAULT_RU,
                    (true, true) => tag::FAULT_WU,
                    (false, false) => tag::FAULT_RK,
                    (true, false) => tag::FAULT_WK,
                };
                self.tag(t, Some(*pid));
                let page = addr >> 12;
                self.signed(page.wrapping_sub(self.last_fault) as i64);
                self.last_fault = page;
            }
            Validate {
                pid,
                rss_anon_kb,
                rss_file_kb,
                anon_huge_kb,
            } => {
                self.tag(tag::VALIDATE, Some(*pid));
                self.varint(*rss_anon_kb);
                self.varint(*rss_file_kb);
                self.varint(*anon_huge_kb);
            }
            Lost { count } => {
                self.tag(tag::LOST, None);
                self.varint(*count);
            }
        }
    }

    /// Uncompressed payload bytes so far.
    pub fn payload_len(&self) -> usize {
        self.buf.len()
    }

    /// Ends the stream and returns the file bytes (preamble + zstd frame).
    pub fn finish(mut self) -> std::io::Result<Vec<u8>> {
        if self.overflowed > 0 {
            // Room was kept for this (PAYLOAD_RESERVE): the trace says it is incomplete.
            let n = self.overflowed;
            self.tag(tag::LOST, None);
            self.varint(n);
        }
        self.buf.push(tag::END);
        seal(&self.buf)
    }
}

/// The file bytes (preamble and zstd frame) of a payload, as [`Writer::finish`] writes them.
/// Public so that tests and tools can build a file from a payload of their own, valid or not.
pub fn seal(payload: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(payload.len() / 4 + PREAMBLE);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    let z = zstd::bulk::compress(payload, ZSTD_LEVEL)?;
    out.extend_from_slice(&z);
    Ok(out)
}

/// A decoded trace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Trace {
    /// The header.
    pub header: Header,
    /// Every event, in order.
    pub events: Vec<Event>,
    /// Size of the file (bytes).
    pub file_bytes: u64,
    /// Size of the decompressed payload (bytes).
    pub payload_bytes: u64,
}

/// Largest zstd window the reader accepts, log2 (16 MiB). The decoder's memory is about
/// its window, which a frame header chooses; the writer's level 19 uses at most 2²³, and
/// zstd's own reader default (2²⁷) would let a 100-byte file make every reader allocate
/// 128 MiB.
pub const MAX_WINDOW_LOG: u32 = 24;

/// Payload bytes read through one buffer (the zstd decoder's output is read in chunks).
const READ_BUFFER: usize = 64 << 10;

/// Reads the decompressed payload byte by byte, knowing its offset.
struct Cursor<R> {
    r: R,
    at: u64,
    /// Size of the compressed file, when the payload comes out of one (errors of the zstd
    /// frame name the file's bytes).
    compressed: Option<u64>,
}

impl<R: BufRead> Cursor<R> {
    fn err(&self, at: u64, what: impl Into<String>) -> FormatError {
        FormatError::Payload {
            offset: at,
            what: what.into(),
        }
    }

    fn io(&self, e: &std::io::Error) -> FormatError {
        match self.compressed {
            Some(n) => FormatError::File {
                offset: PREAMBLE as u64,
                what: format!("zstd frame (compressed bytes {PREAMBLE}..{n}): {e}"),
            },
            None => self.err(self.at, format!("read: {e}")),
        }
    }

    /// The next byte, `None` at the end of the payload.
    fn peek(&mut self) -> Result<Option<u8>, FormatError> {
        loop {
            match self.r.fill_buf() {
                Ok(b) => return Ok(b.first().copied()),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.io(&e)),
            }
        }
    }

    fn byte(&mut self) -> Result<u8, FormatError> {
        if self.at >= MAX_PAYLOAD {
            return Err(FormatError::File {
                offset: PREAMBLE as u64,
                what: "decompressed payload larger than 1 GiB".into(),
            });
        }
        let v = self
            .peek()?
            .ok_or_else(|| self.err(self.at, "truncated: end of payload inside an event"))?;
        self.r.consume(1);
        self.at += 1;
        Ok(v)
    }

    fn varint(&mut self) -> Result<u64, FormatError> {
        let start = self.at;
        let mut v = 0u64;
        for i in 0..10 {
            let b = self.byte()?;
            if i == 9 && b > 1 {
                return Err(self.err(start, "varint longer than 64 bits"));
            }
            v |= ((b & 0x7f) as u64) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(self.err(start, "varint longer than 10 bytes"))
    }

    fn bounded(&mut self, max: u64, what: &str) -> Result<u64, FormatError> {
        let at = self.at;
        let v = self.varint()?;
        if v > max {
            return Err(self.err(at, format!("{what} {v} exceeds the bound {max}")));
        }
        Ok(v)
    }

    fn u32(&mut self, what: &str) -> Result<u32, FormatError> {
        Ok(self.bounded(u32::MAX as u64, what)? as u32)
    }

    fn u8(&mut self, what: &str) -> Result<u8, FormatError> {
        Ok(self.bounded(u8::MAX as u64, what)? as u8)
    }

    fn signed(&mut self) -> Result<i64, FormatError> {
        Ok(unzigzag(self.varint()?))
    }

    fn string(&mut self) -> Result<String, FormatError> {
        let n = self.bounded(MAX_STRING, "string length")? as usize;
        let at = self.at;
        let mut b = Vec::with_capacity(n);
        for _ in 0..n {
            match self.byte() {
                Ok(v) => b.push(v),
                Err(FormatError::Payload { .. }) => {
                    return Err(self.err(at, format!("truncated: string of {n} bytes")))
                }
                Err(e) => return Err(e),
            }
        }
        String::from_utf8(b).map_err(|e| {
            self.err(
                at + e.utf8_error().valid_up_to() as u64,
                "string is not UTF-8",
            )
        })
    }
}

/// A streaming reader of a trace: the header, then one event at a time, in bounded memory
/// (a 16 MiB zstd window, one event, the set of defined file ids) and within a [`Budget`]
/// of events, exec-image pages and seconds. Every command that reads a trace reads it
/// through this; [`read`] collects it into a [`Trace`].
///
/// Besides the format's bounds it refuses what no recording can produce and no consumer
/// could agree on: a file reference (exec image or mmap) to a file id no earlier `File`
/// event defined, and a second `File` event for one id.
pub struct Decoder<R> {
    c: Cursor<R>,
    header: Header,
    budget: Budget,
    deadline: Option<Instant>,
    last_pid: Option<u32>,
    last_fault: u64,
    files: HashSet<u32>,
    events: u64,
    image_pages: u64,
    event_at: u64,
    file_bytes: u64,
    done: bool,
}

fn ferr(offset: u64, what: impl Into<String>) -> FormatError {
    FormatError::File {
        offset,
        what: what.into(),
    }
}

/// Checks the 12-byte preamble.
fn preamble(r: &mut impl Read) -> Result<(), FormatError> {
    let mut p = [0u8; PREAMBLE];
    let mut n = 0;
    while n < PREAMBLE {
        match r.read(&mut p[n..]) {
            Ok(0) => {
                return Err(ferr(
                    n as u64,
                    "truncated: shorter than the 12-byte preamble",
                ))
            }
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(ferr(n as u64, format!("read: {e}"))),
        }
    }
    if &p[..8] != MAGIC {
        return Err(ferr(0, "not a usermm trace (bad magic)"));
    }
    let version = u16::from_le_bytes([p[8], p[9]]);
    if version != VERSION {
        return Err(ferr(
            8,
            format!("version {version} (this reader knows version {VERSION})"),
        ));
    }
    if p[10..12] != [0, 0] {
        return Err(ferr(10, "reserved preamble bytes are not zero"));
    }
    Ok(())
}

/// The payload of a compressed stream (after the preamble): a zstd decoder with the
/// bounded window, read through a buffer.
fn unzstd<'a, R: BufRead + 'a>(r: R) -> Result<impl BufRead + 'a, FormatError> {
    let mut dec = zstd::stream::read::Decoder::with_buffer(r)
        .map_err(|e| ferr(PREAMBLE as u64, format!("zstd: {e}")))?;
    dec.window_log_max(MAX_WINDOW_LOG)
        .map_err(|e| ferr(PREAMBLE as u64, format!("zstd: {e}")))?;
    Ok(std::io::BufReader::with_capacity(READ_BUFFER, dec))
}

impl<'a> Decoder<Box<dyn BufRead + 'a>> {
    /// A decoder of a trace file's bytes.
    pub fn from_bytes(bytes: &'a [u8], budget: &Budget) -> Result<Self, FormatError> {
        let mut r = bytes;
        preamble(&mut r)?;
        let payload: Box<dyn BufRead + 'a> = Box::new(unzstd(r)?);
        let mut d = Decoder::start(payload, Some(bytes.len() as u64), budget)?;
        d.file_bytes = bytes.len() as u64;
        Ok(d)
    }
}

impl Decoder<Box<dyn BufRead>> {
    /// A decoder of the trace file at `path`, read as it is decoded (never whole).
    pub fn open(path: &Path, budget: &Budget) -> Result<Self, ReadError> {
        let io = |e| ReadError::Io(path.to_path_buf(), e);
        let f = std::fs::File::open(path).map_err(io)?;
        let len = f.metadata().map_err(io)?.len();
        let mut r = std::io::BufReader::with_capacity(READ_BUFFER, f);
        let fmt = |e| ReadError::Format(path.to_path_buf(), e);
        preamble(&mut r).map_err(fmt)?;
        let payload: Box<dyn BufRead> = Box::new(unzstd(r).map_err(fmt)?);
        let mut d = Decoder::start(payload, Some(len), budget).map_err(fmt)?;
        d.file_bytes = len;
        Ok(d)
    }
}

impl<R: BufRead> Decoder<R> {
    /// A decoder of a decompressed payload (`&[u8]` is one).
    pub fn from_payload(payload: R, budget: &Budget) -> Result<Self, FormatError> {
        Decoder::start(payload, None, budget)
    }

    fn start(r: R, compressed: Option<u64>, budget: &Budget) -> Result<Self, FormatError> {
        let mut c = Cursor {
            r,
            at: 0,
            compressed,
        };
        let host = c.string()?;
        let kernel = c.string()?;
        let n = c.bounded(MAX_ARGS, "argument count")?;
        let mut command = Vec::new();
        for _ in 0..n {
            command.push(c.string()?);
        }
        let policy = c.string()?;
        let recorded_at = c.varint()?;
        Ok(Decoder {
            c,
            header: Header {
                host,
                kernel,
                command,
                policy,
                recorded_at,
            },
            budget: budget.clone(),
            deadline: budget.deadline(),
            last_pid: None,
            last_fault: 0,
            files: HashSet::new(),
            events: 0,
            image_pages: 0,
            event_at: 0,
            file_bytes: 0,
            done: false,
        })
    }

    /// The header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// Payload offset of the last event returned (its tag byte).
    pub fn offset(&self) -> u64 {
        self.event_at
    }

    /// Payload bytes read so far (all of them once the end tag was read).
    pub fn payload_bytes(&self) -> u64 {
        self.c.at
    }

    /// Size of the file (0 for a payload given as such).
    pub fn file_bytes(&self) -> u64 {
        self.file_bytes
    }

    /// Events returned so far.
    pub fn events(&self) -> u64 {
        self.events
    }

    fn over(&self, at: u64, what: String) -> FormatError {
        FormatError::Budget { offset: at, what }
    }

    fn file_ref(&mut self) -> Result<Option<u32>, FormatError> {
        let at = self.c.at;
        match self.c.u32("file id")? {
            0 => Ok(None),
            f if self.files.contains(&(f - 1)) => Ok(Some(f - 1)),
            f => Err(self.c.err(
                at,
                format!("file id {} is used before a FILE event defines it", f - 1),
            )),
        }
    }

    /// The next event; `None` after the end tag. An error ends the stream.
    pub fn next_event(&mut self) -> Result<Option<Event>, FormatError> {
        if self.done {
            return Ok(None);
        }
        let r = self.decode_one();
        if !matches!(r, Ok(Some(_))) {
            self.done = true;
        }
        r
    }

    fn decode_one(&mut self) -> Result<Option<Event>, FormatError> {
        let c = &mut self.c;
        let at = c.at;
        let t = c.byte()?;
        if t & tag::RESERVED != 0 {
            return Err(c.err(at, format!("tag {t:#04x} has reserved bits set")));
        }
        let kind = t & 0x1f;
        if kind == tag::END {
            if t & tag::SAME_PID != 0 {
                return Err(c.err(at, "end tag with the same-process bit"));
            }
            if c.peek()?.is_some() {
                return Err(c.err(c.at, "bytes after the end tag"));
            }
            return Ok(None);
        }
        if self.events >= self.budget.max_events {
            return Err(self.over(
                at,
                format!(
                    "more than {} events: over the budget (--max-events)",
                    self.budget.max_events
                ),
            ));
        }
        if self.events.is_multiple_of(1024) && self.deadline.is_some_and(|d| Instant::now() > d) {
            return Err(self.over(
                at,
                format!(
                    "decoding took more than {} s: over the budget (--max-seconds)",
                    self.budget.max_seconds
                ),
            ));
        }
        let c = &mut self.c;
        let has_pid = !matches!(kind, tag::FILE | tag::LOST);
        let pid = if !has_pid {
            if t & tag::SAME_PID != 0 {
                return Err(c.err(at, "same-process bit on an event without a process"));
            }
            0
        } else if t & tag::SAME_PID != 0 {
            self.last_pid
                .ok_or_else(|| c.err(at, "same-process bit on the first event"))?
        } else {
            let p = c.u32("pid")?;
            self.last_pid = Some(p);
            p
        };
        let e = match kind {
            tag::SPAWN => Event::Spawn { pid },
            tag::FORK => Event::Fork {
                parent: pid,
                child: c.u32("child pid")?,
                flags: c.u8("fork flags")?,
            },
            tag::EXEC => {
                let n = c.bounded(MAX_VMAS, "VMA count")?;
                let mut vmas = Vec::new();
                let mut prev = 0u64;
                for _ in 0..n {
                    let c = &mut self.c;
                    let vat = c.at;
                    let start = prev.wrapping_add(c.signed()? as u64);
                    let len = c.varint()?;
                    let end = start
                        .checked_add(len)
                        .filter(|_| len > 0)
                        .ok_or_else(|| c.err(vat, "VMA with an empty or wrapping range"))?;
                    let prot = c.u8("prot")?;
                    let flags = c.u8("VMA flags")?;
                    let file = self.file_ref()?;
                    let offset = self.c.varint()?;
                    vmas.push(ImageVma {
                        start,
                        end,
                        prot,
                        flags,
                        file,
                        offset,
                    });
                    prev = end;
                }
                let c = &mut self.c;
                let pat = c.at;
                let n = c.bounded(MAX_PAGES, "page count")?;
                let left = self.budget.max_image_pages.saturating_sub(self.image_pages);
                if n > left {
                    return Err(self.over(
                        pat,
                        format!(
                            "{n} exec-image pages: over the budget of {} in all (--max-image-pages)",
                            self.budget.max_image_pages
                        ),
                    ));
                }
                self.image_pages += n;
                let c = &mut self.c;
                let mut pages = Vec::new();
                let mut prev = 0u64;
                for _ in 0..n {
                    let v = c.varint()?;
                    let page = prev.wrapping_add(unzigzag(v >> 1) as u64);
                    pages.push((page.wrapping_shl(12), v & 1 != 0));
                    prev = page;
                }
                Event::Exec {
                    pid,
                    image: Image { vmas, pages },
                }
            }
            tag::EXIT => Event::Exit { pid },
            tag::FILE => {
                let iat = c.at;
                let id = c.u32("file id")?;
                if !self.files.insert(id) {
                    return Err(c.err(iat, format!("file id {id} defined twice")));
                }
                Event::File {
                    id,
                    dev: c.varint()?,
                    ino: c.varint()?,
                    size: c.varint()?,
                    path: c.string()?,
                }
            }
            tag::MMAP => {
                let (addr, len) = (c.varint()?, c.varint()?);
                let (prot, flags) = (c.u32("prot")?, c.u32("flags")?);
                let fat = c.at;
                let v = c.signed()?;
                let fd =
                    i32::try_from(v).map_err(|_| c.err(fat, format!("fd {v} out of range")))?;
                let offset = c.varint()?;
                let file = self.file_ref()?;
                Event::Mmap {
                    pid,
                    addr,
                    len,
                    prot,
                    flags,
                    fd,
                    offset,
                    file,
                    ret: self.c.signed()?,
                }
            }
            tag::MUNMAP => Event::Munmap {
                pid,
                addr: c.varint()?,
                len: c.varint()?,
                ret: c.signed()?,
            },
            tag::MPROTECT => Event::Mprotect {
                pid,
                addr: c.varint()?,
                len: c.varint()?,
                prot: c.u32("prot")?,
                ret: c.signed()?,
            },
            tag::MREMAP => Event::Mremap {
                pid,
                addr: c.varint()?,
                old_len: c.varint()?,
                new_len: c.varint()?,
                flags: c.u32("flags")?,
                new_addr: c.varint()?,
                ret: c.signed()?,
            },
            tag::BRK => Event::Brk {
                pid,
                brk: c.varint()?,
                ret: c.signed()?,
            },
            tag::MADVISE => Event::Madvise {
                pid,
                addr: c.varint()?,
                len: c.varint()?,
                advice: c.u32("advice")?,
                ret: c.signed()?,
            },
            tag::MLOCK => Event::Mlock {
                pid,
                addr: c.varint()?,
                len: c.varint()?,
                flags: c.u32("flags")?,
                ret: c.signed()?,
            },
            tag::MUNLOCK => Event::Munlock {
                pid,
                addr: c.varint()?,
                len: c.varint()?,
                ret: c.signed()?,
            },
            tag::MLOCKALL => Event::Mlockall {
                pid,
                flags: c.u32("flags")?,
                ret: c.signed()?,
            },
            tag::MUNLOCKALL => Event::Munlockall {
                pid,
                ret: c.signed()?,
            },
            tag::FAULT_RU | tag::FAULT_WU | tag::FAULT_RK | tag::FAULT_WK => {
                let page = self.last_fault.wrapping_add(c.signed()? as u64);
                self.last_fault = page;
                Event::Fault {
                    pid,
                    addr: page.wrapping_shl(12),
                    write: matches!(kind, tag::FAULT_WU | tag::FAULT_WK),
                    user: matches!(kind, tag::FAULT_RU | tag::FAULT_WU),
                }
            }
            tag::VALIDATE => Event::Validate {
                pid,
                rss_anon_kb: c.varint()?,
                rss_file_kb: c.varint()?,
                anon_huge_kb: c.varint()?,
            },
            tag::LOST => Event::Lost { count: c.varint()? },
            k => return Err(c.err(at, format!("unknown event tag {k}"))),
        };
        self.events += 1;
        self.event_at = at;
        Ok(Some(e))
    }

    /// Every remaining event, collected (bounded by the budget's event count).
    pub fn collect_trace(mut self) -> Result<Trace, FormatError> {
        let mut events = Vec::new();
        while let Some(e) = self.next_event()? {
            events.push(e);
        }
        Ok(Trace {
            payload_bytes: self.c.at,
            file_bytes: self.file_bytes,
            header: self.header,
            events,
        })
    }
}

impl<R> std::fmt::Debug for Decoder<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decoder")
            .field("header", &self.header)
            .field("at", &self.c.at)
            .field("events", &self.events)
            .finish_non_exhaustive()
    }
}

impl<R: BufRead> Iterator for Decoder<R> {
    type Item = Result<Event, FormatError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_event().transpose()
    }
}

/// Reads a trace file's bytes, within the default [`Budget`].
pub fn read(bytes: &[u8]) -> Result<Trace, FormatError> {
    read_with(bytes, &Budget::default())
}

/// Reads a trace file's bytes within `budget`.
pub fn read_with(bytes: &[u8], budget: &Budget) -> Result<Trace, FormatError> {
    Decoder::from_bytes(bytes, budget)?.collect_trace()
}

/// An error opening a trace file.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// It could not be read.
    #[error("{0}: {1}")]
    Io(std::path::PathBuf, std::io::Error),
    /// It is not a valid trace.
    #[error("{0}: {1}")]
    Format(std::path::PathBuf, FormatError),
}

/// Reads a trace file within the default [`Budget`].
pub fn read_file(path: &Path) -> Result<Trace, ReadError> {
    read_file_with(path, &Budget::default())
}

/// Reads a trace file within `budget` (streamed: the file is never held whole).
pub fn read_file_with(path: &Path, budget: &Budget) -> Result<Trace, ReadError> {
    Decoder::open(path, budget)?
        .collect_trace()
        .map_err(|e| ReadError::Format(path.to_path_buf(), e))
}

/// Decodes a decompressed payload within the default [`Budget`].
pub fn decode(payload: &[u8]) -> Result<Trace, FormatError> {
    decode_with(payload, &Budget::default())
}

/// Decodes a decompressed payload within `budget`.
pub fn decode_with(payload: &[u8], budget: &Budget) -> Result<Trace, FormatError> {
    Decoder::from_payload(payload, budget)?.collect_trace()
}

/// Encodes a whole trace (header and events) into file bytes.
pub fn write(header: &Header, events: &[Event]) -> std::io::Result<Vec<u8>> {
    write_counted(header, events).map(|(bytes, _)| bytes)
}

/// Encodes a whole trace, and says how much the writer had to leave out
/// ([`Writer::dropped`]: arguments, VMAs, pages, file references, events), for a recorder to
/// report.
pub fn write_counted(header: &Header, events: &[Event]) -> std::io::Result<(Vec<u8>, u64)> {
    let mut w = Writer::new(header);
    for e in events {
        w.push(e);
    }
    let dropped = w.dropped();
    Ok((w.finish()?, dropped))
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
