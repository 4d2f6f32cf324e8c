//! `set swap SIZE` on the host: a swap file of ours, added with `swapon(2)` for one scenario
//! file and removed with `swapoff(2)` after it (Linux's `mm/swapfile.c`; the header is the
//! one `mkswap` writes, `union swap_header` of `include/linux/swap.h`).
//!
//! The file lives in a private directory (mode 0700, ours, made with
//! [`ScratchDir::create`](crate::files::ScratchDir::create) under a random
//! `usermm-oracle-PID-HEX` name) on `/var/tmp`, which must be ext4: a world-writable sticky
//! directory where nobody else can rename or fill our directory, and where the file is created
//! with `O_CREAT | O_EXCL | O_NOFOLLOW`, so no planted name is ever followed. It is fully
//! allocated (`fallocate`) after [`files::check_room`] left the file system its reserve,
//! and its header is written here, so nothing depends on util-linux.
//!
//! The controller adds it under the machine-wide lock, after journaling its path
//! ([`crate::hostres`]): a run killed while the swap is on leaves the journal, and the next
//! run (or `usermm oracle --restore-knobs`) turns it off and deletes it ([`remove_left`]).
//! Stale directories whose creator is gone are also swept when a new swap file is made
//! ([`sweep_stale`]). A first SIGINT/SIGTERM ends the run in order (the file is removed as
//! after any file); a second one, which exits at once, still turns the swap off and deletes
//! the file from the signal handler ([`sys::arm_emergency_swapoff`]).

use crate::files::{self, ScratchDir};
use crate::sys::{self, errno_text};
use std::ffi::{CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

/// Where the swap files' directories are made (block-backed: swap cannot live on tmpfs).
pub const SWAP_PARENT: &str = files::DISK_PARENT;
/// The largest `set swap` the host accepts.
pub const SWAP_MAX: u64 = 8 << 30;
/// The swap priority our file is added with (`SWAP_FLAG_PREFER`): fixed, and above the
/// negative defaults the kernel gives areas added without one, so a scenario swaps to it
/// first when the host has other swap.
pub const SWAP_PRIORITY: i32 = 100;
/// The file's name in its directory.
const FILE_NAME: &CStr = c"swap";
/// `mkswap`'s minimum: ten pages.
const MIN_PAGES: u64 = 10;
/// The swap header's magic, in the last ten bytes of page 0.
const MAGIC: &[u8; 10] = b"SWAPSPACE2";
/// Prefix of the directories' names (as [`files`] names its scratch directories).
const PREFIX: &str = "usermm-oracle-";

/// An active (or about to be) swap file of ours; turned off and deleted when dropped.
#[derive(Debug)]
pub struct SwapFile {
    dir: ScratchDir,
    path: PathBuf,
    size: u64,
    active: bool,
}

/// Page 0 of a swap area of `pages` pages of `page` bytes (version 1, no bad pages).
pub fn header(page: usize, pages: u64) -> Vec<u8> {
    let mut h = vec![0u8; page];
    // `info.version` and `info.last_page` follow the 1024 boot bytes, in native order.
    h[1024..1028].copy_from_slice(&1u32.to_ne_bytes());
    let last = u32::try_from(pages.saturating_sub(1)).unwrap_or(u32::MAX);
    h[1028..1032].copy_from_slice(&last.to_ne_bytes());
    h[page - MAGIC.len()..].copy_from_slice(MAGIC);
    h
}

/// The swap areas `/proc/swaps` lists (its first column), not counting its header.
pub fn active_areas() -> Vec<String> {
    std::fs::read_to_string("/proc/swaps")
        .unwrap_or_default()
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

/// Whether `path` is an active swap area (`/proc/swaps` escapes blanks in names; ours
/// have none).
fn is_active(path: &Path) -> bool {
    let p = path.to_string_lossy();
    active_areas().iter().any(|a| *a == p)
}

impl SwapFile {
    /// Makes the swap file of `size` bytes (rounded down to pages): private directory,
    /// room checked, fully allocated, header written and synced. Not active yet
    /// ([`SwapFile::activate`]); the error says why the host cannot give that swap.
    pub fn create(size: u64) -> Result<SwapFile, String> {
        let page = rustix::param::page_size();
        let pages = size / page as u64;
        if size > SWAP_MAX {
            return Err(format!(
                "set swap {} MiB: the host's swap file is limited to {} MiB",
                size >> 20,
                SWAP_MAX >> 20
            ));
        }
        if pages < MIN_PAGES {
            return Err(format!(
                "set swap {size}: a swap area needs at least {MIN_PAGES} pages"
            ));
        }
        let size = pages * page as u64;
        sweep_stale();
        let dir = ScratchDir::create(Path::new(SWAP_PARENT))?;
        files::check_ext4(&dir)?;
        files::check_room(&dir, size, false)?;
        let path = dir.path().join(FILE_NAME.to_string_lossy().as_ref());
        let file = sys::create_new_at(dir.dir(), FILE_NAME)
            .map_err(|e| format!("{}: {}", path.display(), errno_text(e)))?;
        let swap = SwapFile {
            dir,
            path,
            size,
            active: false,
        };
        let fail = |what: &str, e: String| format!("{}: {what}: {e}", swap.path.display());
        use std::os::fd::AsRawFd;
        sys::fallocate(file.as_raw_fd(), 0, 0, size).map_err(|e| match e {
            libc::ENOSPC => fail("fallocate", "no room left on the device".into()),
            e => fail("fallocate", errno_text(e)),
        })?;
        file.write_all_at(&header(page, pages), 0)
            .and_then(|()| file.sync_all())
            .map_err(|e| fail("writing the swap header", e.to_string()))?;
        Ok(swap)
    }

    /// The file's path (as `/proc/swaps` shows it).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The swap area's size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// `swapon` with priority [`SWAP_PRIORITY`]; warns when the host has other swap areas
    /// (what a scenario observes then includes them).
    pub fn activate(&mut self) -> Result<(), String> {
        let others = active_areas();
        if !others.is_empty() {
            eprintln!(
                "usermm oracle: warning: the host already has swap ({}); a scenario's swapping \
                 may use it too",
                others.join(", ")
            );
        }
        let c = CString::new(self.path.as_os_str().as_bytes())
            .map_err(|_| format!("{}: contains a NUL byte", self.path.display()))?;
        sys::swapon(&c, sys::SWAP_FLAG_PREFER | SWAP_PRIORITY).map_err(|e| match e {
            libc::EPERM => format!(
                "swapon {}: not permitted here (needs CAP_SYS_ADMIN outside a container)",
                self.path.display()
            ),
            e => format!("swapon {}: {}", self.path.display(), errno_text(e)),
        })?;
        self.active = true;
        sys::arm_emergency_swapoff(Some(&c));
        Ok(())
    }

    /// Turns the swap off and deletes the file; what failed, if anything (the journal then
    /// stays for the next run).
    pub fn remove(mut self) -> Result<(), String> {
        self.teardown()
    }

    fn teardown(&mut self) -> Result<(), String> {
        if self.active {
            let c = CString::new(self.path.as_os_str().as_bytes())
                .map_err(|_| format!("{}: contains a NUL byte", self.path.display()))?;
            sys::arm_emergency_swapoff(None);
            match sys::swapoff(&c) {
                Ok(()) | Err(libc::EINVAL) => self.active = false,
                Err(e) => {
                    return Err(format!(
                        "swapoff {}: {}",
                        self.path.display(),
                        errno_text(e)
                    ))
                }
            }
        }
        match sys::unlink_at(self.dir.dir(), FILE_NAME) {
            Ok(()) | Err(libc::ENOENT) => Ok(()),
            Err(e) => Err(format!(
                "{}: unlink: {}",
                self.path.display(),
                errno_text(e)
            )),
        }
    }
}

impl Drop for SwapFile {
    fn drop(&mut self) {
        if let Err(m) = self.teardown() {
            eprintln!("usermm oracle: {m}");
        }
    }
}

/// Whether `name` is one of our directories' names, and the pid it carries.
fn dir_pid(name: &str) -> Option<i32> {
    let rest = name.strip_prefix(PREFIX)?;
    let (pid, hex) = rest.split_once('-')?;
    let ok = !pid.is_empty()
        && pid.bytes().all(|b| b.is_ascii_digit())
        && hex.len() == 16
        && hex.bytes().all(|b| b.is_ascii_hexdigit());
    ok.then(|| pid.parse().ok()).flatten()
}

/// Checks that `path` is a swap file path this module makes:
/// `/var/tmp/usermm-oracle-PID-HEX/swap`; the directory's name, if so.
pub fn journaled_dir(path: &Path) -> Result<String, String> {
    let bad = || format!("{} is not a swap file the oracle makes", path.display());
    let rel = path.strip_prefix(SWAP_PARENT).map_err(|_| bad())?;
    let parts: Vec<&str> = rel.to_str().ok_or_else(bad)?.split('/').collect::<Vec<_>>();
    match parts.as_slice() {
        [d, f] if dir_pid(d).is_some() && Some(*f) == FILE_NAME.to_str().ok() => Ok(d.to_string()),
        _ => Err(bad()),
    }
}

/// Turns off and deletes the swap file in our directory `name` of [`SWAP_PARENT`], then the
/// directory: what a killed run left. Nothing that is not a directory of ours (mode 0700)
/// holding a regular file of ours is touched. `Ok(false)`: nothing was there.
pub fn remove_left(name: &str) -> Result<bool, String> {
    let parent_path = Path::new(SWAP_PARENT);
    let shown = parent_path.join(name);
    let parent = sys::open_dir_nofollow(
        &CString::new(SWAP_PARENT).map_err(|_| "NUL in the swap parent".to_string())?,
    )
    .map_err(|e| format!("{SWAP_PARENT}: {}", errno_text(e)))?;
    let cname = CString::new(name).map_err(|_| format!("{name:?}: NUL"))?;
    let dir = match sys::open_dir_at(&parent, &cname) {
        Ok(d) => d,
        Err(libc::ENOENT) => return Ok(false),
        Err(e) => return Err(format!("{}: {}", shown.display(), errno_text(e))),
    };
    let euid = sys::geteuid();
    let m = dir
        .metadata()
        .map_err(|e| format!("{}: {e}", shown.display()))?;
    if !m.is_dir() || m.uid() != euid || m.mode() & 0o7777 != 0o700 {
        return Err(format!(
            "{}: not a directory of uid {euid} with mode 0700; left alone",
            shown.display()
        ));
    }
    let file = shown.join(FILE_NAME.to_string_lossy().as_ref());
    if is_active(&file) {
        let c = CString::new(file.as_os_str().as_bytes()).map_err(|_| "NUL".to_string())?;
        sys::swapoff(&c).map_err(|e| format!("swapoff {}: {}", file.display(), errno_text(e)))?;
    }
    match sys::open_read_at(&dir, FILE_NAME) {
        Ok(f) => {
            let fm = f
                .metadata()
                .map_err(|e| format!("{}: {e}", file.display()))?;
            if !fm.is_file() || fm.uid() != euid {
                return Err(format!(
                    "{}: not a regular file of uid {euid}; left alone",
                    file.display()
                ));
            }
            drop(f);
            sys::unlink_at(&dir, FILE_NAME)
                .map_err(|e| format!("{}: unlink: {}", file.display(), errno_text(e)))?;
        }
        Err(libc::ENOENT) => {}
        Err(e) => return Err(format!("{}: {}", file.display(), errno_text(e))),
    }
    drop(dir);
    match sys::rmdir_at(&parent, &cname) {
        Ok(()) | Err(libc::ENOENT) => Ok(true),
        Err(e) => Err(format!("{}: rmdir: {}", shown.display(), errno_text(e))),
    }
}

/// Removes the swap files (turning them off first) and directories in [`SWAP_PARENT`] that
/// oracles whose pid is gone left; returns how many. Only called under the machine-wide
/// lock, so no live run's swap is among them.
pub fn sweep_stale() -> usize {
    let Ok(entries) = std::fs::read_dir(SWAP_PARENT) else {
        return 0;
    };
    let mut removed = 0;
    for e in entries.filter_map(Result::ok).take(65_536) {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(pid) = dir_pid(name) else { continue };
        if pid == sys::getpid() || crate::cgroup::pid_alive(pid) {
            continue;
        }
        // Only directories holding a swap file: the empty ones are files::sweep_stale's.
        let has_swap = std::fs::symlink_metadata(Path::new(SWAP_PARENT).join(name).join("swap"))
            .is_ok_and(|m| m.is_file());
        if has_swap && remove_left(name).is_ok_and(|r| r) {
            removed += 1;
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_is_mkswaps() {
        let h = header(4096, 65536);
        assert_eq!(&h[4086..], b"SWAPSPACE2");
        assert_eq!(u32::from_ne_bytes([h[1024], h[1025], h[1026], h[1027]]), 1);
        assert_eq!(
            u32::from_ne_bytes([h[1028], h[1029], h[1030], h[1031]]),
            65535
        );
        assert!(h[..1024].iter().all(|&b| b == 0));
    }

    #[test]
    fn journaled_paths_are_checked() {
        let ok = "/var/tmp/usermm-oracle-12-0123456789abcdef/swap";
        assert_eq!(
            journaled_dir(Path::new(ok)).as_deref(),
            Ok("usermm-oracle-12-0123456789abcdef")
        );
        for bad in [
            "/var/tmp/usermm-oracle-12-0123456789abcdef/other",
            "/var/tmp/usermm-oracle-12-0123456789abcdef/../../etc/swap",
            "/tmp/usermm-oracle-12-0123456789abcdef/swap",
            "/var/tmp/usermm-oracle-x-0123456789abcdef/swap",
            "/var/tmp/usermm-oracle-12-0123/swap",
            "/var/tmp/swap",
        ] {
            assert!(journaled_dir(Path::new(bad)).is_err(), "{bad}");
        }
    }
}
