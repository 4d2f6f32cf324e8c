//! The trace file format, version 1 (byte by byte in `docs/trace-format.md`).
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

pub use decode::*;

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

/// Encodes events into a payload (then [`Writer::finish`] compresses it).
///
/// The writer never produces what the reader refuses: whatever the events hold, it writes
/// only what decodes with the format's bounds (not the reader's work [`Budget`](crate::Budget), which a
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
            Signal { pid, signo, addr } => {
                self.tag(tag::SIGNAL, Some(*pid));
                self.varint(*signo as u64);
                self.varint(*addr);
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
    let mut c = zstd::bulk::Compressor::new(ZSTD_LEVEL)?;
    // The frame carries the payload's checksum (XXH64), which the reader requires: without
    // it 7-9 % of single flipped bytes of a compressed trace decoded to another valid trace.
    c.set_parameter(zstd::zstd_safe::CParameter::ChecksumFlag(true))?;
    out.extend_from_slice(&c.compress(payload)?);
    Ok(out)
}

/// The file bytes of a trace written before traces carried a checksum, with one: its payload
/// streamed from the old frame (within the reader's bounds: [`MAX_PAYLOAD`], the zstd
/// window) into a new one with a checksum ([`ZSTD_LEVEL`]), never held whole, then read back
/// as any trace is (a file that is no trace is refused, not sealed). A trace with a checksum
/// is checked and sealed again too.
pub fn reseal(bytes: &[u8], budget: &crate::Budget) -> Result<Vec<u8>, FormatError> {
    let frame = |what: &str, e: std::io::Error| FormatError::File {
        offset: PREAMBLE as u64,
        what: format!("{what}: {e}"),
    };
    let mut r = bytes;
    decode::preamble(&mut r)?;
    let mut dec = decode::zstd_decoder(r)?;
    let mut out = bytes[..PREAMBLE].to_vec();
    let mut enc =
        zstd::stream::write::Encoder::new(&mut out, ZSTD_LEVEL).map_err(|e| frame("zstd", e))?;
    enc.set_parameter(zstd::zstd_safe::CParameter::ChecksumFlag(true))
        .map_err(|e| frame("zstd", e))?;
    let n = std::io::copy(
        &mut std::io::Read::take(&mut dec, MAX_PAYLOAD + 1),
        &mut enc,
    )
    .map_err(|e| frame("zstd frame", e))?;
    if n > MAX_PAYLOAD {
        return Err(FormatError::File {
            offset: PREAMBLE as u64,
            what: "decompressed payload larger than 1 GiB".into(),
        });
    }
    enc.finish().map_err(|e| frame("zstd", e))?;
    {
        let mut d = Decoder::from_bytes(&out, budget)?;
        while d.next_event()?.is_some() {}
    }
    Ok(out)
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
