//! The host kernel as a scenario [`Backend`]: every scenario process is a real process.
//!
//! The controller (this process) starts one server (the host agent, [`crate::server`]) per
//! `spawn` and sends it requests over a socket pair. A server's `fork` makes a child server
//! whose connection is a socket pair the parent server creates before forking: it sends the
//! controller's end back attached (SCM_RIGHTS) to its reply. The controller listens on no socket, so no other local user
//! can reach it: an earlier design had children connect back to a listening abstract Unix
//! address, where any user could connect first, stall the root controller or forge a
//! server's answers. The controller still checks each passed connection ([`check_peer`]):
//! its peer must be the forking server (pid and user), and the child's hello must name the
//! pid the fork reply announced. Observables come from `/proc`
//! (read by the controller as root), with the per-CPU LRU and mlock batches drained first.
//! Requests whose range overlaps a server's own mappings (its program, libraries, stack,
//! fences) are refused as unsupported: performing them would break the server, not test the
//! kernel.
//!
//! Files (v2) belong to the controller: it creates them, unnamed, in private scratch
//! directories ([`crate::files`]), keeps their descriptors, and performs `pwrite`, `pread`,
//! `ftruncate`, `fallocate`, `fsync` and `fincore` itself (the page cache is shared, so
//! which process makes those calls changes nothing a scenario observes). An `mmap` of a file
//! passes the descriptor to the server with the request; `msync` runs in the server.

use crate::files::{self, ScratchDir};
use crate::hostres::Machine;
use crate::knobs::ThpKnobs;
use crate::proto::{Op, Reply, Request, REPLY_BYTES};
use crate::server::{self, SpawnConfig, Step};
use crate::{procfs, sys};
use scenario::backend::{
    Backend, Fail, FileId, LockOp, MmapReq, MremapOpts, PageView, Place, ProcId, Res, StatusView,
    VmaKind, VmaView,
};
use scenario::{
    Advice, Errno, FileKind, KpageFlag, MlockallFlags, MsyncMode, Outcome, Prot, Setting, Sharing,
    ShmemSetting, Signal, ThpSetting,
};
use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// How long a server may take to answer one request.
const REPLY_TIMEOUT: Duration = Duration::from_secs(600);
/// How often a wait for a server looks at the stop flag.
const POLL: Duration = Duration::from_millis(200);

/// io_uring's largest registered buffer (`io_buffer_validate`).
const PIN_MAX_LEN: u64 = 1 << 30;

/// End of the x86-64 user address space (4-level page tables).
const TASK_SIZE: u64 = 0x7fff_ffff_f000;

/// Reads of a page's kpageflags while they show `PG_locked`, [`LOCK_SETTLE_PAUSE`] apart,
/// before the lock counts as held (see [`HostBackend::frame`]): 50 ms in all.
const LOCK_SETTLE_READS: usize = 50;
/// The pause between those reads.
const LOCK_SETTLE_PAUSE: Duration = Duration::from_millis(1);

/// One server process.
#[derive(Debug)]
struct Server {
    pid: i32,
    /// The user it runs as (a forked child's is its parent's).
    uid: u32,
    conn: UnixStream,
    /// The server's own mappings (and fences), which the scenario must not touch.
    own: Vec<(u64, u64)>,
    pagemap: Option<File>,
    /// A direct child of the controller (reaped by it).
    spawned: bool,
}

/// Checks the file system of a new scratch directory.
type FsCheck = fn(&ScratchDir) -> Result<(), String>;

/// Bytes a `pwrite` or a file's fill writes per system call.
const WRITE_CHUNK: usize = 1 << 20;

/// A scenario file: the controller's read-write descriptor of an unnamed file.
#[derive(Debug)]
struct HostFile {
    file: File,
    kind: FileKind,
}

/// Runs scenario statements in real processes on the host kernel.
#[derive(Debug)]
pub struct HostBackend<'k> {
    knobs: &'k ThpKnobs,
    servers: HashMap<ProcId, Server>,
    /// The scenario's files, by id (dropped before the directories below).
    files: Vec<HostFile>,
    /// The private directories the files were created in (made on first use).
    tmpfs_dir: Option<ScratchDir>,
    disk_dir: Option<ScratchDir>,
    kpageflags: Result<File, String>,
    /// Requests were sent since the last drain of the per-CPU batches.
    undrained: bool,
    /// [`Backend::page`] reads kpageflags and the folio order too (not for `expect pagemap`,
    /// which must not depend on /proc/kpageflags being readable).
    page_frames: bool,
    /// `set memory`, `set swap`: the file's memory cgroup and swap file.
    machine: Machine,
}

/// The longest a statement waits for the machine's writeback to finish. One second was
/// too short under a loaded CI run on the v782 guest: `swap-mprotect-swapin.scn` saw its
/// 64 KiB still under writeback over the next ten statements (and the swapped-in page kept
/// in the swap cache, clean, as a folio under writeback must be), where other runs of the
/// same commit agreed. The wait ends as soon as writeback does.
const WRITEBACK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Waits (at most [`WRITEBACK_WAIT`]) until no page is under writeback machine-wide
/// (`nr_writeback` of /proc/vmstat), after a statement that may have started swap or file
/// writeback (`pageout`, `reclaim`). The engine's writes complete in the call. On the host a
/// folio still under writeback when its process exits or unmaps it keeps its swap slot (the
/// swap cache cannot drop a folio being written), so a later pageout may find too few free
/// slots: the likely cause of `swap-exit-frees-slots.scn` keeping the last 3 to 5 pages of
/// its second range resident in some runs on 6.18 (2 of 3 reruns when that range was 3M,
/// once in CI at 2M), and of the same in `swap-munmap-frees-slots.scn`.
fn settle_writeback() {
    let t0 = std::time::Instant::now();
    while t0.elapsed() < WRITEBACK_WAIT {
        if crate::procfs::vmstat("nr_writeback").unwrap_or(0) == 0 {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

fn unsupported(m: impl Into<String>) -> Fail {
    Fail::Unsupported(m.into())
}

fn errno_fail(e: i32) -> Fail {
    match Errno::from_number(e) {
        Some(x) => Fail::Outcome(Outcome::Errno(x)),
        None => unsupported(format!(
            "the host returned errno {e}, which scenarios cannot name"
        )),
    }
}

fn signal_fail(s: i32) -> Fail {
    match s {
        libc::SIGSEGV => Fail::Outcome(Outcome::Signal(Signal::Sigsegv)),
        libc::SIGBUS => Fail::Outcome(Outcome::Signal(Signal::Sigbus)),
        _ => unsupported(format!("the access raised signal {s}")),
    }
}

fn own_ranges(pid: i32) -> Res<Vec<(u64, u64)>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .map_err(|e| unsupported(format!("/proc/{pid}/maps unreadable: {e}")))?;
    Ok(procfs::parse_smaps(&text)
        .into_iter()
        .map(|v| (v.start, v.end))
        .collect())
}

impl<'k> HostBackend<'k> {
    /// A backend with no processes; `knobs` is where `set thp` goes.
    pub fn new(knobs: &'k ThpKnobs) -> io::Result<HostBackend<'k>> {
        let kpageflags =
            File::open("/proc/kpageflags").map_err(|e| format!("/proc/kpageflags unreadable: {e}"));
        Ok(HostBackend {
            knobs,
            servers: HashMap::new(),
            files: Vec::new(),
            tmpfs_dir: None,
            disk_dir: None,
            kpageflags,
            undrained: true,
            page_frames: true,
            machine: Machine::default(),
        })
    }

    fn server(&mut self, p: ProcId) -> Res<&mut Server> {
        self.servers
            .get_mut(&p)
            .ok_or_else(|| unsupported(format!("host process {p} is not running")))
    }

    /// Refuses a range that overlaps the server's own mappings.
    ///
    /// A range that wraps past the top of the address space needs no guard: the kernel
    /// refuses such a system call before it looks at any mapping, and the accessors of
    /// `csrc/access.c` report SIGSEGV for it without touching memory (as the engine does).
    fn guard(&self, p: ProcId, addr: u64, len: u64) -> Res<()> {
        let Some(end) = addr.checked_add(len.max(1)) else {
            return Ok(());
        };
        let Some(s) = self.servers.get(&p) else {
            return Ok(());
        };
        match s.own.iter().find(|&&(a, b)| a < end && addr < b) {
            Some(&(a, b)) => Err(unsupported(format!(
                "{addr:#x}..{end:#x} overlaps the oracle server's own mapping {a:#x}-{b:#x} \
                 on the host; choose another address"
            ))),
            None => Ok(()),
        }
    }

    /// [`Self::guard`] for calls that the kernel refuses outright when the range ends
    /// beyond the user address space (mmap, mremap, munmap): those need no guard.
    fn guard_mapping(&self, p: ProcId, addr: u64, len: u64) -> Res<()> {
        match addr.checked_add(len) {
            Some(end) if end <= TASK_SIZE => self.guard(p, addr, len),
            _ => Ok(()),
        }
    }

    fn call(&mut self, p: ProcId, op: Op, args: &[u64]) -> Res<(u64, u64)> {
        self.call_fd(p, op, args, None).map(|(r, _)| r)
    }

    /// [`Self::call`] with descriptor `pass` attached to the request (SCM_RIGHTS), also
    /// returning a descriptor the server attached to its reply.
    fn call_fd(
        &mut self,
        p: ProcId,
        op: Op,
        args: &[u64],
        pass: Option<RawFd>,
    ) -> Res<((u64, u64), Option<OwnedFd>)> {
        if sys::stop_requested() {
            return Err(unsupported("interrupted"));
        }
        self.undrained = true;
        let s = self.server(p)?;
        let req = Request::new(op, args).encode();
        let io = |e: io::Error| unsupported(format!("host process {p}: {e}"));
        let mut sent = 0;
        if let Some(fd) = pass {
            sent = loop {
                match sys::send_with_fd(s.conn.as_raw_fd(), &req, fd) {
                    Ok(n) => break n,
                    Err(libc::EINTR) => {}
                    Err(e) => return Err(io(io::Error::from_raw_os_error(e))),
                }
            };
        }
        s.conn.write_all(&req[sent..]).map_err(io)?;
        let (reply, fd) = read_reply_fd(&mut s.conn)?;
        match reply {
            Reply::Ok(a, b) => Ok(((a, b), fd)),
            Reply::Errno(e) => Err(errno_fail(e)),
            Reply::Signal(sig) => Err(signal_fail(sig)),
            Reply::Refused(c, e) => Err(unsupported(format!(
                "host process {p} refused {op:?} (code {c}, errno {e})"
            ))),
        }
    }

    fn unit(&mut self, p: ProcId, op: Op, args: &[u64]) -> Res<()> {
        self.call(p, op, args).map(|_| ())
    }

    /// Takes the connection of the child `child` that server `parent` forked and passed
    /// back: its peer must be the parent (pid and user), and the child's hello its pid.
    fn adopt_child(&mut self, parent: ProcId, child: i32, fd: OwnedFd) -> Res<UnixStream> {
        let (ppid, uid) = {
            let s = self.server(parent)?;
            (s.pid, s.uid)
        };
        check_peer(&fd, ppid, uid).map_err(|m| {
            unsupported(format!(
                "forked host process {child}: connection refused: {m}"
            ))
        })?;
        let mut conn = UnixStream::from(fd);
        conn.set_read_timeout(Some(POLL))
            .map_err(|e| unsupported(e.to_string()))?;
        match read_reply(&mut conn)? {
            Reply::Ok(got, _) if got == child as u64 => Ok(conn),
            other => Err(unsupported(format!(
                "forked host process {child} said {other:?}"
            ))),
        }
    }

    fn add_server(&mut self, pid: i32, uid: u32, conn: UnixStream, spawned: bool) -> Res<ProcId> {
        let pagemap = File::open(format!("/proc/{pid}/pagemap")).ok();
        let own = own_ranges(pid)?;
        self.servers.insert(
            pid as ProcId,
            Server {
                pid,
                uid,
                conn,
                own,
                pagemap,
                spawned,
            },
        );
        Ok(pid as ProcId)
    }

    /// The server's own mapping that `[start, end)` overlaps, if any: a scenario VMA that
    /// merged with one would make the comparison meaningless.
    pub fn own_overlap(&self, p: ProcId, start: u64, end: u64) -> Option<(u64, u64)> {
        let s = self.servers.get(&p)?;
        s.own.iter().copied().find(|&(a, b)| a < end && start < b)
    }

    fn kpf(&self) -> Res<&File> {
        self.kpageflags.as_ref().map_err(|e| unsupported(e.clone()))
    }

    /// Drains the per-CPU LRU and mlock batches if anything ran since the last drain.
    fn drain(&mut self) {
        if self.undrained {
            sys::drain_lru_batches();
            self.undrained = false;
        }
    }

    /// The file's machine: its memory cgroup and swap file, once made.
    pub fn machine(&self) -> &Machine {
        &self.machine
    }

    /// Runs the servers in a memory cgroup even without `set memory` (the file has
    /// `reclaim` statements, which reclaim from it).
    pub fn set_confine(&mut self, on: bool) {
        self.machine.set_confine(on);
    }

    /// Before a new server: the cgroup made or its limit raised for one more.
    fn grow_machine(&mut self) -> Res<Option<i32>> {
        let n = self.servers.len() as u64 + 1;
        self.machine
            .before_new_server(self.knobs, n)
            .map_err(|m| unsupported(format!("set memory: {m}")))
    }

    /// Whether [`Backend::page`] also reads kpageflags and the folio order.
    pub fn set_page_frames(&mut self, on: bool) {
        self.page_frames = on;
    }

    /// The open `/proc/PID/pagemap` of `p`, after draining the per-CPU batches.
    fn pagemap_file(&mut self, p: ProcId) -> Res<&File> {
        self.drain();
        let s = self.server(p)?;
        s.pagemap
            .as_ref()
            .ok_or_else(|| unsupported(format!("/proc/{p}/pagemap unreadable")))
    }

    /// The raw pagemap entries of `count` pages from `addr`.
    pub fn pagemap_range(&mut self, p: ProcId, addr: u64, count: usize) -> Res<Vec<u64>> {
        let f = self.pagemap_file(p)?;
        procfs::pagemap(f, addr >> 12, count)
            .map_err(|e| unsupported(format!("/proc/{p}/pagemap unreadable: {e}")))
    }

    /// The pagemap entries of the pages of `[start, end)` that have a bit of `mask` set, as
    /// `(address, entry)` in address order. The file is read a bounded chunk at a time, so
    /// memory follows the pages shown, not the size of the range.
    pub fn pagemap_entries(
        &mut self,
        p: ProcId,
        start: u64,
        end: u64,
        mask: u64,
    ) -> Res<Vec<(u64, u64)>> {
        let f = self.pagemap_file(p)?;
        let mut out = Vec::new();
        let count = end.saturating_sub(start) >> 12;
        procfs::scan_pagemap(f, start >> 12, count, |vpn, e| {
            if e & mask != 0 {
                out.push((vpn << 12, e));
            }
        })
        .map_err(|e| unsupported(format!("/proc/{p}/pagemap unreadable: {e}")))?;
        Ok(out)
    }

    /// kpageflags and folio order of the frame a pagemap entry names (`None` if absent).
    pub fn frame(&self, entry: u64) -> Res<(Option<u64>, Option<u32>)> {
        let pfn = entry & procfs::PM_PFN;
        if entry & procfs::PM_PRESENT == 0 {
            return Ok((None, None));
        }
        if pfn == 0 {
            return Err(unsupported("pagemap shows no PFNs (not root?)"));
        }
        let f = self.kpf()?;
        let unreadable = |e: io::Error| unsupported(format!("/proc/kpageflags unreadable: {e}"));
        let mut flags = procfs::kpageflags(f, pfn).map_err(unreadable)?;
        // At a statement boundary no scenario process holds a folio lock, but the host's
        // own agents take it for microseconds (reclaim's and khugepaged's trylocks,
        // compaction, a readahead read in flight): CI once read a shared-anon PMD folio
        // locked while other oracle tests pressed on memory, and never again in six reruns.
        // The settled state is the observable; a lock still held after the bound compares.
        for _ in 0..LOCK_SETTLE_READS {
            if flags & KpageFlag::Locked.mask() == 0 {
                break;
            }
            std::thread::sleep(LOCK_SETTLE_PAUSE);
            flags = procfs::kpageflags(f, pfn).map_err(unreadable)?;
        }
        let order = procfs::folio_order(f, pfn, flags).map_err(unreadable)?;
        Ok((Some(flags), Some(order)))
    }

    fn mmap_flags(r: &MmapReq) -> i32 {
        let anon = if r.file.is_none() {
            libc::MAP_ANONYMOUS
        } else {
            0
        };
        let mut f = anon
            | match r.sharing {
                Sharing::Private => libc::MAP_PRIVATE,
                Sharing::Shared => libc::MAP_SHARED,
            };
        for (on, bit) in [
            (r.populate, libc::MAP_POPULATE),
            (r.locked, libc::MAP_LOCKED),
            (r.noreserve, libc::MAP_NORESERVE),
        ] {
            if on {
                f |= bit;
            }
        }
        f | match r.place {
            Place::Fixed(_) => libc::MAP_FIXED,
            Place::FixedNoreplace(_) => libc::MAP_FIXED_NOREPLACE,
            Place::Anywhere | Place::Hint(_) => 0,
        }
    }
}

impl HostBackend<'_> {
    /// The scratch directory of `kind`, made (and its file system checked) on first use.
    fn scratch(&mut self, kind: FileKind) -> Res<&ScratchDir> {
        let (slot, parent, check): (_, _, FsCheck) = match kind {
            FileKind::Tmpfs => (
                &mut self.tmpfs_dir,
                files::TMPFS_PARENT,
                files::check_tmpfs_never,
            ),
            FileKind::Disk => (&mut self.disk_dir, files::DISK_PARENT, files::check_ext4),
        };
        if slot.is_none() {
            let d = ScratchDir::create(Path::new(parent))
                .map_err(|m| unsupported(format!("files: {m}")))?;
            check(&d).map_err(|m| unsupported(format!("files: {m}")))?;
            *slot = Some(d);
        }
        slot.as_ref()
            .ok_or_else(|| unsupported("files: no scratch directory"))
    }

    /// Whether `bytes` more may be written to a file of `kind` ([`files::check_room`]).
    fn check_room(&mut self, kind: FileKind, bytes: u64) -> Res<()> {
        let dir = self.scratch(kind)?;
        files::check_room(dir, bytes, kind == FileKind::Tmpfs)
            .map_err(|m| unsupported(format!("files: {m}")))
    }

    /// The descriptor of file `f`, after checking that process `p` runs (the statement is
    /// that process's system call).
    fn file_fd(&mut self, p: ProcId, f: FileId) -> Res<RawFd> {
        self.server(p)?;
        self.undrained = true;
        self.files
            .get(f as usize)
            .map(|h| h.file.as_raw_fd())
            .ok_or_else(|| unsupported(format!("host file {f} does not exist")))
    }

    /// What the smaps name column `name` maps.
    fn vma_kind(&self, name: &str) -> VmaKind {
        let holds = |d: &Option<ScratchDir>| d.as_ref().is_some_and(|d| d.holds(name));
        if name == "/dev/zero (deleted)" {
            VmaKind::SharedAnon
        } else if holds(&self.tmpfs_dir) {
            VmaKind::TmpfsFile
        } else if holds(&self.disk_dir) {
            VmaKind::DiskFile
        } else {
            VmaKind::Anon
        }
    }
}

/// Writes `len` bytes of `byte` at `offset` of `fd`, a chunk per `pwrite`; the errno of
/// the first failing call.
fn fill_file(fd: RawFd, offset: u64, len: u64, byte: u8) -> Result<(), sys::Errno> {
    let buf = vec![byte; (len.min(WRITE_CHUNK as u64)) as usize];
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(buf.len() as u64) as usize;
        match sys::pwrite(fd, &buf[..n], offset.wrapping_add(done)) {
            Ok(0) => return Err(libc::EIO),
            Ok(w) => done += w as u64,
            Err(libc::EINTR) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Why a wait for a server ended early.
fn wait_error(e: &io::Error, since: Instant) -> Option<Fail> {
    let waiting = matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    );
    if !waiting {
        return Some(unsupported(format!("host process: {e}")));
    }
    if sys::stop_requested() {
        return Some(unsupported("interrupted"));
    }
    (since.elapsed() > REPLY_TIMEOUT).then(|| unsupported("a host process did not answer"))
}

fn read_reply(conn: &mut UnixStream) -> Res<Reply> {
    read_reply_fd(conn).map(|(r, _)| r)
}

/// Reads one reply and the first descriptor attached to it, if any (any other is closed:
/// only a fork reply carries one).
fn read_reply_fd(conn: &mut UnixStream) -> Res<(Reply, Option<OwnedFd>)> {
    let since = Instant::now();
    let mut buf = [0u8; REPLY_BYTES];
    let mut got = 0;
    let mut fd = None;
    while got < REPLY_BYTES {
        match sys::recv_with_fd(conn.as_raw_fd(), &mut buf[got..]) {
            Ok((0, _)) => return Err(unsupported("the host process died")),
            Ok((n, passed)) => {
                got += n;
                if fd.is_none() {
                    fd = passed;
                }
            }
            Err(e) => {
                if let Some(f) = wait_error(&io::Error::from_raw_os_error(e), since) {
                    return Err(f);
                }
            }
        }
    }
    let reply =
        Reply::decode(&buf).ok_or_else(|| unsupported("garbled reply from a host process"))?;
    Ok((reply, fd))
}

/// Whether the Unix socket `conn` is connected to (or, for a socket pair, was created by)
/// process `pid` running as user `uid` (`SO_PEERCRED`); why not, if it is not.
pub fn check_peer(conn: &impl AsRawFd, pid: i32, uid: u32) -> Result<(), String> {
    let (peer_pid, peer_uid, _) =
        sys::peer_cred(conn.as_raw_fd()).map_err(|e| format!("SO_PEERCRED failed: errno {e}"))?;
    if peer_pid != pid || peer_uid != uid {
        return Err(format!(
            "its peer is pid {peer_pid} uid {peer_uid}, expected pid {pid} uid {uid}"
        ));
    }
    Ok(())
}

fn wait_eof(conn: &mut UnixStream) {
    let since = Instant::now();
    let mut b = [0u8; 64];
    loop {
        match conn.read(&mut b) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if wait_error(&e, since).is_some() => return,
            Err(_) => {}
        }
    }
}

impl Drop for HostBackend<'_> {
    fn drop(&mut self) {
        for s in self.servers.values() {
            sys::kill(s.pid);
        }
        for s in self.servers.values_mut() {
            wait_eof(&mut s.conn);
            if s.spawned {
                for _ in 0..1000 {
                    if sys::reap(s.pid) {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
        // The servers are gone: the cgroup can go, then the swap.
        self.machine.teardown(self.knobs);
    }
}

fn lock_flags(op: LockOp) -> (Op, u64) {
    match op {
        LockOp::Mlock => (Op::Mlock2, 0),
        LockOp::Mlock2Onfault => (Op::Mlock2, libc::MLOCK_ONFAULT as u64),
        LockOp::Munlock => (Op::Munlock, 0),
    }
}

impl Backend for HostBackend<'_> {
    fn name(&self) -> &'static str {
        "host"
    }

    fn on_cpu(&mut self, p: ProcId, cpu: u32) -> Res<()> {
        // One sched_setaffinity per statement: cheaper than tracking where each server is.
        let pid = self.server(p)?.pid;
        sys::pin_to_cpu(pid, cpu)
            .map_err(|e| unsupported(format!("cannot pin to host cpu{cpu} (errno {e})")))
    }

    fn set_thp(&mut self, settings: &[ThpSetting]) -> Res<()> {
        self.knobs
            .apply(settings)
            .map_err(|e| unsupported(e.to_string()))
    }

    fn set_engine(&mut self, setting: &Setting) -> Res<()> {
        match setting {
            Setting::Tunable { name, value } if name == "thp_use_zero_page" => self
                .knobs
                .set_use_zero_page(value == "true")
                .map_err(|e| unsupported(e.to_string())),
            Setting::Memory(bytes) => {
                self.machine.set_memory(*bytes);
                Ok(())
            }
            Setting::Swap(bytes, _) => self
                .machine
                .set_swap(self.knobs, *bytes)
                .map_err(|m| unsupported(format!("set swap: {m}"))),
            _ => Ok(()),
        }
    }

    fn set_mempolicy(&mut self, _interleave: bool) -> Res<()> {
        Ok(())
    }

    fn spawn(&mut self, privileged: bool, rlimit_memlock: Option<u64>) -> Res<ProcId> {
        let cgroup_procs = self.grow_machine()?.unwrap_or(-1);
        let (ours, theirs) = UnixStream::pair().map_err(|e| unsupported(e.to_string()))?;
        let cfg = SpawnConfig {
            conn: theirs.as_raw_fd(),
            privileged,
            rlimit_memlock,
            cgroup_procs,
        };
        let pid = server::spawn(&cfg).map_err(unsupported)?;
        drop(theirs);
        let mut conn = ours;
        conn.set_read_timeout(Some(POLL))
            .map_err(|e| unsupported(e.to_string()))?;
        match read_reply(&mut conn) {
            Ok(Reply::Ok(..)) => self.add_server(pid, server::server_uid(privileged), conn, true),
            Ok(Reply::Refused(step, e)) => {
                sys::reap(pid);
                Err(unsupported(format!(
                    "host server setup failed {}: errno {e}",
                    Step::describe(step)
                )))
            }
            Ok(other) => Err(unsupported(format!("host server said {other:?}"))),
            Err(f) => Err(f),
        }
    }

    fn fork(&mut self, p: ProcId) -> Res<ProcId> {
        self.server(p)?;
        self.grow_machine()?;
        let ((child, _), fd) = self.call_fd(p, Op::Fork, &[], None)?;
        let child = child as i32;
        let fd = fd.ok_or_else(|| {
            unsupported(format!(
                "host process {p} forked {child} but passed no connection"
            ))
        })?;
        let conn = self.adopt_child(p, child, fd)?;
        let (own, uid) = {
            let s = self.server(p)?;
            (s.own.clone(), s.uid)
        };
        let id = self.add_server(child, uid, conn, false)?;
        if let Some(s) = self.servers.get_mut(&id) {
            s.own = own;
        }
        Ok(id)
    }

    fn exit(&mut self, p: ProcId) -> Res<()> {
        self.undrained = true;
        let mut s = self
            .servers
            .remove(&p)
            .ok_or_else(|| unsupported(format!("host process {p} is not running")))?;
        let req = Request::new(Op::Exit, &[]).encode();
        s.conn
            .write_all(&req)
            .map_err(|e| unsupported(format!("host process {p}: {e}")))?;
        wait_eof(&mut s.conn);
        if s.spawned {
            while !sys::reap(s.pid) {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        let n = self.servers.len() as u64;
        self.machine
            .after_exit(n)
            .map_err(|m| unsupported(format!("set memory: {m}")))
    }

    fn mmap(&mut self, p: ProcId, req: &MmapReq) -> Res<u64> {
        let addr = match req.place {
            Place::Anywhere => 0,
            Place::Hint(a) => a,
            Place::Fixed(a) | Place::FixedNoreplace(a) => {
                self.guard_mapping(p, a, req.len)?;
                a
            }
        };
        let flags = Self::mmap_flags(req) as u64;
        let prot = u64::from(req.prot.bits());
        match req.file {
            None => self
                .call(p, Op::Mmap, &[addr, req.len, prot, flags])
                .map(|r| r.0),
            Some((f, offset)) => {
                let fd = self.file_fd(p, f)?;
                let args = [addr, req.len, prot, flags, offset];
                self.call_fd(p, Op::MmapFile, &args, Some(fd))
                    .map(|(r, _)| r.0)
            }
        }
    }

    fn reclaim(&mut self, p: ProcId, len: u64) -> Res<()> {
        self.server(p)?;
        self.undrained = true;
        let n = self.servers.len() as u64;
        let r = self.machine.reclaim(len, n).map_err(unsupported);
        settle_writeback();
        r
    }

    fn munmap(&mut self, p: ProcId, addr: u64, len: u64) -> Res<()> {
        self.guard_mapping(p, addr, len)?;
        self.unit(p, Op::Munmap, &[addr, len])
    }

    fn mprotect(&mut self, p: ProcId, addr: u64, len: u64, prot: Prot) -> Res<()> {
        self.guard(p, addr, len)?;
        self.unit(p, Op::Mprotect, &[addr, len, u64::from(prot.bits())])
    }

    fn mremap(&mut self, p: ProcId, addr: u64, old: u64, new: u64, o: MremapOpts) -> Res<u64> {
        self.guard_mapping(p, addr, old)?;
        let mut flags = if o.maymove { libc::MREMAP_MAYMOVE } else { 0 };
        if o.dontunmap {
            flags |= libc::MREMAP_DONTUNMAP;
        }
        if let Some(f) = o.fixed {
            self.guard_mapping(p, f, new)?;
            flags |= libc::MREMAP_FIXED;
        }
        let args = [addr, old, new, flags as u64, o.fixed.unwrap_or(0)];
        self.call(p, Op::Mremap, &args).map(|r| r.0)
    }

    fn brk(&mut self, p: ProcId, new: u64) -> Res<u64> {
        self.call(p, Op::Brk, &[new]).map(|r| r.0)
    }

    fn madvise(&mut self, p: ProcId, addr: u64, len: u64, advice: Advice) -> Res<()> {
        self.guard(p, addr, len)?;
        let r = self.unit(p, Op::Madvise, &[addr, len, advice.number() as u64]);
        if advice == Advice::Pageout {
            settle_writeback();
        }
        r
    }

    fn mlock(&mut self, p: ProcId, addr: u64, len: u64, op: LockOp) -> Res<()> {
        self.guard(p, addr, len)?;
        let (code, flags) = lock_flags(op);
        self.unit(p, code, &[addr, len, flags])
    }

    fn mlockall(&mut self, p: ProcId, flags: MlockallFlags) -> Res<()> {
        self.unit(p, Op::Mlockall, &[u64::from(flags.bits())])
    }

    fn munlockall(&mut self, p: ProcId) -> Res<()> {
        self.unit(p, Op::Munlockall, &[])
    }

    fn pin(&mut self, p: ProcId, addr: u64, len: u64) -> Res<()> {
        // io_uring refuses a null address, an empty or over-1-GiB buffer before it looks at
        // any page, so such a pin cannot reach the server's own memory.
        if addr != 0 && len != 0 && len <= PIN_MAX_LEN {
            self.guard(p, addr, len)?;
        }
        self.unit(p, Op::Pin, &[addr, len])
    }

    fn unpin(&mut self, p: ProcId, addr: u64, len: u64) -> Res<()> {
        self.unit(p, Op::Unpin, &[addr, len])
    }

    fn write(&mut self, p: ProcId, addr: u64, len: u64, byte: u8) -> Res<()> {
        self.guard(p, addr, len)?;
        self.unit(p, Op::Fill, &[addr, len, u64::from(byte)])
    }

    fn touch(&mut self, p: ProcId, addr: u64, len: u64, write: bool) -> Res<()> {
        self.guard(p, addr, len)?;
        self.unit(p, Op::Touch, &[addr, len, u64::from(write)])
    }

    fn check(&mut self, p: ProcId, addr: u64, len: u64, byte: u8) -> Res<Option<(u64, u8)>> {
        self.guard(p, addr, len)?;
        let (off, v) = self.call(p, Op::Check, &[addr, len, u64::from(byte)])?;
        Ok((off != u64::MAX).then_some((off, v as u8)))
    }

    fn vmas(&mut self, p: ProcId) -> Res<Vec<VmaView>> {
        let pid = self.server(p)?.pid;
        let text = std::fs::read_to_string(format!("/proc/{pid}/smaps"))
            .map_err(|e| unsupported(format!("/proc/{pid}/smaps unreadable: {e}")))?;
        Ok(procfs::parse_smaps_named(&text)
            .into_iter()
            .map(|(mut v, name)| {
                v.kind = self.vma_kind(&name);
                let shared = v.perms.ends_with('s');
                scenario::backend::split_pss_by_kind(&mut v.smaps, v.kind, shared);
                v
            })
            .collect())
    }

    fn set_shmem(&mut self, settings: &[ShmemSetting]) -> Res<()> {
        self.knobs
            .apply_shmem(settings)
            .map_err(|e| unsupported(e.to_string()))
    }

    fn file_create(&mut self, size: u64, kind: FileKind, pattern: Option<u8>) -> Res<FileId> {
        let file = self
            .scratch(kind)?
            .tmpfile()
            .map_err(|m| unsupported(format!("files: {m}")))?;
        // Every process of the scenario may use the file as its owner would (ordinary
        // servers run as nobody: MADV_PAGEOUT of file pages, for one, wants write
        // permission). The file has no name, so only our descriptors and mappings reach it.
        use std::os::unix::fs::PermissionsExt;
        file.set_permissions(std::fs::Permissions::from_mode(0o666))
            .map_err(|e| unsupported(format!("files: fchmod: {e}")))?;
        self.undrained = true;
        let fd = file.as_raw_fd();
        // Only a pattern writes the bytes; a file without one stays sparse.
        let written = if pattern.is_some() { size } else { 0 };
        self.check_room(kind, written)?;
        sys::ftruncate(fd, size).map_err(errno_fail)?;
        if let Some(b) = pattern {
            fill_file(fd, 0, size, b).map_err(errno_fail)?;
        }
        if kind == FileKind::Disk {
            // On the device, out of the page cache: the first access reads it back.
            sys::fsync(fd).map_err(errno_fail)?;
            sys::drop_cache(fd).map_err(errno_fail)?;
        }
        let id = self.files.len() as FileId;
        self.files.push(HostFile { file, kind });
        Ok(id)
    }

    fn pwrite(&mut self, p: ProcId, f: FileId, offset: u64, len: u64, byte: u8) -> Res<()> {
        let fd = self.file_fd(p, f)?;
        // A range past LLONG_MAX is the kernel's EINVAL, not a question of room.
        let valid = offset
            .checked_add(len)
            .is_some_and(|e| e <= i64::MAX as u64);
        if let Some(kind) = self.files.get(f as usize).map(|h| h.kind).filter(|_| valid) {
            self.check_room(kind, len)?;
        }
        if len == 0 {
            // pwrite(2) of nothing still checks the offset.
            return sys::pwrite(fd, &[], offset).map(|_| ()).map_err(errno_fail);
        }
        fill_file(fd, offset, len, byte).map_err(errno_fail)
    }

    fn pread(&mut self, p: ProcId, f: FileId, offset: u64, len: u64) -> Res<Vec<u8>> {
        let fd = self.file_fd(p, f)?;
        // What the file can give is all the heap holds: `len` may be huge.
        let size = self
            .files
            .get(f as usize)
            .and_then(|h| h.file.metadata().ok())
            .map_or(0, |m| m.len());
        sys::pread_upto(fd, len, offset, size.saturating_sub(offset)).map_err(errno_fail)
    }

    fn ftruncate(&mut self, p: ProcId, f: FileId, size: u64) -> Res<()> {
        let fd = self.file_fd(p, f)?;
        sys::ftruncate(fd, size).map_err(errno_fail)
    }

    fn fallocate(&mut self, p: ProcId, f: FileId, off: u64, len: u64, punch: bool) -> Res<()> {
        let fd = self.file_fd(p, f)?;
        let mode = if punch {
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE
        } else {
            0
        };
        sys::fallocate(fd, mode, off, len).map_err(errno_fail)
    }

    fn msync(&mut self, p: ProcId, addr: u64, len: u64, mode: MsyncMode) -> Res<()> {
        self.guard(p, addr, len)?;
        self.unit(p, Op::Msync, &[addr, len, mode.bits() as u64])
    }

    fn fsync(&mut self, p: ProcId, f: FileId) -> Res<()> {
        let fd = self.file_fd(p, f)?;
        sys::fsync(fd).map_err(errno_fail)
    }

    fn fincore(&mut self, p: ProcId, f: FileId, offset: u64, len: u64) -> Res<u64> {
        let fd = self.file_fd(p, f)?;
        if len == 0 {
            // cachestat reads a length of 0 as "to the end of the file".
            return Ok(0);
        }
        self.drain();
        match sys::cachestat(fd, offset, len) {
            Ok(pages) => Ok(pages * 4096),
            Err(libc::ENOSYS) => Err(unsupported(
                "fincore: this kernel has no cachestat(2) (Linux 6.5+)",
            )),
            Err(e) => Err(errno_fail(e)),
        }
    }

    fn status(&mut self, p: ProcId) -> Res<StatusView> {
        let pid = self.server(p)?.pid;
        let text = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .map_err(|e| unsupported(format!("/proc/{pid}/status unreadable: {e}")))?;
        let vm_pin = procfs::status_field(&text, "VmPin")
            .ok_or_else(|| unsupported(format!("/proc/{pid}/status has no VmPin")))?;
        Ok(StatusView { vm_pin })
    }

    fn page(&mut self, p: ProcId, addr: u64) -> Res<PageView> {
        let entry = self.pagemap_range(p, addr, 1)?[0];
        let (kpageflags, folio_order) = if self.page_frames {
            self.frame(entry)?
        } else {
            (None, None)
        };
        Ok(PageView {
            present: entry & procfs::PM_PRESENT != 0,
            exclusive: entry & procfs::PM_EXCLUSIVE != 0,
            swapped: entry & procfs::PM_SWAP != 0,
            kpageflags,
            folio_order,
        })
    }
}
