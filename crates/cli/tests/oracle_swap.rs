//! A SIGKILLed oracle run that had `set memory` and `set swap` in effect leaves a memory
//! cgroup (with a server still in it) and an active swap file; `usermm oracle
//! --restore-knobs` removes both from the run's resource journal.
//!
//! The run is this test binary re-executed (`--exact child_role`, the role in [`ROLE_ENV`]),
//! driving the oracle's host backend directly (the engine does not run `set swap` yet). It
//! uses a private lock directory and a fake THP tree (`USERMM_LOCK_DIR`, `USERMM_THP_DIR`,
//! passed to the children only), so the host's THP knobs are never touched. It adds real swap
//! and a real cgroup: it needs root, a memory cgroup controller and permission to `swapon`;
//! without them it prints why and returns.

use oracle::knobs::{LOCK_DIR_ENV, THP_DIR_ENV};
use oracle::{cgroup, swapfile};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Set in a child: what it does (see [`child_role`]).
const ROLE_ENV: &str = "USERMM_ORACLE_SWAP_ROLE";
/// The file the holder writes its cgroup and swap file paths to once they are in use.
const READY_ENV: &str = "USERMM_ORACLE_SWAP_READY";

const FAKE_KNOBS: &[(&str, &str)] = &[
    ("enabled", "always [madvise] never\n"),
    ("use_zero_page", "1\n"),
    ("khugepaged/scan_sleep_millisecs", "10000\n"),
    (
        "hugepages-2048kB/enabled",
        "always [inherit] madvise never\n",
    ),
];

const HOLD: &str = "\
set memory 32M
set swap 128M
p0 = spawn
a = p0 mmap 64M rw private anon
p0 write a 64M pattern=0x11
";

/// The `hold` role: runs [`HOLD`] on the host backend, writes `CGROUP\nSWAPFILE\n` to the
/// [`READY_ENV`] file, and sleeps until killed. Nothing when run as an ordinary test.
#[test]
fn child_role() {
    let Ok(role) = std::env::var(ROLE_ENV) else {
        return;
    };
    assert_eq!(role, "hold");
    let session = oracle::Session::new().unwrap_or_else(|e| panic!("{e}"));
    let script = scenario::parse("hold.scn", HOLD).unwrap_or_else(|e| panic!("{e}"));
    let host = oracle::HostBackend::new(session.knobs()).unwrap_or_else(|e| panic!("{e}"));
    let mut r = scenario::run::Runner::new(host);
    for stmt in &script.stmts {
        let step = r.run_stmt(stmt);
        if let Some(a) = &step.abort {
            println!("ABORT: {a:?}");
            return;
        }
    }
    let m = r.backend.machine();
    let cg = m.cgroup().unwrap_or_else(|| panic!("no cgroup"));
    let swap = swapfile::active_areas()
        .into_iter()
        .find(|a| a.contains("usermm-oracle-"))
        .unwrap_or_else(|| panic!("no swap of ours"));
    let ready = std::env::var_os(READY_ENV).unwrap_or_else(|| panic!("no {READY_ENV}"));
    fs::write(&ready, format!("{}\n{swap}\n", cg.path().display()))
        .unwrap_or_else(|e| panic!("{e}"));
    loop {
        std::thread::sleep(Duration::from_secs(600));
    }
}

fn scratch() -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join("oracle_swap");
    let _ = fs::remove_dir_all(&d);
    fs::create_dir_all(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
    for (rel, text) in FAKE_KNOBS {
        let p = d.join("thp").join(rel);
        if let Some(parent) = p.parent() {
            fs::create_dir_all(parent).unwrap_or_else(|e| panic!("{e}"));
        }
        fs::write(&p, text).unwrap_or_else(|e| panic!("{e}"));
    }
    d
}

#[test]
fn restore_knobs_removes_the_swap_and_cgroup_of_a_killed_run() {
    if oracle::sys::geteuid() != 0 {
        eprintln!("skipped: needs root");
        return;
    }
    if let Err(m) = cgroup::locate() {
        eprintln!("skipped: {m}");
        return;
    }
    let dir = scratch();
    let (thp, lock, ready) = (dir.join("thp"), dir.join("lock"), dir.join("ready"));
    let swaps_before = swapfile::active_areas();
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("{e}"));
    let mut holder = Command::new(exe)
        .args(["--exact", "child_role", "--nocapture", "--test-threads=1"])
        .env(ROLE_ENV, "hold")
        .env(READY_ENV, &ready)
        .env(THP_DIR_ENV, &thp)
        .env(LOCK_DIR_ENV, &lock)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run the child: {e}"));
    let start = Instant::now();
    while !ready.exists() {
        if let Ok(Some(_)) = holder.try_wait() {
            let out = holder.wait_with_output().unwrap_or_else(|e| panic!("{e}"));
            let text = String::from_utf8_lossy(&out.stdout).to_string()
                + &String::from_utf8_lossy(&out.stderr);
            if text.contains("not permitted") {
                eprintln!("skipped: {text}");
                return;
            }
            panic!("the holder ended early:\n{text}");
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "the holder never got ready"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let text = fs::read_to_string(&ready).unwrap_or_else(|e| panic!("{e}"));
    let mut lines = text.lines();
    let cg = PathBuf::from(
        lines
            .next()
            .unwrap_or_else(|| panic!("no cgroup in {text:?}")),
    );
    let swap = lines
        .next()
        .unwrap_or_else(|| panic!("no swap in {text:?}"))
        .to_string();
    let server_pids = fs::read_to_string(cg.join("cgroup.procs")).unwrap_or_default();
    assert!(
        !server_pids.trim().is_empty(),
        "no server in {}",
        cg.display()
    );

    let _ = holder.kill();
    let _ = holder.wait();
    // Killed: its cgroup, with the server in it, and its swap area are still there.
    assert!(cg.exists(), "{}", cg.display());
    assert!(
        swapfile::active_areas().contains(&swap),
        "{swap} not active"
    );
    assert!(lock.join("resources.journal").exists());

    let out = Command::new(env!("CARGO_BIN_EXE_usermm"))
        .args(["oracle", "--restore-knobs"])
        .env(THP_DIR_ENV, &thp)
        .env(LOCK_DIR_ENV, &lock)
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    let shown = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{shown}");
    assert!(
        shown.contains(&format!("removed memory cgroup {}", cg.display())),
        "{shown}"
    );
    assert!(
        shown.contains(&format!("removed swap file {swap}")),
        "{shown}"
    );
    assert!(!cg.exists(), "{} left", cg.display());
    assert_eq!(swapfile::active_areas(), swaps_before, "{shown}");
    assert!(!Path::new(&swap).exists(), "{swap} left");
    assert!(
        !Path::new(&swap).parent().is_some_and(Path::exists),
        "{swap}'s directory left"
    );
    assert!(!lock.join("resources.journal").exists());
    // The servers the killed run left in the cgroup were killed with it.
    for pid in server_pids.split_whitespace() {
        let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        assert!(
            status.is_empty() || status.contains("State:\tZ"),
            "server {pid} still runs"
        );
    }

    // A second run finds nothing to do.
    let out = Command::new(env!("CARGO_BIN_EXE_usermm"))
        .args(["oracle", "--restore-knobs"])
        .env(THP_DIR_ENV, &thp)
        .env(LOCK_DIR_ENV, &lock)
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("no resource journal"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let _ = fs::remove_dir_all(&dir);
}
