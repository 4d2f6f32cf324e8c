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
