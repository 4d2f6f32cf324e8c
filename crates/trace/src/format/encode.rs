//! The writer: events into a payload, sealed into a trace file (the format is in the
//! parent module's docs and `docs/trace-format.md`).

use super::*;

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
    pub(super) buf: Vec<u8>,
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
            Cache { file, folios } => {
                if !self.files.contains(file) {
                    self.dropped += 1;
                    return;
                }
                // Only what the reader takes: aligned folios of a valid order, ascending and
                // not overlapping, at most MAX_CACHE_FOLIOS.
                let mut end = 0u64;
                let kept: Vec<&CachedFolio> = folios
                    .iter()
                    .filter(|f| {
                        let ok = f.fits_after(end);
                        if ok {
                            end = f.end();
                        }
                        ok
                    })
                    .take(MAX_CACHE_FOLIOS as usize)
                    .collect();
                self.dropped += (folios.len() - kept.len()) as u64;
                self.tag(tag::CACHE, None);
                self.varint(*file as u64);
                self.varint(kept.len() as u64);
                let mut end = 0u64;
                for f in kept {
                    self.varint(f.index - end);
                    self.buf.push(f.order | (f.readahead as u8) << 7);
                    end = f.end();
                }
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
