//! Safety of the oracle's lock directory and THP knob journal: planted symbolic links, hard
//! links and loose permissions are refused without touching anything, and the knobs a
//! SIGKILLed run left changed are restored from its journal by the next run.
//!
//! The lock and THP directories are chosen by environment variables, which are global to a
//! process while tests run in parallel threads; so each scenario runs in a child process:
//! this test binary re-executed with `--exact child_role` and the role in [`ROLE_ENV`]. The
//! THP directory is always a fake tree of plain files, so the host's knobs are never
//! touched. The tests need root (the lock directory must be owned by our euid, which the
//! oracle expects to be root); without it each prints why and returns.

use oracle::damon::DAMON_DIR_ENV;
use oracle::knobs::{self, LOCK_DIR_ENV, THP_DIR_ENV};
use std::fs;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Set in a child: what it does (see [`child_role`]).
const ROLE_ENV: &str = "USERMM_KNOBS_SAFETY_ROLE";
/// Set for the `hold` role: the file it creates once it holds the lock with a knob changed.
const READY_ENV: &str = "USERMM_KNOBS_SAFETY_READY";
/// The knob the holder changes.
const KNOB_64K: &str = "hugepages-64kB/enabled";

fn is_root() -> bool {
    if oracle::sys::geteuid() != 0 {
        eprintln!("skipped: the lock checks need root");
        return false;
    }
    true
}

/// A private scratch directory, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let p = std::env::temp_dir().join(format!(
            "usermm-knobs-safety-{name}-{}-{nanos}",
            std::process::id()
        ));
        // `create`, not `create_all`: an existing path (someone else's) is an error.
        if let Err(e) = fs::DirBuilder::new().mode(0o700).create(&p) {
            panic!("{}: {e}", p.display());
        }
        Scratch(p)
    }

    fn join(&self, rel: &str) -> PathBuf {
        self.0.join(rel)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn write(path: &Path, text: &str) {
    if let Some(d) = path.parent() {
        if let Err(e) = fs::create_dir_all(d) {
            panic!("{}: {e}", d.display());
        }
    }
    if let Err(e) = fs::write(path, text) {
        panic!("{}: {e}", path.display());
    }
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The original knob files of the fake THP tree.
const FAKE_KNOBS: &[(&str, &str)] = &[
    ("enabled", "always [madvise] never\n"),
    ("use_zero_page", "1\n"),
    (
        "shmem_enabled",
        "always within_size advise [never] deny force\n",
    ),
    ("khugepaged/scan_sleep_millisecs", "10000\n"),
    (KNOB_64K, "always inherit madvise [never]\n"),
    (
        "hugepages-64kB/shmem_enabled",
        "always inherit within_size advise [never]\n",
    ),
    (
        "hugepages-2048kB/enabled",
        "always [inherit] madvise never\n",
    ),
    (
        "hugepages-2048kB/shmem_enabled",
        "always [inherit] within_size advise never\n",
    ),
];

/// Builds a fake THP sysfs tree of plain files under `s`; its path.
fn fake_thp(s: &Scratch) -> PathBuf {
    let thp = s.join("thp");
    for (rel, text) in FAKE_KNOBS {
        write(&thp.join(rel), text);
    }
    thp
}

/// Each fake knob's current value.
fn knob_values(thp: &Path) -> Vec<(String, String)> {
    FAKE_KNOBS
        .iter()
        .map(|(rel, _)| (rel.to_string(), knobs::current(&read(&thp.join(rel)))))
        .collect()
}

fn original_values() -> Vec<(String, String)> {
    FAKE_KNOBS
        .iter()
        .map(|(rel, text)| (rel.to_string(), knobs::current(text)))
        .collect()
}

/// This test binary, re-executed to run `child_role` as `role` with the two directories.
fn child(role: &str, thp: &Path, lock: &Path) -> Command {
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("current_exe: {e}"));
    let mut c = Command::new(exe);
    c.args(["--exact", "child_role", "--nocapture", "--test-threads=1"])
        .env(ROLE_ENV, role)
        .env(THP_DIR_ENV, thp)
        // A fake DAMON tree beside the fake THP one (absent unless a test makes it).
        .env(DAMON_DIR_ENV, thp.with_file_name("damon"))
        .env(LOCK_DIR_ENV, lock)
        .stdin(Stdio::null());
    c
}

fn run(mut c: Command) -> Output {
    c.output()
        .unwrap_or_else(|e| panic!("cannot run the child: {e}"))
}

fn show(o: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Runs the `acquire-fails` role; the error the child printed.
fn acquire_error(thp: &Path, lock: &Path) -> String {
    let out = run(child("acquire-fails", thp, lock));
    assert!(out.status.success(), "{}", show(&out));
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    match stdout.split_once("ACQUIRE-ERROR: ") {
        Some((_, e)) => e.lines().next().unwrap_or("").to_string(),
        None => panic!("no error reported\n{}", show(&out)),
    }
}

/// The pid line of the journal at `path`.
fn journal_pid(path: &Path) -> Option<i32> {
    let text = fs::read_to_string(path).ok()?;
    text.lines().nth(1)?.strip_prefix("pid ")?.parse().ok()
}

/// What a child does, by [`ROLE_ENV`] (nothing when run as an ordinary test):
/// - `acquire-fails`: `ThpKnobs::acquire` must fail; prints `ACQUIRE-ERROR: <error>`.
/// - `hold`: acquires, sets 64K=always, creates the [`READY_ENV`] file, and sleeps until
///   killed.
/// - `acquire-release`: acquires (checking the journal is now its own), then drops
///   (checking the journal is gone); prints `RELEASED`.
/// - `recover`: `knobs::recover()`; prints `RECOVERED <pid>` or `NOTHING`.
#[test]
fn child_role() {
    let Ok(role) = std::env::var(ROLE_ENV) else {
        return;
    };
    match role.as_str() {
        "acquire-fails" => match knobs::ThpKnobs::acquire() {
            Ok(_) => panic!("acquire succeeded"),
            Err(e) => println!("ACQUIRE-ERROR: {e}"),
        },
        "hold" => {
            let k = knobs::ThpKnobs::acquire().unwrap_or_else(|e| panic!("{e}"));
            let size = scenario::ThpSize::new(64 << 10).unwrap_or_else(|| panic!("no 64K"));
            let set = scenario::ThpSetting::Size {
                size,
                policy: scenario::ThpPolicy::Always,
            };
            k.apply(&[set]).unwrap_or_else(|e| panic!("{e}"));
            let ready = std::env::var_os(READY_ENV).unwrap_or_else(|| panic!("no {READY_ENV}"));
            write(Path::new(&ready), "ready");
            loop {
                std::thread::sleep(Duration::from_secs(600));
            }
        }
        "acquire-release" => {
            let k = knobs::ThpKnobs::acquire().unwrap_or_else(|e| panic!("{e}"));
            let journal = knobs::journal_path();
            assert_eq!(journal_pid(&journal), Some(std::process::id() as i32));
            drop(k);
            assert!(!journal.exists(), "{} left behind", journal.display());
            println!("RELEASED");
        }
        "recover" => match knobs::recover() {
            Ok(Some(r)) => println!("RECOVERED {}", r.pid),
            Ok(None) => println!("NOTHING"),
            Err(e) => panic!("{e}"),
        },
        other => panic!("unknown role {other}"),
    }
}

#[test]
fn planted_lock_file_symlink_is_refused() {
    refuses_a_symlink_planted_as("symlink", "oracle.lock");
}

/// A symlink to a victim planted in the lock directory as `name` is refused by name and
/// the victim and the knobs stay untouched.
fn refuses_a_symlink_planted_as(scratch: &str, name: &str) {
    if !is_root() {
        return;
    }
    let s = Scratch::new(scratch);
    let thp = fake_thp(&s);
    let lock = s.join("lock");
    if let Err(e) = fs::DirBuilder::new().mode(0o700).create(&lock) {
        panic!("{e}");
    }
    let victim = s.join("victim");
    write(&victim, "precious");
    let planted = lock.join(name);
    if let Err(e) = std::os::unix::fs::symlink(&victim, &planted) {
        panic!("{e}");
    }
    let err = acquire_error(&thp, &lock);
    assert!(err.contains(&planted.display().to_string()), "{err}");
    assert!(err.contains("symbolic link"), "{err}");
    assert_eq!(read(&victim), "precious");
    assert_eq!(knob_values(&thp), original_values());
}

#[test]
fn planted_lock_file_hard_link_is_refused() {
    if !is_root() {
        return;
    }
    let s = Scratch::new("hardlink");
    let thp = fake_thp(&s);
    let lock = s.join("lock");
    if let Err(e) = fs::DirBuilder::new().mode(0o700).create(&lock) {
        panic!("{e}");
    }
    let victim = s.join("victim");
    write(&victim, "precious");
    let planted = lock.join("oracle.lock");
    if let Err(e) = fs::hard_link(&victim, &planted) {
        panic!("{e}");
    }
    let err = acquire_error(&thp, &lock);
    assert!(err.contains(&planted.display().to_string()), "{err}");
    assert!(err.contains("hard links"), "{err}");
    assert_eq!(read(&victim), "precious");
}

#[test]
fn writable_lock_dir_is_refused() {
    if !is_root() {
        return;
    }
    for mode in [0o770, 0o707, 0o1777] {
        let s = Scratch::new("writable");
        let thp = fake_thp(&s);
        let lock = s.join("lock");
        if let Err(e) = fs::create_dir(&lock) {
            panic!("{e}");
        }
        // Set after creation: the umask would mask the bits at mkdir.
        if let Err(e) = fs::set_permissions(&lock, fs::Permissions::from_mode(mode)) {
            panic!("{e}");
        }
        let err = acquire_error(&thp, &lock);
        assert!(err.contains(&lock.display().to_string()), "{err}");
        assert!(err.contains("writable by group or others"), "{err}");
        assert!(!lock.join("oracle.lock").exists());
    }
}

#[test]
fn symlinked_lock_dir_is_refused() {
    if !is_root() {
        return;
    }
    let s = Scratch::new("dirlink");
    let thp = fake_thp(&s);
    let real = s.join("real");
    if let Err(e) = fs::DirBuilder::new().mode(0o700).create(&real) {
        panic!("{e}");
    }
    let lock = s.join("lock");
    if let Err(e) = std::os::unix::fs::symlink(&real, &lock) {
        panic!("{e}");
    }
    let err = acquire_error(&thp, &lock);
    assert!(err.contains(&lock.display().to_string()), "{err}");
    assert!(err.contains("symbolic link"), "{err}");
    assert!(!real.join("oracle.lock").exists());
    // A dangling link (mkdir then sees EEXIST) is refused the same way, creating nothing.
    let dangling = s.join("dangling");
    if let Err(e) = std::os::unix::fs::symlink(s.join("nowhere"), &dangling) {
        panic!("{e}");
    }
    let err = acquire_error(&thp, &dangling);
    assert!(err.contains("symbolic link"), "{err}");
    assert!(!s.join("nowhere").exists());
}

#[test]
fn foreign_lock_dir_is_refused() {
    if !is_root() {
        return;
    }
    let s = Scratch::new("foreign");
    let thp = fake_thp(&s);
    let lock = s.join("lock");
    if let Err(e) = fs::DirBuilder::new().mode(0o700).create(&lock) {
        panic!("{e}");
    }
    if let Err(e) = std::os::unix::fs::chown(&lock, Some(65534), Some(65534)) {
        panic!("{e}");
    }
    let err = acquire_error(&thp, &lock);
    assert!(err.contains("owned by uid 65534"), "{err}");
}

/// Starts a `hold` child and waits until it holds the lock with 64K set to `always`; the
/// child, to be killed.
fn start_holder(s: &Scratch, thp: &Path, lock: &Path) -> std::process::Child {
    let ready = s.join("ready");
    let _ = fs::remove_file(&ready);
    let out = fs::File::create(s.join("hold.out")).unwrap_or_else(|e| panic!("{e}"));
    let err = fs::File::create(s.join("hold.err")).unwrap_or_else(|e| panic!("{e}"));
    let mut c = child("hold", thp, lock);
    c.env(READY_ENV, &ready).stdout(out).stderr(err);
    let mut holder = c
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run the child: {e}"));
    let start = Instant::now();
    while !ready.exists() {
        let logs = || {
            format!(
                "stdout:\n{}\nstderr:\n{}",
                fs::read_to_string(s.join("hold.out")).unwrap_or_default(),
                fs::read_to_string(s.join("hold.err")).unwrap_or_default()
            )
        };
        if let Ok(Some(status)) = holder.try_wait() {
            panic!("the holder ended early: {status}\n{}", logs());
        }
        if start.elapsed() > Duration::from_secs(60) {
            let _ = holder.kill();
            let _ = holder.wait();
            panic!("the holder never got ready\n{}", logs());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    holder
}

/// SIGKILLs the holder (the kernel releases its lock; the journal stays).
fn kill(mut holder: std::process::Child) -> u32 {
    let pid = holder.id();
    if let Err(e) = holder.kill() {
        panic!("kill: {e}");
    }
    let _ = holder.wait();
    pid
}

#[test]
fn knobs_left_by_a_sigkilled_run_are_restored() {
    if !is_root() {
        return;
    }
    let s = Scratch::new("sigkill");
    let thp = fake_thp(&s);
    let lock = s.join("lock");
    let journal = lock.join("knobs.journal");
    let holder = start_holder(&s, &thp, &lock);
    assert_eq!(knobs::current(&read(&thp.join(KNOB_64K))), "always");
    assert_eq!(journal_pid(&journal), Some(holder.id() as i32));
    let pid = kill(holder);
    // The killed run could not restore: the host is left changed, the journal remains.
    assert_eq!(knobs::current(&read(&thp.join(KNOB_64K))), "always");
    assert!(journal.exists());

    let out = run(child("acquire-release", &thp, &lock));
    assert!(out.status.success(), "{}", show(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("RELEASED"),
        "{}",
        show(&out)
    );
    let note = format!("usermm: restored THP knobs left by killed run pid {pid}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(&note),
        "{}",
        show(&out)
    );
    // Restored before being saved as the baseline, so the drop left "never" too.
    assert_eq!(read(&thp.join(KNOB_64K)), "never");
    assert_eq!(knob_values(&thp), original_values());
    assert!(!journal.exists());
    assert!(!lock.join("knobs.journal.tmp").exists());
}

#[test]
fn a_running_kdamond_is_paused_and_restarted_even_after_a_sigkill() {
    if !is_root() {
        return;
    }
    let s = Scratch::new("damon");
    let thp = fake_thp(&s);
    let lock = s.join("lock");
    let damon = s.join("damon");
    write(&damon.join("0/state"), "on\n");
    write(&damon.join("1/state"), "off\n");
    let holder = start_holder(&s, &thp, &lock);
    assert_eq!(read(&damon.join("0/state")), "off", "paused under the lock");
    assert_eq!(
        read(&damon.join("1/state")),
        "off\n",
        "a stopped one is left alone"
    );
    kill(holder);
    assert_eq!(
        read(&damon.join("0/state")),
        "off",
        "the killed run restarted nothing"
    );

    let out = run(child("recover", &thp, &lock));
    assert!(out.status.success(), "{}", show(&out));
    assert_eq!(
        read(&damon.join("0/state")),
        "on",
        "restarted from the journal"
    );
    assert_eq!(read(&damon.join("1/state")), "off\n");

    let out = run(child("acquire-release", &thp, &lock));
    assert!(out.status.success(), "{}", show(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("DAMON paused"),
        "{}",
        show(&out)
    );
    assert_eq!(read(&damon.join("0/state")), "on", "restarted by the drop");
}

#[test]
fn recover_restores_without_a_run() {
    if !is_root() {
        return;
    }
    let s = Scratch::new("recover");
    let thp = fake_thp(&s);
    let lock = s.join("lock");
    let journal = lock.join("knobs.journal");
    let pid = kill(start_holder(&s, &thp, &lock));
    assert_eq!(knobs::current(&read(&thp.join(KNOB_64K))), "always");

    let out = run(child("recover", &thp, &lock));
    assert!(out.status.success(), "{}", show(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&format!("RECOVERED {pid}")),
        "{}",
        show(&out)
    );
    assert_eq!(knob_values(&thp), original_values());
    assert!(!journal.exists());

    let out = run(child("recover", &thp, &lock));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("NOTHING"),
        "{}",
        show(&out)
    );
}

#[test]
fn journal_lines_outside_the_thp_dir_are_ignored() {
    if !is_root() {
        return;
    }
    let s = Scratch::new("journal");
    let thp = fake_thp(&s);
    let lock = s.join("lock");
    if let Err(e) = fs::DirBuilder::new().mode(0o700).create(&lock) {
        panic!("{e}");
    }
    let victim = s.join("victim");
    write(&victim, "precious");
    write(&thp.join(KNOB_64K), "always");
    let journal = lock.join("knobs.journal");
    write(
        &journal,
        &format!(
            "usermm-oracle-knobs 1\npid 4242\n{}=pwned\n{}/../victim=pwned\n{}=never\n",
            victim.display(),
            thp.display(),
            thp.join(KNOB_64K).display()
        ),
    );
    if let Err(e) = fs::set_permissions(&journal, fs::Permissions::from_mode(0o600)) {
        panic!("{e}");
    }
    let out = run(child("acquire-release", &thp, &lock));
    assert!(out.status.success(), "{}", show(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("restored THP knobs left by killed run pid 4242"),
        "{}",
        show(&out)
    );
    assert!(
        stderr.contains("line 3:") && stderr.contains("line 4:"),
        "{}",
        show(&out)
    );
    assert_eq!(read(&victim), "precious");
    assert_eq!(read(&thp.join(KNOB_64K)), "never");
    assert!(!journal.exists());
}

#[test]
fn planted_journal_symlink_is_refused() {
    refuses_a_symlink_planted_as("journal-link", "knobs.journal");
}

#[test]
fn a_waiting_run_says_who_holds_the_lock() {
    if !is_root() {
        return;
    }
    let s = Scratch::new("wait");
    let thp = fake_thp(&s);
    let lock = s.join("lock");
    let holder = start_holder(&s, &thp, &lock);
    let holder_pid = holder.id();
    let mut waiter = child("acquire-release", &thp, &lock)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run the child: {e}"));
    // The waiter blocks on the lock; it must have said so before the holder goes.
    std::thread::sleep(Duration::from_millis(800));
    assert!(
        waiter.try_wait().ok().flatten().is_none(),
        "the waiter did not wait"
    );
    kill(holder);
    let out = waiter
        .wait_with_output()
        .unwrap_or_else(|e| panic!("wait: {e}"));
    assert!(out.status.success(), "{}", show(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    let waiting = format!(
        "usermm: waiting for the machine-wide lock {}",
        lock.join("oracle.lock").display()
    );
    assert!(err.contains(&waiting), "{err}");
    assert!(err.contains(&format!("(held by pid {holder_pid}")), "{err}");
    assert!(
        err.contains("usermm: took the machine-wide lock after"),
        "{err}"
    );
}
