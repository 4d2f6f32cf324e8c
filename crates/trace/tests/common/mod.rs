//! Hostile traces, built byte by byte: valid structure, fields chosen to make a reader
//! amplify a small file (shared by `hostile.rs`, `fuzz.rs` and the CLI's budget test).
#![allow(dead_code)]

/// A payload being built (the format of `docs/trace-format.md`).
#[derive(Clone, Debug, Default)]
pub struct Payload(pub Vec<u8>);

/// Tag bit: same process as the previous event.
pub const SAME: u8 = 0x20;

impl Payload {
    /// A payload starting with a header whose command is `argv`.
    pub fn new(argv: &[&str]) -> Payload {
        Payload::with_header("h", "k", argv, "p")
    }

    /// A payload starting with this header.
    pub fn with_header(host: &str, kernel: &str, argv: &[&str], policy: &str) -> Payload {
        let mut p = Payload::default();
        p.string(host).string(kernel).varint(argv.len() as u64);
        for a in argv {
            p.string(a);
        }
        p.string(policy).varint(0);
        p
    }

    pub fn varint(&mut self, mut v: u64) -> &mut Self {
        while v >= 0x80 {
            self.0.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
        self
    }

    pub fn signed(&mut self, v: i64) -> &mut Self {
        self.varint(((v << 1) ^ (v >> 63)) as u64)
    }

    pub fn string(&mut self, s: &str) -> &mut Self {
        self.varint(s.len() as u64);
        self.0.extend_from_slice(s.as_bytes());
        self
    }

    pub fn byte(&mut self, b: u8) -> &mut Self {
        self.0.push(b);
        self
    }

    /// SPAWN of pid 1.
    pub fn spawn(&mut self) -> &mut Self {
        self.byte(1).varint(1)
    }

    /// EXEC of the previous process with these VMAs (start, len, prot, file ref) and no pages.
    pub fn exec(&mut self, vmas: &[(u64, u64, u64, u64)]) -> &mut Self {
        self.byte(3 | SAME).varint(vmas.len() as u64);
        let mut prev = 0u64;
        for &(start, len, prot, file) in vmas {
            self.signed(start.wrapping_sub(prev) as i64)
                .varint(len)
                .varint(prot)
                .varint(0)
                .varint(file)
                .varint(0);
            prev = start + len;
        }
        self.varint(0)
    }

    /// EXEC with no VMAs and `n` pages, each one page below the previous (one byte each).
    pub fn exec_pages(&mut self, n: u64) -> &mut Self {
        self.byte(3 | SAME).varint(0).varint(n);
        self.0.extend(std::iter::repeat_n(2u8, n as usize));
        self
    }

    /// A FILE event.
    pub fn file(&mut self, id: u64, size: u64, path: &str) -> &mut Self {
        self.byte(5)
            .varint(id)
            .varint(1)
            .varint(2)
            .varint(size)
            .string(path)
    }

    /// `n` read faults of the previous process, each `delta` pages after the previous one.
    pub fn faults(&mut self, n: usize, delta: i64) -> &mut Self {
        for _ in 0..n {
            self.byte(16 | SAME).signed(delta);
        }
        self
    }

    /// mmap of the previous process: (addr, len, prot, flags, file ref, ret).
    pub fn mmap(&mut self, addr: u64, len: u64, flags: u64, file: u64, ret: i64) -> &mut Self {
        self.byte(6 | SAME)
            .varint(addr)
            .varint(len)
            .varint(3)
            .varint(flags)
            .signed(-1)
            .varint(0)
            .varint(file)
            .signed(ret)
    }

    /// mprotect of the previous process.
    pub fn mprotect(&mut self, addr: u64, len: u64, prot: u64) -> &mut Self {
        self.byte(8 | SAME)
            .varint(addr)
            .varint(len)
            .varint(prot)
            .signed(0)
    }

    /// madvise of the previous process.
    pub fn madvise(&mut self, addr: u64, len: u64, advice: u64) -> &mut Self {
        self.byte(11 | SAME)
            .varint(addr)
            .varint(len)
            .varint(advice)
            .signed(0)
    }

    /// A LOST event.
    pub fn lost(&mut self, n: u64) -> &mut Self {
        self.byte(21).varint(n)
    }

    /// The payload with its end tag.
    pub fn end(&self) -> Vec<u8> {
        let mut v = self.0.clone();
        v.push(0);
        v
    }

    /// The file bytes (preamble and zstd frame) with the end tag.
    pub fn file_bytes(&self) -> Vec<u8> {
        trace::format::seal(&self.end()).expect("zstd")
    }
}

/// `MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_POPULATE`.
pub const POPULATE_FIXED: u64 = 0x02 | 0x20 | 0x10 | 0x8000;

/// The hostile traces every reader is run on, by name: each is a small file that asks for
/// far more than its size.
pub fn hostile() -> Vec<(&'static str, Vec<u8>)> {
    let a = 0x1000_0000u64;
    let mut v = Vec::new();
    // 4 M one-byte-delta faults: events without end (stats held 48 bytes each).
    let mut p = Payload::new(&["x"]);
    p.spawn().exec(&[(a, 1 << 30, 3, 0)]).faults(4 << 20, 0);
    v.push(("many-events", p.file_bytes()));
    // An exec image of 2^24 pages, twice (held whole: 256 MiB each; export: 2^24 lines).
    let mut p = Payload::new(&["x"]);
    p.spawn().exec_pages(1 << 24).exec_pages(1 << 24);
    v.push(("huge-image", p.file_bytes()));
    // An image just within the page budget: export writes a line per page.
    let mut p = Payload::new(&["x"]);
    p.spawn().exec_pages(1 << 20);
    v.push(("export-lines", p.file_bytes()));
    // 100 × (populate 3 GiB, dontneed 3 GiB): minutes of replay from 70 bytes.
    let mut p = Payload::new(&["x"]);
    p.spawn().exec(&[]);
    for _ in 0..100 {
        p.mmap(a, 3 << 30, POPULATE_FIXED, 0, a as i64)
            .madvise(a, 3 << 30, 4);
    }
    v.push(("populate-loop", p.file_bytes()));
    // Write faults a page apart in a 4 GiB mapping: every one a new frame (a read would map
    // the zero page).
    let mut p = Payload::new(&["x"]);
    p.spawn().exec(&[(a, 4 << 30, 3, 0)]);
    for _ in 0..1 << 20 {
        p.byte(17 | SAME).signed(1);
    }
    v.push(("fresh-pages", p.file_bytes()));
    // 200 MiB populated once, then protected back and forth: no memory, 1 ms a call.
    let mut p = Payload::new(&["x"]);
    p.spawn()
        .exec(&[])
        .mmap(a, 200 << 20, POPULATE_FIXED, 0, a as i64);
    for _ in 0..100_000 {
        p.mprotect(a, 200 << 20, 1).mprotect(a, 200 << 20, 3);
    }
    v.push(("protect-loop", p.file_bytes()));
    // 60 000 one-page VMAs, then calls over all of them, and status reads walking them.
    let vmas: Vec<_> = (0..60_000u64).map(|i| (a + i * 8192, 4096, 1, 0)).collect();
    let mut p = Payload::new(&["x"]);
    p.spawn().exec(&vmas);
    for _ in 0..100_000 {
        p.mprotect(a, 60_000 * 8192, 3);
    }
    v.push(("vma-walk", p.file_bytes()));
    let mut p = Payload::new(&["x"]);
    p.spawn().exec(&vmas);
    for _ in 0..1_000_000 {
        p.byte(20 | SAME).varint(0).varint(0).varint(0);
    }
    v.push(("validate-loop", p.file_bytes()));
    // Fork and exit a million times.
    let mut p = Payload::new(&["x"]);
    p.spawn().exec(&[(a, 1 << 20, 3, 0)]);
    for _ in 0..500_000 {
        p.byte(2).varint(1).varint(2).varint(0).byte(4).varint(2);
    }
    v.push(("fork-loop", p.file_bytes()));
    // Two LOST 2^63: a wrapping sum reads 0.
    let mut p = Payload::new(&["x"]);
    p.lost(1 << 63).lost(1 << 63);
    v.push(("lost-wrap", p.file_bytes()));
    // Strings that would be statements in an export and escapes on a terminal.
    v.push(("evil-strings", evil_strings().file_bytes()));
    v
}

/// Text that is a scenario statement or a terminal command when printed raw.
pub const EVIL: &str =
    "x\nset memory 1G\np9 = spawn\r\n\u{1b}[2J\u{1b}]0;owned\u{7}\u{202e}txt.exe\u{85}";

/// A trace whose every string is [`EVIL`], with a file mapped by the exec image.
pub fn evil_strings() -> Payload {
    let mut p = Payload::with_header(EVIL, EVIL, &[EVIL, "a\nb"], EVIL);
    p.file(0, 4096, EVIL)
        .spawn()
        .exec(&[(0x40_0000, 4096, 5, 1)]);
    p
}
