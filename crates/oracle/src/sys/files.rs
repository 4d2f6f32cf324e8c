//! The file system calls of the host side: positioned reads and writes, truncation,
//! allocation, syncing, the page cache (`cachestat`, `posix_fadvise`), and the `*at` calls
//! that keep the scratch directories private. Part of [`super`], the one module of the crate
//! with `unsafe` code.

use super::*;

/// `pread` of `len` bytes at `offset` as a program with a buffer of `len` bytes makes it,
/// repeated after short reads until end of file or `len`: the bytes read. The kernel sees the
/// real count (its checks of the range depend on it), but only `cap` bytes (what the file can
/// give) are kept in the heap: a longer buffer is an untouched `MAP_NORESERVE` mapping, which
/// costs nothing but the pages the file fills. An error before any byte is the errno.
pub fn pread_upto(fd: i32, len: u64, offset: u64, cap: u64) -> Result<Vec<u8>, Errno> {
    let read_into = |buf: &mut [u8]| -> Result<usize, Errno> {
        let mut got = 0usize;
        while got < buf.len() {
            match pread(fd, &mut buf[got..], offset.wrapping_add(got as u64)) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(libc::EINTR) => {}
                Err(e) if got == 0 => return Err(e),
                Err(_) => break,
            }
        }
        Ok(got)
    };
    let small = len.min(cap);
    let sparse = (len > small)
        .then(|| {
            let bytes = len.checked_add(4095)? & !4095;
            let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
            let addr = mmap(0, bytes, libc::PROT_READ | libc::PROT_WRITE, flags).ok()?;
            Some((addr, bytes))
        })
        .flatten();
    match sparse {
        Some((addr, bytes)) => {
            // SAFETY: `addr` is a fresh private mapping of `bytes >= len` bytes, readable and
            // writable, of ours alone until the munmap below; `len` fits in usize since it
            // was mapped.
            let buf = unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len as usize) };
            let res = read_into(buf).map(|got| buf[..got].to_vec());
            let _ = munmap(addr, bytes);
            res
        }
        None => {
            let mut buf = vec![0u8; small as usize];
            let got = read_into(&mut buf)?;
            buf.truncate(got);
            Ok(buf)
        }
    }
}

/// `pread64` into `buf` at `offset` (an offset above `i64::MAX` is passed on as the
/// negative number the kernel refuses).
pub fn pread(fd: i32, buf: &mut [u8], offset: u64) -> Result<usize, Errno> {
    // SAFETY: `buf` is valid for `buf.len()` bytes of writing.
    let n = unsafe {
        libc::pread64(
            fd,
            buf.as_mut_ptr() as *mut c_void,
            buf.len(),
            offset as i64,
        )
    };
    if n < 0 {
        Err(errno())
    } else {
        Ok(n as usize)
    }
}

/// `pwrite64` of `buf` at `offset`.
pub fn pwrite(fd: i32, buf: &[u8], offset: u64) -> Result<usize, Errno> {
    // SAFETY: `buf` is valid for `buf.len()` bytes of reading.
    let n = unsafe { libc::pwrite64(fd, buf.as_ptr() as *const c_void, buf.len(), offset as i64) };
    if n < 0 {
        Err(errno())
    } else {
        Ok(n as usize)
    }
}

/// `ftruncate64`.
pub fn ftruncate(fd: i32, size: u64) -> Result<(), Errno> {
    // SAFETY: plain integers.
    check(unsafe { libc::ftruncate64(fd, size as i64) })
}

/// `fallocate64`.
pub fn fallocate(fd: i32, mode: i32, offset: u64, len: u64) -> Result<(), Errno> {
    // SAFETY: plain integers.
    check(unsafe { libc::fallocate64(fd, mode, offset as i64, len as i64) })
}

/// `fsync`.
pub fn fsync(fd: i32) -> Result<(), Errno> {
    // SAFETY: plain integer.
    check(unsafe { libc::fsync(fd) })
}

/// `posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)`: drops the file's clean, unmapped pages
/// from the page cache.
pub fn drop_cache(fd: i32) -> Result<(), Errno> {
    // SAFETY: plain integers. posix_fadvise returns the error number instead of setting
    // errno.
    match unsafe { libc::posix_fadvise64(fd, 0, 0, libc::POSIX_FADV_DONTNEED) } {
        0 => Ok(()),
        e => Err(e),
    }
}

/// The `cachestat(2)` system call's number on x86-64 (Linux 6.5).
const SYS_CACHESTAT: libc::c_long = 451;

/// Pages of the file range `[offset, offset+len)` in the page cache (`cachestat(2)`,
/// `nr_cache`; `len` 0 means to the end of the file).
pub fn cachestat(fd: i32, offset: u64, len: u64) -> Result<u64, Errno> {
    // struct cachestat_range { __u64 off, len; } and struct cachestat { __u64 nr_cache,
    // nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted; }.
    let range = [offset, len];
    let mut out = [0u64; 5];
    // SAFETY: `range` and `out` have the layout and size of the kernel's structures.
    check_long(unsafe {
        libc::syscall(SYS_CACHESTAT, fd, range.as_ptr(), out.as_mut_ptr(), 0u32)
    })?;
    Ok(out[0])
}

/// `mkdirat(dir, name, mode)`: EEXIST if anything (a symbolic link too) is there.
pub fn mkdir_at(dir: &std::fs::File, name: &std::ffi::CStr, mode: u32) -> Result<(), Errno> {
    use std::os::fd::AsRawFd;
    // SAFETY: `dir` is open for the call; `name` is NUL-terminated.
    check(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), mode as libc::mode_t) })
}

/// In `dir`: opens the directory `name` read-only, refusing a symbolic link.
pub fn open_dir_at(dir: &std::fs::File, name: &std::ffi::CStr) -> Result<std::fs::File, Errno> {
    open_at(dir, name, libc::O_RDONLY | libc::O_DIRECTORY, 0)
}

/// `unlinkat(dir, name, AT_REMOVEDIR)`: removes the empty directory `name`.
pub fn rmdir_at(dir: &std::fs::File, name: &std::ffi::CStr) -> Result<(), Errno> {
    use std::os::fd::AsRawFd;
    // SAFETY: `dir` is open for the call; `name` is NUL-terminated.
    check(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), libc::AT_REMOVEDIR) })
}

/// A new unnamed regular file (`O_TMPFILE`, mode 0600) in directory `dir`, open read-write:
/// it has no name anyone could reach and is freed when its last descriptor and mapping go.
pub fn tmpfile_in(dir: &std::fs::File) -> Result<std::fs::File, Errno> {
    open_at(dir, c".", libc::O_TMPFILE | libc::O_RDWR, 0o600)
}

/// The file system magic number of the file system `f` is on (`fstatfs` `f_type`).
pub fn fs_type(f: &std::fs::File) -> Result<u64, Errno> {
    use std::os::fd::AsRawFd;
    // SAFETY: statfs is plain data; all-zero is a valid value.
    let mut s: libc::statfs64 = unsafe { std::mem::zeroed() };
    // SAFETY: `s` is a valid out-pointer.
    check(unsafe { libc::fstatfs64(f.as_raw_fd(), &mut s) })?;
    Ok(s.f_type as u64)
}

/// The id of the mount `f` is on (`statx` `STATX_MNT_ID`), as `/proc/self/mountinfo`
/// shows it in its first column.
pub fn mount_id(f: &std::fs::File) -> Result<u64, Errno> {
    use std::os::fd::AsRawFd;
    // SAFETY: statx is plain data; all-zero is a valid value.
    let mut s: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: an empty path with AT_EMPTY_PATH names `f` itself; `s` is a valid out-pointer.
    check(unsafe {
        libc::statx(
            f.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_MNT_ID,
            &mut s,
        )
    })?;
    if s.stx_mask & libc::STATX_MNT_ID == 0 {
        return Err(libc::ENOSYS);
    }
    Ok(s.stx_mnt_id)
}

/// `SWAP_FLAG_PREFER` of `<linux/swap.h>`: the low 15 bits of the flags are the priority.
pub const SWAP_FLAG_PREFER: i32 = 0x8000;

/// `swapon(path, flags)` (`mm/swapfile.c`): adds the swap area at `path`.
pub fn swapon(path: &std::ffi::CStr, flags: i32) -> Result<(), Errno> {
    // SAFETY: `path` is NUL-terminated; swapon reads nothing else of ours.
    check(unsafe { libc::swapon(path.as_ptr(), flags) })
}

/// `swapoff(path)`: brings every page of the swap area at `path` back into memory and
/// removes the area.
pub fn swapoff(path: &std::ffi::CStr) -> Result<(), Errno> {
    // SAFETY: `path` is NUL-terminated; swapoff reads nothing else of ours.
    check(unsafe { libc::swapoff(path.as_ptr()) })
}

/// `kill(pid, SIGKILL)` of a process that is not our child (a server left in a scenario
/// cgroup by a killed run); ESRCH when it is gone.
pub fn kill_pid(pid: i32) -> Result<(), Errno> {
    // SAFETY: sends a signal; no memory of ours is involved.
    check(unsafe { libc::kill(pid, libc::SIGKILL) })
}
