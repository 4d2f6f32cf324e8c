//! `set memory` (and `set swap`) on the host: the scenario's processes run in a memory cgroup
//! of their own, so that the host reclaims (and swaps) their memory as the engine does at the
//! same size. This is Linux's memory controller (`mm/memcontrol.c`, `mm/memcontrol-v1.c`):
//! with cgroup v2 where the host's cgroup2 hierarchy has the memory controller
//! (`memory.max`, `memory.swap.max`, `memory.reclaim`), else with cgroup v1
//! (`memory.limit_in_bytes`, `memory.memsw.limit_in_bytes` where swap accounting is on,
//! `memory.swappiness`).
//!
//! The cgroup is a child of the controller's own memory cgroup (`/proc/self/cgroup`), named
//! `usermm-oracle-PID-HEX`. (Under v2 the no-internal-process rule forbids a child with the
//! memory controller below a cgroup that holds processes unless the memory controller is
//! already enabled in its `cgroup.subtree_control`; otherwise the cgroup is made beside ours,
//! under our parent, and our own limit still bounds it.) Each spawned server writes `0` to
//! the cgroup's `cgroup.procs` (a descriptor the controller opened) before its setup, so every
//! page it charges from then on — and every page of the servers it forks — is the cgroup's.
//!
//! # The limit
//!
//! The engine's `set memory` counts only the scenario's memory; a host server also charges
//! its own: the pages of its program, stack and heap it writes after the fork (copies of the
//! controller's), its fences, and its page tables. That fixed charge was measured on the
//! reference host (Linux 6.18, cgroup v1, x86-64, debug build; `tests/swap_cgroup.rs` prints
//! it): the first idle spawned server charges 508 KiB, each further spawned or forked one
//! 256 KiB (its page tables, stack and the data pages it writes; the program's pages stay
//! charged to the controller, which touched them first). So the limit is `set memory` plus
//! [`FIXED_CHARGE`] (a rounded-up 1 MiB) per live server, recomputed before each `spawn` and
//! `fork` and after each `exit`, and capped by the controller's own (hierarchical) limit.
//! Without `set memory` (only `set swap`) the memory limit is the controller's own.
//!
//! Without `set swap` the cgroup must not swap, even when the host has swap of its own: v1
//! sets `memory.memsw.limit_in_bytes` equal to the memory limit (and `memory.swappiness` to
//! 0, which also keeps a lowered limit — `reclaim` — from swapping), v2 sets
//! `memory.swap.max` to 0. With `set swap SIZE` the cgroup may swap that much.
//!
//! # Removal
//!
//! After the file the processes are killed and reaped and the cgroup is removed (`rmdir`,
//! retried while the last ones exit). Its path is journaled before it is made
//! ([`crate::hostres`]), so a run killed with the cgroup still there has it removed by the
//! next run or `usermm oracle --restore-knobs`; [`sweep_stale`] also removes any cgroup of
//! ours whose oracle pid is gone.

use crate::sys;
use std::ffi::CString;
use std::fs::{self, File};
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// What one live server charges besides the scenario's memory (see the module docs).
pub const FIXED_CHARGE: u64 = 1 << 20;
/// The lowest memory limit written (a smaller one would leave the servers no room).
const MIN_LIMIT: u64 = 4 << 20;
/// Attempts at lowering the v1 limit for `reclaim` (each one reclaims in the kernel until it
/// gives up with EBUSY).
const RECLAIM_TRIES: usize = 3;
/// Attempts at `rmdir`, [`RMDIR_PAUSE`] apart, while the killed processes exit.
const RMDIR_TRIES: usize = 250;
const RMDIR_PAUSE: Duration = Duration::from_millis(20);
/// Prefix of the cgroups' names.
const PREFIX: &str = "usermm-oracle-";
/// `CGROUP_SUPER_MAGIC` and `CGROUP2_SUPER_MAGIC`: a journaled path must be on one.
const CGROUP_MAGIC: u64 = 0x0027_e0eb;
const CGROUP2_MAGIC: u64 = 0x6367_7270;

/// The memory controller's interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    /// cgroup v1 (`memory.limit_in_bytes`…).
    V1,
    /// cgroup v2 (`memory.max`…).
    V2,
}

/// Where a scenario cgroup goes: its parent directory and the limit above it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Place {
    /// The interface.
    pub version: Version,
    /// The directory the cgroup is made in.
    pub parent: PathBuf,
    /// The controller's own (hierarchical) memory limit, in bytes.
    pub ceiling: u64,
}

/// A scenario's memory cgroup; its processes are killed and it is removed when dropped.
#[derive(Debug)]
pub struct MemCgroup {
    version: Version,
    path: PathBuf,
    /// `cgroup.procs`, open for writing: a new server writes `0` to it.
    procs: File,
    memory: Option<u64>,
    swap: u64,
    ceiling: u64,
    /// v1: `memory.memsw.limit_in_bytes` exists.
    memsw: bool,
    /// The memory limit last written.
    limit: u64,
}

fn io_text(path: &Path, e: io::Error) -> String {
    format!("{}: {e}", path.display())
}

/// Whether a process `pid` exists.
pub fn pid_alive(pid: i32) -> bool {
    rustix::process::Pid::from_raw(pid)
        .is_some_and(|pid| rustix::process::test_kill_process(pid).is_ok())
}

/// The pid a cgroup name of ours carries (`usermm-oracle-PID-HEX`).
fn name_pid(name: &str) -> Option<i32> {
    let (pid, hex) = name.strip_prefix(PREFIX)?.split_once('-')?;
    let ok = !pid.is_empty()
        && pid.bytes().all(|b| b.is_ascii_digit())
        && hex.len() == 16
        && hex.bytes().all(|b| b.is_ascii_hexdigit());
    ok.then(|| pid.parse().ok()).flatten()
}

/// Our memory cgroup's path: the v1 `memory` line of `/proc/self/cgroup` and the v2 `0::`
/// line.
fn own_paths(text: &str) -> (Option<String>, Option<String>) {
    let mut v1 = None;
    let mut v2 = None;
    for l in text.lines() {
        let mut f = l.splitn(3, ':');
        let (Some(id), Some(ctrl), Some(path)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        if id == "0" && ctrl.is_empty() {
            v2 = Some(path.to_string());
        } else if ctrl.split(',').any(|c| c == "memory") {
            v1 = Some(path.to_string());
        }
    }
    (v1, v2)
}

/// A mount: its mount point and the root of the file system it shows.
type Mount = (String, String);

/// The mount point and root of the v1 memory hierarchy and of cgroup2, from
/// `/proc/self/mountinfo`.
fn mounts(info: &str) -> (Option<Mount>, Option<Mount>) {
    let mut v1 = None;
    let mut v2 = None;
    for l in info.lines() {
        let Some((before, after)) = l.split_once(" - ") else {
            continue;
        };
        let b: Vec<&str> = before.split_whitespace().collect();
        let a: Vec<&str> = after.split_whitespace().collect();
        let (Some(root), Some(point), Some(fstype)) = (b.get(3), b.get(4), a.first()) else {
            continue;
        };
        let found = Some((point.to_string(), root.to_string()));
        match *fstype {
            "cgroup2" => v2 = v2.or(found),
            "cgroup"
                if a.get(2)
                    .is_some_and(|o| o.split(',').any(|x| x == "memory")) =>
            {
                v1 = v1.or(found)
            }
            _ => {}
        }
    }
    (v1, v2)
}

/// `mount` + (`path` less the mount's `root`).
fn under(mount: &Mount, path: &str) -> PathBuf {
    let rel = if mount.1 == "/" {
        path
    } else {
        path.strip_prefix(mount.1.as_str()).unwrap_or(path)
    };
    Path::new(&mount.0).join(rel.trim_start_matches('/'))
}

fn read_trim(path: &Path) -> Result<String, String> {
    fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .map_err(|e| io_text(path, e))
}

fn read_u64(path: &Path) -> Result<u64, String> {
    let t = read_trim(path)?;
    if t == "max" {
        return Ok(u64::MAX);
    }
    t.parse()
        .map_err(|_| format!("{}: {t:?} is not a number", path.display()))
}

/// Where this host puts a scenario cgroup, or why it cannot.
pub fn locate() -> Result<Place, String> {
    let own =
        fs::read_to_string("/proc/self/cgroup").map_err(|e| format!("/proc/self/cgroup: {e}"))?;
    let info = fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("/proc/self/mountinfo: {e}"))?;
    let (p1, p2) = own_paths(&own);
    let (m1, m2) = mounts(&info);
    if let (Some(p), Some(m)) = (&p2, &m2) {
        let dir = under(m, p);
        let has = |f: &str| {
            fs::read_to_string(dir.join(f))
                .is_ok_and(|t| t.split_whitespace().any(|c| c == "memory"))
        };
        if has("cgroup.controllers")
            || (p == "/"
                && fs::read_to_string(dir.join("cgroup.subtree_control"))
                    .is_ok_and(|t| t.contains("memory")))
        {
            // The smallest memory.max from ours up to the top.
            let mut ceiling = u64::MAX;
            let mut d = dir.as_path();
            while d.starts_with(&m.0) && d != Path::new(&m.0) {
                if let Ok(v) = read_u64(&d.join("memory.max")) {
                    ceiling = ceiling.min(v);
                }
                let Some(up) = d.parent() else { break };
                d = up;
            }
            let parent = if p == "/" || has("cgroup.subtree_control") {
                dir.clone()
            } else {
                dir.parent().map(Path::to_path_buf).unwrap_or(dir.clone())
            };
            return Ok(Place {
                version: Version::V2,
                parent,
                ceiling,
            });
        }
    }
    let (Some(p), Some(m)) = (&p1, &m1) else {
        return Err(
            "this host has no memory cgroup controller (neither cgroup v2 with `memory` nor a \
             cgroup v1 memory hierarchy), so `set memory`/`set swap` cannot be applied"
                .into(),
        );
    };
    let dir = under(m, p);
    let stat = fs::read_to_string(dir.join("memory.stat")).map_err(|e| io_text(&dir, e))?;
    let ceiling = stat
        .lines()
        .find_map(|l| l.strip_prefix("hierarchical_memory_limit "))
        .and_then(|v| v.trim().parse().ok())
        .map_or_else(|| read_u64(&dir.join("memory.limit_in_bytes")), Ok)?;
    Ok(Place {
        version: Version::V1,
        parent: dir,
        ceiling,
    })
}

/// Writes `value` to the control file `file` of cgroup `dir`; the errno on failure.
fn write_ctl(dir: &Path, file: &str, value: &str) -> Result<(), (i32, String)> {
    let path = dir.join(file);
    let r = fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .and_then(|mut f| f.write_all(value.as_bytes()));
    r.map_err(|e| (e.raw_os_error().unwrap_or(0), io_text(&path, e)))
}

impl MemCgroup {
    /// Makes the cgroup for a file with `set memory` `memory` (if any) and `set swap`
    /// `swap` (0: none) in `place`, after calling `journal` with its path (the journal must
    /// name it before it exists). No process is in it yet.
    pub fn create(
        place: &Place,
        memory: Option<u64>,
        swap: u64,
        journal: impl FnOnce(&Path) -> Result<(), String>,
    ) -> Result<MemCgroup, String> {
        sweep_stale(&place.parent);
        let m = fs::metadata(&place.parent).map_err(|e| io_text(&place.parent, e))?;
        if m.uid() != 0 && m.uid() != sys::geteuid() {
            return Err(format!(
                "{}: not owned by root or by us; refusing to make a cgroup there",
                place.parent.display()
            ));
        }
        let hex = sys::random_hex().map_err(|e| format!("getrandom: errno {e}"))?;
        let path = place
            .parent
            .join(format!("{PREFIX}{}-{hex}", sys::getpid()));
        journal(&path)?;
        fs::create_dir(&path).map_err(|e| io_text(&path, e))?;
        let procs = match fs::OpenOptions::new()
            .write(true)
            .open(path.join("cgroup.procs"))
        {
            Ok(f) => f,
            Err(e) => {
                let _ = fs::remove_dir(&path);
                return Err(io_text(&path.join("cgroup.procs"), e));
            }
        };
        let mut cg = MemCgroup {
            version: place.version,
            memsw: path.join("memory.memsw.limit_in_bytes").exists(),
            path,
            procs,
            memory,
            swap,
            ceiling: place.ceiling,
            limit: u64::MAX,
        };
        // From here on, dropping `cg` removes the directory.
        match cg.version {
            Version::V1 => {
                if swap == 0 {
                    write_ctl(&cg.path, "memory.swappiness", "0").map_err(|e| e.1)?;
                }
            }
            Version::V2 => {
                write_ctl(&cg.path, "memory.swap.max", &swap.to_string()).map_err(|e| e.1)?;
            }
        }
        cg.set_processes(0)?;
        Ok(cg)
    }

    /// The cgroup's directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The interface.
    pub fn version(&self) -> Version {
        self.version
    }

    /// The descriptor of `cgroup.procs` a new server writes `0` to.
    pub fn procs_fd(&self) -> i32 {
        use std::os::fd::AsRawFd;
        self.procs.as_raw_fd()
    }

    /// The memory limit for `n` live servers (see the module docs).
    pub fn limit_for(&self, n: u64) -> u64 {
        match self.memory {
            Some(m) => m
                .saturating_add(FIXED_CHARGE.saturating_mul(n.max(1)))
                .min(self.ceiling)
                .max(MIN_LIMIT),
            None => self.ceiling,
        }
    }

    /// Sets the limits for `n` live servers.
    pub fn set_processes(&mut self, n: u64) -> Result<(), String> {
        let mem = self.limit_for(n);
        self.write_limit(mem).map_err(|e| e.1)
    }

    fn write_limit(&mut self, mem: u64) -> Result<(), (i32, String)> {
        let word = |v: u64| {
            if v == u64::MAX {
                "max".to_string()
            } else {
                v.to_string()
            }
        };
        match self.version {
            Version::V2 => write_ctl(&self.path, "memory.max", &word(mem))?,
            Version::V1 => {
                // v1 wants memory <= memsw at every moment: raise memsw first, lower it last.
                let v1 = |v: u64| {
                    if v == u64::MAX {
                        "-1".into()
                    } else {
                        v.to_string()
                    }
                };
                let memsw = if self.swap == 0 {
                    mem
                } else {
                    mem.saturating_add(self.swap)
                };
                let raising = mem > self.limit;
                if self.memsw && raising {
                    write_ctl(&self.path, "memory.memsw.limit_in_bytes", &v1(memsw))?;
                }
                write_ctl(&self.path, "memory.limit_in_bytes", &v1(mem))?;
                if self.memsw && !raising {
                    write_ctl(&self.path, "memory.memsw.limit_in_bytes", &v1(memsw))?;
                }
            }
        }
        self.limit = mem;
        Ok(())
    }

    /// The memory the cgroup is charged for now (v1 `memory.usage_in_bytes`, v2
    /// `memory.current`).
    pub fn usage(&self) -> Result<u64, String> {
        read_u64(&self.path.join(match self.version {
            Version::V1 => "memory.usage_in_bytes",
            Version::V2 => "memory.current",
        }))
    }

    /// Whether the cgroup's swap use is accounted (v2, or v1 with `memory.memsw.*`).
    pub fn swap_accounted(&self) -> bool {
        self.version == Version::V2 || self.memsw
    }

    /// The swap the cgroup uses now (v1 memsw usage less memory usage, v2
    /// `memory.swap.current`; 0 where not accounted).
    pub fn swap_usage(&self) -> u64 {
        match self.version {
            Version::V1 => read_u64(&self.path.join("memory.memsw.usage_in_bytes"))
                .map_or(0, |t| t.saturating_sub(self.usage().unwrap_or(t))),
            Version::V2 => read_u64(&self.path.join("memory.swap.current")).unwrap_or(0),
        }
    }

    /// `reclaim LEN`: reclaims up to `len` bytes from the cgroup, as kswapd would; stops
    /// without error when nothing more can be reclaimed. v2 writes `memory.reclaim`; v1 has
    /// none, so the limit is lowered to the usage less `len` (the kernel reclaims down to it
    /// or gives up with EBUSY) and then put back.
    pub fn reclaim(&mut self, len: u64, servers: u64) -> Result<(), String> {
        if len == 0 {
            return Ok(());
        }
        match self.version {
            Version::V2 => match write_ctl(&self.path, "memory.reclaim", &len.to_string()) {
                Ok(()) | Err((libc::EAGAIN, _)) => Ok(()),
                Err((_, m)) => Err(m),
            },
            Version::V1 => {
                let usage = self.usage()?;
                let floor = MIN_LIMIT.max(FIXED_CHARGE.saturating_mul(servers));
                let target = usage.saturating_sub(len).max(floor);
                if target >= usage {
                    return Ok(());
                }
                let keep = self.limit;
                let mut result = Ok(());
                for _ in 0..RECLAIM_TRIES {
                    match write_ctl(&self.path, "memory.limit_in_bytes", &target.to_string()) {
                        Ok(()) => break,
                        // The kernel reclaimed what it could: nothing more can be.
                        Err((libc::EBUSY, _)) => {}
                        Err((_, m)) => {
                            result = Err(m);
                            break;
                        }
                    }
                }
                let v = if keep == u64::MAX {
                    "-1".to_string()
                } else {
                    keep.to_string()
                };
                write_ctl(&self.path, "memory.limit_in_bytes", &v).map_err(|e| e.1)?;
                result
            }
        }
    }
}

impl Drop for MemCgroup {
    fn drop(&mut self) {
        if let Err(m) = remove_dir(&self.path) {
            eprintln!("usermm oracle: {m}");
        }
    }
}

/// Kills every process in cgroup `path` and removes it, retrying while they exit.
fn remove_dir(path: &Path) -> Result<(), String> {
    let mut last = String::new();
    for _ in 0..RMDIR_TRIES {
        if let Ok(t) = fs::read_to_string(path.join("cgroup.procs")) {
            for pid in t.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                let _ = sys::kill_pid(pid);
            }
        }
        match fs::remove_dir(path) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => last = io_text(path, e),
        }
        std::thread::sleep(RMDIR_PAUSE);
    }
    Err(format!("cannot remove the cgroup: {last}"))
}

/// Checks that `path` may name a scenario cgroup: a plain absolute path (no `..`) whose
/// last component is a name of ours (`usermm-oracle-PID-HEX`).
pub fn journaled(path: &Path) -> Result<(), String> {
    let bad = |why: &str| format!("{}: {why}; left alone", path.display());
    if !path.is_absolute()
        || path.components().any(|c| {
            !matches!(
                c,
                std::path::Component::RootDir | std::path::Component::Normal(_)
            )
        })
    {
        return Err(bad("not a plain absolute path"));
    }
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    if name_pid(name).is_none() {
        return Err(bad("not a cgroup name of the oracle"));
    }
    Ok(())
}

/// Checks that `path` is a scenario cgroup this module makes (a `usermm-oracle-PID-HEX`
/// directory on a cgroup file system, reached without `..`), then kills its processes and
/// removes it: what a killed run left. `Ok(false)`: it was not there.
pub fn remove_left(path: &Path) -> Result<bool, String> {
    let bad = |why: &str| format!("{}: {why}; left alone", path.display());
    journaled(path)?;
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| bad("contains a NUL"))?;
    let dir = match sys::open_dir_nofollow(&c) {
        Ok(d) => d,
        Err(libc::ENOENT) => return Ok(false),
        Err(e) => return Err(bad(&format!("errno {e}"))),
    };
    let t = sys::fs_type(&dir).map_err(|e| bad(&format!("fstatfs: errno {e}")))?;
    if t != CGROUP_MAGIC && t != CGROUP2_MAGIC {
        return Err(bad("not on a cgroup file system"));
    }
    drop(dir);
    remove_dir(path).map(|()| true)
}

/// Removes the scenario cgroups in `parent` whose oracle pid is gone; returns how many.
pub fn sweep_stale(parent: &Path) -> usize {
    let Ok(entries) = fs::read_dir(parent) else {
        return 0;
    };
    let mut removed = 0;
    for e in entries.filter_map(Result::ok) {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(name_pid) else {
            continue;
        };
        if pid != sys::getpid() && !pid_alive(pid) && remove_left(&e.path()).is_ok_and(|r| r) {
            removed += 1;
        }
    }
    removed
}

/// The scenario cgroups in `parent` whose name carries `pid` (for tests and reports).
pub fn cgroups_of(parent: &Path, pid: u32) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(parent) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_str()
                .and_then(name_pid)
                .is_some_and(|p| p as u32 == pid)
        })
        .map(|e| e.path())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_memory_cgroup_and_mounts() {
        let own = "9:name=systemd:/\n4:memory:/process_api/b7\n0::/\n";
        assert_eq!(
            own_paths(own),
            (Some("/process_api/b7".into()), Some("/".into()))
        );
        let info = "\
35 25 0:30 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 25 0:31 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
40 25 0:35 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
        let (m1, m2) = mounts(info);
        assert_eq!(m1, Some(("/sys/fs/cgroup/memory".into(), "/".into())));
        assert_eq!(m2, Some(("/sys/fs/cgroup/unified".into(), "/".into())));
        assert_eq!(
            under(&("/m".into(), "/a".into()), "/a/b"),
            PathBuf::from("/m/b")
        );
    }

    #[test]
    fn names_are_checked() {
        assert_eq!(name_pid("usermm-oracle-42-0123456789abcdef"), Some(42));
        assert_eq!(name_pid("usermm-oracle-42-0123"), None);
        assert_eq!(name_pid("usermm-oracle--0123456789abcdef"), None);
        assert_eq!(name_pid("other"), None);
        assert!(remove_left(Path::new(
            "/sys/fs/cgroup/memory/../x/usermm-oracle-1-0123456789abcdef"
        ))
        .is_err());
        assert!(remove_left(Path::new("/tmp/usermm-oracle-x")).is_err());
    }
}
