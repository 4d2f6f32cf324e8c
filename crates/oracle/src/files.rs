//! The scenario's files on the host: private scratch directories and unnamed files in them.
//!
//! A scenario's tmpfs files live in a directory of ours on `/dev/shm` (a tmpfs mounted with
//! huge=never, as SCENARIO.md requires: checked on the mount itself), its `disk` files in
//! one on `/var/tmp` (checked to be ext4). Both parents are world-writable and sticky, where
//! any local user may plant a name first, so root never follows or reuses a path there:
//! - the parent is opened with `O_DIRECTORY | O_NOFOLLOW` and must be owned by root or us;
//! - the scratch directory is made with `mkdirat(…, 0700)` under a random name (an
//!   existing name, a planted symbolic link included, fails with EEXIST and another name is
//!   tried), opened relative to the parent with `O_NOFOLLOW`, and refused unless `fstat`
//!   shows a directory of ours with mode 0700;
//! - each file is created in it with `O_TMPFILE`: it has no name at all, so nothing can be
//!   planted at it, and the kernel frees it when its last descriptor and mapping go, even if
//!   the oracle is killed.
//!
//! Dropping a [`ScratchDir`] removes the (always empty) directory. A SIGKILLed oracle cannot
//! drop it, so the directory's name carries its creator's pid (`usermm-oracle-PID-HEX`) and
//! the next [`ScratchDir::create`] in the same parent removes the empty directories of ours
//! whose creator is gone.
//!
//! Before a file's bytes are written ([`check_room`]), the file system must have room for
//! them with a reserve left for everyone else, and a tmpfs file (which is memory) must also
//! fit in the host's `MemAvailable` with its reserve: a scenario's `file 1G` on a 64 MiB
//! `/dev/shm` is refused instead of filling it.

use crate::sys::{self, errno_text};
use std::ffi::CString;
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Where tmpfs files go.
pub const TMPFS_PARENT: &str = "/dev/shm";
/// Where disk files go.
pub const DISK_PARENT: &str = "/var/tmp";
/// `TMPFS_MAGIC`.
pub const TMPFS_MAGIC: u64 = 0x0102_1994;
/// `EXT4_SUPER_MAGIC` (shared by ext2 and ext3).
pub const EXT4_MAGIC: u64 = 0xef53;
/// Prefix of the scratch directories' names.
const PREFIX: &str = "usermm-oracle-";
/// Names tried before giving up.
const ATTEMPTS: usize = 16;

/// A private directory of ours (mode 0700) inside a shared parent; removed when dropped.
#[derive(Debug)]
pub struct ScratchDir {
    parent: File,
    name: CString,
    dir: File,
    path: PathBuf,
}

/// Opens the parent `path` without following a symbolic link; it must be a directory
/// owned by root or by us (a directory another user owns could be emptied and refilled).
fn open_parent(path: &Path) -> Result<File, String> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| format!("{}: contains a NUL byte", path.display()))?;
    let f = sys::open_dir_nofollow(&c).map_err(|e| {
        // O_DIRECTORY | O_NOFOLLOW reports a symbolic link as ENOTDIR (or ELOOP).
        let link = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
        if link {
            format!("{}: is a symbolic link; refusing to use it", path.display())
        } else {
            format!("{}: {}", path.display(), errno_text(e))
        }
    })?;
    let m = f
        .metadata()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let euid = sys::geteuid();
    if !m.is_dir() || (m.uid() != 0 && m.uid() != euid) {
        return Err(format!(
            "{}: not a directory owned by root or by uid {euid}; refusing to use it",
            path.display()
        ));
    }
    Ok(f)
}

/// Removes the empty scratch directories in `parent` that an oracle left when it was killed:
/// names of our pattern whose pid is no longer a process, directories (not links) of our
/// euid with mode 0700. `rmdir` removes only an empty one, so a directory in use by a live
/// run, or that someone filled, stays. Returns how many were removed.
pub fn sweep_stale(parent: &Path) -> usize {
    use rustix::fs::{statat, AtFlags, FileType};
    let Ok(p) = open_parent(parent) else {
        return 0;
    };
    let Ok(entries) = std::fs::read_dir(parent) else {
        return 0;
    };
    let euid = sys::geteuid();
    let mut removed = 0;
    // A parent may hold many names; look at a bounded number of them.
    for e in entries.filter_map(Result::ok).take(65_536) {
        let name = e.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(PREFIX)) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<i32>().ok()) else {
            continue;
        };
        let alive = rustix::process::Pid::from_raw(pid)
            .is_some_and(|pid| rustix::process::test_kill_process(pid).is_ok());
        if alive {
            continue;
        }
        let Ok(st) = statat(&p, name.as_os_str(), AtFlags::SYMLINK_NOFOLLOW) else {
            continue;
        };
        let ours = FileType::from_raw_mode(st.st_mode) == FileType::Directory
            && st.st_uid == euid
            && st.st_mode & 0o7777 == 0o700;
        let Ok(cname) = CString::new(name.as_bytes()) else {
            continue;
        };
        if ours && sys::rmdir_at(&p, &cname).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// Refuses to write `bytes` into the file system of `dir` when it would leave less than a
/// sixteenth of that file system (at least 16 MiB) free, or, for a tmpfs (`memory`), when
/// the bytes would not fit in the host's `MemAvailable` less an eighth of it (at least
/// 256 MiB): the host is shared, and a full `/dev/shm` or `/var/tmp` hurts every user.
pub fn check_room(dir: &ScratchDir, bytes: u64, memory: bool) -> Result<(), String> {
    if bytes == 0 {
        return Ok(());
    }
    let st = rustix::fs::fstatvfs(&dir.dir)
        .map_err(|e| format!("{}: statvfs: {e}", dir.path.display()))?;
    let unit = st.f_frsize.max(1);
    let free = st.f_bavail.saturating_mul(unit);
    let total = st.f_blocks.saturating_mul(unit);
    let room = free.saturating_sub((total / 16).max(16 << 20));
    let mib = |b: u64| b >> 20;
    if bytes > room {
        return Err(format!(
            "{} MiB to write on {}, which has {} MiB free of {} MiB: refused, to keep a reserve \
             for the host's other users",
            mib(bytes),
            dir.path.parent().unwrap_or(&dir.path).display(),
            mib(free),
            mib(total)
        ));
    }
    if memory {
        if let Some(avail) = scenario::engine::host_mem_available() {
            let room = scenario::engine::host_memory_room(avail);
            if bytes > room {
                return Err(format!(
                    "{} MiB of tmpfs to write, and the host has {} MiB of memory available: \
                     refused, to keep a reserve for the host's other users",
                    mib(bytes),
                    mib(avail)
                ));
            }
        }
    }
    Ok(())
}

impl ScratchDir {
    /// A new private directory with a random name in `parent`, after removing what killed
    /// runs left there ([`sweep_stale`]).
    pub fn create(parent: &Path) -> Result<ScratchDir, String> {
        sweep_stale(parent);
        let mut last = String::new();
        for _ in 0..ATTEMPTS {
            let hex = sys::random_hex().map_err(|e| format!("getrandom: {}", errno_text(e)))?;
            let name = format!("{PREFIX}{}-{hex}", std::process::id());
            match ScratchDir::create_named(parent, &name) {
                Ok(d) => return Ok(d),
                Err((libc::EEXIST, m)) => last = m,
                Err((_, m)) => return Err(m),
            }
        }
        Err(last)
    }

    /// A new private directory `name` in `parent`: fails (EEXIST) if anything is already
    /// there, a symbolic link included, and never follows one. The error is the errno
    /// (0 if none) and a message.
    pub fn create_named(parent: &Path, name: &str) -> Result<ScratchDir, (sys::Errno, String)> {
        let p = open_parent(parent).map_err(|m| (0, m))?;
        let path = parent.join(name);
        let shown = |e: sys::Errno| (e, format!("{}: {}", path.display(), errno_text(e)));
        let cname = CString::new(name).map_err(|_| (libc::EINVAL, format!("{name:?}: NUL")))?;
        sys::mkdir_at(&p, &cname, 0o700).map_err(shown)?;
        // From here on the name is ours: a failure removes it again.
        let remove = |p: &File| {
            let _ = sys::rmdir_at(p, &cname);
        };
        let dir = match sys::open_dir_at(&p, &cname) {
            Ok(d) => d,
            Err(e) => {
                remove(&p);
                return Err(shown(e));
            }
        };
        let m = match dir.metadata() {
            Ok(m) => m,
            Err(e) => {
                remove(&p);
                return Err((0, format!("{}: {e}", path.display())));
            }
        };
        let euid = sys::geteuid();
        if !m.is_dir() || m.uid() != euid || m.mode() & 0o7777 != 0o700 {
            remove(&p);
            return Err((
                0,
                format!(
                    "{}: not a directory of uid {euid} with mode 0700 (uid {}, mode {:04o}); \
                     refusing to use it",
                    path.display(),
                    m.uid(),
                    m.mode() & 0o7777
                ),
            ));
        }
        Ok(ScratchDir {
            parent: p,
            name: cname,
            dir,
            path,
        })
    }

    /// The directory's path (the prefix of its files' names in `/proc/PID/maps`).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The open directory.
    pub fn dir(&self) -> &File {
        &self.dir
    }

    /// A new unnamed file in the directory (`O_TMPFILE`), open read-write.
    pub fn tmpfile(&self) -> Result<File, String> {
        sys::tmpfile_in(&self.dir).map_err(|e| {
            format!(
                "{}: cannot create an O_TMPFILE file: {}",
                self.path.display(),
                errno_text(e)
            )
        })
    }

    /// Whether `name` (the name column of `/proc/PID/maps`) is a file of this directory.
    pub fn holds(&self, name: &str) -> bool {
        let dir = self.path.as_os_str().as_bytes();
        let n = name.as_bytes();
        n.len() > dir.len() + 1 && n.starts_with(dir) && n[dir.len()] == b'/'
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if let Err(e) = sys::rmdir_at(&self.parent, &self.name) {
            eprintln!(
                "usermm oracle: cannot remove {}: {}",
                self.path.display(),
                errno_text(e)
            );
        }
    }
}

/// Checks that `dir` is on a tmpfs whose mount has no `huge=` option other than `never`
/// (Linux's default, as on `/dev/shm`): why not, if it is not.
pub fn check_tmpfs_never(dir: &ScratchDir) -> Result<(), String> {
    let shown = dir.path().display();
    let t = sys::fs_type(dir.dir()).map_err(|e| format!("{shown}: fstatfs: {}", errno_text(e)))?;
    if t != TMPFS_MAGIC {
        return Err(format!("{shown} is not on a tmpfs (f_type {t:#x})"));
    }
    let id = sys::mount_id(dir.dir()).map_err(|e| format!("{shown}: statx: {}", errno_text(e)))?;
    let info = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("/proc/self/mountinfo: {e}"))?;
    let opts = mount_options(&info, id)
        .ok_or_else(|| format!("{shown}: mount {id} is not in /proc/self/mountinfo"))?;
    match opts.split(',').find_map(|o| o.strip_prefix("huge=")) {
        None | Some("never") => Ok(()),
        Some(h) => Err(format!(
            "the tmpfs of {shown} is mounted with huge={h}; the scenario's tmpfs must be \
             huge=never (as /dev/shm is by default)"
        )),
    }
}

/// The super-block options of mount `id` in `/proc/self/mountinfo` text (the field after
/// the file system type and source), if its type is tmpfs.
pub fn mount_options(info: &str, id: u64) -> Option<String> {
    info.lines().find_map(|l| {
        let mut it = l.split_whitespace();
        if it.next()?.parse::<u64>().ok()? != id {
            return None;
        }
        let (_, after) = l.split_once(" - ")?;
        let mut f = after.split_whitespace();
        (f.next()? == "tmpfs").then_some(())?;
        let _source = f.next()?;
        Some(f.next().unwrap_or("").to_string())
    })
}

/// Checks that `dir` is on ext4 (or ext2/3, which share the magic number).
pub fn check_ext4(dir: &ScratchDir) -> Result<(), String> {
    let shown = dir.path().display();
    let t = sys::fs_type(dir.dir()).map_err(|e| format!("{shown}: fstatfs: {}", errno_text(e)))?;
    if t != EXT4_MAGIC {
        return Err(format!(
            "{shown} is not on ext4 (f_type {t:#x}); disk files need a block-backed file system"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_mount_options() {
        let info = "\
22 1 252:0 / / rw,relatime shared:1 - ext4 /dev/vda rw,discard
30 22 0:25 / /dev/shm rw,nosuid shared:4 - tmpfs tmpfs rw,size=10k
31 30 0:26 / /dev/shm rw - tmpfs tmpfs rw,size=10k,huge=always
";
        assert_eq!(mount_options(info, 30).as_deref(), Some("rw,size=10k"));
        assert_eq!(
            mount_options(info, 31).as_deref(),
            Some("rw,size=10k,huge=always")
        );
        assert_eq!(mount_options(info, 22), None);
        assert_eq!(mount_options(info, 99), None);
    }
}
