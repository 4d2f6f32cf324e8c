//! `usermm bench scenario --sweep thp=…` and its host columns: the THP policy reaches both
//! the engine and the host kernel (the same `set thp` statement on both), the host runs the
//! same statements through the oracle's host backend between the same marks, and without
//! root (or with `--no-host`) the host columns say why they are empty.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn usermm(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_usermm"))
        .args(args)
        .output()
        .expect("run usermm")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn dir(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("bench_scenario_{name}"));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("mkdir");
    d
}

/// Writes 4 MiB (two PMD-aligned 2 MiB blocks) between the marks, then expects them THP-backed:
/// true under `thp=always` on either side, false under `never`.
const FILE: &str = "p0 = spawn
a = p0 mmap 4M rw private anon fixed 0x40000000
bench begin
p0 write a 4M pattern=0x5a
bench end
expect p0 smaps a AnonHugePages=4M
";

fn report(d: &Path, extra: &[&str]) -> (Output, serde_json::Value) {
    let scn = d.join("thp.scn");
    std::fs::write(&scn, FILE).expect("write");
    let json = d.join("out.json");
    let mut args = vec![
        "bench",
        "scenario",
        scn.to_str().expect("path"),
        "--sweep",
        "thp=never,always",
        "--reps",
        "1",
        "--json",
        json.to_str().expect("path"),
    ];
    args.extend(extra);
    let o = usermm(&args);
    let v = std::fs::read_to_string(&json)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_else(|| panic!("no report: {}", text(&o.stderr)));
    (o, v)
}

fn names(t: &serde_json::Value) -> Vec<String> {
    t["variants"]
        .as_array()
        .expect("variants")
        .iter()
        .map(|v| {
            format!(
                "{}:{}",
                v["kind"].as_str().unwrap_or("?"),
                v["name"].as_str().unwrap_or("?")
            )
        })
        .collect()
}

#[test]
fn a_thp_sweep_reaches_the_engine_and_the_host() {
    let d = dir("thp");
    let (o, v) = report(&d, &[]);
    let t = &v["tables"][0];
    assert_eq!(
        names(t),
        [
            "engine:never",
            "engine:always",
            "host:host/never",
            "host:host/always"
        ]
    );
    // Only `never` fails its expectation on the engine: exit 1 (the host does not decide it).
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    let cols = t["rows"][0]["columns"].as_array().expect("columns");
    // Between the marks: 1024 PTE faults under never, 2 PMD faults under always.
    assert_eq!(cols[0]["counters"]["faults_anon"], 1024, "{}", cols[0]);
    assert_eq!(cols[1]["counters"]["faults_anon_pmd"], 2, "{}", cols[1]);
    assert!(
        cols[1]["counters"].get("faults_anon").is_none(),
        "{}",
        cols[1]
    );
    let notes: Vec<&str> = t["notes"]
        .as_array()
        .expect("notes")
        .iter()
        .filter_map(|n| n.as_str())
        .collect();
    assert!(
        notes
            .iter()
            .any(|n| n.starts_with("never: an expectation failed")
                && n.contains("AnonHugePages: expected 4096K, found 0K")),
        "{notes:?}"
    );
    assert!(!notes.iter().any(|n| n.starts_with("always:")), "{notes:?}");
    if oracle::sys::geteuid() == 0 {
        // The host ran the file under each policy: 6 statements and the sweep's `set thp`.
        for c in &cols[2..] {
            assert!(c.get("unavailable").is_none_or(|u| u.is_null()), "{c}");
            assert_eq!(c["samples"].as_array().map(Vec::len), Some(1), "{c}");
            assert!(c["samples"][0].as_f64().is_some_and(|s| s > 0.0), "{c}");
            assert_eq!(c["counters"]["host_statements"], 7, "{c}");
        }
        assert!(
            notes
                .iter()
                .any(|n| n.starts_with("host/never: an expectation failed")
                    && n.contains("host: smaps AnonHugePages: expected 4096K, found 0K")),
            "{notes:?}"
        );
        assert!(
            !notes.iter().any(|n| n.starts_with("host/always:")),
            "the host's THP policy was not applied: {notes:?}"
        );
    } else {
        for c in &cols[2..] {
            let why = c["unavailable"].as_str().unwrap_or_default();
            assert!(why.contains("root"), "{c}");
        }
    }
}

#[test]
fn host_columns_can_be_left_out_and_bad_thp_sweeps_are_refused() {
    let d = dir("no_host");
    let (o, v) = report(&d, &["--no-host"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    let cols = v["tables"][0]["rows"][0]["columns"]
        .as_array()
        .expect("columns")
        .clone();
    for c in &cols[2..] {
        assert_eq!(c["unavailable"], "n/a (left out: --no-host)", "{c}");
    }
    assert!(v["host"]["host_columns"]
        .as_str()
        .is_some_and(|h| h.contains("--no-host")));

    let scn = d.join("thp.scn");
    let scn = scn.to_str().expect("path");
    let o = usermm(&[
        "bench",
        "scenario",
        scn,
        "--sweep",
        "thp=never,sometimes",
        "--no-host",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o.stderr).contains("`sometimes` is not a THP policy"),
        "{}",
        text(&o.stderr)
    );
    let own = d.join("own.scn");
    std::fs::write(&own, format!("set thp top=always\n{FILE}")).expect("write");
    let o = usermm(&[
        "bench",
        "scenario",
        own.to_str().expect("path"),
        "--sweep",
        "thp=never",
        "--no-host",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o.stderr).contains("own.scn:1:1: the file sets the THP policy itself"),
        "{}",
        text(&o.stderr)
    );
}
