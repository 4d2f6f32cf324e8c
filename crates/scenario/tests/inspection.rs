//! Scenario language v3 inspection: `expect counters` (engine counter deltas since the
//! previous one), `dump` (the engine's VMAs, entries and folios of a range) and `bench
//! begin`/`bench end` (the timed region, with its own counters).

use scenario::run::{run, RunOptions};
use usermm::Ev;

fn parse(text: &str) -> scenario::Script {
    scenario::parse("t.scn", text).unwrap_or_else(|e| panic!("{e}"))
}

fn validated() -> RunOptions {
    RunOptions {
        validate: true,
        ..RunOptions::default()
    }
}

const SETUP: &str = "p0 = spawn\na = p0 mmap 64K rw private anon fixed 0x10000000\n\
                     p0 write a 64K pattern=0x11\n";

#[test]
fn expect_counters_checks_deltas_since_the_previous_one() {
    // 16 first-touch faults, then a fork and one COW of a 4K page.
    let ok = format!(
        "{SETUP}expect counters faults=16 cow_copies=0\np1 = p0 fork\n\
         p1 write a 4K pattern=0x22\nexpect counters faults=1 cow_copies=1\n\
         expect counters faults=0\n"
    );
    let r = run(&parse(&ok), &validated());
    assert_eq!(r.exit_code(), 0, "{:?} {:?}", r.failures, r.abort);
    let wrong = format!("{SETUP}expect counters faults=15 cow_copies=0 pte_writes=19\n");
    let r = run(&parse(&wrong), &validated());
    assert_eq!(r.exit_code(), 1);
    assert_eq!(r.failures.len(), 1, "{:?}", r.failures);
    assert_eq!(r.failures[0].line, 4);
    assert_eq!(
        r.failures[0].message, "counters: faults=16 (expected 15)",
        "only the wrong counter is named"
    );
}

#[test]
fn counter_names_are_checked_when_parsed() {
    let e = scenario::parse("t.scn", "expect counters fautls=3\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("t.scn:1:17: unknown counter `fautls`; did you mean `faults`?"),
        "{e}"
    );
    let e = scenario::parse("t.scn", "expect counters faults=1 faults=2\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("t.scn:1:26"), "{e}");
    assert!(scenario::parse("t.scn", "expect counters\n").is_err());
    // A process named `counters` is still a process.
    let s = parse(
        "counters = spawn\na = counters mmap 4K rw private anon\nexpect counters maps count=1\n",
    );
    assert_eq!(s.stmts.len(), 3);
}

#[test]
fn dump_prints_vmas_entries_and_folios() {
    let text = format!("{SETUP}p1 = p0 fork\ndump p1 a 8K\n");
    let r = run(&parse(&text), &validated());
    assert_eq!(r.exit_code(), 0, "{:?} {:?}", r.failures, r.abort);
    assert_eq!(r.dumps.len(), 1);
    let (line, out) = &r.dumps[0];
    assert_eq!(*line, 5);
    assert!(out.contains("vma 0x10000000-0x10010000 rw-p"), "{out}");
    assert_eq!(
        out.lines().filter(|l| l.starts_with("pte ")).count(),
        2,
        "{out}"
    );
    // Each page is mapped by both processes after the fork: two references, two mappings.
    let folios: Vec<&str> = out.lines().filter(|l| l.starts_with("folio ")).collect();
    assert_eq!(folios.len(), 2, "{out}");
    for f in folios {
        assert!(f.contains("order 0 refcount 2 mapcount 2"), "{f}");
        assert!(f.contains("anon"), "{f}");
    }
    // A range longer than the dump's bound is refused (EINVAL), not walked.
    let r = run(&parse(&format!("{SETUP}dump p0 a 4G\n")), &validated());
    assert_eq!(r.exit_code(), 1, "{:?}", r.abort);
}

#[test]
fn bench_marks_time_and_count_only_their_region() {
    let text =
        format!("{SETUP}bench begin\np1 = p0 fork\nbench end\np1 write a 64K pattern=0x22\n");
    let r = run(&parse(&text), &validated());
    assert_eq!(r.exit_code(), 0, "{:?} {:?}", r.failures, r.abort);
    let (_, c) = r.timed.as_ref().expect("a timed region");
    assert_eq!(
        c.get(Ev::Fault),
        0,
        "the setup's and the COW's faults are outside"
    );
    assert_eq!(c.get(Ev::CowCopy), 0);
    assert_eq!(
        (r.counters.get(Ev::CowCopy), r.counters.get(Ev::Fault)),
        (16, 32)
    );
    for bad in [
        "bench end\n",
        "bench begin\nbench begin\n",
        "bench middle\n",
    ] {
        assert!(scenario::parse("t.scn", bad).is_err(), "{bad:?}");
    }
    // Without the marks nothing is timed apart.
    assert!(run(&parse(SETUP), &validated()).timed.is_none());
}
