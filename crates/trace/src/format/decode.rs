//! Reading the trace format: the preamble, the zstd frame under a window bound, and the
//! streaming [`Decoder`] that checks every length against its bound and the reader's
//! [`Budget`], naming the byte offset of whatever is malformed.

use super::*;
use crate::Budget;
use std::collections::HashSet;
use std::io::{BufRead, Read};
use std::path::Path;
use std::time::Instant;

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
pub(crate) fn preamble(r: &mut impl Read) -> Result<(), FormatError> {
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
    if !(MIN_VERSION..=VERSION).contains(&version) {
        return Err(ferr(
            8,
            format!("version {version} (this reader knows versions {MIN_VERSION} to {VERSION})"),
        ));
    }
    if p[10..12] != [0, 0] {
        return Err(ferr(10, "reserved preamble bytes are not zero"));
    }
    Ok(())
}

/// The zstd frame magic number, as stored (little-endian 0xFD2FB528).
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

/// The payload of a compressed stream (after the preamble): a zstd decoder with the
/// bounded window, read through a buffer.
fn unzstd<'a, R: BufRead + 'a>(mut r: R) -> Result<impl BufRead + 'a, FormatError> {
    // The frame header (RFC 8878 §3.1.1): the magic number, then the descriptor, whose bit 2
    // says the frame ends with a checksum of its content, which the decoder then verifies
    // when it reaches the end of the frame (the end tag's look past itself).
    let head = loop {
        match r.fill_buf() {
            Ok(b) => break b,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(ferr(PREAMBLE as u64, format!("read: {e}"))),
        }
    };
    if head.len() < 5 || head[..4] != ZSTD_MAGIC {
        return Err(ferr(PREAMBLE as u64, "not a zstd frame (bad magic)"));
    }
    if head[4] & 0x04 == 0 {
        return Err(ferr(
            PREAMBLE as u64 + 4,
            "the zstd frame has no content checksum (a trace written before traces were \
             checked: `usermm trace reseal` adds one)",
        ));
    }
    Ok(std::io::BufReader::with_capacity(
        READ_BUFFER,
        zstd_decoder(r)?,
    ))
}

/// A zstd decoder of the frame in `r` whose window may not pass [`MAX_WINDOW_LOG`]
/// (whatever the frame header asks, the decoder's memory stays bounded).
pub(crate) fn zstd_decoder<'a, R: BufRead + 'a>(
    r: R,
) -> Result<zstd::stream::read::Decoder<'a, R>, FormatError> {
    let mut dec = zstd::stream::read::Decoder::with_buffer(r)
        .map_err(|e| ferr(PREAMBLE as u64, format!("zstd: {e}")))?;
    dec.window_log_max(MAX_WINDOW_LOG)
        .map_err(|e| ferr(PREAMBLE as u64, format!("zstd: {e}")))?;
    Ok(dec)
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
        let has_pid = !matches!(kind, tag::FILE | tag::CACHE | tag::LOST);
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
            tag::CACHE => {
                let fat = c.at;
                let file = c.u32("file id")?;
                if !self.files.contains(&file) {
                    return Err(c.err(
                        fat,
                        format!("file id {file} is used before a FILE event defines it"),
                    ));
                }
                let nat = c.at;
                let n = c.bounded(MAX_CACHE_FOLIOS, "cached folio count")?;
                // Held in memory like an exec image's pages: the same budget.
                let left = self.budget.max_image_pages.saturating_sub(self.image_pages);
                if n > left {
                    return Err(self.over(
                        nat,
                        format!(
                            "{n} cached folios: over the budget of {} exec-image pages and cached folios in all (--max-image-pages)",
                            self.budget.max_image_pages
                        ),
                    ));
                }
                self.image_pages += n;
                let c = &mut self.c;
                let mut folios = Vec::new();
                let mut end = 0u64;
                for _ in 0..n {
                    let at = c.at;
                    let gap = c.varint()?;
                    let b = c.byte()?;
                    let (order, readahead) = (b & 0x7f, b & 0x80 != 0);
                    if order > MAX_CACHE_ORDER {
                        return Err(
                            c.err(at, format!("folio order {order} above {MAX_CACHE_ORDER}"))
                        );
                    }
                    let index = end
                        .checked_add(gap)
                        .filter(|i| i.checked_add(1 << order).is_some())
                        .ok_or_else(|| c.err(at, "cached folio past the largest page index"))?;
                    if !index.is_multiple_of(1 << order) {
                        return Err(c.err(
                            at,
                            format!(
                                "cached folio at page {index} not aligned to its order {order}"
                            ),
                        ));
                    }
                    let f = CachedFolio {
                        index,
                        order,
                        readahead,
                    };
                    end = f.end();
                    folios.push(f);
                }
                Event::Cache { file, folios }
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
            tag::SIGNAL => {
                let signo = c.varint()?;
                if signo != libc::SIGSEGV as u64 && signo != libc::SIGBUS as u64 {
                    return Err(c.err(at, format!("signal {signo} is not SIGSEGV or SIGBUS")));
                }
                Event::Signal {
                    pid,
                    signo: signo as u8,
                    addr: c.varint()?,
                }
            }
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
