//! Timed host operations: fork (the call only), fork+exit+wait loops, and a child kept
//! alive while the parent writes (copy-on-write).

use super::errno_text;
use oracle::sys;
use std::time::Instant;

/// A start of a timed host operation: the calling thread's CPU time (kernel and user), or
/// the wall clock where the clock cannot be read.
///
/// Why CPU time: on this 2-vCPU guest shared with other builds (load 4-5), a host `fork()`
/// of 256 MiB of 4 KiB pages read 37-69 ms of wall time over one table's repetitions, where
/// it takes 2-4 ms on an idle machine: the call was preempted. The thread's CPU time is the
/// kernel's work for the call, preemption left out, and what the cost model predicts.
#[derive(Clone, Copy, Debug)]
pub struct Stamp {
    cpu: Option<std::time::Duration>,
    wall: Instant,
}

/// The calling thread's CPU time.
fn thread_cpu() -> Option<std::time::Duration> {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Some(std::time::Duration::new(
        u64::try_from(t.tv_sec).ok()?,
        u32::try_from(t.tv_nsec).ok()?,
    ))
}

impl Stamp {
    /// Now.
    pub fn now() -> Stamp {
        Stamp {
            cpu: thread_cpu(),
            wall: Instant::now(),
        }
    }

    /// Seconds since this stamp, of CPU time where both ends could read it.
    pub fn secs(&self) -> f64 {
        match (self.cpu, thread_cpu()) {
            (Some(a), Some(b)) if std::env::var_os("USERMM_HOST_WALL").is_none() => {
                (b - a).as_secs_f64()
            }
            _ => self.wall.elapsed().as_secs_f64(),
        }
    }
}

/// Forks; the child `_exit`s at once; returns the time of the `fork` call in the parent.
pub fn fork_time() -> Result<f64, String> {
    let t = Stamp::now();
    let pid = sys::fork().map_err(|e| errno_text("fork", e))?;
    if pid == 0 {
        sys::exit_now(0);
    }
    let secs = t.secs();
    sys::wait_child(pid).map_err(|e| errno_text("waitpid", e))?;
    Ok(secs)
}

/// fork + child `_exit` + `waitpid`, repeated for `secs` seconds: (forks per second, forks).
pub fn fork_exit_rate(secs: f64) -> Result<(f64, u64), String> {
    let start = Instant::now();
    let mut n = 0u64;
    // At least one fork, even when the thread was descheduled past `secs` at once.
    while n == 0 || start.elapsed().as_secs_f64() < secs {
        let pid = sys::fork().map_err(|e| errno_text("fork", e))?;
        if pid == 0 {
            sys::exit_now(0);
        }
        sys::wait_child(pid).map_err(|e| errno_text("waitpid", e))?;
        n += 1;
    }
    Ok((n as f64 / start.elapsed().as_secs_f64(), n))
}

/// The VMAs of this process (lines of `/proc/self/maps`).
pub fn vma_count() -> u64 {
    std::fs::read_to_string("/proc/self/maps")
        .map(|t| t.lines().count() as u64)
        .unwrap_or(0)
}

/// Which side of [`fork_with_socket`] this process is.
pub enum Forked {
    /// The parent: the child's pid and our end of the socket pair.
    Parent {
        /// The child.
        pid: i32,
        /// Our end.
        fd: i32,
    },
    /// The child: its end of the socket pair (the parent's end is closed).
    Child {
        /// The child's end.
        fd: i32,
    },
}

/// Forks this process with a socket pair between parent and child; each side closes the other's
/// end. On failure nothing is left open.
pub fn fork_with_socket() -> Result<Forked, String> {
    let (ours, theirs) = sys::socketpair().map_err(|e| errno_text("socketpair", e))?;
    match sys::fork() {
        Ok(0) => {
            sys::close(ours);
            Ok(Forked::Child { fd: theirs })
        }
        Ok(pid) => {
            sys::close(theirs);
            Ok(Forked::Parent { pid, fd: ours })
        }
        Err(e) => {
            sys::close(ours);
            sys::close(theirs);
            Err(errno_text("fork", e))
        }
    }
}

/// A forked child that stays alive (blocked reading a socket) until dropped.
pub struct LiveChild {
    pid: i32,
    fd: i32,
}

impl LiveChild {
    /// Forks the child.
    pub fn fork() -> Result<LiveChild, String> {
        match fork_with_socket()? {
            Forked::Child { fd } => {
                let mut b = [0u8; 1];
                let _ = sys::read(fd, &mut b);
                sys::exit_now(0)
            }
            Forked::Parent { pid, fd } => Ok(LiveChild { pid, fd }),
        }
    }
}

impl Drop for LiveChild {
    fn drop(&mut self) {
        sys::close(self.fd);
        let _ = sys::wait_child(self.pid);
    }
}

/// Times `f`.
pub fn timed(f: impl FnOnce() -> Result<(), String>) -> Result<f64, String> {
    let t = Stamp::now();
    f()?;
    Ok(t.secs())
}
