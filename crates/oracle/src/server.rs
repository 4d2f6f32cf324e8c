//! A host server: one real process of the scenario, driven by the controller.
//!
//! The server performs each request (a system call or a memory access in its own address
//! space) and replies with the result. It is a fork of the controller (`spawn`) or of another
//! server (`fork`). It keeps its state in fixed-size values and calls only the
//! allocation-free wrappers of [`crate::sys`], so it never creates or grows a mapping of its
//! own after it starts.
//!
//! A `fork` request makes a socket pair *before* forking: the child keeps one end as its
//! connection, and the parent sends the other end to the controller attached (SCM_RIGHTS)
//! to its reply. No socket is ever listening, so no other local user can connect to the
//! controller, stall it or forge a server's answers (see [`crate::host`]).
//!
//! An `mmap` of a file comes with the controller's descriptor of it attached (SCM_RIGHTS):
//! a server may run as nobody and could not open the file, and the file has no name anyway.
//! Requests are received with `recvmsg` into fixed buffers; a descriptor passed with any
//! other request is closed unused, and the one of an `mmap` is closed right after the call.

use crate::layout;
use crate::proto::{Op, Reply, Request, REPLY_BYTES, REQ_BYTES};
use crate::sys;

/// The descriptor a server talks to the controller on.
const CONN_FD: i32 = 3;
/// Pins a server can hold at once.
const MAX_PINS: usize = 64;
/// The user and group ordinary servers run as (nobody).
const NOBODY: u32 = 65534;
/// The refusal code of a fork whose connection could not be made or handed over.
pub const FORK_CONNECTION: u64 = 6;

/// The user a server spawned with `privileged` runs as (a forked server keeps its
/// parent's): the controller's own effective user, or nobody.
pub fn server_uid(privileged: bool) -> u32 {
    if privileged {
        sys::geteuid()
    } else {
        NOBODY
    }
}

/// Setup steps, reported in a refused hello.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u64)]
pub enum Step {
    /// Signal dispositions and the fault handler.
    Signals = 1,
    /// RLIMIT_MEMLOCK.
    Rlimit = 2,
    /// Fences and the heap move.
    Layout = 3,
    /// Dropping root.
    Credentials = 4,
    /// Moving the connection to its descriptor.
    Descriptors = 5,
    /// Joining the scenario's memory cgroup.
    Cgroup = 6,
}

impl Step {
    /// What the step does, for messages.
    pub fn describe(code: u64) -> &'static str {
        match code {
            1 => "installing signal handlers",
            2 => "setrlimit(RLIMIT_MEMLOCK)",
            3 => "placing fences and moving the heap (prctl PR_SET_MM)",
            4 => "dropping root (setresuid/setresgid)",
            5 => "setting up descriptors",
            6 => "joining the scenario's memory cgroup (writing cgroup.procs)",
            _ => "an unknown step",
        }
    }
}

/// How a spawned server sets itself up.
#[derive(Clone, Copy, Debug)]
pub struct SpawnConfig {
    /// The server's end of its connection.
    pub conn: i32,
    /// The controller's end, to close in the server.
    pub stray: i32,
    /// Keep root's capabilities.
    pub privileged: bool,
    /// RLIMIT_MEMLOCK (`None`: unlimited).
    pub rlimit_memlock: Option<u64>,
    /// The scenario cgroup's `cgroup.procs`, open for writing (-1: none): the server joins
    /// the cgroup first, so everything it charges afterwards is the cgroup's.
    pub cgroup_procs: i32,
}

#[derive(Clone, Copy)]
struct PinSlot {
    addr: u64,
    len: u64,
    fd: i32,
}

const FREE: PinSlot = PinSlot {
    addr: 0,
    len: 0,
    fd: -1,
};

struct Server {
    conn: i32,
    pins: [PinSlot; MAX_PINS],
    /// The descriptor attached to the current request (-1: none).
    passed: i32,
}

/// Runs in the child of the controller's `fork`: sets up, says hello, serves. Never returns.
pub fn run_spawned(cfg: SpawnConfig) -> ! {
    sys::close(cfg.stray);
    let hello = match setup(&cfg) {
        Ok(()) => Reply::Ok(sys::getpid() as u64, 0),
        Err((step, e)) => Reply::Refused(step as u64, e),
    };
    let early = [Step::Descriptors as u64, Step::Cgroup as u64];
    let conn = if matches!(hello, Reply::Refused(s, _) if early.contains(&s)) {
        cfg.conn
    } else {
        CONN_FD
    };
    if !send(conn, &hello) || !matches!(hello, Reply::Ok(..)) {
        sys::exit_now(2);
    }
    let mut s = Server {
        conn,
        pins: [FREE; MAX_PINS],
        passed: -1,
    };
    s.serve()
}

fn setup(cfg: &SpawnConfig) -> Result<(), (Step, i32)> {
    if cfg.cgroup_procs >= 0 {
        // "0" is the writer itself (cgroup v1 and v2).
        sys::write(cfg.cgroup_procs, b"0").map_err(|e| (Step::Cgroup, e))?;
    }
    sys::dup2(cfg.conn, CONN_FD).map_err(|e| (Step::Descriptors, e))?;
    sys::close_from(CONN_FD as u32 + 1);
    sys::server_signals().map_err(|e| (Step::Signals, e))?;
    sys::install_fault_handler().map_err(|e| (Step::Signals, e))?;
    // A privileged process's memlock limit does not matter (CAP_IPC_LOCK); without
    // CAP_SYS_RESOURCE a limit above the hard one cannot be set, so do not insist there.
    match sys::set_memlock_limit(cfg.rlimit_memlock) {
        Err(e) if !cfg.privileged => return Err((Step::Rlimit, e)),
        _ => {}
    }
    layout::prepare().map_err(|e| (Step::Layout, e))?;
    if !cfg.privileged {
        sys::drop_privileges(NOBODY).map_err(|e| (Step::Credentials, e))?;
    }
    Ok(())
}

/// Reads a whole request into `buf`; the first descriptor attached to it, if any, goes to
/// `passed` (others are closed). False at end of file or on an error.
fn read_request(fd: i32, buf: &mut [u8], passed: &mut i32) -> bool {
    use std::os::fd::IntoRawFd;
    let mut got = 0;
    while got < buf.len() {
        match sys::recv_with_fd(fd, &mut buf[got..]) {
            Ok((0, _)) => return false,
            Ok((n, fd)) => {
                got += n;
                if let Some(fd) = fd {
                    if *passed < 0 {
                        *passed = fd.into_raw_fd();
                    }
                }
            }
            Err(libc::EINTR) => {}
            Err(_) => return false,
        }
    }
    true
}

fn send(fd: i32, r: &Reply) -> bool {
    send_from(fd, &r.encode(), 0)
}

/// Writes `buf[put..]` completely.
fn send_from(fd: i32, buf: &[u8; REPLY_BYTES], mut put: usize) -> bool {
    while put < REPLY_BYTES {
        match sys::write(fd, &buf[put..]) {
            Ok(n) => put += n,
            Err(libc::EINTR) => {}
            Err(_) => return false,
        }
    }
    true
}

fn unit(r: Result<(), sys::Errno>) -> Reply {
    match r {
        Ok(()) => Reply::Ok(0, 0),
        Err(e) => Reply::Errno(e),
    }
}

fn value(r: Result<u64, sys::Errno>) -> Reply {
    match r {
        Ok(v) => Reply::Ok(v, 0),
        Err(e) => Reply::Errno(e),
    }
}

fn access(r: Result<(), i32>) -> Reply {
    match r {
        Ok(()) => Reply::Ok(0, 0),
        Err(sig) => Reply::Signal(sig),
    }
}

impl Server {
    fn serve(&mut self) -> ! {
        loop {
            let mut buf = [0u8; REQ_BYTES];
            if !read_request(self.conn, &mut buf, &mut self.passed) {
                self.exit();
            }
            let reply = match Request::decode(&buf) {
                Some(req) => self.handle(&req),
                None => Some(Reply::Refused(0, libc::EINVAL)),
            };
            if self.passed >= 0 {
                sys::close(self.passed);
                self.passed = -1;
            }
            if let Some(r) = reply {
                if !send(self.conn, &r) {
                    self.exit();
                }
            }
        }
    }

    /// Performs one request; `None` when there is nothing to reply (a fork's child).
    fn handle(&mut self, req: &Request) -> Option<Reply> {
        let [a, b, c, d, e] = req.args;
        Some(match req.op {
            Op::Mmap => value(sys::mmap(a, b, c as i32, d as i32)),
            Op::MmapFile if self.passed < 0 => Reply::Refused(0, libc::EBADF),
            Op::MmapFile => value(sys::mmap_fd(a, b, c as i32, d as i32, self.passed, e)),
            Op::Msync => unit(sys::msync(a, b, c as i32)),
            Op::Munmap => unit(sys::munmap(a, b)),
            Op::Mprotect => unit(sys::mprotect(a, b, c as i32)),
            Op::Mremap => value(sys::mremap(a, b, c, d as i32, e)),
            Op::Brk => Reply::Ok(sys::brk(a), 0),
            Op::Madvise => unit(sys::madvise(a, b, c as i32)),
            Op::Mlock2 => unit(sys::mlock2(a, b, c as u32)),
            Op::Munlock => unit(sys::munlock(a, b)),
            Op::Mlockall => unit(sys::mlockall(a as i32)),
            Op::Munlockall => unit(sys::munlockall()),
            Op::Pin => self.pin(a, b),
            Op::Unpin => self.unpin(a, b),
            Op::Fill => access(sys::fill(a, b, c as u8)),
            Op::Touch => access(sys::touch(a, b, c != 0)),
            Op::Check => match sys::check_bytes(a, b, c as u8) {
                Ok(None) => Reply::Ok(u64::MAX, 0),
                Ok(Some((off, v))) => Reply::Ok(off, u64::from(v)),
                Err(sig) => Reply::Signal(sig),
            },
            Op::Fork => return self.fork(),
            Op::Exit => self.exit(),
        })
    }

    fn pin(&mut self, addr: u64, len: u64) -> Reply {
        let Some(slot) = self.pins.iter_mut().find(|p| p.fd < 0) else {
            return Reply::Refused(0, libc::ENOSPC);
        };
        match sys::io_uring_pin(addr, len) {
            Ok(fd) => {
                *slot = PinSlot { addr, len, fd };
                Reply::Ok(0, 0)
            }
            Err(e) => Reply::Errno(e),
        }
    }

    fn unpin(&mut self, addr: u64, len: u64) -> Reply {
        match self
            .pins
            .iter_mut()
            .find(|p| p.fd >= 0 && p.addr == addr && p.len == len)
        {
            Some(slot) => {
                let r = sys::io_uring_unpin(slot.fd);
                *slot = FREE;
                unit(r)
            }
            None => Reply::Errno(libc::EINVAL),
        }
    }

    /// Forks; the reply (sent here, with the controller's end of the child's connection
    /// attached) is the child's pid.
    fn fork(&mut self) -> Option<Reply> {
        let (controller_end, child_end) = match sys::socketpair() {
            Ok(pair) => pair,
            Err(e) => return Some(Reply::Refused(FORK_CONNECTION, e)),
        };
        match sys::fork() {
            Ok(0) => {
                sys::close(controller_end);
                self.become_child(child_end);
                None
            }
            Ok(pid) => {
                sys::close(child_end);
                let sent = self.send_with_connection(&Reply::Ok(pid as u64, 0), controller_end);
                sys::close(controller_end);
                if !sent {
                    // The child has no controller and sees end of file; so do we.
                    self.exit();
                }
                None
            }
            Err(e) => {
                sys::close(controller_end);
                sys::close(child_end);
                Some(Reply::Errno(e))
            }
        }
    }

    /// Sends `r` with descriptor `fd` attached to its first byte.
    fn send_with_connection(&self, r: &Reply, fd: i32) -> bool {
        let buf = r.encode();
        loop {
            match sys::send_with_fd(self.conn, &buf, fd) {
                Ok(0) => return false,
                Ok(n) => return send_from(self.conn, &buf, n),
                Err(libc::EINTR) => {}
                Err(_) => return false,
            }
        }
    }

    /// In a fork's child: drop the parent's connection and pins, take `conn` as the
    /// connection, say hello.
    fn become_child(&mut self, conn: i32) {
        sys::close(self.conn);
        for p in self.pins.iter_mut().filter(|p| p.fd >= 0) {
            sys::close(p.fd);
            *p = FREE;
        }
        self.conn = conn;
        if !send(self.conn, &Reply::Ok(sys::getpid() as u64, 0)) {
            sys::exit_now(3);
        }
    }

    /// Releases the pins synchronously (a ring's teardown at exit is deferred) and exits.
    fn exit(&mut self) -> ! {
        for p in self.pins.iter().filter(|p| p.fd >= 0) {
            let _ = sys::io_uring_unpin(p.fd);
        }
        sys::exit_now(0)
    }
}
