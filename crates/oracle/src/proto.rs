//! The request/response protocol between the controller and a host server.
//!
//! Messages are fixed-size little-endian words, so the server reads and writes them from
//! buffers on its stack and never allocates. A request is an operation and five arguments;
//! a reply is a kind and two values. A new server's first message is a hello reply: its pid,
//! or the setup step that failed and the errno.

/// Bytes of a request.
pub const REQ_BYTES: usize = 48;
/// Bytes of a reply.
pub const REPLY_BYTES: usize = 24;

/// What the controller asks a server to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u64)]
pub enum Op {
    /// `mmap(addr, len, prot, flags)`.
    Mmap = 1,
    /// `munmap(addr, len)`.
    Munmap = 2,
    /// `mprotect(addr, len, prot)`.
    Mprotect = 3,
    /// `mremap(addr, old, new, flags, new_addr)`.
    Mremap = 4,
    /// `brk(addr)`.
    Brk = 5,
    /// `madvise(addr, len, advice)`.
    Madvise = 6,
    /// `mlock2(addr, len, flags)`.
    Mlock2 = 7,
    /// `munlock(addr, len)`.
    Munlock = 8,
    /// `mlockall(flags)`.
    Mlockall = 9,
    /// `munlockall()`.
    Munlockall = 10,
    /// Long-term pin of `(addr, len)`.
    Pin = 11,
    /// Release the pin of exactly `(addr, len)`.
    Unpin = 12,
    /// Fill `(addr, len)` with byte `arg2`.
    Fill = 13,
    /// One access per page of `(addr, len)`; `arg2` 1 for write.
    Touch = 14,
    /// First byte of `(addr, len)` that is not `arg2`.
    Check = 15,
    /// Fork: the child connects back as a new server.
    Fork = 16,
    /// Release pins and `_exit` (no reply: the connection closes).
    Exit = 17,
    /// `mmap(addr, len, prot, flags, fd, offset)` of the file whose descriptor is attached
    /// to the request (SCM_RIGHTS); the server closes its copy after the call.
    MmapFile = 18,
    /// `msync(addr, len, flags)`.
    Msync = 19,
}

impl Op {
    /// The operation with this code.
    pub fn from_code(code: u64) -> Option<Op> {
        const ALL: [Op; 19] = [
            Op::Mmap,
            Op::Munmap,
            Op::Mprotect,
            Op::Mremap,
            Op::Brk,
            Op::Madvise,
            Op::Mlock2,
            Op::Munlock,
            Op::Mlockall,
            Op::Munlockall,
            Op::Pin,
            Op::Unpin,
            Op::Fill,
            Op::Touch,
            Op::Check,
            Op::Fork,
            Op::Exit,
            Op::MmapFile,
            Op::Msync,
        ];
        ALL.iter().copied().find(|o| *o as u64 == code)
    }
}

/// A request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// The operation.
    pub op: Op,
    /// Its arguments (unused ones are 0).
    pub args: [u64; 5],
}

impl Request {
    /// A request with up to five arguments.
    pub fn new(op: Op, args: &[u64]) -> Request {
        let mut a = [0u64; 5];
        for (d, s) in a.iter_mut().zip(args) {
            *d = *s;
        }
        Request { op, args: a }
    }

    /// Wire form.
    pub fn encode(&self) -> [u8; REQ_BYTES] {
        let mut b = [0u8; REQ_BYTES];
        put(&mut b, 0, self.op as u64);
        for (i, a) in self.args.iter().enumerate() {
            put(&mut b, i + 1, *a);
        }
        b
    }

    /// Parses the wire form (`None` for an unknown operation).
    pub fn decode(b: &[u8; REQ_BYTES]) -> Option<Request> {
        let op = Op::from_code(get(b, 0))?;
        let mut args = [0u64; 5];
        for (i, a) in args.iter_mut().enumerate() {
            *a = get(b, i + 1);
        }
        Some(Request { op, args })
    }
}

/// A reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reply {
    /// Success with two values.
    Ok(u64, u64),
    /// The system call failed with this errno.
    Errno(i32),
    /// The access raised this signal.
    Signal(i32),
    /// The server could not do it (a setup step, a full pin table): code and errno.
    Refused(u64, i32),
}

impl Reply {
    /// Wire form.
    pub fn encode(&self) -> [u8; REPLY_BYTES] {
        let (k, a, b) = match *self {
            Reply::Ok(a, b) => (0, a, b),
            Reply::Errno(e) => (1, e as u64, 0),
            Reply::Signal(s) => (2, s as u64, 0),
            Reply::Refused(c, e) => (3, c, e as u64),
        };
        let mut out = [0u8; REPLY_BYTES];
        put(&mut out, 0, k);
        put(&mut out, 1, a);
        put(&mut out, 2, b);
        out
    }

    /// Parses the wire form (`None` for an unknown kind).
    pub fn decode(b: &[u8; REPLY_BYTES]) -> Option<Reply> {
        let (a, v) = (get(b, 1), get(b, 2));
        Some(match get(b, 0) {
            0 => Reply::Ok(a, v),
            1 => Reply::Errno(a as i32),
            2 => Reply::Signal(a as i32),
            3 => Reply::Refused(a, v as i32),
            _ => return None,
        })
    }
}

fn put(b: &mut [u8], word: usize, v: u64) {
    b[word * 8..word * 8 + 8].copy_from_slice(&v.to_le_bytes());
}

fn get(b: &[u8], word: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[word * 8..word * 8 + 8]);
    u64::from_le_bytes(w)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip() {
        let r = Request::new(Op::Mremap, &[1, 2, 3, 4, 5]);
        assert_eq!(Request::decode(&r.encode()), Some(r));
        for rep in [
            Reply::Ok(7, 8),
            Reply::Errno(12),
            Reply::Signal(11),
            Reply::Refused(2, 1),
        ] {
            assert_eq!(Reply::decode(&rep.encode()), Some(rep));
        }
    }
}
