//! `usermm replay --strict`: status 1 when the replay disagrees with what the host recorded,
//! 0 otherwise; every shipped trace replays strictly clean.

#[path = "../../trace/tests/common/mod.rs"]
mod common;

use std::path::Path;
use std::process::Command;

fn replay(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_usermm"))
        .arg("replay")
        .args(args)
        .output()
        .expect("usermm runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn every_shipped_trace_replays_strictly_clean() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../traces");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).expect("traces/") {
        let p = e.expect("entry").path();
        if p.extension().is_some_and(|x| x == "umt") {
            let (code, err) = replay(&["--strict", "--validate", p.to_str().expect("utf-8")]);
            assert_eq!(code, Some(0), "{}: {err}", p.display());
            n += 1;
        }
    }
    assert!(n >= 4, "{n} shipped traces");
}

#[test]
fn a_replay_that_disagrees_fails_only_under_strict() {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join("replay_strict");
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("mkdir");
    let f = d.join("lost.umt");
    let mut p = common::Payload::new(&["x"]);
    p.spawn().lost(3);
    std::fs::write(&f, p.file_bytes()).expect("write");
    let f = f.to_str().expect("utf-8");
    assert_eq!(replay(&[f]).0, Some(0), "not strict: the report is all");
    let (code, err) = replay(&["--strict", f]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("strict: 3 lost records"), "{err}");
}

/// `bench replay`: a trace that cannot be replayed within the budget is named and skipped,
/// the others still make their tables, and the status says one failed.
#[test]
fn bench_replay_names_a_failed_trace_and_goes_on() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../traces");
    let good = dir.join("sh-pipeline.umt");
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join("bench_replay_failed");
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("tmp");
    let bad = d.join("not-a-trace.umt");
    std::fs::write(&bad, b"not a trace").expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_usermm"))
        .args(["bench", "replay", "--json"])
        .arg(&bad)
        .arg(&good)
        .output()
        .expect("usermm runs");
    assert_eq!(out.status.code(), Some(1));
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    assert_eq!(j["tables"].as_array().map(Vec::len), Some(1));
    assert_eq!(j["tables"][0]["trace"], "sh-pipeline");
    assert_eq!(j["failed"][0]["trace"], bad.display().to_string());
    // A budget flag reaches every replay: too few events for the good trace fails it too.
    let out = Command::new(env!("CARGO_BIN_EXE_usermm"))
        .args(["bench", "replay", "--max-events", "3"])
        .arg(&good)
        .output()
        .expect("usermm runs");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("sh-pipeline.umt"), "{err}");
}
