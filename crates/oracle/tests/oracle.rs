//! The oracle against the real kernel: agreement on a tiny scenario, a deliberately broken
//! engine detected, THP knobs restored. These need root and the THP sysfs knobs; without
//! them each test prints why and returns (CI runs as root).

mod common;
use common::{host_ready, script};
use oracle::knobs;

const FORK_WRITE: &str = "\
p0 = spawn
a = p0 mmap 64K rw private anon fixed 0x200000000
p0 write a 64K pattern=0x11
p1 = p0 fork
p0 write a 4K pattern=0x22
expect p1 read a 4K pattern=0x11
expect p0 read a 4K pattern=0x22
expect p0 pagemap a exclusive
expect p1 pagemap a+4K shared
p1 exit
expect p0 pagemap a+4K exclusive
";

#[test]
fn tiny_scenario_agrees() {
    if !host_ready() {
        return;
    }
    let rep = oracle::compare(&script(FORK_WRITE), &[]);
    assert_eq!(rep.exit_code(), 0, "{rep}");
    assert!(
        rep.differences.is_empty() && rep.skipped.is_empty(),
        "{rep}"
    );
    assert_eq!(rep.statements, 11);
}

#[test]
fn broken_engine_is_caught() {
    if !host_ready() {
        return;
    }
    let broken = [("test_skip_fork_wrprotect".to_string(), "true".to_string())];
    let rep = oracle::compare(&script(FORK_WRITE), &broken);
    assert_eq!(rep.exit_code(), 1, "{rep}");
    assert!(!rep.differences.is_empty(), "{rep}");
    assert!(
        rep.to_string().contains("engine=") && rep.to_string().contains("host="),
        "{rep}"
    );
}

/// Each `test_*` tunable breaks the engine on purpose; the corpus file named beside it
/// must catch the break (README shows the same two commands).
const CATCHERS: [(&str, &str); 3] = [
    ("test_skip_fork_wrprotect", "fork-cow-small.scn"),
    ("test_skip_tlb_flush", "on-cpu-shootdown.scn"),
    ("test_local_flush_only", "on-cpu-shootdown.scn"),
];

#[test]
fn every_test_tunable_has_a_catching_corpus_file() {
    let mut named: Vec<&str> = CATCHERS.iter().map(|&(t, _)| t).collect();
    let mut all: Vec<&str> = usermm::Tunables::default()
        .list()
        .iter()
        .map(|t| t.name)
        .filter(|n| n.starts_with("test_"))
        .collect();
    named.sort_unstable();
    all.sort_unstable();
    assert_eq!(
        named, all,
        "every test_* tunable needs a corpus file in CATCHERS"
    );
    if !host_ready() {
        return;
    }
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/oracle");
    for (tunable, file) in CATCHERS {
        let path = dir.join(file);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{file}: {e}"));
        let parsed = scenario::parse(file, &text).unwrap_or_else(|e| panic!("{e}"));
        let broken = [(tunable.to_string(), "true".to_string())];
        let rep = oracle::compare(&parsed, &broken);
        assert_eq!(rep.exit_code(), 1, "{tunable} not caught by {file}: {rep}");
        assert!(
            !rep.differences.is_empty() || !rep.expect_failures.is_empty(),
            "{tunable}: {rep}"
        );
    }
}

#[test]
fn thp_knobs_are_restored() {
    if !host_ready() {
        return;
    }
    // Hold the oracle lock while reading, so another test's run does not overlap.
    let before = {
        let _guard = knobs::ThpKnobs::acquire();
        knobs::snapshot()
    };
    let before = match before {
        Ok(b) => b,
        Err(e) => panic!("{e}"),
    };
    let rep = oracle::compare(
        &script("set thp top=always 64K=always 2M=never\np0 = spawn\na = p0 mmap 2M rw private anon\np0 write a 2M pattern=0x1\n"),
        &[],
    );
    assert_eq!(rep.exit_code(), 0, "{rep}");
    let after = {
        let _guard = knobs::ThpKnobs::acquire();
        knobs::snapshot()
    };
    match after {
        Ok(a) => assert_eq!(before, a),
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn corpus_agrees_with_the_host() {
    if !host_ready() {
        return;
    }
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/oracle");
    let mut files: Vec<_> = match std::fs::read_dir(&dir) {
        Ok(rd) => rd
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "scn"))
            .collect(),
        Err(e) => panic!("{}: {e}", dir.display()),
    };
    files.sort();
    assert!(files.len() >= 12, "corpus too small: {}", files.len());
    // Files named `*noswap*` describe reclaim without a swap device; with swap the host
    // would swap their pages out.
    let swap = std::fs::read_to_string("/proc/swaps")
        .map(|t| t.lines().count() > 1)
        .unwrap_or(false);
    if swap {
        eprintln!("this host has swap: the *noswap* files are left out");
        files.retain(|f| !f.to_string_lossy().contains("noswap"));
    }
    let mut bad = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap_or_default();
        let name = f.display().to_string();
        let script = match scenario::parse(&name, &text) {
            Ok(s) => s,
            Err(e) => panic!("{e}"),
        };
        let mut rep = oracle::compare(&script, &[]);
        // The host alone missing an expectation, with no difference, is the machine's state,
        // not the engine's fidelity: a readahead window once came up one 64 KiB folio short
        // (14272K cached for 14336K) while other tests held GiBs, a large folio the page
        // cache could not allocate then. Such a file runs once more; only a repeat counts.
        let host_only = |r: &oracle::OracleReport| {
            r.differences.is_empty()
                && r.failed.is_none()
                && !r.expect_failures.is_empty()
                && r.expect_failures.iter().all(|(_, side, _)| *side == "host")
        };
        if host_only(&rep) {
            eprintln!("{name}: the host alone missed an expectation, run again:\n{rep}");
            std::thread::sleep(std::time::Duration::from_secs(2));
            rep = oracle::compare(&script, &[]);
        }
        // A v2 file (`files-*`) the engine cannot run yet is reported, not failed: there is
        // nothing to compare until the engine has files. Any other file must run.
        let v2 = f
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("files-"));
        if let (true, Some((line, m))) = (v2, &rep.cannot_run) {
            if m.starts_with("engine:") {
                eprintln!("{name}:{line}: skipped, the engine cannot run it: {m}");
                continue;
            }
        }
        if rep.exit_code() != 0 {
            bad.push(rep.to_string());
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}
