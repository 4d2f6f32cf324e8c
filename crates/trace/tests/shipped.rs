//! The traces shipped in `traces/` replay on the engine without root or perf, and agree with
//! what the host recorded.

use std::path::PathBuf;
use trace::format::Event;
use trace::{replay, ReplayOptions, Trace};

/// Largest relative RssAnon difference at a recorded exit.
const RSS_TOLERANCE: f64 = 0.05;

fn shipped() -> Vec<(PathBuf, Trace)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../traces");
    let mut v: Vec<_> = std::fs::read_dir(&dir)
        .expect("traces/ exists")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "umt"))
        .collect();
    v.sort();
    v.into_iter()
        .map(|p| {
            let t = trace::read_file(&p).unwrap();
            (p, t)
        })
        .collect()
}

#[test]
fn four_traces_are_shipped_small() {
    let t = shipped();
    assert!(t.len() >= 4, "{} traces", t.len());
    for (p, t) in &t {
        assert!(
            t.file_bytes <= 2 << 20,
            "{}: {} bytes",
            p.display(),
            t.file_bytes
        );
        assert!(
            t.file_bytes as f64 / t.events.len() as f64 <= 16.0,
            "{}: more than 16 bytes per event",
            p.display()
        );
        assert!(matches!(t.events.first(), Some(Event::Spawn { .. })));
        assert!(t.events.iter().any(|e| matches!(e, Event::Validate { .. })));
    }
}

#[test]
fn shipped_traces_replay_and_agree_with_the_host() {
    for (p, t) in shipped() {
        let name = p.display();
        let r = replay(&t, &ReplayOptions::default()).unwrap();
        let faults = t
            .events
            .iter()
            .filter(|e| matches!(e, Event::Fault { .. }))
            .count() as u64;
        let calls = t
            .events
            .iter()
            .filter(|e| {
                matches!(
                    e,
                    Event::Mmap { .. }
                        | Event::Munmap { .. }
                        | Event::Mprotect { .. }
                        | Event::Mremap { .. }
                        | Event::Brk { .. }
                        | Event::Madvise { .. }
                        | Event::Mlock { .. }
                        | Event::Munlock { .. }
                        | Event::Mlockall { .. }
                        | Event::Munlockall { .. }
                )
            })
            .count() as u64;
        let validates = t
            .events
            .iter()
            .filter(|e| matches!(e, Event::Validate { .. }))
            .count();
        // Every event ran, against a known process.
        assert_eq!(r.events, t.events.len() as u64, "{name}");
        assert_eq!(r.faults, faults, "{name}");
        assert_eq!(r.syscalls, calls, "{name}");
        assert_eq!(r.unknown_process, 0, "{name}");
        assert_eq!(r.lost, 0, "{name}: the recording lost records");
        assert_eq!(r.file_as_anon, 0, "{name}");
        // No call may differ from the host's outcome (docs/record-replay.md: the allowance is 0).
        assert_eq!(r.errno_mismatches, 0, "{name}: {:?}", r.mismatches);
        assert_eq!(r.fault_signals, 0, "{name}: a recorded fault got a signal");
        assert_eq!(r.image_errors, 0, "{name}");
        // The faults went through the engine's fault path.
        assert!(r.snapshot.get(usermm::Ev::Fault) > 0, "{name}");
        // RssAnon at every recorded exit, within 5 %.
        assert_eq!(r.rss.len(), validates, "{name}");
        for c in &r.rss {
            assert!(c.host_anon_kb > 0, "{name}: {c:?}");
            assert!(c.anon_rel_err <= RSS_TOLERANCE, "{name}: {c:?}");
            assert!(!c.anon_huge_off(), "{name}: {c:?}");
        }
        // Deterministic counters, also on the RAM the previous replay left behind (the
        // second replay on this thread reuses it, old contents and all).
        let again = replay(&t, &ReplayOptions::default()).unwrap();
        assert_eq!(r.snapshot, again.snapshot, "{name}");
        assert_eq!(r.rss, again.rss, "{name}");
    }
}

#[test]
fn a_policy_switch_changes_what_the_engine_does() {
    let (_, t) = shipped()
        .into_iter()
        .find(|(p, _)| p.to_string_lossy().contains("python3-json"))
        .expect("the python3 trace");
    let base = replay(&t, &ReplayOptions::default()).unwrap();
    let mthp = replay(
        &t,
        &ReplayOptions {
            thp: vec![("64K".into(), "always".into())],
            ..Default::default()
        },
    )
    .unwrap();
    use usermm::Ev;
    assert_eq!(base.snapshot.get(Ev::FaultAnonMthp), 0);
    assert!(mthp.snapshot.get(Ev::FaultAnonMthp) > 0);
    // 64K folios fault fewer times and allocate more frames than the 4K host policy.
    assert!(mthp.snapshot.get(Ev::FaultAnon) < base.snapshot.get(Ev::FaultAnon));
    assert!(mthp.snapshot.get(Ev::FramesAlloc) > base.snapshot.get(Ev::FramesAlloc));
    // A bad setting is refused before anything runs.
    let bad = ReplayOptions {
        tunables: vec![("fork_pte_batch".into(), "sometimes".into())],
        ..Default::default()
    };
    assert!(replay(&t, &bad).is_err());
}

#[test]
fn small_traces_export_as_scenarios_that_run_on_the_engine() {
    for (p, t) in shipped() {
        let text = trace::export::to_scenario(&t).unwrap();
        let script = scenario::parse(&p.display().to_string(), &text)
            .unwrap_or_else(|e| panic!("{}: {e:?}", p.display()));
        let r = scenario::run::run(&script, &scenario::run::RunOptions::default());
        assert_eq!(r.exit_code(), 0, "{}: {:?}", p.display(), r.abort);
        assert!(r.counters.get(usermm::Ev::Fault) > 0);
    }
    // No cap on events: 60 000 of them export; the text stops at the output budget.
    let big = Trace {
        events: vec![Event::Lost { count: 1 }; 60_000],
        ..Trace::default()
    };
    let text = trace::export::to_scenario(&big).unwrap();
    assert_eq!(text.matches("records lost").count(), 60_000);
    let small = trace::Budget {
        max_output: 100_000,
        ..trace::Budget::default()
    };
    assert!(matches!(
        trace::export::to_scenario_with(&big, &small),
        Err(trace::export::ExportError::Output(_, 100_000))
    ));
}

/// Every trace recorded under a THP policy replays under it as the host ran: no problem,
/// every exit's RssAnon exactly the host's and, where PMD THPs exist, the same
/// AnonHugePages. Among them the fork-heavy ones: `traces/python3-forkers.py` (a 32 MiB
/// heap, four children writing a quarter each: under 2M the same THPs in every process
/// that has them, under 64K the heap faults 64K folios) and `traces/redis-bgsave.sh` (a
/// BGSAVE child forked from a ~80 MB server that keeps taking writes).
#[test]
fn thp_recordings_replay_under_their_policy() {
    use usermm::Ev;
    let all = shipped();
    let mut thp = 0;
    for (p, t) in &all {
        if !t.header.policy.contains("=always") {
            continue;
        }
        thp += 1;
        let r = replay(t, &ReplayOptions::default()).unwrap();
        let name = p.display();
        assert!(r.problems().is_empty(), "{name}: {:?}", r.problems());
        assert!(
            r.rss.iter().all(|c| c.host_anon_kb == c.engine_anon_kb),
            "{name}: {:?}",
            r.rss
        );
        let huge: Vec<(u64, u64)> = r.rss.iter().filter_map(|c| c.anon_huge_kb).collect();
        assert!(huge.iter().all(|(h, e)| h == e), "{name}: {huge:?}");
        if t.header.policy.contains("2048K=always") {
            assert!(r.snapshot.get(Ev::FaultAnonPmd) > 0, "{name}");
            assert!(huge.iter().any(|&(h, _)| h > 0), "{name}: {huge:?}");
        } else {
            assert!(r.snapshot.get(Ev::FaultAnonMthp) > 0, "{name}");
        }
        if p.to_string_lossy().contains("forkers-2m") {
            assert!(
                huge.iter().filter(|(h, _)| *h >= 16 << 10).count() >= 4,
                "{huge:?}"
            );
        }
        // A BGSAVE is a fork whose parent keeps writing: copy-on-write faults.
        if p.to_string_lossy().contains("redis-bgsave") {
            assert!(r.snapshot.get(Ev::CowCopy) > 1000, "{name}");
        }
        // Recorded with the page cache each file mapping found (format 2): the replay
        // starts from it, and every exit's RssFile is within 1 % of the host's.
        if t.events
            .iter()
            .any(|e| matches!(e, trace::format::Event::Cache { .. }))
        {
            assert!(r.cache_seeded > 0 && r.cache_errors == 0, "{name}");
            for c in &r.rss {
                let off = c.engine_file_kb.abs_diff(c.host_file_kb) as f64;
                assert!(off <= 0.01 * c.host_file_kb as f64, "{name}: {c:?}");
            }
        }
    }
    assert!(thp >= 4, "{thp} traces recorded under THP");
}
