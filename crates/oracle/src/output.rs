//! Output files written safely on a shared host: traces, JSON reports, exported scenarios.
//!
//! `usermm record`, `bench --json` and `trace export --scenario` often run as root, and the
//! paths they are given often lie under world-writable directories (`/tmp`, `/var/tmp`) where
//! any local user may plant a symbolic link or a directory of their own. A plain
//! `File::create` follows a planted link and truncates whatever it points at. So an output
//! file is made like this:
//!
//! 1. Its directory is reached from `/` one component at a time with `O_NOFOLLOW`, and each
//!    directory on the way must be owned by root or by us and be writable by nobody else,
//!    or be sticky (`/tmp`: others may add names there but not remove or rename ours). A
//!    symbolic link on the way is followed only when it is owned by root or by us and lies in
//!    a directory that passed (so nobody else could have planted it); a directory missing at
//!    the end is created (mode 0755 less the umask) when the caller asks.
//! 2. The file is created under a fresh temporary name in that directory with
//!    `O_CREAT | O_EXCL | O_NOFOLLOW` (nothing there is opened or truncated), written,
//!    synced, and only then renamed over the final name; `rename` replaces a link planted at
//!    the final name instead of following it. Until [`SafeOutput::commit`], dropping the
//!    output removes the temporary file, so a failed run leaves the old file as it was.
//!
//! The check is done before the work that produces the output (a recording, a benchmark), so
//! an unusable path fails in a second instead of after the run.

use rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;
use std::ffi::OsStr;
use std::fs::File;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// Symbolic links followed on one path before giving up (Linux's `MAXSYMLINKS`).
const MAX_LINKS: u32 = 40;

/// Why an output file could not be made safely.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    /// A directory on the path another user could change under us.
    #[error(
        "{path}: {why}; refusing to write there (choose a directory only you or root can write)"
    )]
    Unsafe {
        /// The directory or link refused.
        path: PathBuf,
        /// What makes it unsafe.
        why: String,
    },
    /// A system call failed.
    #[error("{path}: {err}")]
    Io {
        /// What it was applied to.
        path: PathBuf,
        /// The error.
        err: std::io::Error,
    },
}

fn io(path: &Path, e: impl Into<std::io::Error>) -> OutputError {
    OutputError::Io {
        path: path.to_path_buf(),
        err: e.into(),
    }
}

fn unsafe_dir(path: &Path, why: impl Into<String>) -> OutputError {
    OutputError::Unsafe {
        path: path.to_path_buf(),
        why: why.into(),
    }
}

/// Whether `uid` is one we trust to have made an entry: root or ourselves.
fn trusted(uid: u32) -> bool {
    uid == 0 || uid == rustix::process::geteuid().as_raw()
}

/// Checks an opened directory: a directory, owned by root or us, writable by nobody else
/// unless sticky.
fn check_dir(fd: &OwnedFd, path: &Path) -> Result<(), OutputError> {
    let st = rfs::fstat(fd).map_err(|e| io(path, e))?;
    if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
        return Err(unsafe_dir(path, "not a directory"));
    }
    if !trusted(st.st_uid) {
        return Err(unsafe_dir(path, format!("owned by uid {}", st.st_uid)));
    }
    let mode = st.st_mode;
    if mode & 0o022 != 0 && mode & 0o1000 == 0 {
        return Err(unsafe_dir(
            path,
            format!("writable by its group or others (mode {:o})", mode & 0o7777),
        ));
    }
    Ok(())
}

fn open_dir_at(dir: &OwnedFd, name: &OsStr) -> rustix::io::Result<OwnedFd> {
    rfs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

/// Opens directory `path`, checked as the module says, creating missing directories at the
/// end of it when `create` is set.
pub fn open_dir(path: &Path, create: bool) -> Result<OwnedFd, OutputError> {
    let abs = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir().map_err(|e| io(path, e))?.join(path)
    };
    // The components still to walk, the first at the end.
    let mut todo: Vec<std::ffi::OsString> = components(&abs);
    todo.reverse();
    let root = || {
        rfs::open(
            "/",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
    };
    let mut cur = root().map_err(|e| io(Path::new("/"), e))?;
    let mut here = PathBuf::from("/");
    check_dir(&cur, &here)?;
    let mut links = 0;
    while let Some(name) = todo.pop() {
        let next = here.join(&name);
        match open_dir_at(&cur, &name) {
            Ok(fd) => {
                check_dir(&fd, &next)?;
                cur = fd;
                here = next;
            }
            Err(Errno::LOOP | Errno::NOTDIR) => {
                let st = rfs::statat(&cur, &name, AtFlags::SYMLINK_NOFOLLOW)
                    .map_err(|e| io(&next, e))?;
                if FileType::from_raw_mode(st.st_mode) != FileType::Symlink {
                    return Err(unsafe_dir(&next, "not a directory"));
                }
                if !trusted(st.st_uid) {
                    return Err(unsafe_dir(
                        &next,
                        format!("a symbolic link owned by uid {}", st.st_uid),
                    ));
                }
                links += 1;
                if links > MAX_LINKS {
                    return Err(io(&next, Errno::LOOP));
                }
                let target = rfs::readlinkat(&cur, &name, Vec::new()).map_err(|e| io(&next, e))?;
                let target = PathBuf::from(OsStr::from_bytes(target.as_bytes()));
                let mut parts = components(&target);
                parts.reverse();
                todo.extend(parts);
                if target.is_absolute() {
                    cur = root().map_err(|e| io(Path::new("/"), e))?;
                    here = PathBuf::from("/");
                }
            }
            Err(Errno::NOENT) if create => {
                match rfs::mkdirat(&cur, &name, Mode::from_raw_mode(0o755)) {
                    Ok(()) | Err(Errno::EXIST) => {}
                    Err(e) => return Err(io(&next, e)),
                }
                todo.push(name);
            }
            Err(e) => return Err(io(&next, e)),
        }
    }
    Ok(cur)
}

/// The normal components of `p` (`..` kept: it is walked like a name, from a directory that
/// was checked, to one that is checked in turn).
fn components(p: &Path) -> Vec<std::ffi::OsString> {
    p.components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_os_string()),
            Component::ParentDir => Some("..".into()),
            _ => None,
        })
        .collect()
}

/// An output file being written under a temporary name (see the module documentation).
#[derive(Debug)]
#[must_use = "an output is only there once committed"]
pub struct SafeOutput {
    dir: OwnedFd,
    tmp: std::ffi::OsString,
    name: std::ffi::OsString,
    path: PathBuf,
    file: Option<File>,
}

impl SafeOutput {
    /// Checks `path`'s directory (creating it if `create_dirs`) and creates the temporary
    /// file beside the final name.
    pub fn create(path: &Path, create_dirs: bool) -> Result<SafeOutput, OutputError> {
        let name = path
            .file_name()
            .filter(|n| !n.is_empty() && *n != "." && *n != "..")
            .ok_or_else(|| io(path, std::io::Error::other("not a file name")))?
            .to_os_string();
        let parent = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let dir = open_dir(parent, create_dirs)?;
        match rfs::statat(&dir, &name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => {
                return Err(io(path, std::io::Error::other("is a directory")));
            }
            _ => {}
        }
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        for attempt in 0..100u32 {
            let mut tmp = std::ffi::OsString::from(".");
            tmp.push(&name);
            tmp.push(format!(".{}.{stamp:x}.{attempt}.tmp", std::process::id()));
            match rfs::openat(
                &dir,
                &tmp,
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o644),
            ) {
                Ok(fd) => {
                    return Ok(SafeOutput {
                        dir,
                        tmp,
                        name,
                        path: path.to_path_buf(),
                        file: Some(File::from(fd)),
                    })
                }
                Err(Errno::EXIST) => continue,
                Err(e) => return Err(io(path, e)),
            }
        }
        Err(io(path, Errno::EXIST))
    }

    /// The final path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The temporary file, to write to.
    pub fn file(&mut self) -> &mut File {
        self.file.as_mut().expect("the file is open until commit")
    }

    /// Syncs the file and renames it over the final name.
    pub fn commit(mut self) -> Result<(), OutputError> {
        let file = self.file.take().expect("the file is open until commit");
        file.sync_all().map_err(|e| io(&self.path, e))?;
        drop(file);
        rfs::renameat(&self.dir, &self.tmp, &self.dir, &self.name)
            .map_err(|e| io(&self.path, e))?;
        self.tmp.clear();
        Ok(())
    }
}

impl Drop for SafeOutput {
    fn drop(&mut self) {
        if !self.tmp.is_empty() {
            let _ = rfs::unlinkat(&self.dir, &self.tmp, AtFlags::empty());
        }
    }
}

/// Writes `bytes` to `path` as the module says (creating missing directories).
pub fn write_file(path: &Path, bytes: &[u8]) -> Result<(), OutputError> {
    let mut out = SafeOutput::create(path, true)?;
    out.file().write_all(bytes).map_err(|e| io(path, e))?;
    out.commit()
}
