//! The oracle's only contact with libc and the C accessors.
//!
//! Thin wrappers around the system calls the host servers and the controller make
//! (memory-management calls, process and socket plumbing, io_uring buffer registration,
//! credentials and limits), and around `csrc/access.c`, which touches scenario memory with
//! SIGSEGV/SIGBUS caught. Each returns the errno (or the signal number) as a value. None of
//! them allocates, so the servers may call them after `fork` of a multi-threaded controller.

use std::ffi::{c_void, CString};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// An errno value.
pub type Errno = i32;

extern "C" {
    fn usermm_oracle_fill(addr: usize, len: usize, byte: u8) -> libc::c_int;
    fn usermm_oracle_touch_every(
        addr: usize,
        len: usize,
        step: usize,
        write: libc::c_int,
    ) -> libc::c_int;
    fn usermm_oracle_check(
        addr: usize,
        len: usize,
        byte: u8,
        at: *mut usize,
        found: *mut u8,
    ) -> libc::c_int;
}

fn errno() -> Errno {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// The host's words for errno `e` (`strerror`'s, through std): the one description every
/// host-side error message uses.
pub fn errno_text(e: Errno) -> String {
    std::io::Error::from_raw_os_error(e).to_string()
}

fn check(ret: libc::c_int) -> Result<(), Errno> {
    if ret == -1 {
        Err(errno())
    } else {
        Ok(())
    }
}

fn check_long(ret: libc::c_long) -> Result<u64, Errno> {
    if ret == -1 {
        Err(errno())
    } else {
        Ok(ret as u64)
    }
}

/// `mmap(2)`'s flags as libc names them, for the host-side callers outside this crate (bench):
/// no other crate writes the ABI's numbers again. Protections are `usermm::Prot::bits` and
/// advice `usermm::Advice::number`, the workspace's one `PROT_*` and `MADV_*` tables.
pub use libc::{MAP_ANONYMOUS, MAP_FIXED, MAP_LOCKED, MAP_POPULATE, MAP_PRIVATE, MAP_SHARED};

/// `mmap` of anonymous memory.
pub fn mmap(addr: u64, len: u64, prot: i32, flags: i32) -> Result<u64, Errno> {
    // SAFETY: an anonymous mapping (fd -1); the kernel validates every argument. A fixed
    // placement can replace mappings; the controller refuses ranges that overlap the
    // server's own mappings before asking for it.
    let r = unsafe { libc::mmap(addr as *mut c_void, len as usize, prot, flags, -1, 0) };
    if r == libc::MAP_FAILED {
        Err(errno())
    } else {
        Ok(r as u64)
    }
}

/// `munmap`.
pub fn munmap(addr: u64, len: u64) -> Result<(), Errno> {
    // SAFETY: unmaps scenario memory only (the controller checks the range against the
    // server's own mappings); no Rust reference points into it.
    check(unsafe { libc::munmap(addr as *mut c_void, len as usize) })
}

/// `mprotect`.
pub fn mprotect(addr: u64, len: u64, prot: i32) -> Result<(), Errno> {
    // SAFETY: as `munmap`: scenario memory only, never referenced from Rust.
    check(unsafe { libc::mprotect(addr as *mut c_void, len as usize, prot) })
}

/// The raw `mremap` system call.
pub fn mremap(addr: u64, old: u64, new: u64, flags: i32, new_addr: u64) -> Result<u64, Errno> {
    // SAFETY: moves or resizes scenario memory only (checked by the controller); the raw
    // system call takes plain integers.
    check_long(unsafe { libc::syscall(libc::SYS_mremap, addr, old, new, flags, new_addr) })
}

/// `madvise`.
pub fn madvise(addr: u64, len: u64, advice: i32) -> Result<(), Errno> {
    // SAFETY: scenario memory only (checked by the controller).
    check(unsafe { libc::madvise(addr as *mut c_void, len as usize, advice) })
}

/// `mlock2` (flags 0 is `mlock`).
pub fn mlock2(addr: u64, len: u64, flags: u32) -> Result<(), Errno> {
    // SAFETY: locking changes no memory contents; plain integer arguments.
    check_long(unsafe { libc::syscall(libc::SYS_mlock2, addr, len, flags) }).map(|_| ())
}

/// `munlock`.
pub fn munlock(addr: u64, len: u64) -> Result<(), Errno> {
    // SAFETY: unlocking changes no memory contents.
    check(unsafe { libc::munlock(addr as *const c_void, len as usize) })
}

/// Drains every CPU's LRU and mlock batches. `move_pages` with a node list disables the
/// per-CPU LRU caches for its duration, which drains them on all CPUs (an `mlock` only
/// drains the calling CPU's); with no pages it moves nothing.
pub fn drain_lru_batches() {
    let node = 0i32;
    let mut status = 0i32;
    // SAFETY: zero pages, so the kernel reads no page list and writes no status; the node
    // and status pointers are valid anyway.
    let _ = unsafe {
        libc::syscall(
            libc::SYS_move_pages,
            0,
            0u64,
            std::ptr::null::<*mut c_void>(),
            &node as *const i32,
            &mut status as *mut i32,
            0,
        )
    };
}

/// `fork`: `Ok(0)` in the child, the child's pid in the parent.
pub fn fork() -> Result<i32, Errno> {
    // SAFETY: the child only calls the allocation-free wrappers of this module (the server
    // loop) and leaves with `exit_now`, so it never touches state another thread held.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        Err(errno())
    } else {
        Ok(pid)
    }
}

/// Forks; the child lets the descriptors of `keep` (those ≥ 0) survive `exec`, turns off
/// address-space randomisation for itself and what it executes (`personality
/// (ADDR_NO_RANDOMIZE)`) and executes the program in the file `image` refers to with `argv`
/// and an empty environment (`execveat` with `AT_EMPTY_PATH`: no path is looked up). If that
/// fails, the child calls `failed` with the errno and exits with status 127. Returns the
/// child's pid.
pub fn fork_exec_fd_no_aslr(
    image: i32,
    argv: &[CString],
    keep: &[i32],
    failed: impl FnOnce(i32),
) -> Result<i32, Errno> {
    let mut ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    let envp: [*const libc::c_char; 1] = [std::ptr::null()];
    // SAFETY: the pointer arrays are built before the fork and outlive the call in both
    // processes. The child (of a possibly multithreaded process) only makes system calls
    // (fcntl, personality, execveat; `failed` writes a reply already on its stack) and leaves with
    // `exit_now`: nothing that takes a lock another thread may have held.
    unsafe {
        let pid = libc::fork();
        if pid < 0 {
            return Err(errno());
        }
        if pid == 0 {
            for &fd in keep.iter().filter(|&&fd| fd >= 0) {
                libc::fcntl(fd, libc::F_SETFD, 0);
            }
            libc::personality(libc::ADDR_NO_RANDOMIZE as libc::c_ulong);
            libc::syscall(
                libc::SYS_execveat,
                image,
                c"".as_ptr(),
                ptrs.as_ptr(),
                envp.as_ptr(),
                libc::AT_EMPTY_PATH,
            );
            failed(errno());
            exit_now(127);
        }
        Ok(pid)
    }
}

/// An anonymous in-memory file holding `bytes` (`memfd_create` with `MFD_CLOEXEC`): a
/// program can be executed from it (`execveat` of the descriptor, or `/proc/self/fd/N`)
/// without any path on disk that another user could plant or replace. It asks for an
/// executable file (`MFD_EXEC`, Linux 6.3+), which `vm.memfd_noexec=1` otherwise withholds;
/// a kernel that does not know the flag (EINVAL) or refuses it (`vm.memfd_noexec=2`,
/// EACCES) gets a plain one.
pub fn memfd_with(name: &std::ffi::CStr, bytes: &[u8]) -> Result<std::fs::File, Errno> {
    use std::io::Write;
    use std::os::fd::FromRawFd;
    let create = |flags: libc::c_uint| {
        // SAFETY: `name` is a valid C string; the call creates a new descriptor we own.
        unsafe { libc::memfd_create(name.as_ptr(), flags) }
    };
    let mut fd = create(libc::MFD_CLOEXEC | libc::MFD_EXEC);
    if fd < 0 && matches!(errno(), libc::EINVAL | libc::EACCES) {
        fd = create(libc::MFD_CLOEXEC);
    }
    if fd < 0 {
        return Err(errno());
    }
    // SAFETY: `fd` was just created and nothing else owns it.
    let mut f = unsafe { std::fs::File::from_raw_fd(fd) };
    f.write_all(bytes)
        .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
    Ok(f)
}

/// The child of [`spawn_task_sharing_mm`]: returns at once, which exits the task.
extern "C" fn task_returns_at_once(_: *mut c_void) -> i32 {
    0
}

/// Creates a task that shares this process's address space (`clone(CLONE_VM | CLONE_VFORK)`
/// with a stack of its own), which exits at once, and waits for it: the kernel's cost of
/// creating and reaping a task without copying an mm (the cost model's `task` primitive).
pub fn spawn_task_sharing_mm() -> Result<(), Errno> {
    let mut stack = vec![0u8; 64 << 10];
    let top = stack.as_mut_ptr_range().end;
    // SAFETY: the child runs `task_returns_at_once` on `stack` (16-byte aligned below its
    // end, which outlives the child: CLONE_VFORK suspends this thread until the child has
    // exited) and touches nothing else; glibc's wrapper exits the task with its return value.
    let pid = unsafe {
        libc::clone(
            task_returns_at_once,
            ((top as usize) & !15) as *mut c_void,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            std::ptr::null_mut(),
        )
    };
    if pid < 0 {
        return Err(errno());
    }
    wait_child(pid).map(|_| ())
}

/// `_exit`.
pub fn exit_now(code: i32) -> ! {
    // SAFETY: ends the process without running destructors or atexit handlers.
    unsafe { libc::_exit(code) }
}

/// `getpid`.
pub fn getpid() -> i32 {
    // SAFETY: no arguments.
    unsafe { libc::getpid() }
}

/// `geteuid`.
pub fn geteuid() -> u32 {
    // SAFETY: no arguments.
    unsafe { libc::geteuid() }
}

/// `read` into `buf`.
pub fn read(fd: i32, buf: &mut [u8]) -> Result<usize, Errno> {
    // SAFETY: `buf` is valid for `buf.len()` bytes of writing.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr() as *mut c_void, buf.len()) };
    if n < 0 {
        Err(errno())
    } else {
        Ok(n as usize)
    }
}

/// `write` of `buf` (MSG_NOSIGNAL semantics are not needed: SIGPIPE is ignored).
pub fn write(fd: i32, buf: &[u8]) -> Result<usize, Errno> {
    // SAFETY: `buf` is valid for `buf.len()` bytes of reading.
    let n = unsafe { libc::write(fd, buf.as_ptr() as *const c_void, buf.len()) };
    if n < 0 {
        Err(errno())
    } else {
        Ok(n as usize)
    }
}

/// `close`.
pub fn close(fd: i32) {
    // SAFETY: closing a descriptor this process owns; errors are irrelevant.
    let _ = unsafe { libc::close(fd) };
}

/// A connected pair of stream sockets.
pub fn socketpair() -> Result<(i32, i32), Errno> {
    let mut fds = [0i32; 2];
    // SAFETY: `fds` has room for the two descriptors.
    check(unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    })?;
    Ok((fds[0], fds[1]))
}

/// Fills scenario memory with `byte`; `Err(signal)` if an access faulted.
pub fn fill(addr: u64, len: u64, byte: u8) -> Result<(), i32> {
    // SAFETY: writes scenario memory of this server, which no Rust object refers to (the
    // controller refuses ranges overlapping the server's own mappings); faults come back
    // as the signal number.
    match unsafe { usermm_oracle_fill(addr as usize, len as usize, byte) } {
        0 => Ok(()),
        sig => Err(sig),
    }
}

/// One read or write access (keeping the contents) per page.
pub fn touch(addr: u64, len: u64, write: bool) -> Result<(), i32> {
    touch_every(addr, len, 1, write)
}

/// One read or write access (keeping the contents) every `step` pages from `addr`, in one
/// call: a per-access call would add a system call per access (the fault guard saves the
/// signal mask), which a timed strided read must not pay.
pub fn touch_every(addr: u64, len: u64, step: u64, write: bool) -> Result<(), i32> {
    // SAFETY: as `fill`; a write access rewrites the byte it read.
    match unsafe {
        usermm_oracle_touch_every(addr as usize, len as usize, step as usize, i32::from(write))
    } {
        0 => Ok(()),
        sig => Err(sig),
    }
}

/// The first byte that is not `byte`: `Ok(Some((offset, value)))`.
pub fn check_bytes(addr: u64, len: u64, byte: u8) -> Result<Option<(u64, u8)>, i32> {
    let mut at = 0usize;
    let mut found = 0u8;
    // SAFETY: reads scenario memory only; `at` and `found` are valid out-pointers.
    let sig =
        unsafe { usermm_oracle_check(addr as usize, len as usize, byte, &mut at, &mut found) };
    match sig {
        0 if at as u64 >= len => Ok(None),
        0 => Ok(Some((at as u64, found))),
        s => Err(s),
    }
}

static STOP: AtomicBool = AtomicBool::new(false);
static EMERGENCY: OnceLock<Vec<(CString, Vec<u8>)>> = OnceLock::new();

/// First stop signal: set the flag the controller polls. Second: write the saved knob
/// values back with raw system calls (all async-signal-safe) and exit with 130.
extern "C" fn on_stop(_sig: libc::c_int) {
    if !STOP.swap(true, Ordering::SeqCst) {
        return;
    }
    if let Some(list) = EMERGENCY.get() {
        for (path, value) in list {
            // SAFETY: open/write/close with a NUL-terminated path and a valid buffer.
            unsafe {
                let fd = libc::open(path.as_ptr(), libc::O_WRONLY);
                if fd >= 0 {
                    let _ = libc::write(fd, value.as_ptr() as *const c_void, value.len());
                    libc::close(fd);
                }
            }
        }
    }
    let swap = EMERGENCY_SWAP.load(Ordering::SeqCst);
    if !swap.is_null() {
        // SAFETY: a NUL-terminated path leaked by `arm_emergency_swapoff`, never freed;
        // swapoff and unlink are system calls (async-signal-safe).
        unsafe {
            if libc::swapoff(swap) == 0 {
                libc::unlink(swap);
            }
        }
    }
    exit_now(130)
}

/// The swap file a second stop signal turns off and deletes (null: none). The journal still
/// names it, so the next run removes its directory.
static EMERGENCY_SWAP: std::sync::atomic::AtomicPtr<libc::c_char> =
    std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());

/// Registers the swap file a second stop signal turns off and deletes before exiting
/// (`None`: none any more). A registered path is leaked, never freed: the handler may be
/// reading it.
pub fn arm_emergency_swapoff(path: Option<&CString>) {
    let p = path.map_or(std::ptr::null_mut(), |p| p.clone().into_raw());
    EMERGENCY_SWAP.store(p, Ordering::SeqCst);
}

/// Registers the knob values a second stop signal writes back before exiting (the first
/// registration of the process is kept).
pub fn arm_emergency_restore(list: Vec<(CString, Vec<u8>)>) {
    let _ = EMERGENCY.set(list);
}

fn set_handler(sig: i32, handler: libc::sighandler_t) -> Result<(), Errno> {
    // SAFETY: sigaction is plain data; all-zero is a valid (empty-mask) value.
    let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
    sa.sa_sigaction = handler;
    // No SA_RESTART: a blocking read returns EINTR so the controller notices the request.
    // SAFETY: `sa` is initialised; the handler only stores to an atomic.
    check(unsafe { libc::sigaction(sig, &sa, std::ptr::null_mut()) })
}

/// Makes SIGINT, SIGTERM and SIGHUP set the flag [`stop_requested`] reads (a second one
/// restores the THP knobs at once and exits).
pub fn install_stop_handler() -> Result<(), Errno> {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        set_handler(sig, on_stop as *const () as libc::sighandler_t)?;
    }
    Ok(())
}

/// Whether SIGINT/SIGTERM/SIGHUP arrived.
pub fn stop_requested() -> bool {
    STOP.load(Ordering::SeqCst)
}

/// `kill(pid, SIGKILL)`.
pub fn kill(pid: i32) {
    // SAFETY: signals a process this controller started.
    let _ = unsafe { libc::kill(pid, libc::SIGKILL) };
}

/// Waits until child `pid` has ended (retrying after signals); its wait status.
pub fn wait_child(pid: i32) -> Result<i32, Errno> {
    let mut status = 0;
    loop {
        // SAFETY: `status` is a valid out-pointer; waiting changes no memory of ours.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            return Ok(status);
        }
        let e = errno();
        if r < 0 && e != libc::EINTR {
            return Err(e);
        }
    }
}

/// `set_mempolicy(mode, nodemask)` for the calling thread (`MPOL_DEFAULT` is 0,
/// `MPOL_INTERLEAVE` 3); `nodemask` has one bit per node 0..64.
pub fn set_mempolicy(mode: i32, nodemask: u64) -> Result<(), Errno> {
    let mask = [nodemask];
    let ptr = if nodemask == 0 {
        std::ptr::null()
    } else {
        mask.as_ptr()
    };
    let maxnode: u64 = if nodemask == 0 { 0 } else { 65 };
    // SAFETY: `ptr` is null or points at one valid u64 holding `maxnode - 1` node bits.
    check_long(unsafe { libc::syscall(libc::SYS_set_mempolicy, mode, ptr, maxnode) }).map(|_| ())
}

/// Reaps `pid` if it has exited (never blocks).
pub fn reap(pid: i32) -> bool {
    let mut status = 0;
    // SAFETY: `status` is a valid out-pointer.
    unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) == pid }
}

/// Pins process (or thread) `pid` to host CPU `cpu` (`on cpuN`); 0 is the calling thread.
pub fn pin_to_cpu(pid: i32, cpu: u32) -> Result<(), Errno> {
    set_affinity(pid, &[cpu])
}

/// Lets `pid` (0: the calling thread) run on exactly `cpus`.
pub fn set_affinity(pid: i32, cpus: &[u32]) -> Result<(), Errno> {
    // SAFETY: a zeroed cpu_set_t is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in cpus {
        if cpu as usize >= libc::CPU_SETSIZE as usize {
            return Err(libc::EINVAL);
        }
        // SAFETY: CPU_SET writes one bit inside `set`; the index was checked above.
        unsafe { libc::CPU_SET(cpu as usize, &mut set) };
    }
    // SAFETY: `set` is a valid cpu_set_t of the size passed.
    check(unsafe { libc::sched_setaffinity(pid, std::mem::size_of::<libc::cpu_set_t>(), &set) })
}

/// The CPUs `pid` (0: the calling thread) may run on, ascending.
pub fn affinity(pid: i32) -> Result<Vec<u32>, Errno> {
    // SAFETY: a zeroed cpu_set_t is a valid out-buffer.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid cpu_set_t of the size passed, written by the kernel.
    check(unsafe {
        libc::sched_getaffinity(pid, std::mem::size_of::<libc::cpu_set_t>(), &mut set)
    })?;
    Ok((0..libc::CPU_SETSIZE as u32)
        // SAFETY: CPU_ISSET reads one bit inside `set`.
        .filter(|&c| unsafe { libc::CPU_ISSET(c as usize, &set) })
        .collect())
}

/// Wraps a descriptor a system call just returned (`fd < 0`: the errno).
fn file_from_fd(fd: libc::c_int) -> Result<std::fs::File, Errno> {
    if fd < 0 {
        return Err(errno());
    }
    use std::os::fd::FromRawFd;
    // SAFETY: `fd` was just returned by the kernel to this call and nothing else owns it.
    Ok(unsafe { std::fs::File::from_raw_fd(fd) })
}

/// Opens directory `path` read-only (close-on-exec), refusing a symbolic link as its last
/// component (`O_DIRECTORY | O_NOFOLLOW`): the oracle's lock directory, whose descriptor
/// the `*_at` calls below work in.
pub fn open_dir_nofollow(path: &std::ffi::CStr) -> Result<std::fs::File, Errno> {
    // SAFETY: `path` is NUL-terminated; open reads nothing else of ours.
    let fd = unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    file_from_fd(fd)
}

/// `openat` in `dir` with `O_NOFOLLOW | O_CLOEXEC` always added: a symbolic link planted
/// at `name` fails with ELOOP instead of redirecting the open.
fn open_at(
    dir: &std::fs::File,
    name: &std::ffi::CStr,
    flags: libc::c_int,
    mode: libc::mode_t,
) -> Result<std::fs::File, Errno> {
    use std::os::fd::AsRawFd;
    // SAFETY: `dir` is an open descriptor for the whole call and `name` is NUL-terminated;
    // `mode_t` is an unsigned int on Linux, the type the variadic argument is read as.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            flags | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            mode,
        )
    };
    file_from_fd(fd)
}

/// In `dir`: opens `name` read-write, creating it with mode 0600 if missing. Never
/// truncates and never follows a symbolic link.
pub fn open_or_create_at(
    dir: &std::fs::File,
    name: &std::ffi::CStr,
) -> Result<std::fs::File, Errno> {
    open_at(dir, name, libc::O_RDWR | libc::O_CREAT, 0o600)
}

/// In `dir`: creates `name` write-only with mode 0600; EEXIST if anything (a symbolic link
/// included) is already there.
pub fn create_new_at(dir: &std::fs::File, name: &std::ffi::CStr) -> Result<std::fs::File, Errno> {
    open_at(
        dir,
        name,
        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
        0o600,
    )
}

/// In `dir`: opens the existing `name` read-only without following a symbolic link.
pub fn open_read_at(dir: &std::fs::File, name: &std::ffi::CStr) -> Result<std::fs::File, Errno> {
    open_at(dir, name, libc::O_RDONLY, 0)
}

/// `renameat` of `from` to `to`, both in `dir` (atomically replaces `to`).
pub fn rename_at(
    dir: &std::fs::File,
    from: &std::ffi::CStr,
    to: &std::ffi::CStr,
) -> Result<(), Errno> {
    use std::os::fd::AsRawFd;
    let d = dir.as_raw_fd();
    // SAFETY: `d` is open for the call; both names are NUL-terminated.
    check(unsafe { libc::renameat(d, from.as_ptr(), d, to.as_ptr()) })
}

/// `unlinkat` of the file `name` in `dir` (a symbolic link is removed, not followed).
pub fn unlink_at(dir: &std::fs::File, name: &std::ffi::CStr) -> Result<(), Errno> {
    use std::os::fd::AsRawFd;
    // SAFETY: `dir` is open for the call; `name` is NUL-terminated.
    check(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), 0) })
}

/// Control-message room for one descriptor (`CMSG_SPACE(sizeof(int))`, 24 bytes on 64-bit
/// Linux), aligned as `struct cmsghdr` needs; on the stack, so sending stays allocation-free.
#[repr(C, align(8))]
struct OneFdCmsg([u8; 32]);

// SAFETY: CMSG_SPACE is arithmetic on its argument. The check keeps `OneFdCmsg` big enough.
const _: () = assert!(unsafe { libc::CMSG_SPACE(std::mem::size_of::<i32>() as u32) } <= 32);

/// Sends `buf` on the stream socket `sock` with descriptor `fd` attached (SCM_RIGHTS):
/// how a server hands the controller the connection of the child it forked. Returns the
/// bytes sent (the descriptor goes with them). Allocation-free: servers call it.
pub fn send_with_fd(sock: i32, buf: &[u8], fd: i32) -> Result<usize, Errno> {
    let mut space = OneFdCmsg([0; 32]);
    let mut iov = libc::iovec {
        iov_base: buf.as_ptr() as *mut c_void,
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is plain data; all-zero is a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = space.0.as_mut_ptr() as *mut c_void;
    // SAFETY: CMSG_SPACE is arithmetic on its argument.
    msg.msg_controllen = unsafe { libc::CMSG_SPACE(std::mem::size_of::<i32>() as u32) } as _;
    // SAFETY: `msg_control` points at `space`, which is aligned for cmsghdr and large
    // enough for CMSG_SPACE(sizeof(int)) (the constant assertion above), so
    // CMSG_FIRSTHDR is non-null and the header and its one int of data lie inside `space`.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        if c.is_null() {
            return Err(libc::EINVAL);
        }
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<i32>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut i32, fd);
    }
    // SAFETY: `msg` points at `iov` (valid for `buf.len()` bytes of reading) and at the
    // control message built above; all of them outlive the call.
    let n = unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        Err(errno())
    } else {
        Ok(n as usize)
    }
}

/// Receives into `buf` from the stream socket `sock`, and the first descriptor attached
/// with SCM_RIGHTS, if any (close-on-exec; further ones are closed at once, and the kernel
/// closes those that did not fit). `Ok((0, _))` is end of file; a receive timeout is EAGAIN.
pub fn recv_with_fd(
    sock: i32,
    buf: &mut [u8],
) -> Result<(usize, Option<std::os::fd::OwnedFd>), Errno> {
    use std::os::fd::FromRawFd;
    let mut space = OneFdCmsg([0; 32]);
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut c_void,
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is plain data; all-zero is a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = space.0.as_mut_ptr() as *mut c_void;
    msg.msg_controllen = space.0.len() as _;
    // SAFETY: `iov` is valid for `buf.len()` bytes of writing and the control buffer for
    // `msg_controllen` bytes; both outlive the call.
    let n = unsafe { libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(errno());
    }
    let mut got: Option<std::os::fd::OwnedFd> = None;
    // SAFETY: the kernel wrote `msg_controllen` bytes of well-formed control messages into
    // `space`; CMSG_FIRSTHDR/CMSG_NXTHDR stay inside that length and return null at its end.
    // Each SCM_RIGHTS message carries `(cmsg_len - CMSG_LEN(0)) / sizeof(int)` descriptors
    // that were just installed in this process and belong to nobody else, so wrapping each
    // in an OwnedFd (which closes it when dropped) is sound.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c) as *const i32;
                let bytes = ((*c).cmsg_len as usize).saturating_sub(libc::CMSG_LEN(0) as usize);
                for i in 0..bytes / std::mem::size_of::<i32>() {
                    let fd =
                        std::os::fd::OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i)));
                    if got.is_none() {
                        got = Some(fd);
                    }
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok((n as usize, got))
}

/// The credentials a Unix socket's peer had when the connection was made (`SO_PEERCRED`;
/// for a socket pair, the process that created the pair): `(pid, euid, egid)`.
pub fn peer_cred(sock: i32) -> Result<(i32, u32, u32), Errno> {
    let mut c = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `c` and `len` are valid out-pointers of the sizes passed.
    check(unsafe {
        libc::getsockopt(
            sock,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut c as *mut libc::ucred as *mut c_void,
            &mut len,
        )
    })?;
    Ok((c.pid, c.uid, c.gid))
}

/// The peak resident set size of this process so far, in KiB (`getrusage` ru_maxrss).
pub fn peak_rss_kib() -> Result<u64, Errno> {
    // SAFETY: rusage is plain data; all-zero is a valid value.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid out-pointer.
    check(unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) })?;
    Ok(u.ru_maxrss.max(0) as u64)
}

/// `mmap` of the file `fd` at `offset` (`fd` -1: anonymous memory, with MAP_ANONYMOUS in
/// `flags`).
pub fn mmap_fd(
    addr: u64,
    len: u64,
    prot: i32,
    flags: i32,
    fd: i32,
    offset: u64,
) -> Result<u64, Errno> {
    // SAFETY: as `mmap`; the descriptor is one the controller passed, and the kernel checks
    // it, the offset and the file's permissions.
    let r = unsafe {
        libc::mmap(
            addr as *mut c_void,
            len as usize,
            prot,
            flags,
            fd,
            offset as libc::off_t,
        )
    };
    if r == libc::MAP_FAILED {
        Err(errno())
    } else {
        Ok(r as u64)
    }
}

/// `mincore`: one byte per page of `[addr, addr + len)`, bit 0 set where the page is
/// resident in the page cache (or memory).
pub fn mincore(addr: u64, len: u64) -> Result<Vec<u8>, Errno> {
    let mut v = vec![0u8; len.div_ceil(4096) as usize];
    // SAFETY: `v` holds one byte for every page of the range; the kernel only writes there.
    check(unsafe { libc::mincore(addr as *mut c_void, len as usize, v.as_mut_ptr()) })?;
    Ok(v)
}

/// Eight random bytes as sixteen hex digits (`getrandom`), for names nobody can guess.
pub fn random_hex() -> Result<String, Errno> {
    let mut b = [0u8; 8];
    // SAFETY: `b` is valid for its length of writing.
    let n = unsafe { libc::getrandom(b.as_mut_ptr() as *mut c_void, b.len(), 0) };
    if n != b.len() as isize {
        return Err(if n < 0 { errno() } else { libc::EIO });
    }
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

mod files;
pub use files::*;

#[cfg(test)]
mod tests {
    use super::*;

    /// The pages of a fresh 10-page private anonymous mapping that `touch_every` with `step`
    /// made resident (the mapping stays within this test's own memory: no fault guard needed).
    fn resident_after(step: u64, len_pages: u64) -> Vec<usize> {
        const PAGE: u64 = 4096;
        let addr = mmap(
            0,
            10 * PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            MAP_PRIVATE | MAP_ANONYMOUS,
        )
        .expect("mmap");
        touch_every(addr, len_pages * PAGE, step, true).expect("touch");
        let v = mincore(addr, 10 * PAGE).expect("mincore");
        munmap(addr, 10 * PAGE).expect("munmap");
        v.iter()
            .enumerate()
            .filter(|(_, r)| *r & 1 != 0)
            .map(|(i, _)| i)
            .collect()
    }

    #[test]
    fn touch_every_accesses_one_page_in_step_and_stops_at_the_end() {
        assert_eq!(resident_after(3, 10), [0, 3, 6, 9]);
        assert_eq!(resident_after(4, 9), [0, 4, 8]);
        // 0 reads as 1: every page; a step past the end: the first page only.
        assert_eq!(resident_after(0, 3), [0, 1, 2]);
        assert_eq!(resident_after(1, 10), (0..10).collect::<Vec<_>>());
        assert_eq!(resident_after(u64::MAX, 10), [0]);
    }
}
