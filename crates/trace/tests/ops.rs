//! The replay's counters per operation (`ReplayReport::ops`): every shipped trace, under the
//! recorded 4K policy and under 64K and 2M THP, files each counter under the cost model's
//! operations so that they add up exactly to the replay's counters.

use std::collections::BTreeMap;
use std::path::PathBuf;
use trace::format::Event;
use trace::{replay, ReplayOptions, ReplayReport};

fn shipped() -> Vec<(PathBuf, trace::Trace)> {
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

fn check(name: &str, t: &trace::Trace, r: &ReplayReport) {
    // Sum over operations == the whole replay's counters, counter by counter.
    let mut sum: BTreeMap<String, u64> = BTreeMap::new();
    for c in r.ops.values() {
        for (k, v) in c {
            *sum.entry(k.clone()).or_insert(0) += v;
        }
    }
    assert_eq!(sum, r.counters, "{name}");
    // The distinct calls add up to the sums and the call counts.
    let mut again: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    let mut calls: BTreeMap<String, u64> = BTreeMap::new();
    for c in &r.op_distinct {
        assert!(c.count > 0 && !c.counters.is_empty(), "{name}: {c:?}");
        *calls.entry(c.op.to_string()).or_insert(0) += c.count;
        for &(k, v) in &c.counters {
            *again
                .entry(c.op.to_string())
                .or_default()
                .entry(k.to_string())
                .or_insert(0) += v * c.count;
        }
    }
    assert_eq!(again, r.ops, "{name}");
    assert_eq!(calls, r.op_calls, "{name}");
    // Only the model's operations, the engine's creation of the recorded files (one system
    // call each) and the touches that needed no fault: nothing is filed as `other`.
    let files = t
        .events
        .iter()
        .filter(|e| matches!(e, Event::File { .. }))
        .count() as u64;
    if files > 0 {
        assert_eq!(r.ops["file"].get("syscalls"), Some(&files), "{name}");
    }
    for op in r.ops.keys().filter(|op| *op != "file" && *op != "touch") {
        assert!(
            trace::replay::MODEL_OPS.contains(&op.as_str()),
            "{name}: operation {op} {:?}",
            r.ops[op]
        );
    }
    // Faults are the page touches: as many engine faults under `fault` and `fault_file` as
    // in the replay, and the file faults under `fault_file`.
    let count = |op: &str, counter: &str| {
        r.ops
            .get(op)
            .and_then(|c| c.get(counter))
            .copied()
            .unwrap_or(0)
    };
    let total = |counter: &str| r.counters.get(counter).copied().unwrap_or(0);
    assert_eq!(
        count("fault", "faults") + count("fault_file", "faults"),
        total("faults"),
        "{name}"
    );
    // A recorded fault the engine answered without one (the entry was there: a TLB refill)
    // is a `touch`, priced at nothing; every call filed as a fault took one.
    assert_eq!(count("touch", "faults"), 0, "{name}");
    for c in r.op_distinct.iter().filter(|c| c.op.starts_with("fault")) {
        assert!(
            c.counters.iter().any(|&(k, v)| k == "faults" && v > 0),
            "{name}: a fault call without a fault: {c:?}"
        );
    }
    assert_eq!(
        count("fault", "faults_file"),
        0,
        "{name}: a file fault filed as anonymous"
    );
    assert_eq!(
        count("fault_file", "faults_file"),
        total("faults_file"),
        "{name}"
    );
    // One fork call per process forked with its own mm (and the spawned root).
    let forks = t
        .events
        .iter()
        .filter(|e| match e {
            Event::Fork { flags, .. } => flags & trace::format::FORK_SHARES_VM == 0,
            Event::Spawn { .. } => true,
            _ => false,
        })
        .count() as u64;
    assert_eq!(
        r.op_calls.get("fork").copied().unwrap_or(0),
        forks,
        "{name}"
    );
    // Every exit or exec of a process with its own mm tore one down: munmap has the zaps.
    assert!(r.ops["munmap"].contains_key("zap_ptes"), "{name}");
    // System calls: each mmap-family call counts one engine syscall under its operation.
    let syscalls = |op: &str| r.ops.get(op).and_then(|c| c.get("syscalls")).copied();
    for op in ["fault", "fault_file"] {
        assert_eq!(syscalls(op), None, "{name}: a page touch is no system call");
    }
}

#[test]
fn per_operation_counters_sum_to_the_replay_counters() {
    let policies: [&[(&str, &str)]; 3] = [&[], &[("64K", "always")], &[("2M", "always")]];
    for (p, t) in shipped() {
        for thp in policies {
            let name = format!("{} {thp:?}", p.display());
            let opts = ReplayOptions {
                thp: thp
                    .iter()
                    .map(|(a, b)| (a.to_string(), b.to_string()))
                    .collect(),
                ..Default::default()
            };
            let r = replay(&t, &opts).unwrap();
            check(&name, &t, &r);
            // Deterministic, as the counters are.
            let again = replay(&t, &opts).unwrap();
            assert_eq!(r.ops, again.ops, "{name}");
            assert_eq!(r.op_distinct, again.op_distinct, "{name}");
        }
    }
}

#[test]
fn a_fork_and_an_exit_are_filed_as_fork_and_munmap() {
    // A spawned process faults two pages, forks a child that writes one of them (COW) and
    // exits, then exits itself.
    let t = trace::Trace {
        events: vec![
            Event::Spawn { pid: 1 },
            Event::Mmap {
                pid: 1,
                addr: 0,
                len: 8192,
                prot: 3,
                flags: 0x22,
                fd: -1,
                offset: 0,
                file: None,
                ret: 0x7000_0000,
            },
            Event::Fault {
                pid: 1,
                addr: 0x7000_0000,
                write: true,
                user: true,
            },
            Event::Fault {
                pid: 1,
                addr: 0x7000_1000,
                write: true,
                user: true,
            },
            Event::Fork {
                parent: 1,
                child: 2,
                flags: 0,
            },
            Event::Fault {
                pid: 2,
                addr: 0x7000_0000,
                write: true,
                user: true,
            },
            Event::Exit { pid: 2 },
            Event::Exit { pid: 1 },
        ],
        ..Default::default()
    };
    let r = replay(&t, &ReplayOptions::default()).unwrap();
    check("synthetic", &t, &r);
    assert_eq!(r.op_calls["fork"], 2, "the spawn and the fork");
    assert_eq!(r.op_calls["fault"], 3);
    assert_eq!(r.op_calls["mmap"], 1);
    assert_eq!(r.op_calls["munmap"], 2, "two exits");
    assert_eq!(r.ops["fault"]["cow_copies"], 1);
    assert_eq!(r.ops["fork"]["fork_ptes"], 2);
    assert_eq!(
        r.ops["munmap"]["zap_ptes"], 4,
        "the child's two, the parent's two"
    );
    assert!(!r.ops["fork"].contains_key("cow_copies"));
}
