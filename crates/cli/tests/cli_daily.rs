//! `usermm` for daily use: one JSON document per `run`, tunables checked before anything
//! runs (in files and on the command line), `bench compare`, `bench scenario`, completions
//! and the manual page. Runs the built binary.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use usermm_bench::model::{
    Better, Column, HostInfo, Report, Row, RunInfo, Stat, Table, Unit, Variant,
};

fn usermm(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_usermm"))
        .args(args)
        .output()
        .expect("run usermm")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A fresh directory for one test.
fn dir(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("cli_daily_{name}"));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("mkdir");
    d
}

fn write(d: &Path, name: &str, text: &str) -> String {
    let p = d.join(name);
    std::fs::write(&p, text).expect("write");
    p.to_string_lossy().into_owned()
}

fn scenarios() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios")
}

const OK: &str = "p0 = spawn\na = p0 mmap 64K rw private anon\np0 write a 64K pattern=0xA5\n\
                  expect p0 read a 64K pattern=0xA5\n";
/// A failed expectation on line 3, then an mlock of an unmapped range aborts on line 4.
const ABORTS: &str = "p0 = spawn\na = p0 mmap 4K rw private anon\n\
                      expect p0 read a 4K pattern=0x11\np0 mlock a+8K 4K\np0 exit\n";
const BAD_TUNABLES: &str =
    "set tunable fork_pte_bach=per-pte\nset tunable fork_pte_batch=perpte\np0 = spawn\n";

#[test]
fn run_json_is_one_document_for_all_files() {
    let d = dir("run_json");
    let ok = write(&d, "ok.scn", OK);
    let aborts = write(&d, "aborts.scn", ABORTS);
    let bad = write(&d, "bad.scn", BAD_TUNABLES);
    let missing = d.join("missing.scn").to_string_lossy().into_owned();
    let o = usermm(&["run", "--json", &ok, &aborts, &bad, &missing]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("one JSON document");
    assert_eq!(v["exit_code"], 2);
    let files = v["files"].as_array().expect("files");
    assert_eq!(files.len(), 4);

    let f = &files[0];
    assert_eq!(f["file"], ok.as_str());
    assert_eq!(f["exit_code"], 0);
    assert_eq!(f["statements"], 4);
    assert!(f["abort"].is_null());
    assert_eq!(f["failures"].as_array().map(Vec::len), Some(0));
    let counters = f["counters"].as_object().expect("counters");
    assert!(counters.len() > 20, "every counter: {counters:?}");
    assert!(counters.values().any(|c| c == 0), "zeros are included");
    assert!(counters["frames_allocated"].as_u64() > Some(0));
    assert!(f["wall_seconds"].as_f64() > Some(0.0));

    let f = &files[1];
    assert_eq!(f["file"], aborts.as_str());
    assert_eq!(f["exit_code"], 1);
    assert_eq!(f["failures"][0]["line"], 3);
    assert_eq!(f["abort"]["line"], 4);
    assert_eq!(f["abort"]["col"], 1);
    assert_eq!(f["abort"]["kind"], "failed");
    assert!(f["abort"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("ENOMEM")));

    let f = &files[2];
    assert_eq!(f["exit_code"], 2);
    assert_eq!(f["statements"], 0);
    let pe = f["parse_errors"].as_array().expect("parse errors");
    assert_eq!(pe.len(), 2);
    assert_eq!((&pe[0]["line"], &pe[0]["col"]), (&1.into(), &13.into()));
    assert!(pe[0]["message"]
        .as_str()
        .is_some_and(|m| m.contains("did you mean `fork_pte_batch`?")));
    assert_eq!((&pe[1]["line"], &pe[1]["col"]), (&2.into(), &28.into()));
    assert!(pe[1]["message"]
        .as_str()
        .is_some_and(|m| m.contains("did you mean `per-pte`?")));

    let f = &files[3];
    assert_eq!(f["exit_code"], 2);
    assert!(f["read_error"]
        .as_str()
        .is_some_and(|m| m.contains("cannot read")));
}

#[test]
fn a_bad_tunable_in_a_file_is_a_parse_error_and_nothing_runs() {
    let d = dir("bad_tunable");
    let bad = write(&d, "bad.scn", BAD_TUNABLES);
    let o = usermm(&["run", &bad]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(stdout(&o), "", "nothing ran");
    let e = stderr(&o);
    assert!(
        e.contains(&format!(
            "{bad}:1:13: unknown tunable `fork_pte_bach`; did you mean `fork_pte_batch`?"
        )),
        "{e}"
    );
    assert!(
        e.contains(&format!(
            "{bad}:2:28: bad value `perpte` for tunable `fork_pte_batch` (accepted: batched|per-pte); did you mean `per-pte`?"
        )),
        "{e}"
    );
}

#[test]
fn a_bad_tunable_option_blames_the_option() {
    let d = dir("bad_option");
    let ok = write(&d, "ok.scn", OK);
    let o = usermm(&["run", "--tunable", "nope=1", &ok]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(stdout(&o), "");
    let e = stderr(&o);
    assert!(
        e.starts_with("usermm: --tunable nope=1: unknown tunable `nope`"),
        "{e}"
    );
    assert!(!e.contains("ok.scn"), "{e}");
    let o = usermm(&["run", "--json", "--tunable", "fork_pte_bach=per-pte", &ok]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("--tunable fork_pte_bach=per-pte: unknown tunable `fork_pte_bach`; did you mean `fork_pte_batch`?"),
        "{}",
        stderr(&o)
    );
    let o = usermm(&["run", "--tunable", "fork_pte_batch=per-pte", &ok]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains(": ok: 4 statements"));
}

#[test]
fn run_reads_standard_input() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_usermm"))
        .args(["run", "--json", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    use std::io::Write;
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(OK.as_bytes())
        .expect("write");
    let o = child.wait_with_output().expect("wait");
    assert_eq!(o.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("json");
    assert_eq!(v["files"][0]["file"], "-");
    assert_eq!(v["files"][0]["statements"], 4);
}

#[test]
fn tunables_and_kmap_as_json() {
    let o = usermm(&["tunables", "--json"]);
    assert_eq!(o.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("json");
    let list = v.as_array().expect("array");
    let fork = list
        .iter()
        .find(|t| t["name"] == "fork_pte_batch")
        .expect("fork_pte_batch");
    assert_eq!(fork["value"], "batched");
    assert_eq!(fork["values"], "batched|per-pte");
    assert!(fork["help"].as_str().is_some_and(|h| !h.is_empty()));

    let o = usermm(&["kmap", "--json", "--ram", "2G"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("json");
    assert_eq!(v["ram_bytes"], 2u64 << 30);
    let mapped: u64 = v["leaves"]
        .as_array()
        .expect("leaves")
        .iter()
        .filter_map(|l| l["bytes"].as_u64())
        .sum();
    assert!(mapped > 0);
    assert!(!v["runs"].as_array().expect("runs").is_empty());
}

#[test]
fn bench_scenario_sweeps_a_tunable() {
    let d = dir("bench_scenario");
    let json = d.join("sweep.json");
    let fork_cow = scenarios().join("fork-cow.scn");
    let o = usermm(&[
        "bench",
        "scenario",
        fork_cow.to_str().expect("path"),
        "--sweep",
        "fork_pte_batch=per-pte,batched",
        "--reps",
        "3",
        "--json",
        json.to_str().expect("path"),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    let header = out
        .lines()
        .find(|l| l.contains("per-pte") && l.contains("batched") && !l.contains('('))
        .unwrap_or_else(|| panic!("no header with both columns:\n{out}"));
    assert!(header.find("per-pte") < header.find("batched"), "{header}");
    assert!(out.contains("Median "), "{out}");
    assert!(
        out.contains("fork_batches "),
        "the counter that differs:\n{out}"
    );
    let r = Report::from_json(&std::fs::read_to_string(&json).expect("json")).expect("report");
    let t = &r.tables[0];
    let names: Vec<&str> = t.variants.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(names, ["per-pte", "batched", "host"]);
    assert_eq!(t.baseline, "per-pte");
    let row = &t.rows[0];
    assert!(row.columns[..2].iter().all(|c| c.samples.len() == 3));
    // The host column: the same file on the kernel as root, else why not.
    match oracle::sys::geteuid() {
        0 => assert_eq!(row.columns[2].samples.len(), 3, "{:?}", row.columns[2]),
        _ => assert!(row.columns[2].unavailable.is_some()),
    }
    let batches = |i: usize| row.columns[i].counters.get("fork_batches").copied();
    assert!(batches(0) > batches(1), "batched fork takes fewer batches");
    assert!(row.columns[1].gain_ci95_pct.is_some());

    // Two sweeps: the cartesian product, four columns.
    let o = usermm(&[
        "bench",
        "scenario",
        fork_cow.to_str().expect("path"),
        "--sweep",
        "fork_pte_batch=per-pte,batched",
        "--sweep",
        "zap_pte_batch=per-pte,batched",
        "--reps",
        "1",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("per-pte/batched"), "{}", stdout(&o));
    assert!(stdout(&o).contains("batched/per-pte"));
}

#[test]
fn bench_scenario_refuses_bad_sweeps() {
    let fork_cow = scenarios().join("fork-cow.scn");
    let f = fork_cow.to_str().expect("path");
    let o = usermm(&[
        "bench",
        "scenario",
        f,
        "--sweep",
        "fork_pte_bach=per-pte,batched",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("did you mean `fork_pte_batch`?"),
        "{}",
        stderr(&o)
    );
    let d = dir("bench_scenario_bad");
    let sets = write(
        &d,
        "sets.scn",
        "set tunable fork_pte_batch=batched\np0 = spawn\n",
    );
    let o = usermm(&[
        "bench",
        "scenario",
        &sets,
        "--sweep",
        "fork_pte_batch=per-pte,batched",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("would override --sweep"),
        "{}",
        stderr(&o)
    );
}

/// A one-table report whose `batched` cells have `samples`, `per-pte` fixed.
fn report(batched: &[f64]) -> Report {
    let col = |name: &str, s: &[f64]| Column::new(name, s.to_vec(), BTreeMap::new());
    let base = [1.0, 1.02, 0.98, 1.01, 0.99];
    Report {
        cost_model: None,
        schema_version: usermm_bench::SCHEMA_VERSION,
        generator: "test".into(),
        meta: Default::default(),
        run: RunInfo {
            which: "fork".into(),
            scale_bytes: 4 << 20,
            reps: 5,
            max_reps: 5,
            tight_pp: 10.0,
            spawn_seconds: 0.0,
            linear_map_gib: Vec::new(),
            reclaim_memory_bytes: 0,
        },
        host: HostInfo {
            kernel: String::new(),
            cpus: 1,
            numa_nodes: 1,
            host_columns: String::new(),
        },
        wall_seconds: 1.0,
        bench_seconds: Vec::new(),
        tables: vec![Table {
            host_matches: None,
            cost_model: None,
            id: "fork".into(),
            title: "fork".into(),
            seed: None,
            metric: "fork() time".into(),
            unit: Unit::Seconds,
            better: Better::Lower,
            stats: vec![Stat::Min, Stat::Median, Stat::Max],
            baseline: "per-pte".into(),
            variants: vec![
                Variant::engine("per-pte", "a"),
                Variant::engine("batched", "b"),
                Variant::host("the host"),
            ],
            row_label: "folio size".into(),
            rows: vec![Row {
                label: "64K".into(),
                columns: vec![
                    col("per-pte", &base),
                    col("batched", batched),
                    col("host", &[5.0, 5.0, 5.0]),
                ],
                published: Vec::new(),
                layout: None,
            }],
            counters_shown: Vec::new(),
            published_source: None,
            notes: Vec::new(),
        }],
    }
}

#[test]
fn bench_compare_marks_noise_and_real_changes() {
    let d = dir("bench_compare");
    let a = d.join("before.json");
    let b = d.join("after.json");
    std::fs::write(
        &a,
        report(&[0.5, 0.51, 0.49, 0.5, 0.52])
            .to_json()
            .expect("json"),
    )
    .expect("write");
    // per-pte unchanged (noise); batched twice as fast.
    std::fs::write(
        &b,
        report(&[0.25, 0.26, 0.24, 0.25, 0.25])
            .to_json()
            .expect("json"),
    )
    .expect("write");
    let (a, b) = (a.to_str().expect("path"), b.to_str().expect("path"));
    let o = usermm(&["bench", "compare", a, b]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    let header = out
        .lines()
        .find(|l| l.contains("before") && l.contains("after"))
        .unwrap_or_else(|| panic!("no header:\n{out}"));
    assert!(header.find("before") < header.find("after"));
    let line = |v: &str| {
        out.lines()
            .find(|l| l.starts_with(&format!("Median 64K {v}")))
            .unwrap_or_else(|| panic!("no {v} line:\n{out}"))
            .to_string()
    };
    assert!(line("per-pte").contains("(~"), "{}", line("per-pte"));
    assert!(line("batched").contains("( 50.00%)"), "{}", line("batched"));
    assert!(!line("batched").contains('~'));
    assert!(
        !out.contains("Median 64K host"),
        "host columns are not compared"
    );

    let o = usermm(&["bench", "compare", "--json", a, b]);
    assert_eq!(o.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("json");
    assert_eq!(v["runs"][1]["name"], "after");
    let lines = v["tables"][0]["lines"].as_array().expect("lines");
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[1]["variant"], "batched");
    assert_eq!(lines[1]["medians"][0], 0.5);
    assert_eq!(lines[1]["medians"][1], 0.25);
    assert_eq!(lines[1]["changes"][1]["noise"], false);
    assert_eq!(lines[0]["changes"][1]["noise"], true);
    assert!(lines[0]["changes"][0].is_null());

    let o = usermm(&["bench", "compare", a]);
    assert_eq!(o.status.code(), Some(2), "two reports at least");
}

/// `report(batched)` with counters: per-pte's `(fork_batches, fork_ptes)` 1024/1024,
/// batched's `batched`, and `fork_batches` the table's chosen counter.
fn report_with_counters(batched: &[(&str, u64)]) -> Report {
    let mut r = report(&[0.5, 0.51, 0.49, 0.5, 0.52]);
    let t = &mut r.tables[0];
    t.counters_shown = vec!["fork_batches".into()];
    let own = |c: &[(&str, u64)]| c.iter().map(|&(k, v)| (k.to_string(), v)).collect();
    t.rows[0].columns[0].counters = own(&[("fork_batches", 1024), ("fork_ptes", 1024)]);
    t.rows[0].columns[1].counters = own(batched);
    r
}

#[test]
fn bench_compare_shows_counters_and_their_differences() {
    let d = dir("bench_compare_counters");
    let a = d.join("before.json");
    let b = d.join("after.json");
    let before = report_with_counters(&[("fork_batches", 64), ("fork_ptes", 1024)]);
    let after =
        report_with_counters(&[("fork_batches", 16), ("fork_ptes", 1024), ("cow_copies", 3)]);
    std::fs::write(&a, before.to_json().expect("json")).expect("write");
    std::fs::write(&b, after.to_json().expect("json")).expect("write");
    let (a, b) = (a.to_str().expect("path"), b.to_str().expect("path"));
    let o = usermm(&["bench", "compare", a, b]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    let line = |start: &str| {
        out.lines()
            .find(|l| l.starts_with(start))
            .unwrap_or_else(|| panic!("no `{start}` line:\n{out}"))
            .split_whitespace()
            .skip(start.split_whitespace().count())
            .collect::<Vec<_>>()
            .join(" ")
    };
    // The chosen counter, same or not; one that differs; not one that is the same everywhere.
    assert_eq!(line("  fork_batches 64K per-pte"), "1024 1024 (=)");
    assert_eq!(line("  fork_batches 64K batched"), "64 16 (-48)");
    assert_eq!(line("  cow_copies 64K batched"), "- 3");
    assert!(!out.contains("fork_ptes"), "{out}");
    // Under their own Median line.
    let median = out.find("Median 64K batched").expect("median line");
    assert!(out.find("  fork_batches 64K batched").expect("counter") > median);

    let o = usermm(&["bench", "compare", "--json", a, b]);
    assert_eq!(o.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("json");
    let counters = &v["tables"][0]["lines"][1]["counters"];
    let by_name = |n: &str| {
        counters
            .as_array()
            .expect("counters")
            .iter()
            .find(|c| c["name"] == n)
            .unwrap_or_else(|| panic!("no {n} in {counters}"))
            .clone()
    };
    assert_eq!(
        by_name("fork_batches"),
        serde_json::json!({"name": "fork_batches", "values": [64, 16], "diffs": [null, -48]})
    );
    assert_eq!(
        by_name("fork_ptes"),
        serde_json::json!({"name": "fork_ptes", "values": [1024, 1024], "diffs": [null, 0]})
    );
    assert_eq!(
        by_name("cow_copies"),
        serde_json::json!({"name": "cow_copies", "values": [null, 3], "diffs": [null, null]})
    );
}

#[test]
fn bench_compare_refuses_impossible_samples_and_runs_not_alike() {
    let d = dir("bench_compare_hostile");
    let a = d.join("a.json");
    std::fs::write(
        &a,
        report(&[0.5, 0.51, 0.49, 0.5, 0.52])
            .to_json()
            .expect("json"),
    )
    .expect("write");
    let good = report(&[0.25, 0.26, 0.24, 0.25, 0.25])
        .to_json()
        .expect("json");
    let a = a.to_str().expect("path");
    for bad in ["1e999", "0.0", "-0.25", "-1e999"] {
        let b = d.join("b.json");
        std::fs::write(&b, good.replacen("0.26", bad, 1)).expect("write");
        // `calibrate --evaluate` reads reports as `bench compare` does, before any profile.
        for args in [
            &["bench", "compare", a, b.to_str().expect("path")][..],
            &["calibrate", "--evaluate", a, b.to_str().expect("path")],
        ] {
            let o = usermm(args);
            assert_ne!(o.status.code(), Some(0), "{args:?} {bad}: {}", stdout(&o));
            let e = stderr(&o);
            assert!(
                e.contains("is not a positive finite time") || e.contains("not a bench report"),
                "{args:?} {bad}: {e}"
            );
        }
    }
    // Another scale is refused (the 64M-vs-16M pair), and compared with --force and a warning.
    let mut other = report(&[0.25, 0.26, 0.24, 0.25, 0.25]);
    other.run.scale_bytes = 16 << 20;
    let b = d.join("c.json");
    std::fs::write(&b, other.to_json().expect("json")).expect("write");
    let o = usermm(&["bench", "compare", a, b.to_str().expect("path")]);
    assert_ne!(o.status.code(), Some(0), "{}", stdout(&o));
    assert!(stderr(&o).contains("not run alike"), "{}", stderr(&o));
    let o = usermm(&["bench", "compare", "--force", a, b.to_str().expect("path")]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("c ran at 16 MiB, a at 4 MiB"),
        "{}",
        stderr(&o)
    );
    // Reports with no table in common: nothing matched is an error, not an empty success.
    let mut elsewhere = report(&[0.25, 0.26, 0.24, 0.25, 0.25]);
    elsewhere.tables[0].id = "munmap".into();
    let e = d.join("e.json");
    std::fs::write(&e, elsewhere.to_json().expect("json")).expect("write");
    let o = usermm(&["bench", "compare", a, e.to_str().expect("path")]);
    assert_ne!(o.status.code(), Some(0), "{}", stdout(&o));
    assert!(stderr(&o).contains("nothing to compare"), "{}", stderr(&o));
}

#[test]
fn calibrate_check_reads_the_profile_first_and_takes_no_other_mode() {
    let d = dir("calibrate_check");
    // A file that is no profile is refused before any probe runs (no host side needed).
    let bad = d.join("bad.json");
    std::fs::write(&bad, "{\"version\": 2}").expect("write");
    let o = usermm(&[
        "calibrate",
        "--check",
        "--show",
        bad.to_str().expect("path"),
    ]);
    assert_ne!(o.status.code(), Some(0), "{}", stdout(&o));
    assert!(stdout(&o).is_empty(), "{}", stdout(&o));
    assert!(stderr(&o).contains("profile"), "{}", stderr(&o));
    // A check calibrates nothing, writes nothing and prices no report.
    for other in ["--json", "--refit", "--no-pool", "--out=x.json"] {
        let o = usermm(&["calibrate", "--check", other]);
        assert_eq!(o.status.code(), Some(2), "{other}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("cannot be used with"),
            "{other}: {}",
            stderr(&o)
        );
    }
}

#[test]
fn completions_and_man_page() {
    for shell in ["bash", "zsh", "fish"] {
        let o = usermm(&["completions", shell]);
        assert_eq!(o.status.code(), Some(0));
        let s = stdout(&o);
        assert!(s.contains("usermm") && s.contains("tunables"), "{shell}");
    }
    let o = usermm(&["man"]);
    assert_eq!(o.status.code(), Some(0));
    assert!(stdout(&o).contains(".TH usermm 1"));
    let o = usermm(&["man", "bench", "scenario"]);
    assert_eq!(o.status.code(), Some(0));
    assert!(stdout(&o).contains(".TH usermm-bench-scenario 1"));
    assert!(stdout(&o).contains("sweep"));
    // The language reference as a page of its own: its sections and its grammar.
    let o = usermm(&["man", "language"]);
    assert_eq!(o.status.code(), Some(0));
    let page = stdout(&o);
    assert!(
        page.starts_with(".TH USERMM-LANGUAGE 7"),
        "{}",
        &page[..80.min(page.len())]
    );
    assert!(page.contains(".SH \"GRAMMAR\""));
    assert!(page.contains("expect counters") && page.contains("bench begin"));
    // Fenced blocks are no-fill text, kept line for line.
    assert!(
        page.contains(".nf\nfile        = { line"),
        "the grammar block"
    );
}

#[test]
fn run_reports_as_tap_and_junit_for_ci() {
    let d = dir("ci-formats");
    let good = scenarios().join("fork-cow.scn").display().to_string();
    let bad = write(
        &d,
        "bad.scn",
        "p0 = spawn\na = p0 mmap 4K rw private anon\nexpect p0 read a 4K pattern=0x1\n",
    );
    let missing = d.join("missing.scn").display().to_string();
    let o = usermm(&["run", "--format", "tap", &good, &bad, &missing]);
    assert_eq!(o.status.code(), Some(2));
    let t = stdout(&o);
    assert!(t.starts_with("TAP version 13\n1..3\n"), "{t}");
    assert!(t.contains(&format!("ok 1 - {good}\n")), "{t}");
    assert!(t.contains(&format!("not ok 2 - {bad}\n")), "{t}");
    assert!(t.contains("expected pattern=0x01"), "{t}");
    assert!(t.contains(&format!("not ok 3 - {missing}\n")), "{t}");
    let o = usermm(&["run", "--format", "junit", &good, &bad, &missing]);
    let x = stdout(&o);
    assert!(x.contains("tests=\"3\" failures=\"1\" errors=\"1\""), "{x}");
    assert_eq!(x.matches("<testcase ").count(), 3, "{x}");
    assert!(
        x.contains("<failure message=") && x.contains("<error message="),
        "{x}"
    );
}

#[test]
fn oracle_json_is_one_document_naming_each_files_outcome() {
    let d = dir("oracle_json");
    let ok = write(&d, "ok.scn", OK);
    let bad = write(&d, "bad.scn", "p0 = spawn\nx = p0 mapp 4K\n");
    let o = usermm(&["oracle", "--format", "json", &ok, &bad]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let doc: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("one JSON document");
    assert_eq!(doc["exit_code"], 2);
    let files = doc["files"].as_array().expect("files");
    if files.is_empty() {
        // Not root (or no THP knobs): the oracle cannot run here and says why on stderr.
        assert!(stderr(&o).contains("usermm oracle"), "{}", stderr(&o));
        return;
    }
    assert_eq!(files.len(), 2);
    assert_eq!(files[0]["status"], "ok", "{doc}");
    assert_eq!(files[0]["differences"].as_array().map(Vec::len), Some(0));
    assert_eq!(files[1]["status"], "not run");
    let err = files[1]["error"].as_str().expect("error");
    assert!(
        err.ends_with("bad.scn:2:8: unknown statement `mapp`"),
        "{err}"
    );
    let tap = usermm(&["oracle", "--format", "tap", &ok, &bad]);
    let text = stdout(&tap);
    assert!(text.starts_with("TAP version 13\n1..2\nok 1 - "), "{text}");
    assert!(text.contains("not ok 2 - "), "{text}");
}

/// `usermm run --stats`: each statement with the counters it moved, as text and in the JSON.
#[test]
fn run_stats_prints_each_statement_s_counter_deltas() {
    let d = dir("run_stats");
    let f = write(
        &d,
        "s.scn",
        "p0 = spawn\na = p0 mmap 64K rw private anon\np0 write a 64K pattern=0x5a\n\
         p1 = p0 fork\np1 write a 4K pattern=0x1\n",
    );
    let o = usermm(&["run", "--stats", &f]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    let line = |n: u32| {
        out.lines()
            .find(|l| l.contains(&format!("s.scn:{n}: ")))
            .unwrap_or_else(|| panic!("no line {n}:\n{out}"))
            .to_string()
    };
    assert!(line(3).contains("faults +16"), "{}", line(3));
    assert!(
        line(5).contains("cow_copies +1") && line(5).contains("faults +1"),
        "{}",
        line(5)
    );
    assert!(!line(4).contains("cow_copies"), "{}", line(4));
    let o = usermm(&["run", "--stats", "--json", &f]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("json");
    let stats = v["files"][0]["stats"].as_array().expect("stats");
    assert_eq!(stats.len(), 5);
    assert_eq!(stats[4]["line"], 5);
    assert_eq!(stats[4]["counters"]["cow_copies"], 1);
    assert_eq!(stats[2]["counters"]["faults"], 16);
}
