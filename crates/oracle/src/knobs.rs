//! The host's THP policy knobs under `/sys/kernel/mm/transparent_hugepage`.
//!
//! [`ThpKnobs`] saves every knob the oracle may write, sets Linux's defaults before each
//! file, applies `set thp`, and restores the saved values when dropped (at the end, on an
//! error, and after SIGINT/SIGTERM, which the controller turns into an orderly return). It
//! also holds an exclusive lock so that two oracle runs never fight over the global knobs.
//!
//! Besides the anonymous THP policies it pins the shmem policies (shared anonymous memory
//! and the scenario's tmpfs files follow those) to the host baseline of SCENARIO.md (top
//! `never`, 2M `inherit`, other sizes `never`) before each file, applies `set shmem`, and
//! slows khugepaged down for the run (a long sleep, and `max_ptes_none` 0 for the scans it
//! still makes when woken), so a background collapse cannot change a page between two
//! observations. A running DAMON monitor is paused for the run and restarted after, saved and
//! journaled like the knobs ([`crate::damon`]).
//!
//! # The lock directory
//!
//! The lock and the knob journal live in a directory of our own: `/run/lock/usermm`, or
//! `$TMPDIR/usermm-<uid>` (`/tmp` without `TMPDIR`) where `/run/lock` is missing, or
//! whatever the environment variable `USERMM_LOCK_DIR` ([`LOCK_DIR_ENV`]) names. Both
//! defaults sit in world-writable directories where any local user may plant a symbolic
//! link, so root never follows one there: the directory is created with mode 0700 if
//! missing and otherwise opened with `O_NOFOLLOW` and refused unless it is a directory
//! owned by our euid that neither group nor others may write; its files are opened relative
//! to it with `O_NOFOLLOW`, never truncated on open, and refused unless they are regular
//! files of ours with a single link ([`HostError::UnsafeLock`]).
//!
//! # The knob journal
//!
//! A SIGKILLed run cannot restore the knobs, and the next run would save the changed values
//! as its baseline. So right after saving the knobs, and before changing any, a run writes
//! the saved values and its pid to `knobs.journal` in the lock directory (a temporary file
//! renamed over it, both synced), and deletes the journal once it has restored them. Taking
//! the lock means the previous owner has ended; a journal still there is what a killed run
//! left, and [`ThpKnobs::acquire`] (or [`recover`], which `usermm oracle --restore-knobs`
//! calls) writes its values back first: only lines naming a knob under the THP directory
//! with a plain word as value, and nothing from a journal of an earlier boot (the reboot
//! reset the knobs already).
//!
//! The same lock directory holds `resources.journal`, the swap file and memory cgroup a run
//! added for `set swap`/`set memory` ([`crate::hostres`]): [`ThpKnobs::acquire`] and
//! [`recover_all`] remove what a killed run's journal names the same way.
//!
//! The THP directory itself can be redirected with `USERMM_THP_DIR` ([`THP_DIR_ENV`]), which
//! the tests use to run on a fake tree of plain files.

use crate::{hostres, sys, HostError};
use scenario::{Keyword, ShmemSetting, ThpSetting};
use std::ffi::{CStr, CString};
use std::fmt::Write as _;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

/// The sysfs directory of the THP knobs (the default of [`thp_dir`]).
pub const THP_DIR: &str = "/sys/kernel/mm/transparent_hugepage";
/// The environment variable that overrides [`THP_DIR`] (tests point it at a fake tree).
pub const THP_DIR_ENV: &str = "USERMM_THP_DIR";
/// The environment variable that overrides the lock directory (see [`lock_dir`]).
pub const LOCK_DIR_ENV: &str = "USERMM_LOCK_DIR";
/// PMD size in kB.
const PMD_KB: u64 = 2048;
/// khugepaged's sleep between scans during a run (ms).
const KHUGEPAGED_SLEEP_MS: &str = "3600000";
/// khugepaged's `max_ptes_none` during a run: it collapses only fully populated ranges.
/// A long sleep is not enough: khugepaged also scans when a knob is written and when the
/// first mm registers with it (an `mmap` of a THP-eligible area), and with the default
/// (511) it would then collapse a range holding a single page, behind the scenario's back.
/// MADV_COLLAPSE ignores this limit.
const KHUGEPAGED_MAX_PTES_NONE: &str = "0";
/// Knobs that may be missing on some kernels (or in a test's fake tree): saved, set and
/// restored only where they exist.
const OPTIONAL_KNOBS: [&str; 2] = ["shmem_enabled", "khugepaged/max_ptes_none"];
/// Where the default lock directory is made, if it exists.
const RUN_LOCK: &str = "/run/lock";
const LOCK_NAME: &CStr = c"oracle.lock";
const JOURNAL_NAME: &CStr = c"knobs.journal";
const JOURNAL_TMP: &CStr = c"knobs.journal.tmp";
/// The journal of the swap file and memory cgroup a run added ([`crate::hostres`]).
const RES_JOURNAL_NAME: &CStr = c"resources.journal";
const RES_JOURNAL_TMP: &CStr = c"resources.journal.tmp";
/// The journal's first line (its format and version).
const JOURNAL_MAGIC: &str = "usermm-oracle-knobs 1";
/// A journal is a few hundred bytes; anything much larger is not one of ours.
const JOURNAL_MAX: u64 = 64 << 10;
/// The longest knob value a journal may hold.
const VALUE_MAX: usize = 64;

/// Saved THP knobs and the oracle's lock; restores the knobs when dropped.
#[derive(Debug)]
pub struct ThpKnobs {
    dir: PathBuf,
    saved: Vec<(PathBuf, String)>,
    lock: OracleLock,
}

/// What a journal left by a killed run held, and what was done with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recovery {
    /// The journal's path (deleted now).
    pub journal: PathBuf,
    /// The pid of the run that wrote it.
    pub pid: i32,
    /// The knobs written back (path, value); empty if `earlier_boot`.
    pub restored: Vec<(PathBuf, String)>,
    /// Lines that were not restored, each with why.
    pub ignored: Vec<String>,
    /// The journal is from before this boot: discarded without restoring anything.
    pub earlier_boot: bool,
}

impl Recovery {
    /// A one-line note for stderr.
    pub fn note(&self) -> String {
        if self.earlier_boot {
            format!(
                "usermm: discarded the THP knob journal of run pid {} from an earlier boot",
                self.pid
            )
        } else {
            format!(
                "usermm: restored THP knobs left by killed run pid {}",
                self.pid
            )
        }
    }
}

/// The current value of a knob: the bracketed choice, or the whole text.
pub fn current(text: &str) -> String {
    match (text.find('['), text.find(']')) {
        (Some(a), Some(b)) if a < b => text[a + 1..b].to_string(),
        _ => text.trim().to_string(),
    }
}

/// The THP knob directory: `$USERMM_THP_DIR` if set and not empty, else [`THP_DIR`].
pub fn thp_dir() -> PathBuf {
    match std::env::var_os(THP_DIR_ENV) {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => PathBuf::from(THP_DIR),
    }
}

/// The oracle's lock directory: `$USERMM_LOCK_DIR` if set and not empty, else
/// `/run/lock/usermm`, else (no `/run/lock`) `usermm-<euid>` in the temporary directory.
/// It is only used after the checks of the module documentation.
pub fn lock_dir() -> PathBuf {
    match std::env::var_os(LOCK_DIR_ENV) {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ if Path::new(RUN_LOCK).is_dir() => Path::new(RUN_LOCK).join("usermm"),
        _ => std::env::temp_dir().join(format!("usermm-{}", sys::geteuid())),
    }
}

/// Where a run keeps the original knob values while it may have changed them.
pub fn journal_path() -> PathBuf {
    lock_dir().join(name_str(JOURNAL_NAME))
}

fn name_str(name: &CStr) -> &str {
    // The names are ASCII constants of this module.
    name.to_str().unwrap_or("?")
}

/// `hugepages-<N>kB` → N.
fn size_kb(name: &str) -> Option<u64> {
    let n = name.strip_prefix("hugepages-")?.strip_suffix("kB")?;
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    n.parse().ok()
}

fn size_dirs(dir: &Path) -> Result<Vec<(u64, PathBuf)>, HostError> {
    let mut out = Vec::new();
    let rd = fs::read_dir(dir).map_err(|e| HostError::Knob(dir.display().to_string(), e))?;
    for ent in rd.flatten() {
        if let Some(kb) = size_kb(&ent.file_name().to_string_lossy()) {
            out.push((kb, ent.path()));
        }
    }
    out.sort();
    Ok(out)
}

/// Writes a saved value back, unless the knob reads it already (a kdamond refuses `on`
/// while it runs).
fn restore_knob(path: &Path, value: &str) -> io::Result<()> {
    if crate::damon::already(path, value) {
        return Ok(());
    }
    write_knob(path, value)
}

/// Writes one knob. Never creates a file: a knob this kernel lacks is NotFound.
fn write_knob(path: &Path, value: &str) -> io::Result<()> {
    // Truncation matters only for the plain files of a fake tree (sysfs ignores it).
    fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)?
        .write_all(value.as_bytes())
}

fn read_knobs(dir: &Path) -> Result<Vec<(PathBuf, String)>, HostError> {
    let mut out = Vec::new();
    for p in ThpKnobs::paths(dir)? {
        let text =
            fs::read_to_string(&p).map_err(|e| HostError::Knob(p.display().to_string(), e))?;
        out.push((p, current(&text)));
    }
    Ok(out)
}

/// Whether `rel` (relative to the THP directory) is a knob [`ThpKnobs`] saves.
fn is_knob(rel: &str) -> bool {
    match rel {
        "enabled"
        | "use_zero_page"
        | "shmem_enabled"
        | "khugepaged/scan_sleep_millisecs"
        | "khugepaged/max_ptes_none" => true,
        _ => rel
            .split_once('/')
            .is_some_and(|(d, f)| size_kb(d).is_some() && matches!(f, "enabled" | "shmem_enabled")),
    }
}

/// Whether `v` may be a knob value: a short word (policy names, numbers).
fn valid_value(v: &str) -> bool {
    !v.is_empty()
        && v.len() <= VALUE_MAX
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// One `PATH=VALUE` line of a journal, checked: the knob path rebuilt under `thp`, or a
/// paused kdamond's `state` to set `on` again ([`crate::damon`]).
fn knob_line(thp: &Path, line: &str) -> Result<(PathBuf, String), String> {
    let (p, v) = line
        .rsplit_once('=')
        .ok_or_else(|| format!("{line:?} is not PATH=VALUE"))?;
    if !valid_value(v) {
        return Err(format!("{p}: {v:?} is not a knob value"));
    }
    if let Some(d) = crate::damon::damon_dir() {
        if crate::damon::is_journal_line(&d, Path::new(p), v) {
            return Ok((PathBuf::from(p), v.to_string()));
        }
    }
    let rel = Path::new(p)
        .strip_prefix(thp)
        .map_err(|_| format!("{p} is outside {}", thp.display()))?;
    // Components are compared as text, so `..` or anything unexpected never matches.
    let rel = rel
        .to_str()
        .filter(|r| is_knob(r))
        .ok_or_else(|| format!("{p} is not a THP knob the oracle saves"))?;
    Ok((thp.join(rel), v.to_string()))
}

/// This boot's id (empty if unreadable: the check is then skipped).
fn boot_id() -> String {
    fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// A parsed journal.
struct Journal {
    pid: i32,
    boot: Option<String>,
    knobs: Vec<(PathBuf, String)>,
    ignored: Vec<String>,
}

/// A journal's first two lines, `magic` and `pid N` (N > 0): N and the lines after them.
/// The knob journal and the host resources' journal (`hostres`) start alike.
pub(crate) fn journal_header<'a>(
    text: &'a str,
    magic: &str,
) -> Result<(i32, std::str::Lines<'a>), String> {
    let mut lines = text.lines();
    if lines.next() != Some(magic) {
        return Err(format!("does not start with {magic:?}"));
    }
    let pid = lines
        .next()
        .and_then(|l| l.strip_prefix("pid "))
        .and_then(|n| n.parse::<i32>().ok())
        .filter(|&p| p > 0)
        .ok_or("its second line is not \"pid N\"")?;
    Ok((pid, lines))
}

fn parse_journal(text: &str, thp: &Path) -> Result<Journal, String> {
    let (pid, lines) = journal_header(text, JOURNAL_MAGIC)?;
    let mut j = Journal {
        pid,
        boot: None,
        knobs: Vec::new(),
        ignored: Vec::new(),
    };
    for (i, line) in lines.enumerate() {
        if let Some(b) = line.strip_prefix("boot ") {
            j.boot = Some(b.to_string());
        } else if !line.is_empty() {
            match knob_line(thp, line) {
                Ok(kv) => j.knobs.push(kv),
                Err(why) => j.ignored.push(format!("line {}: {why}", i + 3)),
            }
        }
    }
    Ok(j)
}

fn unsafe_lock(path: &Path, problem: impl Into<String>) -> HostError {
    HostError::UnsafeLock {
        path: path.display().to_string(),
        problem: problem.into(),
    }
}

fn io_error(path: &Path, e: io::Error) -> HostError {
    HostError::Knob(path.display().to_string(), e)
}

/// An errno from a `*_at` call on `path`: ELOOP means a symbolic link was planted there.
fn at_error(path: &Path, e: sys::Errno) -> HostError {
    if e == libc::ELOOP {
        unsafe_lock(path, "is a symbolic link")
    } else {
        io_error(path, io::Error::from_raw_os_error(e))
    }
}

/// Checks a file opened in the lock directory: a regular file of ours with one link (a
/// hard link would let a write through it reach a file elsewhere).
fn check_private_file(file: &File, path: &Path) -> Result<(), HostError> {
    let m = file.metadata().map_err(|e| io_error(path, e))?;
    let euid = sys::geteuid();
    if !m.file_type().is_file() {
        Err(unsafe_lock(path, "is not a regular file"))
    } else if m.uid() != euid {
        Err(unsafe_lock(
            path,
            format!("is owned by uid {}, not by uid {euid}", m.uid()),
        ))
    } else if m.nlink() != 1 {
        Err(unsafe_lock(
            path,
            format!("has {} hard links (must have exactly one)", m.nlink()),
        ))
    } else {
        Ok(())
    }
}

/// Creates (mode 0700) or opens the lock directory `path` and checks it.
fn open_private_dir(path: &Path) -> Result<File, HostError> {
    match fs::DirBuilder::new().mode(0o700).create(path) {
        Ok(()) => {}
        // Whatever is there (a dangling symbolic link too) is judged below.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io_error(path, e)),
    }
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| unsafe_lock(path, "contains a NUL byte"))?;
    let dir = sys::open_dir_nofollow(&c).map_err(|e| match e {
        libc::ELOOP | libc::ENOTDIR => {
            let link = fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
            unsafe_lock(
                path,
                if link {
                    "is a symbolic link"
                } else {
                    "is not a directory"
                },
            )
        }
        e => io_error(path, io::Error::from_raw_os_error(e)),
    })?;
    let m = dir.metadata().map_err(|e| io_error(path, e))?;
    let euid = sys::geteuid();
    if !m.is_dir() {
        return Err(unsafe_lock(path, "is not a directory"));
    }
    if m.uid() != euid {
        return Err(unsafe_lock(
            path,
            format!("is owned by uid {}, not by uid {euid}", m.uid()),
        ));
    }
    if m.mode() & 0o022 != 0 {
        return Err(unsafe_lock(
            path,
            format!(
                "is writable by group or others (mode {:04o})",
                m.mode() & 0o7777
            ),
        ));
    }
    Ok(dir)
}

/// The oracle's exclusive lock: the checked lock directory and its locked `oracle.lock`.
/// Dropping it closes the file, which releases the lock.
#[derive(Debug)]
struct OracleLock {
    path: PathBuf,
    dir: File,
    _file: File,
}

impl OracleLock {
    /// Opens and checks the lock directory and file, then waits for the lock.
    fn take() -> Result<OracleLock, HostError> {
        // A non-root caller would create the default directory as itself, which root then
        // refuses; it cannot write the knobs anyway.
        if sys::geteuid() != 0 && std::env::var_os(LOCK_DIR_ENV).is_none() {
            return Err(HostError::NotRoot);
        }
        let path = lock_dir();
        let dir = open_private_dir(&path)?;
        let lock_path = path.join(name_str(LOCK_NAME));
        let file = sys::open_or_create_at(&dir, LOCK_NAME).map_err(|e| at_error(&lock_path, e))?;
        check_private_file(&file, &lock_path)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                // Say so: a run of the oracle, a benchmark's host cells or a recording may
                // hold it for minutes.
                let t0 = std::time::Instant::now();
                eprintln!(
                    "usermm: waiting for the machine-wide lock {}{}",
                    lock_path.display(),
                    lock_holder(&path.join(name_str(JOURNAL_NAME)))
                );
                file.lock().map_err(|e| io_error(&lock_path, e))?;
                eprintln!(
                    "usermm: took the machine-wide lock after {:.1} s",
                    t0.elapsed().as_secs_f64()
                );
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(io_error(&lock_path, e)),
        }
        Ok(OracleLock {
            path,
            dir,
            _file: file,
        })
    }

    fn journal(&self) -> PathBuf {
        self.path.join(name_str(JOURNAL_NAME))
    }

    /// Unlinks `name` (absent is fine) and syncs the directory.
    fn remove(&self, name: &CStr) -> Result<(), HostError> {
        let path = self.path.join(name_str(name));
        match sys::unlink_at(&self.dir, name) {
            Ok(()) => self.dir.sync_all().map_err(|e| io_error(&self.path, e)),
            Err(libc::ENOENT) => Ok(()),
            Err(e) => Err(at_error(&path, e)),
        }
    }

    /// Atomically replaces the journal with `saved` and this process's pid.
    fn write_journal(&self, saved: &[(PathBuf, String)]) -> Result<(), HostError> {
        let mut text = format!("{JOURNAL_MAGIC}\npid {}\n", sys::getpid());
        let boot = boot_id();
        if !boot.is_empty() {
            let _ = writeln!(text, "boot {boot}");
        }
        for (p, v) in saved {
            // Only lines a later run accepts are worth writing; a knob with unusual content
            // is still restored by Drop, just not after a SIGKILL.
            if let Some(p) = p.to_str().filter(|p| !p.contains('\n')) {
                if valid_value(v) {
                    let _ = writeln!(text, "{p}={v}");
                }
            }
        }
        self.write_atomic(JOURNAL_NAME, JOURNAL_TMP, &text)
    }

    /// Atomically replaces `name` with `text`: written to `tmp_name`, synced, renamed over
    /// `name`, the directory synced.
    fn write_atomic(&self, name: &CStr, tmp_name: &CStr, text: &str) -> Result<(), HostError> {
        // We hold the lock, so a temporary file here is from a run killed while writing it.
        self.remove(tmp_name)?;
        let tmp = self.path.join(name_str(tmp_name));
        let mut f = sys::create_new_at(&self.dir, tmp_name).map_err(|e| at_error(&tmp, e))?;
        f.write_all(text.as_bytes())
            .and_then(|()| f.sync_all())
            .map_err(|e| io_error(&tmp, e))?;
        drop(f);
        sys::rename_at(&self.dir, tmp_name, name)
            .map_err(|e| at_error(&self.path.join(name_str(name)), e))?;
        self.dir.sync_all().map_err(|e| io_error(&self.path, e))
    }

    /// Reads the private file `name` (bounded to `max` bytes), `None` if absent.
    fn read_private(&self, name: &CStr, max: u64) -> Result<Option<String>, HostError> {
        let path = self.path.join(name_str(name));
        let f = match sys::open_read_at(&self.dir, name) {
            Ok(f) => f,
            Err(libc::ENOENT) => return Ok(None),
            Err(e) => return Err(at_error(&path, e)),
        };
        check_private_file(&f, &path)?;
        let mut bytes = Vec::new();
        f.take(max + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| io_error(&path, e))?;
        let bad = |problem: &str| HostError::Journal {
            path: path.display().to_string(),
            problem: problem.into(),
        };
        if bytes.len() as u64 > max {
            return Err(bad(&format!("is larger than {max} bytes")));
        }
        String::from_utf8(bytes)
            .map(Some)
            .map_err(|_| bad("is not UTF-8"))
    }

    /// Removes what the resource journal of a killed run names ([`crate::hostres`]).
    fn replay_resources(&self) -> Result<Option<hostres::Cleanup>, HostError> {
        let Some(text) = self.read_private(RES_JOURNAL_NAME, JOURNAL_MAX)? else {
            return Ok(None);
        };
        let path = self.path.join(name_str(RES_JOURNAL_NAME));
        let cleanup = hostres::replay(&text).map_err(|problem| HostError::Journal {
            path: path.display().to_string(),
            problem,
        })?;
        if cleanup.left.is_empty() {
            self.remove(RES_JOURNAL_NAME)?;
        }
        Ok(Some(cleanup))
    }

    /// Restores the knobs from a journal a killed run left, then deletes it. A knob that
    /// cannot be written keeps the journal and fails, so the changed value never becomes
    /// the next baseline.
    fn replay_journal(&self, thp: &Path) -> Result<Option<Recovery>, HostError> {
        let path = self.journal();
        let f = match sys::open_read_at(&self.dir, JOURNAL_NAME) {
            Ok(f) => f,
            Err(libc::ENOENT) => return Ok(None),
            Err(e) => return Err(at_error(&path, e)),
        };
        check_private_file(&f, &path)?;
        let mut bytes = Vec::new();
        f.take(JOURNAL_MAX + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| io_error(&path, e))?;
        let bad = |problem: String| HostError::Journal {
            path: path.display().to_string(),
            problem,
        };
        if bytes.len() as u64 > JOURNAL_MAX {
            return Err(bad(format!("is larger than {JOURNAL_MAX} bytes")));
        }
        let text = String::from_utf8(bytes).map_err(|_| bad("is not UTF-8".into()))?;
        let j = parse_journal(&text, thp).map_err(bad)?;
        let mut rec = Recovery {
            journal: path.clone(),
            pid: j.pid,
            restored: Vec::new(),
            ignored: j.ignored,
            earlier_boot: false,
        };
        let now = boot_id();
        if j.boot
            .as_deref()
            .is_some_and(|b| !now.is_empty() && b != now)
        {
            rec.earlier_boot = true;
            rec.ignored.clear();
        } else {
            for (p, v) in j.knobs {
                match restore_knob(&p, &v) {
                    Ok(()) => rec.restored.push((p, v)),
                    Err(e) if e.kind() == io::ErrorKind::NotFound => rec
                        .ignored
                        .push(format!("{}: no such knob on this kernel", p.display())),
                    Err(e) => return Err(io_error(&p, e)),
                }
            }
        }
        self.remove(JOURNAL_NAME)?;
        Ok(Some(rec))
    }
}

/// Takes the oracle lock (waiting for a running oracle or benchmark) and restores the knobs
/// from a journal a killed run left, then releases the lock; `None` if there was no
/// journal. `usermm oracle --restore-knobs` is this.
pub fn recover() -> Result<Option<Recovery>, HostError> {
    recover_all().map(|(knobs, _)| knobs)
}

/// [`recover`], and also removes the swap file and memory cgroup a killed run's resource
/// journal names ([`crate::hostres`]); `usermm oracle --restore-knobs` is this.
pub fn recover_all() -> Result<(Option<Recovery>, Option<hostres::Cleanup>), HostError> {
    let lock = OracleLock::take()?;
    let knobs = lock.replay_journal(&thp_dir())?;
    let res = lock.replay_resources()?;
    Ok((knobs, res))
}

/// Where a run journals the swap file and memory cgroup it added.
pub fn resource_journal_path() -> PathBuf {
    lock_dir().join(name_str(RES_JOURNAL_NAME))
}

/// Who holds the lock, as its journal says (` (held by pid N, COMM)`), or nothing when the
/// journal is absent or not one of ours. The journal sits in our private directory; it is
/// read bounded all the same.
fn lock_holder(journal: &Path) -> String {
    let Ok(f) = File::open(journal) else {
        return String::new();
    };
    let mut text = String::new();
    if f.take(JOURNAL_MAX).read_to_string(&mut text).is_err() || !text.starts_with(JOURNAL_MAGIC) {
        return String::new();
    }
    let Some(pid) = text
        .lines()
        .find_map(|l| l.strip_prefix("pid "))
        .and_then(|p| p.trim().parse::<u32>().ok())
    else {
        return String::new();
    };
    let comm = fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    let comm: String = comm
        .trim()
        .chars()
        .filter(|c| !c.is_control())
        .take(32)
        .collect();
    if comm.is_empty() {
        format!(" (held by pid {pid})")
    } else {
        format!(" (held by pid {pid}, {comm})")
    }
}

impl ThpKnobs {
    /// Takes the oracle lock (waiting for another run to finish), restores the knobs a
    /// killed run left changed (printing a note to stderr), saves every knob, and journals
    /// the saved values before anything changes them.
    pub fn acquire() -> Result<ThpKnobs, HostError> {
        let lock = OracleLock::take()?;
        let dir = thp_dir();
        if let Some(rec) = lock.replay_journal(&dir)? {
            eprintln!("{}", rec.note());
            for why in &rec.ignored {
                eprintln!("usermm: {}: ignored {why}", rec.journal.display());
            }
        }
        if let Some(c) = lock.replay_resources()? {
            c.print();
            if !c.left.is_empty() {
                return Err(HostError::Journal {
                    path: lock
                        .path
                        .join(name_str(RES_JOURNAL_NAME))
                        .display()
                        .to_string(),
                    problem: format!(
                        "what a killed run added could not all be removed: {}",
                        c.left.join("; ")
                    ),
                });
            }
        }
        let mut saved = read_knobs(&dir)?;
        // Running kdamonds after the THP knobs: restored last, they start on the policy
        // the machine had.
        let damon = crate::damon::damon_dir()
            .map(|d| crate::damon::running(&d))
            .unwrap_or_default();
        saved.extend(
            damon
                .iter()
                .map(|p| (p.clone(), crate::damon::ON.to_string())),
        );
        lock.write_journal(&saved)?;
        crate::sys::arm_emergency_restore(
            saved
                .iter()
                .filter_map(|(p, v)| {
                    let c = CString::new(p.as_os_str().as_encoded_bytes()).ok()?;
                    Some((c, v.clone().into_bytes()))
                })
                .collect(),
        );
        for p in &damon {
            match write_knob(p, crate::damon::OFF) {
                Ok(()) => eprintln!(
                    "usermm: DAMON paused while the lock is held ({} off; it ages and reclaims the pages compared and timed)",
                    p.display()
                ),
                Err(e) => eprintln!("usermm: DAMON left running: {}: {e}", p.display()),
            }
        }
        Ok(ThpKnobs { dir, saved, lock })
    }

    fn paths(dir: &Path) -> Result<Vec<PathBuf>, HostError> {
        let mut v = vec![
            dir.join("enabled"),
            dir.join("use_zero_page"),
            dir.join("khugepaged/scan_sleep_millisecs"),
        ];
        for k in OPTIONAL_KNOBS {
            if dir.join(k).exists() {
                v.push(dir.join(k));
            }
        }
        for (_, d) in size_dirs(dir)? {
            for f in ["enabled", "shmem_enabled"] {
                if d.join(f).exists() {
                    v.push(d.join(f));
                }
            }
        }
        Ok(v)
    }

    fn write(&self, rel: &Path, value: &str) -> Result<(), HostError> {
        let p = self.dir.join(rel);
        write_knob(&p, value).map_err(|e| io_error(&p, e))
    }

    /// Linux's defaults: top `madvise`, 2M `inherit`, other sizes `never`, the zero page
    /// used; shmem THP off except 2M `inherit`; khugepaged asleep and collapsing only full
    /// ranges.
    pub fn set_defaults(&self) -> Result<(), HostError> {
        self.write(Path::new("enabled"), "madvise")?;
        self.write(Path::new("use_zero_page"), "1")?;
        if self.dir.join("shmem_enabled").exists() {
            self.write(Path::new("shmem_enabled"), "never")?;
        }
        if self.dir.join("khugepaged/max_ptes_none").exists() {
            self.write(
                Path::new("khugepaged/max_ptes_none"),
                KHUGEPAGED_MAX_PTES_NONE,
            )?;
        }
        self.write(
            Path::new("khugepaged/scan_sleep_millisecs"),
            KHUGEPAGED_SLEEP_MS,
        )?;
        for (kb, d) in size_dirs(&self.dir)? {
            let v = if kb == PMD_KB { "inherit" } else { "never" };
            for f in ["enabled", "shmem_enabled"] {
                if d.join(f).exists() {
                    self.write(&d.join(f), v)?;
                }
            }
        }
        Ok(())
    }

    /// Applies `set thp` settings.
    pub fn apply(&self, settings: &[ThpSetting]) -> Result<(), HostError> {
        for s in settings {
            match s {
                ThpSetting::Top(t) => self.write(Path::new("enabled"), t.as_str())?,
                ThpSetting::Size { size, policy } => {
                    let rel = format!("hugepages-{}kB/enabled", size.bytes() / 1024);
                    self.write(Path::new(&rel), policy.as_str())?
                }
            }
        }
        Ok(())
    }

    /// Applies `set shmem` settings: the top-level `shmem_enabled` and the per-size
    /// `hugepages-<N>kB/shmem_enabled` (restored like the THP knobs: they are among the
    /// knobs saved and journaled before any change).
    pub fn apply_shmem(&self, settings: &[ShmemSetting]) -> Result<(), HostError> {
        let write = |s: &ShmemSetting| match s {
            ShmemSetting::Top(t) => self.write(Path::new("shmem_enabled"), t.as_str()),
            ShmemSetting::Size { size, policy } => {
                let rel = format!("hugepages-{}kB/shmem_enabled", size.bytes() / 1024);
                self.write(Path::new(&rel), policy.as_str())
            }
        };
        // The kernel checks each write against the other knobs (`top=force` needs 2M to
        // inherit first), so a setting refused in the written order is tried once more after
        // the rest: `set shmem top=force 2M=inherit` works whatever 2M was before.
        let refused: Vec<&ShmemSetting> = settings.iter().filter(|s| write(s).is_err()).collect();
        for s in refused {
            write(s)?;
        }
        Ok(())
    }

    /// `use_zero_page` (the engine's tunable `thp_use_zero_page`).
    pub fn set_use_zero_page(&self, on: bool) -> Result<(), HostError> {
        self.write(Path::new("use_zero_page"), if on { "1" } else { "0" })
    }

    /// Writes the saved values back; returns the knobs that could not be restored. The
    /// journal stays until the drop, since the knobs may still be changed after this.
    pub fn restore(&self) -> Vec<String> {
        let mut failed = Vec::new();
        for (p, v) in &self.saved {
            if let Err(e) = restore_knob(p, v) {
                failed.push(format!("{}: {e}", p.display()));
            }
        }
        failed
    }

    /// The saved values (path, value).
    pub fn saved(&self) -> &[(PathBuf, String)] {
        &self.saved
    }

    /// Journals the host resources of `entries` (a swap file, a memory cgroup) before they
    /// are added, so a SIGKILLed run's are removed by the next one; no entries removes the
    /// journal.
    pub(crate) fn journal_resources(&self, entries: &hostres::Entries) -> Result<(), HostError> {
        if entries.is_empty() {
            self.lock.remove(RES_JOURNAL_NAME)
        } else {
            self.lock
                .write_atomic(RES_JOURNAL_NAME, RES_JOURNAL_TMP, &entries.journal_text())
        }
    }
}

impl Drop for ThpKnobs {
    fn drop(&mut self) {
        let failed = self.restore();
        for f in &failed {
            eprintln!("usermm oracle: could not restore THP knob {f}");
        }
        if !failed.is_empty() {
            // The next run (or `usermm oracle --restore-knobs`) retries from the journal.
            eprintln!(
                "usermm oracle: keeping {} to restore from later",
                self.lock.journal().display()
            );
        } else if let Err(e) = self.lock.remove(JOURNAL_NAME) {
            eprintln!("usermm oracle: cannot remove the knob journal: {e}");
        }
    }
}

/// Reads every knob's current value (for tests and reports) under [`thp_dir`].
pub fn snapshot() -> Result<Vec<(PathBuf, String)>, HostError> {
    read_knobs(&thp_dir())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_bracketed_choice() {
        assert_eq!(current("always [madvise] never\n"), "madvise");
        assert_eq!(current("1\n"), "1");
    }

    #[test]
    fn journal_lines_are_checked() {
        let thp = Path::new("/thp");
        let ok = |l: &str| knob_line(thp, l).ok();
        assert_eq!(
            ok("/thp/hugepages-64kB/enabled=never"),
            Some((PathBuf::from("/thp/hugepages-64kB/enabled"), "never".into()))
        );
        assert_eq!(
            ok("/thp/khugepaged/scan_sleep_millisecs=10000"),
            Some((
                PathBuf::from("/thp/khugepaged/scan_sleep_millisecs"),
                "10000".into()
            ))
        );
        assert!(ok("/thp/khugepaged/max_ptes_none=511").is_some());
        assert!(ok("/thp/shmem_enabled=never").is_some());
        assert!(ok("/thp/hugepages-2048kB/shmem_enabled=inherit").is_some());
        assert_eq!(ok("/etc/passwd=x"), None);
        assert_eq!(ok("/thp/../etc/passwd=x"), None);
        assert_eq!(ok("/thp/hugepages-64kB/../../etc/shadow=x"), None);
        assert_eq!(ok("/thp/hugepages-+64kB/enabled=never"), None);
        assert_eq!(ok("/thp/defrag=never"), None);
        assert_eq!(ok("/thp/enabled=a b"), None);
        assert_eq!(ok("/thp/enabled="), None);
        assert_eq!(ok("/thp/enabled"), None);
    }

    #[test]
    fn journal_header_is_required() {
        let thp = Path::new("/thp");
        assert!(parse_journal("pid 3\n/thp/enabled=never\n", thp).is_err());
        assert!(parse_journal(&format!("{JOURNAL_MAGIC}\npid x\n"), thp).is_err());
        let j = match parse_journal(
            &format!("{JOURNAL_MAGIC}\npid 42\nboot b\n/thp/enabled=never\n/tmp/x=1\n"),
            thp,
        ) {
            Ok(j) => j,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(j.pid, 42);
        assert_eq!(j.boot.as_deref(), Some("b"));
        assert_eq!(j.knobs.len(), 1);
        assert_eq!(j.ignored.len(), 1);
        assert!(j.ignored[0].starts_with("line 5:"), "{:?}", j.ignored);
    }
}
