//! Reproducers of the security and data-loss review, on the engine (the oracle corpus runs
//! the same files against the host): each failed before its fix.

use scenario::engine::EngineBackend;
use scenario::run::{run, RunOptions, Runner};
use usermm::Ev;

fn file(name: &str) -> scenario::Script {
    let path = format!(
        "{}/../../scenarios/oracle/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = scenario::read_source(&path).unwrap_or_else(|e| panic!("{e}"));
    scenario::parse(&path, &text).unwrap_or_else(|e| panic!("{e}"))
}

fn validated(tunables: &[(&str, &str)]) -> RunOptions {
    RunOptions {
        validate: true,
        tunables: tunables
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..RunOptions::default()
    }
}

fn assert_clean(name: &str) {
    let r = run(&file(name), &validated(&[]));
    assert_eq!(r.exit_code(), 0, "{name}: {:?} {:?}", r.failures, r.abort);
}

#[test]
fn mremap_with_an_old_length_past_the_address_space_is_einval_and_loses_nothing() {
    assert_clean("mremap-huge-old-len.scn");
}

#[test]
fn pins_follow_io_uring_limits_without_allocating_for_absurd_lengths() {
    assert_clean("pin-bounds.scn");
}

#[test]
fn on_cpu_shootdown_reaches_the_other_cpu() {
    assert_clean("on-cpu-shootdown.scn");
}

#[test]
fn a_skipped_shootdown_is_reported_as_a_stale_access() {
    let r = run(
        &file("on-cpu-shootdown.scn"),
        &validated(&[("test_skip_tlb_flush", "true"), ("check_tlb", "true")]),
    );
    assert_eq!(r.exit_code(), 1, "{:?}", r.abort);
    assert!(
        r.failures
            .iter()
            .any(|f| f.line == 9 && f.message.contains("succeeded")),
        "the read on cpu1 after the unmap must be the failure: {:?}",
        r.failures
    );
    assert!(r.counters.get(Ev::TlbStaleHit) >= 1);
    assert!(
        r.failures
            .iter()
            .any(|f| f.message.starts_with("validate:")),
        "validate() sees the stale TLB entry: {:?}",
        r.failures
    );
}

#[test]
fn on_cpu_runs_the_statement_on_that_cpu() {
    let text = "set cpus 3\np0 = spawn\na = p0 mmap 64K rw private anon\n\
                p0 write a 4K pattern=0x1 on cpu2\np0 read a 4K on cpu1\n";
    let script = scenario::parse("t.scn", text).expect("parses");
    let mut r = Runner::new(EngineBackend::new(Vec::new()));
    for s in &script.stmts {
        let step = r.run_stmt(s);
        assert!(step.abort.is_none() && step.expect_failure.is_none());
    }
    let m = r.backend.built().expect("machine");
    let tlbs = m.tlbs();
    let filled: Vec<usize> = tlbs.iter().map(|t| t.entries().len()).collect();
    assert_eq!(filled, vec![0, 1, 1], "cpu0 never ran an access");
    assert_eq!(
        script.to_string().lines().nth(3),
        Some("p0 write a 4K pattern=0x01 on cpu2")
    );
}

#[test]
fn on_cpu_is_checked_at_parse_time() {
    for (text, col, msg) in [
        (
            "p0 = spawn\np0 exit on cpu2\n",
            12,
            "the machine has 2 CPUs",
        ),
        (
            "set cpus 4\np0 = spawn\np0 exit on cpu4\n",
            12,
            "the machine has 4 CPUs",
        ),
        ("p0 = spawn on cpu1\n", 12, "needs a statement of a process"),
        (
            "set thp 64K=always on cpu0\n",
            20,
            "needs a statement of a process",
        ),
        ("p0 = spawn\np0 exit on cpux\n", 12, "a CPU"),
    ] {
        let e = scenario::parse("t.scn", text).expect_err(text);
        let first = e.first().expect("an error");
        assert_eq!(first.pos.col, col, "{text}: {e}");
        assert!(e.to_string().contains(msg), "{text}: {e}");
    }
}

#[test]
fn error_output_is_bounded() {
    let token = "x".repeat(10 << 20);
    let e = scenario::parse("t.scn", &format!("p0 = spawn\np0 {token}\n")).expect_err("bad");
    assert!(e.to_string().len() < 300, "{} bytes", e.to_string().len());
    assert!(e.to_string().contains('…'));
    let many = "bogus\n".repeat(1_000_000);
    let e = scenario::parse("t.scn", &many).expect_err("bad");
    assert_eq!(e.len(), scenario::MAX_ERRORS);
    assert_eq!(e.more(), 1_000_000 - scenario::MAX_ERRORS);
    assert!(e.to_string().ends_with(&format!(
        "t.scn: … and {} more errors",
        1_000_000 - scenario::MAX_ERRORS
    )));
}

/// Every sabotage switch (`test_*` tunable) makes some corpus file fail its expectations (so
/// the oracle, which checks them on both sides, catches it), and the README's examples are
/// ones that do.
#[test]
fn every_sabotage_switch_is_caught_by_the_corpus() {
    let dir = format!("{}/../../scenarios/oracle", env!("CARGO_MANIFEST_DIR"));
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("corpus")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "scn"))
        .collect();
    files.sort();
    let switches: Vec<String> = usermm::Tunables::default()
        .list()
        .into_iter()
        .map(|i| i.name.to_string())
        .filter(|n| n.starts_with("test_"))
        .collect();
    assert!(switches.len() >= 2, "{switches:?}");
    for sw in &switches {
        let caught: Vec<String> = files
            .iter()
            .filter(|f| {
                let name = f
                    .file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .to_string();
                // Caught by what a user sees (an expectation), not only by validate().
                let opts = RunOptions {
                    validate: false,
                    ..validated(&[(sw.as_str(), "true")])
                };
                run(&file(&name), &opts).exit_code() == 1
            })
            .map(|f| f.display().to_string())
            .collect();
        assert!(!caught.is_empty(), "{sw}: no corpus file notices it");
        let readme_example = match sw.as_str() {
            "test_skip_fork_wrprotect" => "fork-cow-small.scn",
            "test_skip_tlb_flush" | "test_local_flush_only" => "on-cpu-shootdown.scn",
            other => panic!("{other}: name a corpus file that catches it in the README"),
        };
        assert!(
            caught.iter().any(|c| c.ends_with(readme_example)),
            "{sw}: the README's example {readme_example} must catch it ({caught:?})"
        );
    }
}

#[test]
fn a_utf8_byte_order_mark_starts_a_file_like_nothing() {
    let text = "\u{feff}p0 = spawn\na = p0 mmap 64K rw private anon\nexpect p0 read a 4K bogus\n";
    let e = scenario::parse("bom.scn", text).unwrap_err().to_string();
    // The first line parses; the error of line 3 is where it is, columns unshifted.
    assert!(e.starts_with("bom.scn:3:"), "{e}");
    let ok = "\u{feff}p0 = spawn\na = p0 mmap 64K rw private anon\np0 write a 4K pattern=0x7\n\
              expect p0 read a 4K pattern=0x7\n";
    let r = run(
        &scenario::parse("bom.scn", ok).expect("parses"),
        &validated(&[]),
    );
    assert_eq!(r.exit_code(), 0, "{:?} {:?}", r.failures, r.abort);
}

/// `set memory` past what the host could back is refused before anything runs: the arena
/// is host memory as the scenario writes it, and the host is shared. A machine under 4 MiB
/// has no RAM at all, which `validate` knows (no zero page, no false buddy report).
#[test]
fn set_memory_is_bounded_by_the_host_and_tiny_machines_validate() {
    let big = "set memory 0xffffffffffff000\np0 = spawn\n";
    let r = run(
        &scenario::parse("big.scn", big).expect("parses"),
        &validated(&[]),
    );
    match &r.abort {
        Some((_, scenario::run::Abort::CannotRun(m))) => {
            assert!(m.contains("the host has"), "{m}")
        }
        other => panic!("expected the machine to be refused: {other:?}"),
    }
    assert_eq!(r.exit_code(), 2);
    let tiny = "set memory 2M\ng = file 4K\n";
    let r = run(
        &scenario::parse("tiny.scn", tiny).expect("parses"),
        &validated(&[]),
    );
    assert!(r.failures.is_empty(), "{:?}", r.failures);
}

/// The shootdown file shows a cross-CPU shootdown: an engine that flushes only the CPU that
/// unmapped is caught by it, and would not be if its statements all ran on one CPU.
#[test]
fn a_local_flush_only_engine_is_caught_only_across_cpus() {
    let local_only = validated(&[("test_local_flush_only", "true"), ("check_tlb", "true")]);
    let r = run(&file("on-cpu-shootdown.scn"), &local_only);
    assert_eq!(r.exit_code(), 1, "{:?} {:?}", r.failures, r.abort);
    assert!(
        r.failures.iter().any(|f| f.line == 9),
        "cpu1's read after cpu0's munmap is the failure: {:?}",
        r.failures
    );
    let path = format!(
        "{}/../../scenarios/oracle/on-cpu-shootdown.scn",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = scenario::read_source(&path).expect("read");
    let one_cpu: String = text
        .lines()
        .map(|l| {
            l.split_once(" on cpu")
                .map_or(l, |(stmt, _)| stmt)
                .to_string()
                + "\n"
        })
        .collect();
    let r = run(
        &scenario::parse("one-cpu.scn", &one_cpu).expect("parses"),
        &local_only,
    );
    assert_eq!(r.exit_code(), 0, "{:?} {:?}", r.failures, r.abort);
}
