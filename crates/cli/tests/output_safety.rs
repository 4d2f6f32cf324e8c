//! Output files of `bench` (`--json`, `--report`) and `trace export --scenario` on a shared
//! host: never written through a
//! link planted at the final name, never into a directory another user controls, and such a
//! directory is refused before the benchmark runs. Runs the built binary.

use std::fs;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn usermm(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_usermm"))
        .args(args)
        .output()
        .expect("run usermm")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A fresh private directory for one test.
fn scratch(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("output_safety_{name}"));
    let _ = fs::remove_dir_all(&d);
    fs::DirBuilder::new().mode(0o700).create(&d).expect("mkdir");
    d
}

const SCN: &str = "p0 = spawn\na = p0 mmap 64K rw private anon\np0 write a 64K pattern=0x5a\n";

#[test]
fn bench_json_replaces_a_planted_link_and_leaves_its_target_alone() {
    let d = scratch("link");
    let scn = d.join("s.scn");
    fs::write(&scn, SCN).expect("scenario");
    let victim = d.join("victim");
    fs::write(&victim, "precious\n").expect("victim");
    let json = d.join("out.json");
    std::os::unix::fs::symlink(&victim, &json).expect("symlink");
    let o = usermm(&[
        "bench",
        "scenario",
        "--reps",
        "1",
        "--json",
        json.to_str().expect("utf-8"),
        scn.to_str().expect("utf-8"),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(fs::read_to_string(&victim).expect("victim"), "precious\n");
    assert!(fs::symlink_metadata(&json)
        .expect("json")
        .file_type()
        .is_file());
    let doc: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&json).expect("json")).expect("a JSON report");
    assert!(doc.get("tables").is_some());
}

#[test]
fn bench_refuses_a_directory_others_can_write_before_it_runs() {
    let d = scratch("open");
    let open = d.join("open");
    fs::create_dir(&open).expect("mkdir");
    fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).expect("chmod");
    let json = open.join("r.json");
    let t0 = std::time::Instant::now();
    // The whole suite would take minutes: the refusal must come first.
    let o = usermm(&[
        "bench",
        "--no-host",
        "--json",
        json.to_str().expect("utf-8"),
    ]);
    assert_ne!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        text(&o).contains("writable by its group or others"),
        "{}",
        text(&o)
    );
    assert!(t0.elapsed().as_secs() < 20, "refused only after running");
    assert!(!json.exists());
}

#[test]
fn trace_export_replaces_a_planted_link_and_refuses_a_foreign_directory() {
    let d = scratch("export");
    let victim = d.join("victim");
    fs::write(&victim, "precious\n").expect("victim");
    let out = d.join("t.scn");
    std::os::unix::fs::symlink(&victim, &out).expect("symlink");
    let trace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../traces/sh-pipeline.umt");
    let trace = trace.to_str().expect("utf-8");
    let o = usermm(&[
        "trace",
        "export",
        "--scenario",
        out.to_str().expect("utf-8"),
        trace,
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(fs::read_to_string(&victim).expect("victim"), "precious\n");
    assert!(fs::symlink_metadata(&out)
        .expect("out")
        .file_type()
        .is_file());
    scenario::parse("t.scn", &fs::read_to_string(&out).expect("scenario")).expect("it parses");
    let open = d.join("open");
    fs::create_dir(&open).expect("mkdir");
    fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).expect("chmod");
    let o = usermm(&[
        "trace",
        "export",
        "--scenario",
        open.join("t.scn").to_str().expect("utf-8"),
        trace,
    ]);
    assert_ne!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        text(&o).contains("writable by its group or others"),
        "{}",
        text(&o)
    );
}
