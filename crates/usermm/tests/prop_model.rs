//! Random sequences of system calls and memory accesses, checked after every step against a
//! naive reference model that knows nothing but "which pages are mapped, with which protection
//! and advice, and what bytes they hold".
//!
//! The model is page-granular: each process maps page addresses to a page record (protection,
//! advice bits, and either private bytes or a page of a shared object). It predicts the result
//! (value or errno, or the signal of an access) of every call and the resulting state; the engine
//! must agree exactly, `validate()` must hold after every step, and every case ends with all
//! processes exited and no frame allocated.
//!
//! VMA boundaries are the one thing the model does not predict (they depend on anon_vma merge
//! rules); where an errno depends on them (mremap's "old range must lie in one VMA"), the engine's
//! own `maps()` from before the call is used, and `maps()` itself is checked against the model
//! (union of the VMAs == the model's pages, with matching perms and advice flags).
//!
//! A few inputs where the engine is known to differ from Linux are not generated (each is an
//! `#[ignore]`d test in `tests/errno.rs`): mremap FIXED over an overlapping range of an unmapped
//! address, mremap FIXED with `old_len == 0` of a private mapping, and pinning shared pages
//! beyond their object's size.
//!
//! `PROPTEST_CASES` sets the number of cases (default 64, each two mmaps then 10..=90 steps).

mod common;
use common::*;
use proptest::prelude::*;
use proptest::strategy::{BoxedStrategy, Union};
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use usermm::machine::START_BRK;
use usermm::pgtable::TASK_SIZE;
use usermm::views::MapsEntry;
use usermm::vma::VmFlags;
use usermm::{
    Access, Advice, Arch, Cpu, Errno, Machine, MachineConfig, MmapArgs, MremapFlags, Pid,
    Placement, Privilege, Prot, Sharing, Signal, ThpPolicy,
};

const PAGE: u64 = 4096;
/// The window where fixed mappings are placed, so that they overlap, merge and split.
const WIN: u64 = 0x1000_0000;
const WIN_PAGES: u64 = 1024;
const RLIMIT_MEMLOCK: u64 = 8 * M;
const MAX_PROCS: usize = 4;
/// The advice bits the model tracks per page (and compares with `MapsEntry::flags`).
const ADVICE_BITS: u64 =
    VmFlags::DONTCOPY | VmFlags::WIPEONFORK | VmFlags::HUGEPAGE | VmFlags::NOHUGEPAGE;

fn page_align(len: u64) -> Option<u64> {
    len.checked_add(PAGE - 1).map(|v| v & !(PAGE - 1))
}

// ---------------------------------------------------------------------------------------------
// The reference model.
// ---------------------------------------------------------------------------------------------

/// The bytes of one page as runs `(start offset, byte)`: sorted, the first at 0, neighbours
/// differ. Writes are fills, so a page rarely has more than a few runs.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Content(Vec<(u16, u8)>);

impl Content {
    fn zero() -> Content {
        Content(vec![(0, 0)])
    }

    /// `(start, end, byte)` for each run.
    fn runs(&self) -> impl Iterator<Item = (u64, u64, u8)> + '_ {
        self.0.iter().enumerate().map(move |(i, &(s, b))| {
            let e = self.0.get(i + 1).map_or(PAGE, |n| u64::from(n.0));
            (u64::from(s), e, b)
        })
    }

    fn uniform(&self) -> Option<u8> {
        (self.0.len() == 1).then(|| self.0[0].1)
    }

    fn byte_at(&self, off: u64) -> u8 {
        self.runs()
            .find(|r| r.0 <= off && off < r.1)
            .map_or(0, |r| r.2)
    }

    /// Sets `[off, end)` to `b`.
    fn fill(&mut self, off: u64, end: u64, b: u8) {
        let mut segs: Vec<(u64, u64, u8)> = Vec::new();
        for (s, e, x) in self.runs() {
            if e <= off || s >= end {
                segs.push((s, e, x));
                continue;
            }
            if s < off {
                segs.push((s, off, x));
            }
            if e > end {
                segs.push((end, e, x));
            }
        }
        segs.push((off, end, b));
        segs.sort_by_key(|t| t.0);
        let mut v: Vec<(u16, u8)> = Vec::new();
        for (s, _, x) in segs {
            if v.last().map(|l| l.1) != Some(x) {
                v.push((s as u16, x));
            }
        }
        self.0 = v;
    }
}

/// Protection as the model sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum P {
    None,
    R,
    Rw,
}

impl P {
    fn prot(self) -> Prot {
        match self {
            P::None => Prot::NONE,
            P::R => RO,
            P::Rw => RW,
        }
    }

    fn allows(self, a: Access) -> bool {
        match a {
            Access::Read => self != P::None,
            Access::Write => self == P::Rw,
        }
    }

    fn perms(self, shared: bool) -> &'static str {
        match (self, shared) {
            (P::None, false) => "---p",
            (P::R, false) => "r--p",
            (P::Rw, false) => "rw-p",
            (P::None, true) => "---s",
            (P::R, true) => "r--s",
            (P::Rw, true) => "rw-s",
        }
    }
}

/// What backs a page.
#[derive(Clone, Debug)]
enum Back {
    /// Private anonymous memory with its bytes.
    Private(Content),
    /// Page `idx` of shared object `obj` (bytes are in the object).
    Shared { obj: u32, idx: u64 },
}

/// One mapped page.
#[derive(Clone, Debug)]
struct Pg {
    prot: P,
    back: Back,
    /// Subset of [`ADVICE_BITS`].
    advice: u64,
}

impl Pg {
    fn shared(&self) -> Option<(u32, u64)> {
        match self.back {
            Back::Shared { obj, idx } => Some((obj, idx)),
            Back::Private(_) => None,
        }
    }
}

#[derive(Clone, Debug)]
struct Proc {
    pid: Pid,
    pages: BTreeMap<u64, Pg>,
    brk: u64,
    pins: Vec<(u64, u64)>,
    pinned_pages: u64,
}

/// A shared anonymous object: its size (pages) and the bytes of the pages ever written.
#[derive(Debug, Default)]
struct Obj {
    size: u64,
    pages: HashMap<u64, Content>,
}

#[derive(Debug, Default)]
struct Model {
    procs: Vec<Proc>,
    objs: HashMap<u32, Obj>,
    next_obj: u32,
}

impl Model {
    fn content<'s>(&'s self, pg: &'s Pg) -> Cow<'s, Content> {
        match &pg.back {
            Back::Private(c) => Cow::Borrowed(c),
            Back::Shared { obj, idx } => self.objs[obj]
                .pages
                .get(idx)
                .map_or_else(|| Cow::Owned(Content::zero()), Cow::Borrowed),
        }
    }

    fn content_mut(&mut self, pi: usize, page: u64) -> &mut Content {
        let pg = self.procs[pi]
            .pages
            .get_mut(&page)
            .expect("caller checked the page is mapped");
        match &mut pg.back {
            Back::Private(c) => c,
            Back::Shared { obj, idx } => self
                .objs
                .get_mut(obj)
                .expect("shared page of a known object")
                .pages
                .entry(*idx)
                .or_insert_with(Content::zero),
        }
    }

    fn any_mapped(&self, pi: usize, start: u64, end: u64) -> bool {
        start < end && self.procs[pi].pages.range(start..end).next().is_some()
    }

    fn remove_range(&mut self, pi: usize, start: u64, end: u64) -> Vec<(u64, Pg)> {
        if start >= end {
            return Vec::new();
        }
        let pages = &mut self.procs[pi].pages;
        let keys: Vec<u64> = pages.range(start..end).map(|(&a, _)| a).collect();
        keys.into_iter()
            .map(|a| (a, pages.remove(&a).expect("key just listed")))
            .collect()
    }

    /// The page at `a` if `access` is allowed: SIGSEGV without a mapping or permission, SIGBUS
    /// for a page of a shared object beyond its size (a shared mapping grown by mremap).
    fn page_for(&self, pi: usize, a: u64, access: Access) -> Result<&Pg, Signal> {
        match self.procs[pi].pages.get(&(a & !(PAGE - 1))) {
            Some(pg) if pg.prot.allows(access) => match pg.shared() {
                Some((obj, idx)) if idx >= self.objs[&obj].size => Err(Signal::Bus(a)),
                _ => Ok(pg),
            },
            _ => Err(Signal::Segv(a)),
        }
    }

    /// Accesses `[addr, addr+len)` piece by piece like the engine does, filling with `fill` when
    /// writing; the signal is at the first piece the protection refuses.
    fn access(
        &mut self,
        pi: usize,
        addr: u64,
        len: u64,
        access: Access,
        fill: Option<u8>,
    ) -> Result<(), Signal> {
        let end = addr + len;
        let mut a = addr;
        while a < end {
            let page = a & !(PAGE - 1);
            let n = (PAGE - (a - page)).min(end - a);
            self.page_for(pi, a, access)?;
            if let Some(b) = fill {
                self.content_mut(pi, page).fill(a - page, a - page + n, b);
            }
            a += n;
        }
        Ok(())
    }

    /// The bytes a read of `[addr, addr+len)` returns.
    fn read(&self, pi: usize, addr: u64, len: u64) -> Result<Vec<u8>, Signal> {
        let mut out = Vec::with_capacity(len as usize);
        let end = addr + len;
        let mut a = addr;
        while a < end {
            let page = a & !(PAGE - 1);
            let n = (PAGE - (a - page)).min(end - a);
            let c = self.content(self.page_for(pi, a, Access::Read)?);
            out.extend((a - page..a - page + n).map(|o| c.byte_at(o)));
            a += n;
        }
        Ok(out)
    }

    /// One access per page, as `Cpu::touch`.
    fn touch(&self, pi: usize, addr: u64, len: u64, access: Access) -> Result<(), Signal> {
        let end = addr + len;
        let mut a = addr;
        while a < end {
            self.page_for(pi, a, access)?;
            a = (a & !(PAGE - 1)) + PAGE;
        }
        Ok(())
    }

    fn new_pages(&mut self, pi: usize, start: u64, pages: u64, prot: P, shared: bool) {
        let obj = shared.then(|| {
            self.next_obj += 1;
            self.objs.insert(
                self.next_obj,
                Obj {
                    size: pages,
                    pages: HashMap::new(),
                },
            );
            self.next_obj
        });
        for i in 0..pages {
            let back = match obj {
                Some(obj) => Back::Shared { obj, idx: i },
                None => Back::Private(Content::zero()),
            };
            self.procs[pi].pages.insert(
                start + i * PAGE,
                Pg {
                    prot,
                    back,
                    advice: 0,
                },
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Operations.
// ---------------------------------------------------------------------------------------------

/// Where an operation starts.
#[derive(Clone, Debug)]
enum At {
    /// A page of the window.
    Win(u16),
    /// A mapped page of the process (chosen by index, modulo) plus a few pages.
    Near(u16, i8),
    /// An unaligned address in the window.
    Odd(u16, u16),
}

/// A length argument.
#[derive(Clone, Debug)]
enum Len {
    Pages(u16),
    /// `pages * 4096 - k`: rounds up to `pages`.
    Ragged(u16, u16),
    Zero,
    /// `u64::MAX - k * 4096 - j`: overflows once page aligned or added to an address.
    Huge(u8, u16),
}

impl Len {
    fn bytes(&self) -> u64 {
        match *self {
            Len::Pages(n) => u64::from(n) * PAGE,
            Len::Ragged(n, k) => u64::from(n) * PAGE - u64::from(k),
            Len::Zero => 0,
            Len::Huge(k, j) => u64::MAX - u64::from(k) * PAGE - u64::from(j),
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Place {
    Any,
    Hint,
    Fixed,
    NoReplace,
}

#[derive(Clone, Copy, Debug)]
enum Remap {
    Plain,
    MayMove,
    Fixed,
    /// `MREMAP_FIXED` without `MREMAP_MAYMOVE`: always EINVAL.
    FixedNoMove,
}

#[derive(Clone, Debug)]
enum Op {
    Read {
        p: u8,
        at: At,
        off: u16,
        len: u16,
    },
    Touch {
        p: u8,
        at: At,
        pages: u8,
        write: bool,
    },
    Write {
        p: u8,
        at: At,
        off: u16,
        len: u16,
        byte: u8,
    },
    Mmap {
        p: u8,
        place: Place,
        at: At,
        len: Len,
        prot: P,
        shared: bool,
        populate: bool,
    },
    Munmap {
        p: u8,
        at: At,
        len: Len,
    },
    Mprotect {
        p: u8,
        at: At,
        len: Len,
        prot: P,
    },
    Mremap {
        p: u8,
        at: At,
        old: Len,
        new: Len,
        how: Remap,
        to: At,
    },
    Madvise {
        p: u8,
        at: At,
        len: Len,
        advice: Advice,
    },
    Fork {
        p: u8,
    },
    Exit {
        p: u8,
    },
    Brk {
        p: u8,
        delta: i32,
    },
    Pin {
        p: u8,
        at: At,
        pages: u8,
    },
    Unpin {
        p: u8,
        sel: u8,
        bogus: bool,
    },
}

fn at_s() -> impl Strategy<Value = At> {
    prop_oneof![
        3 => (0..WIN_PAGES as u16).prop_map(At::Win),
        // PMD-aligned, for THP.
        1 => prop_oneof![Just(0u16), Just(512)].prop_map(At::Win),
        8 => (any::<u16>(), prop_oneof![4 => Just(0i8), 1 => -4i8..=4])
            .prop_map(|(s, d)| At::Near(s, d)),
        1 => (0..WIN_PAGES as u16, 1u16..4096).prop_map(|(p, o)| At::Odd(p, o)),
    ]
}

/// Where accesses go: mostly mapped pages.
fn access_at_s() -> impl Strategy<Value = At> {
    prop_oneof![
        1 => (0..WIN_PAGES as u16).prop_map(At::Win),
        10 => (any::<u16>(), prop_oneof![4 => Just(0i8), 1 => -2i8..=2])
            .prop_map(|(s, d)| At::Near(s, d)),
    ]
}

fn pages_s() -> impl Strategy<Value = u16> {
    prop_oneof![
        10 => 1u16..=16,
        3 => 17u16..=64,
        1 => 65u16..=256,
        1 => Just(512u16),
    ]
}

/// Lengths for mmap/munmap/mprotect/madvise: mostly whole pages, rarely ragged, zero or huge.
fn len_s() -> impl Strategy<Value = Len> {
    prop_oneof![
        40 => pages_s().prop_map(Len::Pages),
        3 => (pages_s(), 1u16..4096).prop_map(|(n, k)| Len::Ragged(n, k)),
        1 => Just(Len::Zero),
        1 => (0u8..4, 0u16..4096).prop_map(|(k, j)| Len::Huge(k, j)),
    ]
}

fn prot_s() -> impl Strategy<Value = P> {
    prop_oneof![1 => Just(P::None), 1 => Just(P::R), 6 => Just(P::Rw)]
}

fn mmap_s(p: impl Strategy<Value = u8>) -> impl Strategy<Value = Op> {
    (
        p,
        prop_oneof![
            2 => Just(Place::Any),
            1 => Just(Place::Hint),
            5 => Just(Place::Fixed),
            1 => Just(Place::NoReplace),
        ],
        at_s(),
        len_s(),
        prot_s(),
        prop::bool::weighted(0.25),
        prop::bool::weighted(0.1),
    )
        .prop_map(|(p, place, at, len, prot, shared, populate)| Op::Mmap {
            p,
            place,
            at,
            len,
            prot,
            shared,
            populate,
        })
}

fn op_s() -> impl Strategy<Value = Op> {
    let p = any::<u8>();
    let arms: Vec<(u32, BoxedStrategy<Op>)> = vec![
        (
            4,
            (p, access_at_s(), 0u16..4096, 1u16..12288)
                .prop_map(|(p, at, off, len)| Op::Read { p, at, off, len })
                .boxed(),
        ),
        (
            3,
            (p, access_at_s(), 1u8..=16, any::<bool>())
                .prop_map(|(p, at, pages, write)| Op::Touch {
                    p,
                    at,
                    pages,
                    write,
                })
                .boxed(),
        ),
        (
            8,
            (
                p,
                access_at_s(),
                0u16..4096,
                prop_oneof![3 => 0u16..4096, 1 => 0u16..12288],
                1u8..=255,
            )
                .prop_map(|(p, at, off, len, byte)| Op::Write {
                    p,
                    at,
                    off,
                    len,
                    byte,
                })
                .boxed(),
        ),
        (9, mmap_s(p).boxed()),
        (
            4,
            (p, at_s(), len_s())
                .prop_map(|(p, at, len)| Op::Munmap { p, at, len })
                .boxed(),
        ),
        (
            4,
            (p, at_s(), len_s(), prot_s())
                .prop_map(|(p, at, len, prot)| Op::Mprotect { p, at, len, prot })
                .boxed(),
        ),
        (
            5,
            (
                p,
                at_s(),
                prop_oneof![
                    12 => (1u16..=8).prop_map(Len::Pages),
                    8 => pages_s().prop_map(Len::Pages),
                    2 => (pages_s(), 1u16..4096).prop_map(|(n, k)| Len::Ragged(n, k)),
                    1 => Just(Len::Zero),
                ],
                prop_oneof![
                    20 => pages_s().prop_map(Len::Pages),
                    2 => (pages_s(), 1u16..4096).prop_map(|(n, k)| Len::Ragged(n, k)),
                    1 => Just(Len::Zero),
                    1 => (0u16..4095).prop_map(|j| Len::Huge(0, j)),
                ],
                prop_oneof![
                    3 => Just(Remap::Plain),
                    4 => Just(Remap::MayMove),
                    3 => Just(Remap::Fixed),
                    1 => Just(Remap::FixedNoMove),
                ],
                prop_oneof![
                    3 => (0..WIN_PAGES as u16).prop_map(At::Win),
                    1 => at_s(),
                ],
            )
                .prop_map(|(p, at, old, new, how, to)| Op::Mremap {
                    p,
                    at,
                    old,
                    new,
                    how,
                    to,
                })
                .boxed(),
        ),
        (
            5,
            (
                p,
                at_s(),
                len_s(),
                prop_oneof![
                    3 => Just(Advice::DontNeed),
                    2 => Just(Advice::DontFork),
                    1 => Just(Advice::DoFork),
                    2 => Just(Advice::WipeOnFork),
                    1 => Just(Advice::KeepOnFork),
                    1 => Just(Advice::HugePage),
                    1 => Just(Advice::NoHugePage),
                ],
            )
                .prop_map(|(p, at, len, advice)| Op::Madvise { p, at, len, advice })
                .boxed(),
        ),
        (2, p.prop_map(|p| Op::Fork { p }).boxed()),
        (1, p.prop_map(|p| Op::Exit { p }).boxed()),
        (
            1,
            (p, -64i32 * 4096..64 * 4096)
                .prop_map(|(p, delta)| Op::Brk { p, delta })
                .boxed(),
        ),
        (
            1,
            (p, access_at_s(), 1u8..=16)
                .prop_map(|(p, at, pages)| Op::Pin { p, at, pages })
                .boxed(),
        ),
        (
            1,
            (p, any::<u8>(), prop::bool::weighted(0.2))
                .prop_map(|(p, sel, bogus)| Op::Unpin { p, sel, bogus })
                .boxed(),
        ),
    ];
    Union::new_weighted(arms)
}

// ---------------------------------------------------------------------------------------------
// The harness: runs an operation on the engine and the model, and compares.
// ---------------------------------------------------------------------------------------------

/// What the model expects of a system call.
#[derive(Debug, PartialEq, Eq)]
enum Want<T> {
    Is(Result<T, Errno>),
    /// Succeeds with a value the engine chooses (an address), checked by the caller.
    AnyOk,
}

/// What a run did, printed at the end (visible with `--nocapture`).
#[derive(Debug, Default)]
struct Stats {
    cases: u64,
    steps: u64,
    skipped: u64,
    outcomes: BTreeMap<String, u64>,
    op_time: std::time::Duration,
    validate_time: std::time::Duration,
    check_time: std::time::Duration,
    pages_checked: u64,
    /// A few engine counters summed over the cases (coverage of the interesting paths).
    engine: BTreeMap<&'static str, u64>,
}

struct Harness<'a, 'm> {
    m: &'m Machine,
    cpu: &'a Cpu<'m>,
    model: Model,
    /// Read every mapped page after every step (else only pages already present).
    full_reads: bool,
    stats: &'a std::cell::RefCell<Stats>,
}

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)*) => {
        if !$cond {
            return Err(format!($($fmt)*));
        }
    };
}

impl<'a, 'm> Harness<'a, 'm> {
    /// Counts the outcome of a call for the run's summary.
    fn note<T, E: std::fmt::Debug>(&self, call: &str, r: &Result<T, E>) {
        let key = match r {
            Ok(_) => format!("{call} ok"),
            Err(e) => {
                let e = format!("{e:?}");
                format!("{call} {}", e.split('(').next().unwrap_or(&e))
            }
        };
        *self.stats.borrow_mut().outcomes.entry(key).or_default() += 1;
    }

    /// The model cannot predict ENOMEM from memory limits: a call it expects to succeed may fail
    /// with ENOMEM when memory is short, and must then change nothing (which the comparison
    /// after the step checks, the model being unchanged).
    fn out_of_memory_allowed<T>(&self, got: &Result<T, Errno>) -> bool {
        matches!(got, Err(Errno::ENOMEM)) && self.m.phys.free_frames() < self.m.phys.nr_frames() / 4
    }

    fn pi(&self, p: u8) -> usize {
        usize::from(p) % self.model.procs.len()
    }

    fn pid(&self, pi: usize) -> Pid {
        self.model.procs[pi].pid
    }

    fn resolve(&self, pi: usize, at: &At) -> u64 {
        match *at {
            At::Win(i) => WIN + u64::from(i) * PAGE,
            At::Odd(i, o) => WIN + u64::from(i) * PAGE + u64::from(o),
            At::Near(sel, d) => {
                let pages = &self.model.procs[pi].pages;
                if pages.is_empty() {
                    return WIN + (u64::from(sel) % WIN_PAGES) * PAGE;
                }
                let base = *pages
                    .keys()
                    .nth(usize::from(sel) % pages.len())
                    .expect("index within len");
                base.wrapping_add_signed(i64::from(d) * PAGE as i64)
            }
        }
    }

    fn maps(&self, pi: usize) -> Result<Vec<MapsEntry>, String> {
        self.cpu
            .maps(self.pid(pi))
            .map_err(|e| format!("maps({}) failed: {e}", self.pid(pi)))
    }

    /// Runs one operation. `Ok(false)` when the operation was skipped.
    fn step(&mut self, op: &Op) -> Result<bool, String> {
        match op {
            Op::Read { p, at, off, len } => {
                let pi = self.pi(*p);
                let addr = self.resolve(pi, at) + u64::from(*off);
                let want = self.model.read(pi, addr, u64::from(*len));
                let mut buf = vec![0u8; usize::from(*len)];
                let got = self
                    .cpu
                    .read_bytes(self.pid(pi), addr, &mut buf)
                    .map(|()| buf);
                self.note("read", &got);
                match (&want, &got) {
                    (Ok(w), Ok(g)) if w != g => {
                        let i = w.iter().zip(g).position(|(a, b)| a != b).unwrap_or(0);
                        return Err(format!(
                            "read at {:#x}: byte {:#x} is {:#x}, model says {:#x}",
                            addr,
                            addr + i as u64,
                            g[i],
                            w[i]
                        ));
                    }
                    (Ok(_), Ok(_)) => {}
                    _ => ensure!(
                        want.as_ref().err() == got.as_ref().err(),
                        "read {addr:#x}+{len}: engine {:?}, model {:?}",
                        got.as_ref().err(),
                        want.as_ref().err()
                    ),
                }
            }
            Op::Touch {
                p,
                at,
                pages,
                write,
            } => {
                let pi = self.pi(*p);
                let addr = self.resolve(pi, at);
                let len = u64::from(*pages) * PAGE;
                let access = if *write { Access::Write } else { Access::Read };
                let want = self.model.touch(pi, addr, len, access);
                let got = self.cpu.touch(self.pid(pi), addr, len, access);
                self.note("touch", &got);
                ensure!(
                    want == got,
                    "touch {access:?} {addr:#x}+{len:#x}: engine {got:?}, model {want:?}"
                );
            }
            Op::Write {
                p,
                at,
                off,
                len,
                byte,
            } => {
                let pi = self.pi(*p);
                let addr = self.resolve(pi, at) + u64::from(*off);
                let len = u64::from(*len);
                let want = self.model.access(pi, addr, len, Access::Write, Some(*byte));
                let got = self.cpu.write_fill(self.pid(pi), addr, len, *byte);
                self.note("write", &got);
                ensure!(
                    want == got,
                    "write_fill {addr:#x}+{len:#x}: engine {got:?}, model {want:?}"
                );
            }
            Op::Mmap { .. } => return self.mmap(op),
            Op::Munmap { p, at, len } => {
                let pi = self.pi(*p);
                let addr = self.resolve(pi, at);
                let len = len.bytes();
                let want = if !addr.is_multiple_of(PAGE) || len == 0 {
                    Err(Errno::EINVAL)
                } else {
                    match page_align(len) {
                        Some(l) if addr <= TASK_SIZE && l <= TASK_SIZE - addr => Ok(l),
                        _ => Err(Errno::EINVAL),
                    }
                };
                let got = self.cpu.munmap(self.pid(pi), addr, len);
                self.note("munmap", &got);
                ensure!(
                    want.map(|_| ()) == got,
                    "munmap {addr:#x}+{len:#x}: engine {got:?}, model {want:?}"
                );
                if let Ok(l) = want {
                    self.model.remove_range(pi, addr, addr + l);
                }
            }
            Op::Mprotect { p, at, len, prot } => {
                let pi = self.pi(*p);
                let addr = self.resolve(pi, at);
                let len = len.bytes();
                let want = self.model_mprotect(pi, addr, len, *prot);
                let got = self.cpu.mprotect(self.pid(pi), addr, len, prot.prot());
                self.note("mprotect", &got);
                ensure!(
                    want == got,
                    "mprotect {addr:#x}+{len:#x} {prot:?}: engine {got:?}, model {want:?}"
                );
            }
            Op::Madvise { p, at, len, advice } => {
                let pi = self.pi(*p);
                let addr = self.resolve(pi, at);
                let len = len.bytes();
                let want = self.model_madvise(pi, addr, len, *advice);
                let got = self.cpu.madvise(self.pid(pi), addr, len, *advice);
                self.note("madvise", &got);
                ensure!(
                    want == got,
                    "madvise {addr:#x}+{len:#x} {advice:?}: engine {got:?}, model {want:?}"
                );
            }
            Op::Mremap {
                p,
                at,
                old,
                new,
                how,
                to,
            } => return self.mremap(*p, at, old, new, *how, to),
            Op::Fork { p } => {
                if self.model.procs.len() >= MAX_PROCS {
                    return Ok(false);
                }
                let pi = self.pi(*p);
                let got = self.cpu.fork(self.pid(pi));
                if self.out_of_memory_allowed(&got) {
                    return Ok(true);
                }
                let child = got.map_err(|e| format!("fork of {} failed: {e}", self.pid(pi)))?;
                let parent = &self.model.procs[pi];
                let pages = parent
                    .pages
                    .iter()
                    .filter(|(_, pg)| pg.advice & VmFlags::DONTCOPY == 0)
                    .map(|(&a, pg)| {
                        let mut pg = pg.clone();
                        if pg.advice & VmFlags::WIPEONFORK != 0 {
                            pg.back = Back::Private(Content::zero());
                        }
                        (a, pg)
                    })
                    .collect();
                let brk = parent.brk;
                self.model.procs.push(Proc {
                    pid: child,
                    pages,
                    brk,
                    pins: Vec::new(),
                    pinned_pages: 0,
                });
            }
            Op::Exit { p } => {
                if self.model.procs.len() <= 1 {
                    return Ok(false);
                }
                let pi = self.pi(*p);
                let pid = self.pid(pi);
                self.cpu
                    .exit(pid)
                    .map_err(|e| format!("exit of {pid} failed: {e}"))?;
                self.model.procs.remove(pi);
            }
            Op::Brk { p, delta } => {
                let pi = self.pi(*p);
                let cur = self.model.procs[pi].brk;
                let req = cur.wrapping_add_signed(i64::from(*delta));
                let (newbrk, oldbrk) = (
                    page_align(req).expect("near START_BRK"),
                    page_align(cur).expect("near START_BRK"),
                );
                let want = if req < START_BRK {
                    cur
                } else if newbrk == oldbrk {
                    req
                } else if req <= cur {
                    // Linux shrinks only if some mapping reaches into [newbrk, oldbrk).
                    if self.model.any_mapped(pi, newbrk, oldbrk) {
                        self.model.remove_range(pi, newbrk, oldbrk);
                        req
                    } else {
                        cur
                    }
                } else if self.model.any_mapped(pi, oldbrk, newbrk + PAGE) {
                    cur
                } else {
                    self.model
                        .new_pages(pi, oldbrk, (newbrk - oldbrk) / PAGE, P::Rw, false);
                    req
                };
                self.model.procs[pi].brk = want;
                let got = self.cpu.brk(self.pid(pi), req);
                self.note("brk", &got);
                ensure!(
                    got == Ok(want),
                    "brk({req:#x}) from {cur:#x}: engine {got:?}, model {want:#x}"
                );
            }
            Op::Pin { p, at, pages } => {
                let pi = self.pi(*p);
                let addr = self.resolve(pi, at);
                let len = u64::from(*pages) * PAGE;
                let pr = &self.model.procs[pi];
                let want = if !addr.is_multiple_of(PAGE) {
                    Err(Errno::EINVAL)
                } else if (pr.pinned_pages + u64::from(*pages)) * PAGE > RLIMIT_MEMLOCK {
                    Err(Errno::ENOMEM)
                } else {
                    match self.model.touch(pi, addr, len, Access::Write) {
                        Ok(()) => Ok(()),
                        // SIGBUS (beyond a shared object): Linux's GUP says EFAULT, the engine
                        // ENOMEM (tests/errno.rs).
                        Err(Signal::Bus(_)) => return Ok(false),
                        Err(_) => Err(Errno::EFAULT),
                    }
                };
                let got = self.cpu.pin(self.pid(pi), addr, len);
                self.note("pin", &got);
                ensure!(
                    want == got,
                    "pin {addr:#x}+{len:#x}: engine {got:?}, model {want:?}"
                );
                if want.is_ok() {
                    let pr = &mut self.model.procs[pi];
                    pr.pins.push((addr, len));
                    pr.pinned_pages += u64::from(*pages);
                }
            }
            Op::Unpin { p, sel, bogus } => {
                let pi = self.pi(*p);
                let pins = &self.model.procs[pi].pins;
                let (addr, len, want) = if *bogus || pins.is_empty() {
                    (
                        WIN + u64::from(*sel) * PAGE,
                        3 * PAGE + 1,
                        Err(Errno::EINVAL),
                    )
                } else {
                    let (a, l) = pins[usize::from(*sel) % pins.len()];
                    (a, l, Ok(()))
                };
                let got = self.cpu.unpin(self.pid(pi), addr, len);
                self.note("unpin", &got);
                ensure!(
                    want == got,
                    "unpin {addr:#x}+{len:#x}: engine {got:?}, model {want:?}"
                );
                if want.is_ok() {
                    let pr = &mut self.model.procs[pi];
                    let i = pr
                        .pins
                        .iter()
                        .position(|&(a, l)| a == addr && l == len)
                        .expect("pin chosen from the list");
                    pr.pins.remove(i);
                    pr.pinned_pages -= len / PAGE;
                }
            }
        }
        Ok(true)
    }

    /// An `Op::Mmap` on the engine and the model.
    fn mmap(&mut self, op: &Op) -> Result<bool, String> {
        let &Op::Mmap {
            p,
            place,
            ref at,
            ref len,
            prot,
            shared,
            populate,
        } = op
        else {
            return Err(format!("not an mmap: {op:?}"));
        };
        let pi = self.pi(p);
        let addr = self.resolve(pi, at);
        let bytes = len.bytes();
        let placement = match place {
            Place::Any => Placement::Any,
            // Hints are page aligned: x86 rounds an unaligned hint down, the generic code up.
            Place::Hint => Placement::Hint(addr & !(PAGE - 1)),
            Place::Fixed => Placement::Fixed(addr),
            Place::NoReplace => Placement::FixedNoReplace(addr),
        };
        let args = MmapArgs {
            placement,
            sharing: if shared {
                Sharing::Shared
            } else {
                Sharing::Private
            },
            populate,
            ..MmapArgs::anon(bytes, prot.prot())
        };
        let alen = page_align(bytes).filter(|&l| l != 0 && l <= TASK_SIZE - PAGE);
        let want: Want<u64> = if bytes == 0 {
            Want::Is(Err(Errno::EINVAL))
        } else if alen.is_none() {
            Want::Is(Err(Errno::ENOMEM))
        } else {
            let alen = alen.expect("checked");
            match placement {
                Placement::Fixed(a) | Placement::FixedNoReplace(a) if a % PAGE != 0 => {
                    Want::Is(Err(Errno::EINVAL))
                }
                Placement::FixedNoReplace(a) if self.model.any_mapped(pi, a, a + alen) => {
                    Want::Is(Err(Errno::EEXIST))
                }
                Placement::Fixed(a) | Placement::FixedNoReplace(a) => Want::Is(Ok(a)),
                Placement::Hint(h) if !self.model.any_mapped(pi, h, h + alen) => Want::Is(Ok(h)),
                _ => Want::AnyOk,
            }
        };
        let got = self.cpu.mmap(self.pid(pi), args);
        self.note("mmap", &got);
        if want != Want::Is(Err(Errno::ENOMEM)) && self.out_of_memory_allowed(&got) {
            return Ok(true);
        }
        match (&want, got) {
            (Want::Is(w), g) => ensure!(
                *w == g,
                "mmap {placement:?} len {bytes:#x}: engine {g:?}, model {w:?}"
            ),
            (Want::AnyOk, Ok(a)) => {
                let alen = alen.expect("AnyOk has a length");
                ensure!(
                    a % PAGE == 0 && a >= PAGE && a <= TASK_SIZE - alen,
                    "mmap {placement:?} returned a bad address {a:#x}"
                );
                ensure!(
                    !self.model.any_mapped(pi, a, a + alen),
                    "mmap {placement:?} returned {a:#x}+{alen:#x}, which overlaps a mapping"
                );
            }
            (Want::AnyOk, Err(e)) => {
                return Err(format!("mmap {placement:?} len {bytes:#x} failed with {e}"))
            }
        }
        if let Ok(a) = got {
            let alen = alen.expect("success has a length");
            self.model.remove_range(pi, a, a + alen);
            self.model.new_pages(pi, a, alen / PAGE, prot, shared);
        }
        Ok(true)
    }

    /// mprotect: VMA by VMA from `addr`, stopping with ENOMEM at the first hole.
    fn model_mprotect(&mut self, pi: usize, addr: u64, len: u64, prot: P) -> Result<(), Errno> {
        if !addr.is_multiple_of(PAGE) {
            return Err(Errno::EINVAL);
        }
        if len == 0 {
            return Ok(());
        }
        let end = page_align(len)
            .and_then(|l| addr.checked_add(l))
            .ok_or(Errno::ENOMEM)?;
        let mut expect = addr;
        for (&a, pg) in self.model.procs[pi].pages.range_mut(addr..end) {
            if a != expect {
                return Err(Errno::ENOMEM);
            }
            pg.prot = prot;
            expect += PAGE;
        }
        if expect < end {
            return Err(Errno::ENOMEM);
        }
        Ok(())
    }

    /// madvise: every mapped page of the range, ENOMEM at the end if there were holes; EINVAL
    /// (immediately) for wipeonfork on a shared page.
    fn model_madvise(&mut self, pi: usize, addr: u64, len: u64, adv: Advice) -> Result<(), Errno> {
        if !addr.is_multiple_of(PAGE) {
            return Err(Errno::EINVAL);
        }
        let end = page_align(len)
            .and_then(|l| addr.checked_add(l))
            .ok_or(Errno::EINVAL)?;
        if end == addr {
            return Ok(());
        }
        let mut expect = addr;
        let mut hole = false;
        for (&a, pg) in self.model.procs[pi].pages.range_mut(addr..end) {
            hole |= a != expect;
            expect = a + PAGE;
            let shared = matches!(pg.back, Back::Shared { .. });
            match adv {
                Advice::DontNeed => {
                    if let Back::Private(c) = &mut pg.back {
                        *c = Content::zero();
                    }
                }
                Advice::WipeOnFork if shared => return Err(Errno::EINVAL),
                Advice::WipeOnFork => pg.advice |= VmFlags::WIPEONFORK,
                Advice::KeepOnFork => pg.advice &= !VmFlags::WIPEONFORK,
                Advice::DontFork => pg.advice |= VmFlags::DONTCOPY,
                Advice::DoFork => pg.advice &= !VmFlags::DONTCOPY,
                Advice::HugePage => {
                    pg.advice = (pg.advice | VmFlags::HUGEPAGE) & !VmFlags::NOHUGEPAGE
                }
                Advice::NoHugePage => {
                    pg.advice = (pg.advice | VmFlags::NOHUGEPAGE) & !VmFlags::HUGEPAGE
                }
                #[allow(unreachable_patterns)]
                other => unreachable!("{other:?} is not generated"),
            }
        }
        if hole || expect < end {
            return Err(Errno::ENOMEM);
        }
        Ok(())
    }

    fn mremap(
        &mut self,
        p: u8,
        at: &At,
        old: &Len,
        new: &Len,
        how: Remap,
        to: &At,
    ) -> Result<bool, String> {
        let pi = self.pi(p);
        let addr = self.resolve(pi, at);
        let (old, new) = (old.bytes(), new.bytes());
        let fixed = match how {
            Remap::Fixed | Remap::FixedNoMove => Some(self.resolve(pi, to)),
            _ => None,
        };
        let flags = MremapFlags {
            maymove: !matches!(how, Remap::Plain | Remap::FixedNoMove),
            fixed,
            dontunmap: false,
        };
        let maps = self.maps(pi)?;
        let aold = page_align(old).expect("old lengths are small");
        let anew = page_align(new).unwrap_or(0);
        let vma = maps.iter().find(|e| e.start <= addr && addr < e.end);
        let overlap = fixed.is_some_and(|na| na < addr + aold && addr < na + anew);

        // The errno checks, in Linux's order (check_mremap_params, the VMA lookup, then
        // remap_is_valid). Where the engine differs (see the module doc), the call is skipped.
        let early: Option<Errno> = 'e: {
            if !addr.is_multiple_of(PAGE) || anew == 0 {
                break 'e Some(Errno::EINVAL);
            }
            if let Some(na) = fixed {
                if na % PAGE != 0 || !flags.maymove {
                    break 'e Some(Errno::EINVAL);
                }
                if overlap {
                    if vma.is_none() {
                        return Ok(false); // Linux looks the VMA up first: EFAULT.
                    }
                    break 'e Some(Errno::EINVAL);
                }
            }
            let Some(v) = vma else {
                break 'e Some(Errno::EFAULT);
            };
            if aold == 0 {
                // Only a shared mapping can be duplicated, and only to a new place.
                if !v.perms.ends_with('s') {
                    if fixed.is_some() {
                        return Ok(false); // Linux unmaps the FIXED target first.
                    }
                    break 'e Some(Errno::EINVAL);
                }
                if !flags.maymove {
                    break 'e Some(Errno::ENOMEM);
                }
            } else if fixed.is_none() && anew > aold && aold > v.end - addr {
                // Growing needs the old range inside one VMA (shrinking does not).
                break 'e Some(Errno::EFAULT);
            }
            None
        };
        if let Some(e) = early {
            let got = self.cpu.mremap(self.pid(pi), addr, old, new, flags);
            self.note("mremap", &got);
            ensure!(
                got == Err(e),
                "mremap {addr:#x} {old:#x}->{new:#x} {flags:?}: engine {got:?}, model {e}"
            );
            return Ok(true);
        }
        let vma = vma.expect("no early errno means the VMA exists");
        let vend = vma.end;
        let template = self.model.procs[pi]
            .pages
            .get(&addr)
            .cloned()
            .ok_or_else(|| format!("maps() has {addr:#x} but the model does not"))?;
        let keep = aold.min(anew);
        // FIXED with an unchanged length over several VMAs (Linux 6.17+): each moves to the
        // same offset in the target, which changes only where a piece lands.
        if let Some(na) = fixed {
            if aold > 0 && aold == anew && keep > vend - addr && !flags.dontunmap {
                let got = self.cpu.mremap(self.pid(pi), addr, old, new, flags);
                self.note("mremap", &got);
                if self.out_of_memory_allowed(&got) {
                    return Ok(true);
                }
                ensure!(
                    got == Ok(na),
                    "mremap {addr:#x} {old:#x} {flags:?} of several VMAs: engine {got:?}, \
                     model Ok({na:#x})"
                );
                let moved = self.model.remove_range(pi, addr, addr + aold);
                let pages = &mut self.model.procs[pi].pages;
                for (a, pg) in moved {
                    pages.insert(a - addr + na, pg);
                }
                return Ok(true);
            }
        }
        // Otherwise what is kept of the old range must lie in one VMA, checked before the
        // target or the shrunk tail is unmapped (`check_prep_vma`, 6.17+): EFAULT, nothing
        // changed.
        if fixed.is_some() && aold > 0 && keep > vend - addr {
            let got = self.cpu.mremap(self.pid(pi), addr, old, new, flags);
            self.note("mremap", &got);
            ensure!(
                got == Err(Errno::EFAULT),
                "mremap {addr:#x} {old:#x}->{new:#x} {flags:?} of a range spanning VMAs: \
                 engine {got:?}, model EFAULT"
            );
            return Ok(true);
        }
        let want: Want<u64> = if let Some(na) = fixed {
            Want::Is(Ok(na))
        } else if aold == 0 {
            Want::AnyOk
        } else if anew <= aold
            // Shrinks stay; growth in place where the room after the VMA is free.
            || (addr + aold == vend
                && addr + anew <= TASK_SIZE
                && !self.model.any_mapped(pi, vend, addr + anew))
        {
            Want::Is(Ok(addr))
        } else if flags.maymove {
            Want::AnyOk
        } else {
            Want::Is(Err(Errno::ENOMEM))
        };
        let got = self.cpu.mremap(self.pid(pi), addr, old, new, flags);
        self.note("mremap", &got);
        if self.out_of_memory_allowed(&got) {
            return Ok(true);
        }
        let dst = match (&want, got) {
            (Want::Is(w), g) => {
                ensure!(
                    *w == g,
                    "mremap {addr:#x} {old:#x}->{new:#x} {flags:?}: engine {g:?}, model {w:?}"
                );
                match g {
                    Ok(d) => d,
                    Err(_) => return Ok(true),
                }
            }
            (Want::AnyOk, Ok(d)) => {
                ensure!(
                    d % PAGE == 0
                        && d <= TASK_SIZE - anew
                        && !self.model.any_mapped(pi, d, d + anew),
                    "mremap {addr:#x} {old:#x}->{new:#x} moved to {d:#x}, which is not free"
                );
                d
            }
            (Want::AnyOk, Err(e)) => {
                return Err(format!(
                    "mremap {addr:#x} {old:#x}->{new:#x} {flags:?} failed with {e}"
                ))
            }
        };
        // Apply: take the kept pages, clear the target and the old range, put them back at
        // dst, and add the grown tail (for old_len 0: a second mapping of the same object).
        let moved = self.model.remove_range(pi, addr, addr + keep);
        self.model.remove_range(pi, addr + keep, addr + aold);
        self.model.remove_range(pi, dst, dst + anew);
        let pages = &mut self.model.procs[pi].pages;
        for (a, pg) in moved {
            pages.insert(a - addr + dst, pg);
        }
        for i in keep / PAGE..anew / PAGE {
            // Shared pages past the object's size fault with SIGBUS (Model::page_for).
            let back = match template.shared() {
                Some((obj, idx)) => Back::Shared { obj, idx: idx + i },
                None => Back::Private(Content::zero()),
            };
            pages.insert(
                dst + i * PAGE,
                Pg {
                    back,
                    ..template.clone()
                },
            );
        }
        Ok(true)
    }

    /// Compares everything the engine shows with the model.
    fn check(&self, full_reads: bool) -> Result<(), String> {
        let t = std::time::Instant::now();
        let v = self.m.validate();
        self.stats.borrow_mut().validate_time += t.elapsed();
        if let Err(e) = v {
            return Err(format!("validate failed:\n{}", e.join("\n")));
        }
        let t = std::time::Instant::now();
        let r = (0..self.model.procs.len()).try_for_each(|pi| self.check_proc(pi, full_reads));
        self.stats.borrow_mut().pages_checked += self
            .model
            .procs
            .iter()
            .map(|p| p.pages.len() as u64)
            .sum::<u64>();
        self.stats.borrow_mut().check_time += t.elapsed();
        r
    }

    fn check_proc(&self, pi: usize, full_reads: bool) -> Result<(), String> {
        let pr = &self.model.procs[pi];
        let pid = pr.pid;
        let maps = self.maps(pi)?;
        // The VMAs cover exactly the model's pages, with its perms and advice.
        let mut covered = 0u64;
        let mut prev_end = 0;
        for e in &maps {
            ensure!(
                e.start < e.end && e.start >= prev_end,
                "pid {pid}: maps not sorted/disjoint at {e:?}"
            );
            prev_end = e.end;
            let mut a = e.start;
            while a < e.end {
                let Some(pg) = pr.pages.get(&a) else {
                    return Err(format!(
                        "pid {pid}: engine maps {a:#x} ({e:?}) but the model has no page there"
                    ));
                };
                let perms = pg.prot.perms(pg.shared().is_some());
                ensure!(
                    e.perms == perms,
                    "pid {pid}: {a:#x} has perms {} ({e:?}), model {perms}",
                    e.perms
                );
                ensure!(
                    e.flags & ADVICE_BITS == pg.advice,
                    "pid {pid}: {a:#x} has advice bits {:#x} ({e:?}), model {:#x}",
                    e.flags & ADVICE_BITS,
                    pg.advice
                );
                if let Some((_, idx)) = pg.shared() {
                    let off = e.offset / PAGE + (a - e.start) / PAGE;
                    ensure!(
                        off == idx,
                        "pid {pid}: shared page {a:#x} is object page {off}, model {idx}"
                    );
                }
                covered += 1;
                a += PAGE;
            }
        }
        if covered != pr.pages.len() as u64 {
            let missing = pr
                .pages
                .keys()
                .find(|&&a| !maps.iter().any(|e| e.start <= a && a < e.end));
            return Err(format!(
                "pid {pid}: model page {missing:#x?} is not in maps ({} VMAs)",
                maps.len()
            ));
        }
        // status.
        let st = self
            .cpu
            .status(pid)
            .map_err(|e| format!("status({pid}): {e}"))?;
        let data = pr
            .pages
            .values()
            .filter(|pg| pg.prot == P::Rw && pg.shared().is_none())
            .count() as u64;
        ensure!(
            st.vm_size == covered * PAGE
                && st.map_count == maps.len() as u64
                && st.vm_pin == pr.pinned_pages * PAGE
                && st.vm_data == data * PAGE
                && st.vm_rss <= st.vm_size + pr.pinned_pages * PAGE,
            "pid {pid}: status {st:?} vs model size {:#x} data {:#x} pin {:#x}",
            covered * PAGE,
            data * PAGE,
            pr.pinned_pages * PAGE
        );
        // Contents: uniform pages in runs, others run by run.
        let mut run: Option<(u64, u64, u8)> = None; // (start, end, byte)
        let flush = |run: &mut Option<(u64, u64, u8)>| -> Result<(), String> {
            if let Some((s, e, b)) = run.take() {
                let got = self.cpu.find_mismatch(pid, s, e - s, b);
                ensure!(
                    got == Ok(None),
                    "pid {pid}: [{s:#x}, {e:#x}) should all be {b:#x}: engine {got:?}"
                );
            }
            Ok(())
        };
        for (&a, pg) in &pr.pages {
            if pg.prot == P::None {
                continue;
            }
            if let Err(sig) = self.model.page_for(pi, a, Access::Read) {
                // Beyond its shared object: SIGBUS, and nothing gets mapped.
                let got = self.cpu.touch(pid, a, 1, Access::Read);
                ensure!(
                    got == Err(sig),
                    "pid {pid}: read of {a:#x}: engine {got:?}, model {sig:?}"
                );
                continue;
            }
            let c = self.model.content(pg);
            if !full_reads {
                let pm = self
                    .cpu
                    .pagemap(pid, a)
                    .map_err(|e| format!("pagemap: {e}"))?;
                if !pm.present {
                    if pg.shared().is_none() {
                        ensure!(
                            c.uniform() == Some(0),
                            "pid {pid}: private page {a:#x} is not present but the model \
                             has data {c:?}"
                        );
                    }
                    continue;
                }
            }
            match c.uniform() {
                Some(b) => match &mut run {
                    Some((_, e, rb)) if *e == a && *rb == b => *e += PAGE,
                    _ => {
                        flush(&mut run)?;
                        run = Some((a, a + PAGE, b));
                    }
                },
                None => {
                    flush(&mut run)?;
                    for (s, e, b) in c.runs() {
                        run = Some((a + s, a + e, b));
                        flush(&mut run)?;
                    }
                }
            }
        }
        flush(&mut run)?;
        // Protection and holes: the edges of each VMA, and the pages around it.
        for e in &maps {
            for a in [e.start, e.end - PAGE] {
                let pg = &pr.pages[&a];
                let probe = match pg.prot {
                    P::None => Some(Access::Read),
                    P::R => Some(Access::Write),
                    P::Rw => None,
                };
                if let Some(acc) = probe {
                    let got = self.cpu.touch(pid, a, 1, acc);
                    ensure!(
                        got == Err(Signal::Segv(a)),
                        "pid {pid}: {acc:?} of {a:#x} ({:?}) gave {got:?}",
                        pg.prot
                    );
                }
            }
            for a in [e.start.wrapping_sub(PAGE), e.end] {
                if (PAGE..TASK_SIZE).contains(&a) && !pr.pages.contains_key(&a) {
                    let got = self.cpu.touch(pid, a, 1, Access::Read);
                    ensure!(
                        got == Err(Signal::Segv(a)),
                        "pid {pid}: read of unmapped {a:#x} gave {got:?}"
                    );
                }
            }
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Running.
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
enum Variant {
    X86,
    Arm64,
    Thp,
}

fn new_machine(v: Variant) -> Machine {
    let mut cfg = MachineConfig {
        memory: 128 * M,
        arch: match v {
            Variant::Arm64 => Arch::Arm64,
            _ => Arch::X86_64,
        },
        ..MachineConfig::default()
    };
    cfg.tunables.check_tlb = true;
    let m = Machine::new(cfg);
    if let Variant::Thp = v {
        m.update_tunables(|t| {
            t.thp.top = ThpPolicy::Always;
            t.thp
                .set_size(64 * K, ThpPolicy::Always)
                .expect("64K is a valid mTHP size");
        });
    }
    m
}

fn run_case(
    v: Variant,
    full_reads: bool,
    ops: &[Op],
    stats: &std::cell::RefCell<Stats>,
) -> Result<(), TestCaseError> {
    stats.borrow_mut().cases += 1;
    let m = new_machine(v);
    let cpu = m.enter_cpu(0).expect("cpu 0 is free");
    let pid = cpu
        .spawn(Privilege::Ordinary, RLIMIT_MEMLOCK)
        .expect("spawn on an empty machine");
    let mut h = Harness {
        m: &m,
        cpu: &cpu,
        model: Model {
            procs: vec![Proc {
                pid,
                pages: BTreeMap::new(),
                brk: START_BRK,
                pins: Vec::new(),
                pinned_pages: 0,
            }],
            ..Model::default()
        },
        full_reads,
        stats,
    };
    for (i, op) in ops.iter().enumerate() {
        let t = std::time::Instant::now();
        let r = h.step(op);
        {
            let mut s = stats.borrow_mut();
            s.op_time += t.elapsed();
            match r {
                Ok(true) => s.steps += 1,
                Ok(false) => s.skipped += 1,
                Err(_) => {}
            }
        }
        let r = r.and_then(|ran| if ran { h.check(h.full_reads) } else { Ok(()) });
        if let Err(e) = r {
            return Err(TestCaseError::fail(format!("step {i} {op:?}: {e}")));
        }
    }
    {
        let mut s = stats.borrow_mut();
        for (name, v) in m.counters().nonzero() {
            if [
                "faults_anon_mthp",
                "faults_anon_pmd",
                "thp_split_pmd",
                "cow_copies",
                "cow_reuses",
                "fork_pinned_copies",
                "vma_splits",
                "vma_merges",
                "faults_shared",
            ]
            .contains(&name)
            {
                *s.engine.entry(name).or_default() += v;
            }
        }
    }
    // A last look with every page read, then tear everything down.
    h.check(true)
        .map_err(|e| TestCaseError::fail(format!("final check: {e}")))?;
    for pr in std::mem::take(&mut h.model.procs) {
        cpu.exit(pr.pid)
            .map_err(|e| TestCaseError::fail(format!("exit {}: {e}", pr.pid)))?;
    }
    if let Err(e) = m.validate() {
        return Err(TestCaseError::fail(format!(
            "validate after exits:\n{}",
            e.join("\n")
        )));
    }
    prop_assert_eq!(
        m.phys.allocated_frames(),
        0,
        "frames leaked after every process exited"
    );
    Ok(())
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64)
}

fn run(v: Variant) {
    let config = Config {
        cases: cases(),
        failure_persistence: None,
        max_shrink_iters: 4096,
        ..Config::default()
    };
    let mut runner = TestRunner::new(config);
    // Two mappings first, so that the first operations have something to work on.
    let strategy = (
        prop::bool::weighted(0.5),
        prop::collection::vec(mmap_s(Just(0u8)), 2),
        prop::collection::vec(op_s(), 10..=90),
    );
    let stats = std::cell::RefCell::new(Stats::default());
    let result = runner.run(&strategy, |(full_reads, mut ops, more)| {
        ops.extend(more);
        run_case(v, full_reads, &ops, &stats)
    });
    eprintln!("{v:?}: {:#?}", stats.borrow());
    if let Err(e) = result {
        panic!("{v:?}: {e}");
    }
}

#[test]
fn random_sequences_match_the_model() {
    run(Variant::X86);
}

#[test]
fn random_sequences_match_the_model_on_arm64_tables() {
    run(Variant::Arm64);
}

#[test]
fn random_sequences_match_the_model_with_thp_always() {
    run(Variant::Thp);
}

/// Regression: a VMA split by madvise used to leave a PMD-mapped THP across the boundary.
#[test]
fn fork_after_madvise_splits_a_pmd_thp_copies_only_what_the_child_maps() {
    // Linux splits the huge PMD when a VMA boundary falls inside it (__split_vma ->
    // vma_adjust_trans_huge). Had the PMD survived, fork would copy it for the VMA that remains,
    // and the child would see the parent's page where it has no mapping (DONTFORK) or should see
    // zeroes (WIPEONFORK).
    for advice in [Advice::DontFork, Advice::WipeOnFork] {
        let m = new_machine(Variant::Thp);
        let cpu = m.enter_cpu(0).expect("cpu");
        let p = cpu
            .spawn(Privilege::Ordinary, RLIMIT_MEMLOCK)
            .expect("spawn");
        let a = cpu.mmap(p, MmapArgs::anon(2 * M, RW)).expect("mmap 2M");
        cpu.write_fill(p, a, 8 * K, 1).expect("write");
        assert_eq!(cpu.folio_order(p, a), Ok(Some(9)), "a PMD-mapped THP");
        cpu.madvise(p, a, 4 * K, advice)
            .expect("madvise the first page");
        let c = cpu.fork(p).expect("fork");
        valid(&m);
        let mut b = [0xffu8; 1];
        let got = cpu.read_bytes(c, a, &mut b);
        match advice {
            Advice::DontFork => assert_eq!(got, Err(Signal::Segv(a)), "not mapped in the child"),
            _ => assert_eq!((got, b), (Ok(()), [0]), "wiped in the child"),
        }
        assert_eq!(
            cpu.find_mismatch(c, a + 4 * K, 4 * K, 1),
            Ok(None),
            "the rest is the parent's copy"
        );
    }
}

/// Regression: a VMA split by madvise used to leave the huge zero PMD across the boundary, and a
/// write fault in the upper VMA underflowed in `Vma::pgoff_at`.
#[test]
fn write_after_madvise_splits_a_huge_zero_pmd_gets_a_zeroed_page() {
    let m = new_machine(Variant::Thp);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = cpu
        .spawn(Privilege::Ordinary, RLIMIT_MEMLOCK)
        .expect("spawn");
    let a = cpu.mmap(p, MmapArgs::anon(2 * M, RW)).expect("mmap 2M");
    cpu.touch(p, a, 1, Access::Read)
        .expect("a read maps the huge zero page");
    cpu.madvise(p, a, 4 * K, Advice::HugePage)
        .expect("madvise the first page");
    valid(&m);
    cpu.write_fill(p, a + 4 * K, 1, 1).expect("write");
    assert_eq!(cpu.find_mismatch(p, a, 4 * K, 0), Ok(None));
    assert_eq!(cpu.find_mismatch(p, a + 4 * K + 1, 4 * K - 1, 0), Ok(None));
    valid(&m);
}

/// Regression (found by `random_sequences_match_the_model_with_thp_always`): the huge zero
/// folio, allocated on its first use, kept the data of the folio its frames last held, so a
/// read fault on a fresh mapping read another mapping's freed byte.
#[test]
fn the_huge_zero_folio_reads_zeroes_when_its_frames_held_data() {
    let m = new_machine(Variant::Thp);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = cpu
        .spawn(Privilege::Ordinary, RLIMIT_MEMLOCK)
        .expect("spawn");
    // Not PMD-aligned: 64K folios, written, then freed.
    let a = cpu
        .mmap(
            p,
            MmapArgs {
                placement: usermm::Placement::Hint(WIN + 576 * PAGE),
                populate: true,
                ..MmapArgs::anon(2 * M, RW)
            },
        )
        .expect("mmap");
    assert_eq!(a, WIN + 576 * PAGE);
    cpu.write_fill(p, a + 496 * PAGE, 1, 1).expect("write");
    cpu.madvise(p, a, 2 * M, Advice::DontNeed)
        .expect("dontneed");
    valid(&m);
    // A read of a fresh PMD-aligned mapping maps the huge zero folio, allocated now.
    let c = cpu
        .mmap(
            p,
            MmapArgs {
                placement: usermm::Placement::Fixed(WIN),
                ..MmapArgs::anon(2 * M, RO)
            },
        )
        .expect("fixed");
    assert_eq!(cpu.find_mismatch(p, c, 2 * M, 0), Ok(None));
    assert_eq!(cpu.folio_order(p, c), Ok(Some(9)), "the huge zero folio");
    valid(&m);
}
