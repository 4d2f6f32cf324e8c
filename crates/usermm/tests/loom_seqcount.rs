//! Model checking of seed 003's atomic seqcount and the folio record it protects (issue 5).
//!
//! Run with (a separate target directory keeps the `--cfg loom` build from evicting the normal
//! one):
//!
//! ```text
//! CARGO_TARGET_DIR=target/loom RUSTFLAGS="--cfg loom" \
//!     cargo test -p usermm --release --test loom_seqcount
//! ```
//!
//! The engine's own code runs under loom: `usermm::sharing::seqcount` and
//! `usermm::sharing::rmap_id::FolioWords` are generic over the [`Word`] trait, implemented here
//! for loom's `AtomicU64`. Two or three writers each apply one (un)map to the record while a
//! reader takes a snapshot (the retrying `read_begin`/`read_retry` loop) and a COW-style
//! one-shot look (`raw_read`, no waiting). Every snapshot a reader accepts must equal the state
//! after some subset of the writers' sections, and after all threads finish the record must
//! hold every writer's delta (no update lost by the exclusive writer's plain load+store).
//! Coverage counters show that the exclusive-writer path, the add-return race (a would-be
//! exclusive writer converting to shared), shared writers waiting for the exclusive one, and
//! reader retries all occurred. Two negative controls show the checker catches a reader that
//! skips `read_retry` and writers that skip the writer count.

#![allow(unexpected_cfgs)]
#![cfg(loom)]

use loom::sync::atomic::AtomicU64;
use loom::sync::Arc;
use loom::thread;
use std::sync::atomic::{AtomicU64 as StdU64, Ordering};
use usermm::sharing::rmap_id::{FolioWords, Maintained, Snapshot, RECORD_WORDS};
use usermm::sharing::seqcount::{SeqCount, SeqEvent, Word, WriterMode, WRITERS_MASK};
use usermm::sharing::subid::{Layout, Sizing};

/// Coverage counters, summed over every explored execution (std atomics, outside the model).
static EVENTS: [StdU64; 5] = [
    StdU64::new(0),
    StdU64::new(0),
    StdU64::new(0),
    StdU64::new(0),
    StdU64::new(0),
];

fn event_index(e: SeqEvent) -> usize {
    match e {
        SeqEvent::Exclusive => 0,
        SeqEvent::Converted => 1,
        SeqEvent::Shared => 2,
        SeqEvent::WaitedForExclusive => 3,
        SeqEvent::ReaderRetry => 4,
    }
}

fn events() -> [u64; 5] {
    std::array::from_fn(|i| EVENTS[i].load(Ordering::Relaxed))
}

struct L(AtomicU64);

impl Word for L {
    fn load(&self, o: Ordering) -> u64 {
        self.0.load(o)
    }
    fn store(&self, v: u64, o: Ordering) {
        self.0.store(v, o)
    }
    fn fetch_add(&self, v: u64, o: Ordering) -> u64 {
        self.0.fetch_add(v, o)
    }
    fn compare_exchange(&self, c: u64, n: u64, ok: Ordering, f: Ordering) -> Result<u64, u64> {
        self.0.compare_exchange(c, n, ok, f)
    }
    fn fence(o: Ordering) {
        loom::sync::atomic::fence(o)
    }
    fn relax(_spins: &mut u32) {
        thread::yield_now();
    }
    fn note(e: SeqEvent) {
        EVENTS[event_index(e)].fetch_add(1, Ordering::Relaxed);
    }
}

fn record() -> Arc<Vec<L>> {
    Arc::new((0..RECORD_WORDS).map(|_| L(AtomicU64::new(0))).collect())
}

/// The state after `base` plus the ops whose bit is set in `mask`.
fn expected(what: Maintained, base: (u32, i64), ops: &[(u32, i64)], mask: u32) -> Snapshot {
    let mut s = Snapshot::default();
    let mut add = |id: u32, d: i64| {
        let d = d as u64;
        s.total = s.total.wrapping_add(d);
        if what.sq {
            s.s1 = s.s1.wrapping_add(d.wrapping_mul(u64::from(id)));
            s.s2 =
                s.s2.wrapping_add(d.wrapping_mul(u64::from(id) * u64::from(id)));
        }
        if let Some(l) = what.rmap {
            for j in 0..l.values as usize {
                s.vals[j] = s.vals[j].wrapping_add(d.wrapping_mul(l.subid_of(id, j as u32)));
            }
        }
    };
    add(base.0, base.1);
    for (i, &(id, d)) in ops.iter().enumerate() {
        if mask >> i & 1 != 0 {
            add(id, d);
        }
    }
    s
}

fn consistent(what: Maintained, base: (u32, i64), ops: &[(u32, i64)], s: &Snapshot) -> bool {
    (0..1u32 << ops.len()).any(|m| expected(what, base, ops, m) == *s)
}

fn small() -> Maintained {
    Maintained {
        rmap: Some(Sizing::Safe.layout(2)),
        seed_sizing: false,
        sq: false,
    }
}

fn full() -> Maintained {
    Maintained {
        rmap: Some(Layout {
            values: 2,
            bits: 12,
            base: 9,
        }),
        seed_sizing: false,
        sq: true,
    }
}

/// Writers apply `ops` concurrently (one thread each) while one reader checks snapshots.
/// Prints how long a model took (with `--nocapture`).
struct Elapsed(std::time::Instant, String);

impl Drop for Elapsed {
    fn drop(&mut self) {
        eprintln!("{}: {:.1}s", self.1, self.0.elapsed().as_secs_f64());
    }
}

#[derive(Clone, Copy, Debug)]
struct Reader {
    /// Attempts of the waiting, retrying snapshot (`read_begin`/`read_retry`; 0: none).
    /// One attempt suffices for safety: every attempt is the same code, and only a successful
    /// attempt's snapshot is ever accepted.
    retrying: u32,
    /// The COW path's one-shot look (`raw_read`, no waiting, `read_retry`).
    cow_look: bool,
}

const SPIN: Reader = Reader {
    retrying: 1,
    cow_look: false,
};
const COW: Reader = Reader {
    retrying: 0,
    cow_look: true,
};

/// Writers apply `ops` concurrently (one thread each) while one reader checks snapshots.
/// `bound` is loom's preemption bound (`LOOM_BOUND` overrides it for deeper runs).
fn scenario(
    mode: WriterMode,
    what: Maintained,
    ops: &'static [(u32, i64)],
    bound: Option<usize>,
    reader: Reader,
) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = std::env::var("LOOM_BOUND")
        .ok()
        .and_then(|v| v.parse().ok())
        .or(bound);
    // Spin-waits (readers for writers, shared writers for the exclusive one) add branches.
    b.max_branches = 100_000;
    let base = (7u32, 3i64);
    let t0 = std::time::Instant::now();
    let _report = Elapsed(
        t0,
        format!(
            "{mode:?} {} writers, {reader:?}, bound {bound:?}",
            ops.len()
        ),
    );
    b.check(move || {
        let w = record();
        FolioWords::new(&w[..]).init(what, base.0, base.1 as u64);
        let mut hs = Vec::new();
        for &(id, d) in ops {
            let w = Arc::clone(&w);
            hs.push(thread::spawn(move || {
                FolioWords::new(&w[..]).apply(what, mode, id, d);
            }));
        }
        let r = {
            let w = Arc::clone(&w);
            thread::spawn(move || {
                let f = FolioWords::new(&w[..]);
                // A bounded number of retries keeps the model finite; giving up means "shared".
                if reader.retrying > 0 {
                    if let Some(s) = f.snapshot(what, reader.retrying) {
                        assert!(consistent(what, base, ops, &s), "reader accepted {s:?}");
                    }
                }
                if reader.cow_look {
                    if let Some((s, ())) = f.try_snapshot_with(what, |_| ()) {
                        assert!(consistent(what, base, ops, &s), "COW look accepted {s:?}");
                    }
                }
            })
        };
        for h in hs {
            h.join().expect("writer");
        }
        r.join().expect("reader");
        let f = FolioWords::new(&w[..]);
        assert_eq!(w[0].load(Ordering::Relaxed) & WRITERS_MASK, 0);
        let end = f.snapshot(what, 1).expect("quiescent");
        assert_eq!(end, expected(what, base, ops, u32::MAX), "lost update");
    });
}

fn delta(before: [u64; 5]) -> [u64; 5] {
    let after = events();
    std::array::from_fn(|i| after[i] - before[i])
}

const TWO: &[(u32, i64)] = &[(1, 2), (0xabc, -1)];
const THREE: &[(u32, i64)] = &[(1, 1), (2, 2), (0xfff, -1)];

#[test]
fn two_shared_writers_and_a_waiting_reader() {
    scenario(WriterMode::Shared, small(), TWO, Some(2), SPIN);
}

#[test]
fn two_shared_writers_and_a_cow_reader() {
    scenario(WriterMode::Shared, small(), TWO, Some(3), COW);
}

#[test]
fn exclusive_add_return_writers_and_a_waiting_reader() {
    let before = events();
    scenario(WriterMode::ExclusiveAddReturn, small(), TWO, Some(1), SPIN);
    let d = delta(before);
    assert!(d[0] > 0, "exclusive-writer path never taken");
    assert!(d[4] > 0, "no reader retry explored");
}

#[test]
fn exclusive_add_return_writers_and_a_cow_reader() {
    let before = events();
    scenario(WriterMode::ExclusiveAddReturn, small(), TWO, Some(2), COW);
    let d = delta(before);
    eprintln!(
        "add-return: exclusive {} converted {} shared {} waited {} retries {}",
        d[0], d[1], d[2], d[3], d[4]
    );
    assert!(d[0] > 0, "exclusive-writer path never taken");
    assert!(
        d[1] > 0,
        "add-return race (conversion to shared) never explored"
    );
    assert!(d[3] > 0, "no writer ever waited for the exclusive writer");
    assert!(d[4] > 0, "no reader retry explored");
}

#[test]
fn exclusive_cmpxchg_writers_and_readers() {
    let before = events();
    scenario(WriterMode::ExclusiveCmpxchg, small(), TWO, Some(1), SPIN);
    scenario(WriterMode::ExclusiveCmpxchg, small(), TWO, Some(2), COW);
    let d = delta(before);
    assert!(d[0] > 0, "exclusive-writer path never taken");
    assert!(d[3] > 0, "no writer ever waited for the exclusive writer");
}

#[test]
fn all_counters_two_writers_and_readers() {
    scenario(
        WriterMode::ExclusiveAddReturn,
        full(),
        &[(5, 1), (0x00fe_dcba, 2)],
        Some(1),
        SPIN,
    );
    scenario(
        WriterMode::ExclusiveAddReturn,
        full(),
        &[(5, 1), (0x00fe_dcba, 2)],
        Some(1),
        COW,
    );
}

#[test]
fn three_writers_and_a_reader() {
    let before = events();
    scenario(WriterMode::Shared, small(), THREE, Some(1), SPIN);
    scenario(WriterMode::Shared, small(), THREE, Some(1), COW);
    scenario(WriterMode::ExclusiveAddReturn, small(), THREE, Some(1), COW);
    let d = delta(before);
    assert!(
        d[0] > 0 && d[1] > 0 && d[3] > 0,
        "exclusive paths not covered: {d:?}"
    );
}

/// The remaining three-writer combinations (about 3 minutes): `--ignored`.
#[test]
#[ignore]
fn three_writers_and_a_reader_extended() {
    scenario(
        WriterMode::ExclusiveAddReturn,
        small(),
        THREE,
        Some(1),
        SPIN,
    );
    scenario(WriterMode::ExclusiveCmpxchg, small(), THREE, Some(1), SPIN);
    scenario(WriterMode::ExclusiveCmpxchg, small(), THREE, Some(1), COW);
}

/// Negative control: a reader that does not re-check the sequence accepts torn snapshots.
#[test]
fn reader_without_retry_is_caught() {
    let res = std::panic::catch_unwind(|| {
        let what = small();
        let ops: &[(u32, i64)] = &[(1, 2)];
        let base = (7u32, 3i64);
        loom::model(move || {
            let w = record();
            FolioWords::new(&w[..]).init(what, base.0, base.1 as u64);
            let w2 = Arc::clone(&w);
            let h = thread::spawn(move || {
                FolioWords::new(&w2[..]).apply(what, WriterMode::Shared, 1, 2);
            });
            let seq = SeqCount(&w[0]);
            let _start = seq.read_begin();
            let s = Snapshot {
                total: w[1].load(Ordering::Relaxed),
                vals: [w[4].load(Ordering::Relaxed), 0, 0, 0, 0, 0],
                ..Snapshot::default()
            };
            assert!(consistent(what, base, ops, &s), "torn read {s:?}");
            h.join().expect("writer");
        });
    });
    assert!(res.is_err(), "the model checker missed a torn read");
}

/// Negative control: two writers that both act as exclusive writers lose an update.
#[test]
fn writers_ignoring_each_other_are_caught() {
    let res = std::panic::catch_unwind(|| {
        loom::model(|| {
            let w = record();
            let hs: Vec<_> = (0..2)
                .map(|_| {
                    let w = Arc::clone(&w);
                    thread::spawn(move || {
                        let v = w[1].load(Ordering::Relaxed);
                        w[1].store(v + 1, Ordering::Relaxed);
                    })
                })
                .collect();
            for h in hs {
                h.join().expect("writer");
            }
            assert_eq!(w[1].load(Ordering::Relaxed), 2, "lost update");
        });
    });
    assert!(res.is_err(), "the model checker missed a lost update");
}
