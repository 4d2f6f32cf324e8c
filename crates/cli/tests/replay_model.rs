//! `usermm replay` and `usermm bench replay` with and without a machine profile: a named
//! profile prices the workload (`model` in the JSON), no cached profile is said plainly and
//! is no error, an unreadable `--profile` is an error before anything runs. Exit codes and
//! documents only; no timing is asserted.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const TRACE: &str = "sqlite3-query.umt";

fn trace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../traces")
        .join(TRACE)
}

/// A fresh directory for one test.
fn dir(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("replay_model_{name}"));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("mkdir");
    d
}

/// `usermm ARGS` with an empty profile cache (`XDG_CACHE_HOME` in `cache`).
fn usermm(cache: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_usermm"))
        .args(args)
        .env("XDG_CACHE_HOME", cache)
        .output()
        .expect("run usermm")
}

fn example(d: &Path) -> PathBuf {
    let p = d.join("example-profile.json");
    usermm_bench::replay_model::example_profile()
        .expect("example profile")
        .save(&p)
        .expect("save");
    p
}

#[test]
fn replay_prices_the_workload_with_a_named_profile() {
    let d = dir("named");
    let profile = example(&d);
    let t = trace();
    let o = usermm(
        &d,
        &[
            "replay",
            t.to_str().unwrap(),
            "--profile",
            profile.to_str().unwrap(),
            "--json",
        ],
    );
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let m = &j["model"]["prediction"];
    let ns = m["ns"].as_f64().expect("a prediction");
    assert!(ns > 0.0);
    assert!(m["ci95_ns"][0].as_f64().unwrap() <= ns && ns <= m["ci95_ns"][1].as_f64().unwrap());
    assert!(j["model"]["profile"]
        .as_str()
        .unwrap()
        .contains("example-profile.json"));
    // The per-operation counters are in the document and sum to the counters.
    let mut sum = std::collections::BTreeMap::<String, u64>::new();
    for c in j["ops"].as_object().expect("ops").values() {
        for (k, v) in c.as_object().unwrap() {
            *sum.entry(k.clone()).or_default() += v.as_u64().unwrap();
        }
    }
    let counters: std::collections::BTreeMap<String, u64> =
        serde_json::from_value(j["counters"].clone()).unwrap();
    assert_eq!(sum, counters);
    // The text names the prediction.
    let o = usermm(
        &d,
        &[
            "replay",
            t.to_str().unwrap(),
            "--profile",
            profile.to_str().unwrap(),
        ],
    );
    assert_eq!(o.status.code(), Some(0));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("model: kernel mm time of the workload"),
        "{text}"
    );
    assert!(text.contains("counters per operation"), "{text}");
}

#[test]
fn no_profile_is_said_and_a_bad_one_is_an_error() {
    let d = dir("none");
    let t = trace();
    let o = usermm(&d, &["replay", t.to_str().unwrap()]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("model: no profile"), "{text}");
    assert!(text.contains("usermm calibrate"), "{text}");
    let o = usermm(&d, &["replay", t.to_str().unwrap(), "--json"]);
    assert_eq!(o.status.code(), Some(0));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert!(j["model"]["prediction"].is_null());
    // A named profile that cannot be read: an error, before the replay.
    let missing = d.join("missing.json");
    let bad = d.join("bad.json");
    std::fs::write(&bad, "{ not a profile").unwrap();
    for p in [&missing, &bad] {
        for cmd in [&["replay"][..], &["bench", "replay"][..]] {
            let mut args: Vec<&str> = cmd.to_vec();
            args.extend([t.to_str().unwrap(), "--profile", p.to_str().unwrap()]);
            let o = usermm(&d, &args);
            assert_ne!(o.status.code(), Some(0), "{args:?}");
            assert!(o.status.code().is_some(), "{args:?}: killed by a signal");
            assert!(
                String::from_utf8_lossy(&o.stderr).contains("--profile"),
                "{args:?}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
    }
}

#[test]
fn bench_replay_has_model_cells_for_every_column() {
    let d = dir("bench");
    let profile = example(&d);
    let t = trace();
    let o = usermm(
        &d,
        &[
            "bench",
            "replay",
            t.to_str().unwrap(),
            "--profile",
            profile.to_str().unwrap(),
            "--json",
        ],
    );
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let tab = &j["tables"][0];
    let cols = tab["columns"].as_array().unwrap();
    let cells = tab["model"].as_array().unwrap();
    assert_eq!(cols.len(), cells.len());
    for (c, m) in cols.iter().zip(cells) {
        assert!(m["ns"].as_f64().unwrap() > 0.0, "{c}");
        // Every column but the recorded 4K baseline has a gain with its interval.
        if c != "4K" {
            let g = m["gain_pct"].as_f64().unwrap();
            let ci = &m["gain_ci95_pct"];
            assert!(
                ci[0].as_f64().unwrap() <= g && g <= ci[1].as_f64().unwrap(),
                "{c}"
            );
        }
    }
    // Without a profile: the same columns, no cells, and the note says so.
    let o = usermm(&d, &["bench", "replay", t.to_str().unwrap(), "--json"]);
    assert_eq!(o.status.code(), Some(0));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert!(j["model"]
        .as_str()
        .unwrap()
        .starts_with("model: no profile"));
    assert!(j["tables"][0]["model"]
        .as_array()
        .unwrap()
        .iter()
        .all(serde_json::Value::is_null));
}
