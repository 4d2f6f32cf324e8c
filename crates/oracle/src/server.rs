//! A host server: one real process of the scenario, driven by the controller.
//!
//! A server is the *host agent* (`csrc/host_agent.c`): a small statically linked C program
//! the controller executes from an in-memory file (`memfd_create`, then `execveat` of the
//! descriptor, so no path on disk is involved that another user could plant or replace). It
//! sets itself up, says hello (its pid, or the step that failed and the errno) and performs
//! each request of [`crate::proto`] (a system call or a memory access in its own address
//! space) until end of file or an exit request.
//!
//! Why a program of its own and not a fork of the controller: a fork would start every
//! scenario process with the controller's 9 MB of text, its libraries, heap and thread
//! stacks. The engine's processes start empty, and the kernel counts a process's whole
//! address space in places a scenario observes: `mlockall(MCL_CURRENT)` compares `total_vm`
//! with RLIMIT_MEMLOCK, so an ordinary process that mapped a few MiB and locked everything
//! got ENOMEM on the host where the engine (and a minimal C program) succeeded; a fork of a
//! server copied the controller's heap too. The agent holds its program (about 0.7 MB of
//! static text), its stack, the vDSO and the fences below.
//!
//! Setup, in this order (each a [`Step`] of a refused hello):
//! - join the scenario's memory cgroup (its `cgroup.procs`, opened by the controller);
//! - move the connection to descriptor 3 and close every other descriptor;
//! - default stop signals, SIGCHLD and SIGPIPE ignored (a dead controller is seen as EPIPE),
//!   the fault handler of the memory accessors (`csrc/access.c`);
//! - RLIMIT_MEMLOCK as the scenario set it;
//! - the heap moved to the engine's heap start (`prctl(PR_SET_MM_MAP)`), so a scenario's
//!   `brk` grows a heap of its own at the engine's address (the agent runs without address
//!   randomisation, as the engine's processes do, so the static program's own small heap,
//!   which the kernel places at `ELF_ET_DYN_BASE`, is always 10 MiB below it); then *fences*: every hole a
//!   top-down search could choose above the first [`FENCE_ALIGN`] boundary below the
//!   program's mappings is filled with a PROT_NONE shared anonymous mapping (one that never
//!   merges with anything), so the scenario's first `mmap` ends at that boundary, as the
//!   engine's ends at its aligned `mmap_base`;
//! - credentials dropped to nobody unless the process was spawned privileged.
//!
//! A `fork` request makes a socket pair *before* forking: the child keeps one end as its
//! connection, and the parent sends the other end to the controller attached (SCM_RIGHTS)
//! to its reply. No socket is ever listening, so no other local user can connect to the
//! controller, stall it or forge a server's answers (see [`crate::host`]). An `mmap` of a
//! file comes with the controller's descriptor of it attached: a server may run as nobody
//! and could not open the file, and the file has no name anyway. The agent never allocates
//! after its start, so it never creates or grows a mapping of its own while it serves.

use crate::proto::{Reply, REPLY_BYTES};
use crate::sys;
use std::ffi::CString;
use std::sync::OnceLock;

/// The user and group ordinary servers run as (nobody).
const NOBODY: u32 = 65534;
/// The refusal code of a fork whose connection could not be made or handed over.
pub const FORK_CONNECTION: u64 = 6;
/// The boundary a server's fences end at, and so the alignment of the end of a scenario's
/// first mapping: the PMD size, the largest folio an anonymous or shmem mapping gets, so
/// every THP alignment decision the kernel makes about scenario mappings is the one the
/// engine makes below its aligned `mmap_base`. (A larger boundary would cost fence space,
/// and fences count in `total_vm`: 1 GiB ones made every unprivileged `mlockall` ENOMEM.)
pub const FENCE_ALIGN: u64 = 2 << 20;

/// The agent program (`csrc/host_agent.c`, built by `build.rs`).
const AGENT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/host_agent"));

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
    /// Executing the agent (in the controller's child).
    Exec = 7,
    /// The agent's arguments.
    Arguments = 8,
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
            7 => "executing the host agent (execveat of its in-memory file)",
            8 => "reading the host agent's arguments",
            _ => "an unknown step",
        }
    }
}

/// How a spawned server sets itself up.
#[derive(Clone, Copy, Debug)]
pub struct SpawnConfig {
    /// The server's end of its connection.
    pub conn: i32,
    /// Keep root's capabilities.
    pub privileged: bool,
    /// RLIMIT_MEMLOCK (`None`: unlimited).
    pub rlimit_memlock: Option<u64>,
    /// The scenario cgroup's `cgroup.procs`, open for writing (-1: none): the server joins
    /// the cgroup first, so everything it charges afterwards is the cgroup's.
    pub cgroup_procs: i32,
}

/// The agent's in-memory file, made once per controller.
fn agent_image() -> Result<&'static std::fs::File, String> {
    static IMAGE: OnceLock<Result<std::fs::File, sys::Errno>> = OnceLock::new();
    IMAGE
        .get_or_init(|| sys::memfd_with(c"usermm-host-agent", AGENT))
        .as_ref()
        .map_err(|e| format!("memfd_create for the host agent: errno {e}"))
}

/// Starts a server: forks, and executes the agent in the child with `cfg`. Returns the
/// child's pid; its hello (or the refusal of the step that failed, [`Step::Exec`] when the
/// agent could not be executed) arrives on the controller's end of `cfg.conn`.
pub fn spawn(cfg: &SpawnConfig) -> Result<i32, String> {
    use std::os::fd::AsRawFd;
    let image = agent_image()?.as_raw_fd();
    let arg = |s: String| CString::new(s).map_err(|e| e.to_string());
    let argv = [
        arg("usermm-host-agent".into())?,
        arg(cfg.conn.to_string())?,
        arg(cfg.cgroup_procs.to_string())?,
        arg(u8::from(cfg.privileged).to_string())?,
        arg(cfg
            .rlimit_memlock
            .map_or_else(|| "inf".to_string(), |v| v.to_string()))?,
        arg(usermm::machine::START_BRK.to_string())?,
        arg(FENCE_ALIGN.to_string())?,
    ];
    let keep = [cfg.conn, cfg.cgroup_procs];
    let conn = cfg.conn;
    sys::fork_exec_fd_no_aslr(image, &argv, &keep, move |e| {
        let hello: [u8; REPLY_BYTES] = Reply::Refused(Step::Exec as u64, e).encode();
        let _ = sys::write(conn, &hello);
    })
    .map_err(|e| format!("fork: errno {e}"))
}
