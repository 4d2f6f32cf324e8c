//! A structure-aware fuzzer of the trace readers (issue 34): proptest on the stable
//! toolchain.
//!
//! Each case generates a trace of valid structure with hostile fields (lengths and addresses
//! at the ends of the address space, sizes that wrap, counts of 2⁶³, pids that reuse or never
//! existed, strings of control characters, bidirectional overrides and newlines followed by
//! scenario statements, file ids defined twice or never), writes it with the crate's writer
//! (which must produce what the reader accepts: the decoded trace writes back to the same
//! bytes), then mutates the payload (bytes flipped, inserted, deleted, a slice repeated up
//! to thousands of times, a hostile varint written over a field, the stream cut) and the
//! compressed file, and feeds the original and every mutant to every reader: the decoder,
//! `show` (header and events printed escaped), `stats`, `export` and a replay within a
//! budget. Nothing may panic; every error names a byte; every reader stays within the
//! budget (its own 5 s limit stops one that spins: no wall time is asserted, timings live in
//! benchmarks) and the process's live heap stays under 512 MiB (a counting allocator); no
//! printed or exported text carries a control character or lets a trace string start a
//! line.
//!
//! Case count: `USERMM_FUZZ_CASES` (default 300; CI runs 2000 with overflow checks, next to
//! the scenario fuzz run). `USERMM_FUZZ_SEED=N` (or `random`) explores other cases.
#![allow(unsafe_code)] // the counting allocator below

use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestRunner};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use trace::format::{self, Decoder, Event, FormatError, Header, Image, ImageVma};
use trace::replay::{replay_decoder, ReplayError};
use trace::{Budget, ReplayOptions};

/// The global allocator, counting live bytes and their peak.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(n: usize) {
    let now = LIVE.fetch_add(n, Relaxed) + n;
    PEAK.fetch_max(now, Relaxed);
}

// SAFETY: every method forwards to `System` with the caller's layout and pointer unchanged;
// the counters are plain atomics.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: forwarded (see the impl).
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            grew(l.size());
        }
        p
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        // SAFETY: forwarded (see the impl).
        let p = unsafe { System.alloc_zeroed(l) };
        if !p.is_null() {
            grew(l.size());
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size(), Relaxed);
        // SAFETY: forwarded (see the impl).
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        // SAFETY: forwarded (see the impl).
        let q = unsafe { System.realloc(p, l, n) };
        if !q.is_null() {
            LIVE.fetch_sub(l.size(), Relaxed);
            grew(n);
        }
        q
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// What the readers did over the run, so that the fuzzer is seen to reach each of them.
#[derive(Debug, Default)]
struct Reached {
    decoded: AtomicUsize,
    decode_errors: AtomicUsize,
    budget_stops: AtomicUsize,
    exported: AtomicUsize,
    replayed: AtomicUsize,
    replayed_events: AtomicUsize,
}

static REACHED: Reached = Reached {
    decoded: AtomicUsize::new(0),
    decode_errors: AtomicUsize::new(0),
    budget_stops: AtomicUsize::new(0),
    exported: AtomicUsize::new(0),
    replayed: AtomicUsize::new(0),
    replayed_events: AtomicUsize::new(0),
};

/// Most live heap in this test binary at any time (the replay machine's 64 MiB arena and
/// every reader's buffers included).
const MAX_HEAP: usize = 512 << 20;

fn cases() -> u32 {
    std::env::var("USERMM_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300)
}

fn config() -> Config {
    Config {
        cases: cases(),
        failure_persistence: None,
        rng_seed: match std::env::var("USERMM_FUZZ_SEED") {
            Ok(v) if v == "random" => RngSeed::Random,
            Ok(v) => RngSeed::Fixed(v.parse().unwrap_or(34)),
            Err(_) => RngSeed::Fixed(34),
        },
        ..Config::default()
    }
}

/// Marks text that must never start a line of `export` output.
const INJECTED: &str = "p9 = spawn";

fn hostile_string() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("\n".to_string()),
        Just("\r".to_string()),
        Just(format!("\n{INJECTED}\n")),
        Just("\nset memory 1G".to_string()),
        Just("\u{1b}[2J\u{1b}]0;t\u{7}".to_string()),
        Just("\u{202e}\u{2066}\u{200b}\u{feff}\u{2028}\u{85}".to_string()),
        Just("\\".to_string()),
        Just("# = é".to_string()),
        "[a-z/.]{0,12}",
        ".{0,8}",
    ];
    prop_oneof![
        3 => proptest::collection::vec(piece, 0..6).prop_map(|v| v.concat()),
        1 => (1usize..5000).prop_map(|n| "é".repeat(n)),
    ]
}

fn big() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(4096),
        Just(3 << 30),
        Just(1 << 47),
        Just(0x7fff_ffff_f000),
        Just(1 << 63),
        Just(u64::MAX),
        Just(u64::MAX - 4095),
        (0u64..1 << 20).prop_map(|p| p << 12),
        any::<u64>(),
    ]
}

/// An address: mostly in one 4 MiB region (so that calls and faults meet), sometimes
/// anything.
fn addr() -> impl Strategy<Value = u64> {
    prop_oneof![
        6 => (0u64..1024).prop_map(|p| 0x1000_0000 + (p << 12)),
        1 => big(),
    ]
}

/// A length: mostly up to 1 MiB, sometimes anything.
fn len() -> impl Strategy<Value = u64> {
    prop_oneof![
        6 => (1u64..256).prop_map(|p| p << 12),
        1 => 1u64..8192,
        1 => big(),
    ]
}

fn ret() -> impl Strategy<Value = i64> {
    prop_oneof![
        Just(0i64),
        Just(-12),
        Just(-22),
        Just(-4095),
        Just(i64::MIN),
        Just(i64::MAX),
        (0u64..1 << 20).prop_map(|p| (0x1000_0000 + (p << 12)) as i64),
        any::<i64>(),
    ]
}

fn pid() -> impl Strategy<Value = u32> {
    prop_oneof![4 => 1u32..4, 1 => any::<u32>()]
}

fn file_id() -> impl Strategy<Value = Option<u32>> {
    prop_oneof![
        Just(None),
        (0u32..4).prop_map(Some),
        any::<u32>().prop_map(Some)
    ]
}

fn image() -> impl Strategy<Value = Image> {
    let vma = (addr(), len(), any::<u8>(), 0u8..8, file_id(), big()).prop_map(
        |(start, len, prot, flags, file, offset)| ImageVma {
            start,
            end: start.wrapping_add(len),
            prot,
            flags,
            file,
            offset,
        },
    );
    (
        proptest::collection::vec(vma, 0..4),
        proptest::collection::vec((addr(), any::<bool>()), 0..8),
    )
        .prop_map(|(vmas, pages)| Image { vmas, pages })
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        1 => pid().prop_map(|pid| Event::Spawn { pid }),
        1 => (pid(), pid(), any::<u8>()).prop_map(|(parent, child, flags)| Event::Fork {
            parent,
            child,
            flags
        }),
        1 => (pid(), image()).prop_map(|(pid, image)| Event::Exec { pid, image }),
        1 => pid().prop_map(|pid| Event::Exit { pid }),
        1 => (0u32..4, len(), hostile_string()).prop_map(|(id, size, path)| Event::File {
            id,
            dev: 8 << 20,
            ino: 1,
            size,
            path
        }),
        4 => (pid(), addr(), len(), 0u32..16, any::<u32>(), file_id(), big(), ret()).prop_map(
            |(pid, addr, len, prot, flags, file, offset, ret)| Event::Mmap {
                pid,
                addr,
                len,
                prot,
                // Mostly meaningful flags: private/shared, anonymous, fixed, populate, locked.
                flags: if flags & 1 == 0 { flags & 0x10_a032 } else { flags },
                fd: if file.is_some() { 3 } else { -1 },
                offset,
                file,
                ret
            }
        ),
        1 => (pid(), addr(), len(), ret()).prop_map(|(pid, addr, len, ret)| Event::Munmap {
            pid,
            addr,
            len,
            ret
        }),
        1 => (pid(), addr(), len(), 0u32..16, ret()).prop_map(|(pid, addr, len, prot, ret)| {
            Event::Mprotect {
                pid,
                addr,
                len,
                prot,
                ret,
            }
        }),
        1 => (pid(), addr(), len(), len(), 0u32..8, addr(), ret()).prop_map(
            |(pid, addr, old_len, new_len, flags, new_addr, ret)| Event::Mremap {
                pid,
                addr,
                old_len,
                new_len,
                flags,
                new_addr,
                ret
            }
        ),
        1 => (pid(), addr(), ret()).prop_map(|(pid, brk, ret)| Event::Brk { pid, brk, ret }),
        2 => (pid(), addr(), len(), 0u32..30, ret()).prop_map(|(pid, addr, len, advice, ret)| {
            Event::Madvise {
                pid,
                addr,
                len,
                advice,
                ret,
            }
        }),
        1 => (pid(), addr(), len(), 0u32..3, ret()).prop_map(|(pid, addr, len, flags, ret)| {
            Event::Mlock {
                pid,
                addr,
                len,
                flags,
                ret,
            }
        }),
        1 => (pid(), addr(), len(), ret()).prop_map(|(pid, addr, len, ret)| Event::Munlock {
            pid,
            addr,
            len,
            ret
        }),
        1 => (pid(), 0u32..8, ret()).prop_map(|(pid, flags, ret)| Event::Mlockall { pid, flags, ret }),
        1 => (pid(), ret()).prop_map(|(pid, ret)| Event::Munlockall { pid, ret }),
        6 => (pid(), addr(), any::<bool>(), any::<bool>()).prop_map(|(pid, addr, write, user)| {
            Event::Fault {
                pid,
                addr: addr & !4095,
                write,
                user,
            }
        }),
        1 => (pid(), any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(pid, a, f, h)| {
            Event::Validate {
                pid,
                rss_anon_kb: a,
                rss_file_kb: f,
                anon_huge_kb: h,
            }
        }),
        1 => prop_oneof![Just(1u64 << 63), Just(u64::MAX), any::<u64>()]
            .prop_map(|count| Event::Lost { count }),
        1 => (pid(), prop_oneof![Just(7u8), Just(11u8)], addr())
            .prop_map(|(pid, signo, addr)| Event::Signal { pid, signo, addr }),
    ]
}

fn header() -> impl Strategy<Value = Header> {
    (
        hostile_string(),
        hostile_string(),
        prop_oneof![
            4 => proptest::collection::vec(hostile_string(), 0..4),
            1 => (1000usize..1100).prop_map(|n| vec!["a".to_string(); n]),
        ],
        hostile_string(),
        any::<u64>(),
    )
        .prop_map(|(host, kernel, command, policy, recorded_at)| Header {
            host,
            kernel,
            command,
            policy,
            recorded_at,
        })
}

/// A trace: the root's spawn and exec, then hostile events.
fn trace() -> impl Strategy<Value = (Header, Vec<Event>)> {
    (header(), image(), proptest::collection::vec(event(), 0..48)).prop_map(|(h, img, rest)| {
        let mut ev = vec![Event::Spawn { pid: 1 }, Event::Exec { pid: 1, image: img }];
        ev.extend(rest);
        (h, ev)
    })
}

/// One mutation of a payload.
#[derive(Clone, Debug)]
enum Mutation {
    Flip(usize, u8),
    Insert(usize, u8),
    Delete(usize),
    /// Repeat `len` bytes at `at` this many times (an event run into an amplifier).
    Repeat(usize, usize, usize),
    /// Write a hostile varint over the bytes at `at`.
    Varint(usize, u64),
    Cut(usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let at = any::<usize>();
    prop_oneof![
        (at, 1u8..=255).prop_map(|(a, x)| Mutation::Flip(a, x)),
        (at, any::<u8>()).prop_map(|(a, x)| Mutation::Insert(a, x)),
        at.prop_map(Mutation::Delete),
        (at, 1usize..24, prop_oneof![1usize..16, 100usize..5000])
            .prop_map(|(a, l, n)| Mutation::Repeat(a, l, n)),
        (
            at,
            prop_oneof![
                Just(1u64 << 24),
                Just(65_536),
                Just(4096),
                Just(1 << 63),
                Just(u64::MAX),
                any::<u64>()
            ]
        )
            .prop_map(|(a, v)| Mutation::Varint(a, v)),
        at.prop_map(Mutation::Cut),
    ]
}

fn mutate(p: &mut Vec<u8>, m: &Mutation) {
    if p.is_empty() {
        return;
    }
    let n = p.len();
    match *m {
        Mutation::Flip(a, x) => p[a % n] ^= x,
        Mutation::Insert(a, x) => p.insert(a % (n + 1), x),
        Mutation::Delete(a) => {
            p.remove(a % n);
        }
        Mutation::Repeat(a, l, k) => {
            let s = a % n;
            let e = (s + l).min(n);
            let chunk = p[s..e].to_vec();
            let tail = p.split_off(e);
            for _ in 0..k {
                p.extend_from_slice(&chunk);
            }
            p.extend(tail);
        }
        Mutation::Varint(a, mut v) => {
            let mut at = a % n;
            loop {
                let b = if v >= 0x80 { (v as u8) | 0x80 } else { v as u8 };
                if at < p.len() {
                    p[at] = b;
                } else {
                    p.push(b);
                }
                at += 1;
                if v < 0x80 {
                    break;
                }
                v >>= 7;
            }
        }
        Mutation::Cut(a) => p.truncate(a % n),
    }
}

/// The budget every reader runs within here: small, so that a mutant reaches its limits.
fn budget() -> Budget {
    Budget {
        max_events: 20_000,
        max_seconds: 5.0,
        max_image_pages: 50_000,
        max_touch: 16 << 20,
        max_walk: 1 << 30,
        max_output: 1 << 20,
    }
}

fn no_control(text: &str, what: &str) -> Result<(), TestCaseError> {
    let bad = text.chars().find(|&c| {
        (c.is_control() && c != '\n')
            || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    });
    prop_assert!(bad.is_none(), "{what}: {bad:?} in {text:?}");
    Ok(())
}

/// Runs one reader on one input and checks the live heap stayed bounded.
fn bounded<T>(what: &str, f: impl FnOnce() -> T) -> Result<T, TestCaseError> {
    let r = f();
    let peak = PEAK.load(Relaxed);
    prop_assert!(peak < MAX_HEAP, "{what}: {} MiB of heap", peak >> 20);
    Ok(r)
}

fn named_byte(e: &impl std::fmt::Display) -> Result<(), TestCaseError> {
    let s = e.to_string();
    prop_assert!(s.contains("byte "), "error without an offset: {s}");
    Ok(())
}

/// Every reader on one file's bytes.
fn every_reader(bytes: &[u8]) -> Result<(), TestCaseError> {
    let b = budget();
    // decode (and stats: counts per kind, lost records saturating)
    let stats = bounded("decode", || -> Result<(u64, u64), FormatError> {
        let mut d = Decoder::from_bytes(bytes, &b)?;
        let mut lost = 0u64;
        let mut kinds = std::collections::BTreeMap::new();
        while let Some(e) = d.next_event()? {
            if let Event::Lost { count } = e {
                lost = lost.saturating_add(count);
            }
            *kinds.entry(e.kind()).or_insert(0u64) += 1;
        }
        Ok((d.events(), lost))
    })?;
    match &stats {
        Ok(_) => REACHED.decoded.fetch_add(1, Relaxed),
        Err(FormatError::Budget { .. }) => REACHED.budget_stops.fetch_add(1, Relaxed),
        Err(_) => REACHED.decode_errors.fetch_add(1, Relaxed),
    };
    if let Err(e) = &stats {
        named_byte(e)?;
    }
    // show: the header escaped, events as Debug, within the output budget
    bounded("show", || -> Result<(), TestCaseError> {
        let Ok(mut d) = Decoder::from_bytes(bytes, &b) else {
            return Ok(());
        };
        let h = d.header().clone();
        let mut out = 0usize;
        for s in [&h.host, &h.kernel, &h.policy]
            .into_iter()
            .chain(&h.command)
        {
            no_control(&trace::escape(s), "show header")?;
        }
        while let Ok(Some(e)) = d.next_event() {
            let line = format!("{e:x?}");
            no_control(&line, "show")?;
            out += line.len();
            if out as u64 > b.max_output {
                break;
            }
        }
        Ok(())
    })??;
    // export
    bounded("export", || -> Result<(), TestCaseError> {
        let Ok(mut d) = Decoder::from_bytes(bytes, &b) else {
            return Ok(());
        };
        let Ok(mut x) = trace::export::Exporter::new(d.header(), &b) else {
            return Ok(());
        };
        while let Ok(Some(e)) = d.next_event() {
            if x.event(&e).is_err() {
                break;
            }
        }
        let text = x.finish();
        REACHED.exported.fetch_add(1, Relaxed);
        prop_assert!(text.len() as u64 <= b.max_output);
        no_control(&text, "export")?;
        for l in text.lines() {
            prop_assert!(
                !l.starts_with(INJECTED) && !l.starts_with("set memory"),
                "{l}"
            );
        }
        Ok(())
    })??;
    // replay within the budget, on a small machine
    bounded("replay", || -> Result<(), TestCaseError> {
        let Ok(mut d) = Decoder::from_bytes(bytes, &b) else {
            return Ok(());
        };
        let opts = ReplayOptions {
            memory: 64 << 20,
            budget: b.clone(),
            ..ReplayOptions::default()
        };
        match replay_decoder(&mut d, &opts) {
            Ok(r) => {
                prop_assert!(r.events <= b.max_events);
                REACHED.replayed.fetch_add(1, Relaxed);
                REACHED
                    .replayed_events
                    .fetch_add(r.events as usize, Relaxed);
            }
            Err(ReplayError::Format(e)) => named_byte(&e)?,
            Err(e @ ReplayError::Budget { .. }) => {
                REACHED.budget_stops.fetch_add(1, Relaxed);
                prop_assert!(e.to_string().contains("--max-"))
            }
            Err(e) => prop_assert!(false, "{e}"),
        }
        Ok(())
    })??;
    Ok(())
}

fn payload_of(bytes: &[u8]) -> Vec<u8> {
    zstd::stream::decode_all(&bytes[format::PREAMBLE..]).expect("the writer's frame")
}

#[test]
fn fuzz_every_reader_on_hostile_and_mutated_traces() {
    let mut runner = TestRunner::new(config());
    let input = (
        trace(),
        proptest::collection::vec(mutation(), 1..4),
        any::<usize>(),
        1u8..=255,
    );
    runner
        .run(&input, |((h, ev), muts, at, x)| {
            // The writer writes only what the reader accepts, and a decoded trace writes
            // back to the same bytes.
            let bytes = format::write(&h, &ev).unwrap();
            let t = format::read_with(&bytes, &Budget::UNLIMITED).map_err(|e| {
                TestCaseError::fail(format!("the writer wrote what the reader refuses: {e}"))
            })?;
            prop_assert!(t.header.command.len() <= format::MAX_ARGS as usize);
            let again = format::write(&t.header, &t.events).unwrap();
            prop_assert_eq!(&again, &bytes);
            every_reader(&bytes)?;
            // The events as generated (never through the writer), to the readers of a trace
            // built in memory.
            let raw = trace::Trace {
                header: h.clone(),
                events: ev.clone(),
                ..trace::Trace::default()
            };
            let b = budget();
            if let Ok(text) = bounded("export (in memory)", || {
                trace::export::to_scenario_with(&raw, &b)
            })? {
                no_control(&text, "export (in memory)")?;
            }
            let opts = ReplayOptions {
                memory: 64 << 20,
                budget: b,
                ..ReplayOptions::default()
            };
            let _ = bounded("replay (in memory)", || trace::replay(&raw, &opts))?;
            // The payload mutated, then sealed again.
            let mut p = payload_of(&bytes);
            for m in &muts {
                mutate(&mut p, m);
            }
            every_reader(&format::seal(&p).unwrap())?;
            // The compressed file mutated.
            let mut z = bytes.clone();
            let i = at % z.len();
            z[i] ^= x;
            every_reader(&z)?;
            Ok(())
        })
        .unwrap();
    // Each reader was reached, on inputs that decode and on inputs that do not.
    eprintln!("{REACHED:?}");
    let n = |a: &AtomicUsize| a.load(Relaxed);
    let cases = cases() as usize;
    assert!(n(&REACHED.decoded) >= cases, "{REACHED:?}");
    assert!(n(&REACHED.decode_errors) >= cases / 10, "{REACHED:?}");
    assert!(n(&REACHED.replayed) >= cases / 2, "{REACHED:?}");
    assert!(n(&REACHED.replayed_events) >= 10 * cases, "{REACHED:?}");
    assert!(n(&REACHED.exported) >= cases, "{REACHED:?}");
    assert!(n(&REACHED.budget_stops) >= 1, "{REACHED:?}");
}

/// The hostile files of `common`: every reader ends within the budget.
#[test]
fn every_reader_on_the_hostile_files() {
    let mut runner = TestRunner::new(Config {
        cases: 1,
        ..config()
    });
    runner
        .run(&Just(()), |()| {
            for (name, bytes) in common::hostile() {
                every_reader(&bytes).map_err(|e| TestCaseError::fail(format!("{name}: {e}")))?;
            }
            Ok(())
        })
        .unwrap();
}

mod common;
