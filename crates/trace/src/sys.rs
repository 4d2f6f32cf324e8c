//! Every system call the recorder makes that the standard library does not wrap:
//! `perf_event_open` and its ring buffers, `ptrace`, `fork`/`execvp` of the traced command,
//! `waitpid`, `kcmp`. All `unsafe` of the crate is in this file. The host calls the oracle
//! also makes (`kill`, `geteuid`, the stop handler) are `oracle::sys`'s, not wrapped again.

#![allow(unsafe_code)]

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// `struct perf_event_attr` (`PERF_ATTR_SIZE_VER8`, 136 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct PerfEventAttr {
    /// `type`.
    pub type_: u32,
    /// `size`.
    pub size: u32,
    /// `config` (the tracepoint id).
    pub config: u64,
    /// `sample_period`.
    pub sample_period: u64,
    /// `sample_type`.
    pub sample_type: u64,
    /// `read_format`.
    pub read_format: u64,
    /// The bit fields (`disabled` is bit 0 …).
    pub flags: u64,
    /// `wakeup_events`.
    pub wakeup_events: u32,
    /// `bp_type`.
    pub bp_type: u32,
    /// `config1`.
    pub config1: u64,
    /// `config2`.
    pub config2: u64,
    /// `branch_sample_type`.
    pub branch_sample_type: u64,
    /// `sample_regs_user`.
    pub sample_regs_user: u64,
    /// `sample_stack_user`.
    pub sample_stack_user: u32,
    /// `clockid`.
    pub clockid: i32,
    /// `sample_regs_intr`.
    pub sample_regs_intr: u64,
    /// `aux_watermark`.
    pub aux_watermark: u32,
    /// `sample_max_stack`.
    pub sample_max_stack: u16,
    /// `__reserved_2`.
    pub reserved2: u16,
    /// `aux_sample_size`.
    pub aux_sample_size: u32,
    /// `__reserved_3`.
    pub reserved3: u32,
    /// `sig_data`.
    pub sig_data: u64,
    /// `config3`.
    pub config3: u64,
}

/// `PERF_TYPE_TRACEPOINT`.
pub const PERF_TYPE_TRACEPOINT: u32 = 2;
/// Flag bits of [`PerfEventAttr::flags`].
pub mod attr {
    /// Start disabled.
    pub const DISABLED: u64 = 1 << 0;
    /// Children inherit the event.
    pub const INHERIT: u64 = 1 << 1;
    /// `PERF_RECORD_MMAP` for executable mappings.
    pub const MMAP: u64 = 1 << 8;
    /// `PERF_RECORD_COMM`.
    pub const COMM: u64 = 1 << 9;
    /// Enable at the next exec.
    pub const ENABLE_ON_EXEC: u64 = 1 << 12;
    /// `PERF_RECORD_FORK`/`EXIT`.
    pub const TASK: u64 = 1 << 13;
    /// Also data (non-executable) mappings.
    pub const MMAP_DATA: u64 = 1 << 17;
    /// Sample id fields on every record.
    pub const SAMPLE_ID_ALL: u64 = 1 << 18;
    /// `PERF_RECORD_MMAP2` instead of `MMAP`.
    pub const MMAP2: u64 = 1 << 23;
    /// Flag exec in `PERF_RECORD_COMM`.
    pub const COMM_EXEC: u64 = 1 << 24;
    /// Use `clockid` for timestamps.
    pub const USE_CLOCKID: u64 = 1 << 25;
}

/// `perf_event_open(2)` for `pid` on `cpu`.
pub fn perf_event_open(a: &PerfEventAttr, pid: i32, cpu: i32) -> io::Result<OwnedFd> {
    let mut a = *a;
    a.size = std::mem::size_of::<PerfEventAttr>() as u32;
    // SAFETY: `a` is a valid, fully initialised perf_event_attr of the size we announce;
    // the kernel only reads it (and may write `size` back on E2BIG, into our copy).
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &mut a as *mut PerfEventAttr,
            pid,
            cpu,
            -1i32,
            8u64, // PERF_FLAG_FD_CLOEXEC
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the syscall returned a new file descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

const IOC_SET_OUTPUT: libc::c_ulong = 0x2405;
const IOC_ID: libc::c_ulong = 0x8008_2407;

/// `PERF_EVENT_IOC_SET_OUTPUT`: `fd`'s records go to `target`'s ring buffer.
pub fn perf_set_output(fd: &OwnedFd, target: &OwnedFd) -> io::Result<()> {
    // SAFETY: both are perf event descriptors we own; the ioctl takes an fd by value.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), IOC_SET_OUTPUT, target.as_raw_fd()) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `PERF_EVENT_IOC_ID`: the id the kernel puts in `PERF_SAMPLE_IDENTIFIER`.
pub fn perf_id(fd: &OwnedFd) -> io::Result<u64> {
    let mut id = 0u64;
    // SAFETY: the ioctl writes one u64 into `id`, which lives for the call.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), IOC_ID, &mut id as *mut u64) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(id)
}

/// A perf ring buffer mapped from an event descriptor.
#[derive(Debug)]
pub struct Ring {
    base: *mut u8,
    len: usize,
    data_off: usize,
    data_size: usize,
}

// SAFETY: the mapping is owned by this value and only accessed through `&mut self`.
unsafe impl Send for Ring {}

/// Offsets in `struct perf_event_mmap_page`.
const DATA_HEAD: usize = 1024;
const DATA_TAIL: usize = 1032;
const DATA_OFFSET: usize = 1040;
const DATA_SIZE: usize = 1048;

impl Ring {
    /// Maps 1 + `pages` pages (`pages` a power of two) of `fd`'s ring buffer.
    pub fn map(fd: &OwnedFd, pages: usize) -> io::Result<Ring> {
        let len = (pages + 1) * 4096;
        // SAFETY: a fresh shared mapping of a perf fd, checked for MAP_FAILED below; the
        // kernel defines its layout (a metadata page, then the data pages).
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = p as *mut u8;
        // SAFETY: the metadata page is mapped; data_offset/data_size are u64 fields of it
        // (non-zero since Linux 4.1; fall back to page 1 onwards otherwise).
        let (off, size) = unsafe {
            (
                std::ptr::read_volatile(base.add(DATA_OFFSET) as *const u64) as usize,
                std::ptr::read_volatile(base.add(DATA_SIZE) as *const u64) as usize,
            )
        };
        let (data_off, data_size) = if off == 0 || size == 0 || off + size > len {
            (4096, pages * 4096)
        } else {
            (off, size)
        };
        Ok(Ring {
            base,
            len,
            data_off,
            data_size,
        })
    }

    /// Copies every complete record written since the last call into `out` (records may
    /// wrap around the buffer's end; the copy is linear) and frees their space.
    pub fn drain(&mut self, out: &mut Vec<u8>) -> usize {
        // SAFETY: data_head/data_tail are u64 fields of the mapped metadata page; the kernel
        // writes data_head, we write data_tail. The acquire fence orders the data reads after
        // the head read, the release fence our reads before the tail write (the protocol of
        // perf_event_mmap_page). Data offsets are taken modulo data_size, inside the mapping.
        unsafe {
            let head = std::ptr::read_volatile(self.base.add(DATA_HEAD) as *const u64);
            std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
            let tail = std::ptr::read_volatile(self.base.add(DATA_TAIL) as *const u64);
            let n = head.wrapping_sub(tail) as usize;
            let n = n.min(self.data_size);
            let data = self.base.add(self.data_off);
            let start = (tail as usize) % self.data_size;
            let first = n.min(self.data_size - start);
            out.extend_from_slice(std::slice::from_raw_parts(data.add(start), first));
            out.extend_from_slice(std::slice::from_raw_parts(data, n - first));
            std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
            std::ptr::write_volatile(self.base.add(DATA_TAIL) as *mut u64, head);
            n
        }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `map`, which nothing else references.
        unsafe {
            libc::munmap(self.base as *mut libc::c_void, self.len);
        }
    }
}

/// Forks a child that asks to be traced, stops itself, and then runs `argv` (`execvp`).
/// Returns the child's pid; the child is stopped (SIGSTOP) when this returns successfully
/// and the caller has waited for it.
pub fn spawn_traced(argv: &[CString], user: Option<&Identity>) -> io::Result<i32> {
    if argv.is_empty() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty command"));
    }
    let mut ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    let groups: Vec<libc::gid_t> = user.map(|u| u.groups.clone()).unwrap_or_default();
    // SAFETY: after fork the child only calls async-signal-safe functions (ptrace, setgroups,
    // setgid, setuid, raise, execvp, _exit) on memory prepared before the fork; the parent
    // just gets the pid.
    unsafe {
        let pid = libc::fork();
        if pid < 0 {
            return Err(io::Error::last_os_error());
        }
        if pid == 0 {
            libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0);
            // Still root here (no `no_new_privs` needed); a failure leaves the file
            // mappings to the `MMAP2` records.
            install_file_mmap_filter();
            // Groups, then group, then user: once the uid is dropped the rest is refused.
            if let Some(u) = user {
                if libc::setgroups(groups.len(), groups.as_ptr()) != 0
                    || libc::setgid(u.gid) != 0
                    || libc::setuid(u.uid) != 0
                {
                    libc::_exit(126);
                }
            }
            libc::raise(libc::SIGSTOP);
            libc::execvp(ptrs[0], ptrs.as_ptr());
            libc::_exit(127);
        }
        Ok(pid)
    }
}

/// `seccomp_data`: the offset of the low half of argument `n`.
const fn seccomp_arg(n: u32) -> u32 {
    16 + 8 * n
}

/// Installs in the calling process a seccomp filter that stops every x86-64 `mmap` of a
/// file (fd not -1) for the tracer, before it runs (`SECCOMP_RET_TRACE`: a
/// `PTRACE_EVENT_SECCOMP` stop, then the call goes on), and lets every other call through.
/// It is inherited by every child, as the tracing is ([`PTRACE_OPTIONS`] has
/// `PTRACE_O_TRACESECCOMP`; `PTRACE_O_EXITKILL` ends the tracees with the tracer, so the
/// filter never outlives it: without a tracer such an mmap would fail with `ENOSYS`).
/// The recorder reads the file's page cache at the stop (`record::cache`). Returns whether
/// it is installed (other architectures: never).
fn install_file_mmap_filter() -> bool {
    if !cfg!(target_arch = "x86_64") {
        return false;
    }
    const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
    const NR_MMAP: u32 = 9;
    let ld = |k| libc::sock_filter {
        code: (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16,
        jt: 0,
        jf: 0,
        k,
    };
    let jeq = |k, jt, jf| libc::sock_filter {
        code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
        jt,
        jf,
        k,
    };
    let ret = |k| libc::sock_filter {
        code: (libc::BPF_RET | libc::BPF_K) as u16,
        jt: 0,
        jf: 0,
        k,
    };
    let prog = [
        ld(4),                        // arch
        jeq(AUDIT_ARCH_X86_64, 0, 5), // else allow
        ld(0),                        // nr
        jeq(NR_MMAP, 0, 3),           // else allow
        ld(seccomp_arg(4)),           // fd (low half)
        jeq(u32::MAX, 1, 0),          // -1: allow
        ret(libc::SECCOMP_RET_TRACE),
        ret(libc::SECCOMP_RET_ALLOW),
    ];
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: `fprog` points to `prog`, which lives across the call; the kernel copies it.
    unsafe {
        libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER as libc::c_ulong,
            &fprog as *const libc::sock_fprog,
            0,
            0,
        ) == 0
    }
}

/// A user the traced command runs as (`record --user`, or the invoking user under sudo).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// Login name.
    pub name: String,
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
    /// Every group the user is in (`getgrouplist`), the primary one included.
    pub groups: Vec<u32>,
}

/// Looks `spec` up in the user database: a login name, or a numeric uid.
pub fn lookup_user(spec: &str) -> io::Result<Identity> {
    let not_found = || io::Error::new(io::ErrorKind::NotFound, format!("no user `{spec}`"));
    // SAFETY: `passwd` is plain data (zeroed is valid); getpw*_r write only into `pw`, `buf`
    // (whose length is passed) and `found`, all of which outlive the call.
    let (name, uid, gid) = unsafe {
        let mut pw: libc::passwd = std::mem::zeroed();
        let mut buf = vec![0 as libc::c_char; 16 << 10];
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        let r = match spec.parse::<u32>() {
            Ok(uid) => libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr(), buf.len(), &mut found),
            Err(_) => {
                let c = CString::new(spec).map_err(|_| not_found())?;
                libc::getpwnam_r(c.as_ptr(), &mut pw, buf.as_mut_ptr(), buf.len(), &mut found)
            }
        };
        if r != 0 {
            return Err(io::Error::from_raw_os_error(r));
        }
        if found.is_null() || pw.pw_name.is_null() {
            return Err(not_found());
        }
        let name = std::ffi::CStr::from_ptr(pw.pw_name).to_owned();
        (name, pw.pw_uid, pw.pw_gid)
    };
    let mut groups = vec![0 as libc::gid_t; 256];
    let mut n = groups.len() as libc::c_int;
    // SAFETY: `groups` holds `n` entries; getgrouplist writes at most `n` and sets `n` to the
    // number it found (which may be more, then it returns -1 and we keep the first 256).
    let r = unsafe { libc::getgrouplist(name.as_ptr(), gid, groups.as_mut_ptr(), &mut n) };
    let n = if r < 0 {
        groups.len()
    } else {
        n.max(0) as usize
    };
    groups.truncate(n);
    if !groups.contains(&gid) {
        groups.push(gid);
    }
    Ok(Identity {
        name: name.to_string_lossy().into_owned(),
        uid,
        gid,
        groups,
    })
}

/// `PTRACE_O_*` options the recorder sets.
pub const PTRACE_OPTIONS: i32 = libc::PTRACE_O_TRACEFORK
    | libc::PTRACE_O_TRACEVFORK
    | libc::PTRACE_O_TRACECLONE
    | libc::PTRACE_O_TRACEEXEC
    | libc::PTRACE_O_TRACEEXIT
    | libc::PTRACE_O_TRACESECCOMP
    | libc::PTRACE_O_EXITKILL;

/// `PTRACE_SETOPTIONS`.
pub fn ptrace_setoptions(pid: i32, opts: i32) -> io::Result<()> {
    // SAFETY: ptrace on a tracee of ours; the data argument is the option bits.
    let r = unsafe { libc::ptrace(libc::PTRACE_SETOPTIONS, pid, 0, opts as libc::c_long) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `PTRACE_CONT` with `sig` injected (0: none).
pub fn ptrace_cont(pid: i32, sig: i32) -> io::Result<()> {
    // SAFETY: ptrace on a stopped tracee; the data argument is a signal number.
    let r = unsafe { libc::ptrace(libc::PTRACE_CONT, pid, 0, sig as libc::c_long) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `PTRACE_GETSIGINFO` at the signal-delivery stop of a `SIGSEGV` or `SIGBUS`: the
/// signal's `si_code` and the faulting address `si_addr`.
pub fn ptrace_fault_siginfo(pid: i32) -> io::Result<(i32, u64)> {
    // SAFETY: siginfo_t is plain data; all-zero is a valid value.
    let mut si: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: the kernel writes one siginfo_t into `si`, which lives for the call.
    let r = unsafe {
        libc::ptrace(
            libc::PTRACE_GETSIGINFO,
            pid,
            0,
            &mut si as *mut libc::siginfo_t as *mut libc::c_void,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `si_addr` is the union member a SIGSEGV or SIGBUS carries (the only signals
    // this is called for); for another it reads bits that are then ignored.
    let addr = unsafe { si.si_addr() } as u64;
    Ok((si.si_code, addr))
}

/// `PTRACE_GETEVENTMSG` (the new pid at a fork stop).
pub fn ptrace_geteventmsg(pid: i32) -> io::Result<u64> {
    let mut msg: libc::c_ulong = 0;
    // SAFETY: the kernel writes one unsigned long into `msg`, which lives for the call.
    let r = unsafe {
        libc::ptrace(
            libc::PTRACE_GETEVENTMSG,
            pid,
            0,
            &mut msg as *mut libc::c_ulong,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(msg as u64)
}

/// What `waitpid` reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// Nothing changed (`WNOHANG`).
    Nothing,
    /// No tracee or child is left.
    NoChild,
    /// `pid` exited (status) or was killed (128 + signal).
    Gone(i32, i32),
    /// `pid` stopped with `sig`; `event` is the `PTRACE_EVENT_*` (0 for a signal stop).
    Stopped {
        /// Process.
        pid: i32,
        /// Signal.
        sig: i32,
        /// ptrace event.
        event: i32,
    },
}

/// `waitpid(-1, __WALL | WNOHANG)`.
pub fn wait_any() -> io::Result<Wait> {
    let mut status = 0;
    // SAFETY: waitpid writes the status into `status`, which lives for the call.
    let pid = unsafe { libc::waitpid(-1, &mut status, libc::__WALL | libc::WNOHANG) };
    if pid < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ECHILD) => Ok(Wait::NoChild),
            Some(libc::EINTR) => Ok(Wait::Nothing),
            _ => Err(e),
        };
    }
    if pid == 0 {
        return Ok(Wait::Nothing);
    }
    if libc::WIFSTOPPED(status) {
        return Ok(Wait::Stopped {
            pid,
            sig: libc::WSTOPSIG(status),
            event: (status >> 16) & 0xff,
        });
    }
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        128 + libc::WTERMSIG(status)
    };
    Ok(Wait::Gone(pid, code))
}

/// Blocking `waitpid(pid, __WALL)`: the raw status.
pub fn wait_pid(pid: i32) -> io::Result<i32> {
    let mut status = 0;
    // SAFETY: waitpid writes the status into `status`, which lives for the call.
    let r = unsafe { libc::waitpid(pid, &mut status, libc::__WALL) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(status)
}

/// Whether `a` and `b` share one address space (`kcmp(KCMP_VM)`); `None` if unknown.
pub fn same_vm(a: i32, b: i32) -> Option<bool> {
    const KCMP_VM: libc::c_long = 1;
    // SAFETY: kcmp only compares kernel objects of the two processes; no memory is passed.
    let r = unsafe { libc::syscall(libc::SYS_kcmp, a, b, KCMP_VM, 0, 0) };
    (r >= 0).then_some(r == 0)
}

/// `CLOCK_MONOTONIC` in ns (the clock perf timestamps use here).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into `ts`, which lives for the call.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A read-only, shared mapping of a window of a file, for reading its page-cache state
/// (`record::cache`); unmapped on drop.
pub struct FileWindow {
    base: *mut libc::c_void,
    len: usize,
}

impl FileWindow {
    /// Maps `len` bytes of `fd` from `offset` (page-aligned) read-only and shared, with
    /// `MADV_RANDOM` so that faults on it read nothing ahead.
    pub fn map(fd: &std::fs::File, offset: u64, len: usize) -> io::Result<FileWindow> {
        use std::os::fd::AsRawFd;
        let off = libc::off_t::try_from(offset)
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: a fresh mapping chosen by the kernel (no address given), of a file we
        // hold open; it is only read through the kernel (mincore, madvise, pagemap).
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                off,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let w = FileWindow { base, len };
        // SAFETY: advice on the mapping just made, inside its bounds.
        if unsafe { libc::madvise(w.base, len, libc::MADV_RANDOM) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(w)
    }

    /// The window's address.
    pub fn addr(&self) -> u64 {
        self.base as u64
    }

    /// `mincore`: one byte per page, bit 0 set when the page is in the page cache.
    pub fn mincore(&self) -> io::Result<Vec<u8>> {
        let mut v = vec![0u8; self.len.div_ceil(4096)];
        // SAFETY: `v` has one byte per page of the mapping, as mincore writes.
        if unsafe { libc::mincore(self.base, self.len, v.as_mut_ptr()) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(v)
    }

    /// `MADV_POPULATE_READ` of `n` pages from page `first`: maps them (cached pages are
    /// mapped, not read; failure, e.g. past a concurrent truncation, is an error, never a
    /// signal).
    pub fn populate(&self, first: usize, n: usize) -> io::Result<()> {
        if (first + n) * 4096 > self.len {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        // SAFETY: the range lies inside the mapping (checked above).
        let r = unsafe {
            libc::madvise(
                self.base.cast::<u8>().add(first * 4096).cast(),
                n * 4096,
                libc::MADV_POPULATE_READ,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

impl Drop for FileWindow {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `map`, which nothing else references.
        unsafe {
            libc::munmap(self.base, self.len);
        }
    }
}

/// `POSIX_FADV_DONTNEED` of the whole of `f`: drops its clean cached pages (tests start
/// from a cold file with it).
pub fn fadvise_dontneed(f: &std::fs::File) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: advice on a descriptor the caller holds open; no memory is passed.
    match unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) } {
        0 => Ok(()),
        e => Err(io::Error::from_raw_os_error(e)),
    }
}
