//! The README's Python example, run by python3 against the module this build made: it maps,
//! forks, writes and reads counters, and asserts them in Python; this test asserts that it
//! ran to its last line.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The fenced `python` block after the `<!-- python-example -->` marker.
fn readme_example() -> String {
    let readme = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md");
    let text = std::fs::read_to_string(&readme).expect("README.md");
    let after = text
        .split_once("<!-- python-example -->")
        .expect("the README has a python example")
        .1;
    let body = after
        .split_once("```python\n")
        .expect("a ```python block")
        .1;
    body.split_once("```")
        .expect("the block ends")
        .0
        .to_string()
}

/// Builds the extension module and returns its path. Cargo builds only the rlib of a
/// package for its tests, so the cdylib is built here, by a nested cargo with a target
/// directory of its own (`target/python-module`: the outer cargo holds the lock of its own).
fn built_module() -> PathBuf {
    let exe = std::env::current_exe().expect("test path");
    let target = exe
        .ancestors()
        .nth(3)
        .expect("target/<profile>/deps/<test>")
        .join("python-module");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "build",
            "--release",
            "--locked",
            "-p",
            "usermm-python",
            "--target-dir",
        ])
        .arg(&target)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "building the Python module failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    target.join("release/libusermm_python.so")
}

/// Runs `script` in python3 with the built module importable; its stdout, or `None` when
/// python3 is not installed (the test then says so and passes nothing off as run).
fn run_python(what: &str, script: &str) -> Option<String> {
    if Command::new("python3").arg("--version").output().is_err() {
        eprintln!("python3 is not installed: {what} cannot run here");
        return None;
    }
    let dir = std::env::temp_dir().join(format!("usermm-python-{what}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    std::fs::copy(built_module(), dir.join("usermm.so")).expect("copy the module");
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .env("PYTHONPATH", &dir)
        .output()
        .expect("python3 runs");
    let _ = std::fs::remove_dir_all(&dir);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what} failed:\n{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(stdout)
}

#[test]
fn the_readme_python_example_runs() {
    let Some(stdout) = run_python("readme", &readme_example()) else {
        return;
    };
    // fork of 8 MiB of 4K pages with batching: one batch per PTE (order-0 folios).
    assert_eq!(stdout.trim(), "cow_copies 1 fork_batches 2048");
}

/// `usermm.Session` runs the scenario language statement by statement and reads its views;
/// `usermm.run_scenario` runs a whole file's text.
#[test]
fn a_session_runs_the_language_and_reads_its_views() {
    let script = r#"
import usermm
s = usermm.Session()
s.run("set thp 64K=always\np0 = spawn\na = p0 mmap 1M rw private anon fixed 0x10000000")
s.run("p0 write a 1M pattern=0x5a\np1 = p0 fork\np1 write a 4K pattern=0x1")
assert s.addr("a") == 0x10000000
sm = s.smaps("p0", "a")
# 16 64K folios shared by fork, one page of one of them copied (mTHP COW copies a page).
assert sm["Rss"] == 1 << 20 and sm["Private_Dirty"] == 4096, sm
assert sm["Pss"] == (1 << 20) // 2 + 2048 and sm["Pss_Anon"] == sm["Pss"], sm
pg = s.page("p1", "a+64K")
assert pg["present"] and not pg["exclusive"] and pg["folio_order"] == 4, pg
assert "refcount" in s.dump("p1", "a", "8K")
r = s.run("expect counters cow_copies=1\nexpect p1 read a 4K pattern=0x2")
assert r["failures"] == ["line 8: read: expected pattern=0x02, found 0x01 at offset 0x0"], r
try:
    s.run("p0 mmap 4K rw private anon fixed 0x0")
    raise SystemExit("no error")
except RuntimeError as e:
    assert "EPERM" in str(e), e
try:
    s.run("p0 bogus")
    raise SystemExit("no error")
except ValueError as e:
    assert "unknown statement" in str(e), e
r = usermm.run_scenario("p0 = spawn\na = p0 mmap 64K rw private anon\n"
                        "p0 write a 64K pattern=0x5a\nexpect p0 smaps a Rss=32K")
assert r["exit_code"] == 1 and r["counters"]["faults"] == 16, r
print("session ok")
"#;
    let Some(stdout) = run_python("session", script) else {
        return;
    };
    assert_eq!(stdout.trim(), "session ok");
}

/// Counters per call: `Machine.last_counters()` is what the most recent call that did mm
/// work moved (views leave it alone; a call that raised sets it too), and `Session.run`
/// returns its chunk's deltas as `"counters"`, the same as `Session.last_counters()`.
#[test]
fn each_call_exposes_its_own_counters() {
    let script = r#"
import usermm
m = usermm.Machine(memory="64M", tunables={"fork_pte_batch": "batched"})
assert m.last_counters() == {}, m.last_counters()
p = m.spawn()
a = m.mmap(p, "1M")
m.touch(p, a, "1M", write=True)
c = m.last_counters()
assert c["faults"] == 256 and c["faults_anon"] == 256, c
child = m.fork(p)
c = m.last_counters()
assert c["fork_ptes"] == 256 and c["fork_batches"] == 256 and "faults" not in c, c
m.status(p); m.counters()
assert m.last_counters() == c, "a view changed last_counters"
try:
    m.munmap(p, a + 1, "4K")
except OSError:
    pass
assert m.last_counters().get("fork_ptes") is None, m.last_counters()
s = usermm.Session()
r = s.run("set thp 64K=always\np0 = spawn\na = p0 mmap 1M rw private anon")
r = s.run("p0 write a 1M pattern=0x1")
assert r["counters"]["faults_anon_mthp"] == 16 and r["counters"] == s.last_counters(), r
r = s.run("p1 = p0 fork")
assert r["counters"]["fork_batches"] == 16 and "faults_anon_mthp" not in r["counters"], r
try:
    s.run("p1 write a 4K pattern=0x2\np1 munmap a+1 4K")
except RuntimeError:
    pass
assert s.last_counters()["cow_copies"] == 1, s.last_counters()
print("per call ok")
"#;
    let Some(stdout) = run_python("per_call", script) else {
        return;
    };
    assert_eq!(stdout.trim(), "per call ok");
}

/// `examples/fork_sweep.py` sweeps fork over folio sizes with each fork's counters; without
/// matplotlib it prints the table alone (CI has no matplotlib), with it it plots too.
#[test]
fn the_fork_sweep_example_runs() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/fork_sweep.py");
    let example = std::fs::read_to_string(&path).expect("the example");
    let out = std::env::temp_dir().join(format!("usermm-fork-sweep-{}.png", std::process::id()));
    let script = format!(
        "import sys\nsys.argv = ['fork_sweep.py', '--size', '4M', '--reps', '1', '--out', {:?}]\n{example}",
        out.display().to_string()
    );
    let Some(stdout) = run_python("fork_sweep", &script) else {
        return;
    };
    // 4 MiB: 1024 PTEs; per-PTE one batch each, batched one per folio.
    let cells = |folio: &str| -> Vec<String> {
        stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(folio))
            .unwrap_or_else(|| panic!("no {folio} line:\n{stdout}"))
            .split_whitespace()
            .skip(3)
            .map(String::from)
            .collect()
    };
    assert_eq!(cells("4K"), ["1024", "1024", "1024"]);
    assert_eq!(cells("64K"), ["1024", "1024", "64"]);
    assert_eq!(cells("1M"), ["1024", "1024", "4"]);
    let plotted = out.exists();
    let _ = std::fs::remove_file(&out);
    assert!(
        stdout.contains("matplotlib is not installed: table only") != plotted,
        "{stdout}"
    );
}
