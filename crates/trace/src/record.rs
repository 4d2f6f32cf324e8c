//! `usermm record`: runs a command under perf tracepoints and writes a trace.
//!
//! What is captured, and how:
//!
//! - mm system calls with arguments and results: the `syscalls:sys_enter_*`/`sys_exit_*`
//!   tracepoints of mmap, munmap, mprotect, mremap, brk, madvise, mlock, mlock2, munlock,
//!   mlockall, munlockall, paired per thread;
//! - page faults: `exceptions:page_fault_user` and `exceptions:page_fault_kernel` (address and
//!   x86 error code: bit 1 = write);
//! - processes: perf's own side-band records (`PERF_RECORD_FORK`/`EXIT`/`COMM` with the exec
//!   flag) — the information of `sched:sched_process_fork/exec/exit`, with thread and process
//!   told apart — and `PERF_RECORD_MMAP2` (data mappings too), which names the file (device,
//!   inode, path) of every file mapping as the kernel made it;
//! - the page cache of each mapped file as the mapping finds it (`record/cache.rs`): at exec, and at
//!   each file `mmap`, which a seccomp filter stops for the recorder before it runs;
//! - what no tracepoint gives is read under ptrace, with the process stopped: at each exec,
//!   the new address space (`/proc/PID/maps` and the pages `pagemap` shows present: the
//!   arguments the kernel copied to the stack, the zeroed bss); at each exit, before the mm
//!   is torn down, `RssAnon`/`RssFile` (`status`) and `AnonHugePages` (`smaps_rollup`);
//!   at each fork, whether the child shares the parent's mm (`kcmp(KCMP_VM)`, vfork and
//!   `CLONE_VM`).
//!
//! Events are enabled at the command's exec (`enable_on_exec`) and inherited by its children;
//! one ring buffer per CPU, drained every millisecond, merged by timestamp
//! (`CLOCK_MONOTONIC`). The host's THP policy is set to `never` at every size for the
//! recording (so every fault is a 4K fault and the trace holds every page touched), or to
//! the `--thp` policy over that (then a fault maps the folio the kernel chose and touches
//! inside it make no event: the trace holds what the host faulted under that policy, and its
//! replay under the same policy takes the same faults), under the oracle's machine-wide knob
//! lock with its journal, and restored afterwards. The header names the policy in force
//! (`thp top=never 16K=never ... 64K=always ...`), which replay sets.

use crate::format::{self, Event, Header, Image, ImageVma, IMG_SHARED, IMG_SPECIAL, IMG_STACK};
use crate::sys;
use oracle::procfs::{status_kb, status_tgid};

mod cache;
mod perf;

use perf::build_events;
use std::collections::{HashMap, HashSet, VecDeque};
use std::ffi::CString;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// An error of `record`.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// Not root.
    #[error("usermm record needs root (perf tracepoints of other processes, ptrace, the THP knobs); euid is {0}")]
    NotRoot(u32),
    /// tracefs is not there and could not be mounted.
    #[error("tracefs is not mounted at /sys/kernel/tracing and mounting it failed: {0}")]
    NoTracefs(String),
    /// A tracepoint is missing.
    #[error("tracepoint {0} is missing on this kernel ({1})")]
    MissingTracepoint(String, String),
    /// A system call failed.
    #[error("{0}: {1}")]
    Sys(String, std::io::Error),
    /// A `--thp` setting is not `top=always|madvise|never` or `SIZE=always|madvise|never|inherit`
    /// with a folio size from 16K to 2M (what was wrong with it last).
    #[error("--thp {0}={1}: expected top=always|madvise|never or SIZE=always|madvise|never|inherit (SIZE a power of two from 16K to 2M): {2}")]
    BadThp(String, String, scenario::ThpPairError),
    /// The THP knobs could not be taken or set.
    #[error("THP knobs: {0}")]
    Knobs(String),
    /// An empty command.
    #[error("no command to record")]
    NoCommand,
    /// The command is not an executable file (checked before anything is changed).
    #[error("{0}: no such command (not an executable file, nor one in $PATH)")]
    NoSuchCommand(String),
    /// The output file cannot be created safely (checked before the command runs).
    #[error("--out")]
    Output(#[from] oracle::output::OutputError),
}

fn sys_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> RecordError {
    let w = what.into();
    move |e| RecordError::Sys(w, e)
}

/// Options of [`record`].
#[derive(Clone, Debug)]
pub struct RecordOptions {
    /// Output file.
    pub out: PathBuf,
    /// Data pages per CPU ring buffer (a power of two).
    pub ring_pages: usize,
    /// Print the progress line on stderr.
    pub progress: bool,
    /// Run the command as this user instead of root (its groups too); the recorder itself
    /// stays root for perf, ptrace and the knobs.
    pub user: Option<sys::Identity>,
    /// THP policy (`top` or a folio size, POLICY) set on the host for the recording, over
    /// `never` at every size; sysfs semantics, as the scenario language's `set thp`.
    pub thp: Vec<(String, String)>,
}

impl Default for RecordOptions {
    fn default() -> Self {
        RecordOptions {
            out: PathBuf::from("trace.umt"),
            ring_pages: 2048,
            progress: true,
            user: None,
            thp: Vec::new(),
        }
    }
}

/// What a recording produced.
#[derive(Clone, Debug, Default)]
pub struct RecordSummary {
    /// Events written.
    pub events: u64,
    /// File size.
    pub bytes: u64,
    /// Records the kernel dropped.
    pub lost: u64,
    /// Processes seen (root and forks).
    pub processes: u64,
    /// File mappings whose file could not be identified (replayed as anonymous).
    pub file_as_anon: u64,
    /// Faults at addresses above the user address space (vsyscall, kernel), left out.
    pub faults_outside_user: u64,
    /// The command's exit status (or 128 + signal).
    pub exit_status: i32,
    /// Wall time of the recording.
    pub seconds: f64,
    /// SIGINT, SIGTERM or SIGHUP ended the recording: the command's processes were killed
    /// and the trace holds what happened until then.
    pub interrupted: bool,
    /// What the trace writer left out to stay within what every reader accepts (arguments
    /// past the 1023rd, VMAs, pages, events past the payload limit; see
    /// [`format::write_counted`]).
    pub left_out: u64,
}

/// The syscalls recorded, in tracepoint-name order.
const SYSCALLS: [&str; 11] = [
    "mmap",
    "munmap",
    "mprotect",
    "mremap",
    "brk",
    "madvise",
    "mlock",
    "mlock2",
    "munlock",
    "mlockall",
    "munlockall",
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tp {
    Enter(usize),
    Exit(usize),
    FaultUser,
    FaultKernel,
}

#[derive(Clone, Debug)]
struct TpFormat {
    tp: Tp,
    id: u64,
    /// Offsets and sizes of the fields we read: syscall args in order, or `ret`, or
    /// (address, error_code).
    fields: Vec<(usize, usize)>,
}

fn tracefs_dir() -> Result<PathBuf, RecordError> {
    for d in ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"] {
        if Path::new(d).join("events").is_dir() {
            return Ok(PathBuf::from(d));
        }
    }
    let out = std::process::Command::new("mount")
        .args(["-t", "tracefs", "nodev", "/sys/kernel/tracing"])
        .output()
        .map_err(|e| RecordError::NoTracefs(e.to_string()))?;
    if Path::new("/sys/kernel/tracing/events").is_dir() {
        return Ok(PathBuf::from("/sys/kernel/tracing"));
    }
    Err(RecordError::NoTracefs(
        String::from_utf8_lossy(&out.stderr).trim().to_string(),
    ))
}

/// Parses a tracepoint `format` file: (name, offset, size) of every field.
fn parse_format(text: &str) -> Vec<(String, usize, usize)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        let Some(rest) = line.strip_prefix("field:") else {
            continue;
        };
        let mut decl = "";
        let mut off = None;
        let mut size = None;
        for part in rest.split(';') {
            let part = part.trim();
            if let Some(v) = part.strip_prefix("offset:") {
                off = v.trim().parse().ok();
            } else if let Some(v) = part.strip_prefix("size:") {
                size = v.trim().parse().ok();
            } else if decl.is_empty() {
                decl = part;
            }
        }
        let name = decl
            .split_whitespace()
            .last()
            .unwrap_or("")
            .split('[')
            .next()
            .unwrap_or("")
            .trim_start_matches('*')
            .to_string();
        if let (Some(o), Some(s)) = (off, size) {
            out.push((name, o, s));
        }
    }
    out
}

fn load_tp(dir: &Path, sys: &str, name: &str, tp: Tp) -> Result<TpFormat, RecordError> {
    let d = dir.join("events").join(sys).join(name);
    let full = format!("{sys}:{name}");
    let id: u64 = std::fs::read_to_string(d.join("id"))
        .map_err(|e| RecordError::MissingTracepoint(full.clone(), e.to_string()))?
        .trim()
        .parse()
        .map_err(|_| RecordError::MissingTracepoint(full.clone(), "bad id".into()))?;
    let text = std::fs::read_to_string(d.join("format"))
        .map_err(|e| RecordError::MissingTracepoint(full.clone(), e.to_string()))?;
    let f = parse_format(&text);
    let pick = |n: &str| {
        f.iter()
            .find(|(k, _, _)| k == n)
            .map(|&(_, o, s)| (o, s))
            .ok_or_else(|| RecordError::MissingTracepoint(full.clone(), format!("no field {n}")))
    };
    let fields = match tp {
        Tp::Enter(_) => {
            let nr = f
                .iter()
                .position(|(k, _, _)| k == "__syscall_nr")
                .ok_or_else(|| {
                    RecordError::MissingTracepoint(full.clone(), "no __syscall_nr".into())
                })?;
            f[nr + 1..].iter().map(|&(_, o, s)| (o, s)).collect()
        }
        Tp::Exit(_) => vec![pick("ret")?],
        Tp::FaultUser | Tp::FaultKernel => vec![pick("address")?, pick("error_code")?],
    };
    Ok(TpFormat { tp, id, fields })
}

fn online_cpus() -> Vec<i32> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap_or_default();
    let mut v = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        if let (Ok(a), Ok(b)) = (a.parse::<i32>(), b.parse::<i32>()) {
            v.extend(a..=b);
        }
    }
    if v.is_empty() {
        v = (0..std::thread::available_parallelism().map_or(1, |n| n.get() as i32)).collect();
    }
    v
}

/// Every file mappings refer to. A file is known by its device, inode and inode generation
/// (`PERF_RECORD_MMAP2`'s `ino_generation`), so an inode number a program freed and the
/// filesystem gave to a new file (git writes a 5 MB pack where a 4 KiB file was) is a new
/// file, not the old one at the old size. The snapshot of a process image reads
/// `/proc/PID/maps`, which shows no generation: such a file takes the generation of the
/// first later MMAP2 that names its device and inode. The trace names each file once, with
/// its size: a file mapped past the size its record already gave (it grew after that) gets
/// a new record.
#[derive(Debug, Default)]
struct Files {
    /// Per (device, inode), the files seen, latest last.
    ids: HashMap<(u64, u64), Vec<Seen>>,
    list: Vec<(u64, u64, u64, String)>,
    emitted: usize,
    /// Per (device, inode), the page cache when the recorder first saw the file, and again
    /// each time a mapping reached past the size of the last snapshot (a file the program
    /// writes and maps as it grows, such as git's packs, gets a FILE per size).
    cache: HashMap<(u64, u64), Vec<cache::Snapshot>>,
    /// Pages the snapshots read so far (at most [`cache::MAX_SNAPSHOT_PAGES`]).
    cache_pages: u64,
}

/// A file seen under a (device, inode): its generation (`None`: not known yet) and id.
type Seen = (Option<u64>, u32);

impl Files {
    fn id(&mut self, dev: u64, ino: u64, generation: Option<u64>, path: &str, extent: u64) -> u32 {
        let known = self.ids.entry((dev, ino)).or_default();
        let found = match generation {
            Some(g) => match known.iter().rev().find(|(kg, _)| *kg == Some(g)) {
                Some(&(_, id)) => Some(id),
                None => known.last_mut().filter(|(kg, _)| kg.is_none()).map(|e| {
                    e.0 = Some(g);
                    e.1
                }),
            },
            None => known.last().map(|&(_, id)| id),
        };
        if let Some(id) = found {
            let e = &mut self.list[id as usize];
            if (id as usize) >= self.emitted {
                e.2 = e.2.max(extent);
                return id;
            }
            if extent <= e.2 {
                return id;
            }
        }
        let size = std::fs::metadata(path).map_or(0, |m| m.len()).max(extent);
        let id = self.list.len() as u32;
        known.push((generation, id));
        self.list.push((dev, ino, size, path.to_string()));
        id
    }

    /// Snapshots the page cache of the file (`dev`, `ino`), mapped up to byte `extent`,
    /// opened by `open`: the first time, and again when `extent` passes the last
    /// snapshot's size.
    fn snapshot_cache(
        &mut self,
        (dev, ino): (u64, u64),
        extent: u64,
        open: impl FnOnce() -> Option<std::fs::File>,
    ) {
        let known = self.cache.entry((dev, ino)).or_default();
        if ino == 0 || known.last().is_some_and(|s| s.size >= extent) {
            return;
        }
        let mut left = cache::MAX_SNAPSHOT_PAGES.saturating_sub(self.cache_pages);
        let before = left;
        let snap = open().and_then(|f| cache::snapshot(&f, &mut left));
        self.cache_pages += before - left;
        // One that could not be read is not tried again.
        known.push(snap.unwrap_or(cache::Snapshot {
            size: u64::MAX,
            folios: Vec::new(),
        }));
    }

    /// The snapshot for the `File` event of (`dev`, `ino`) at `size`: the first taken when
    /// the file had that size or more, else the last.
    fn cache_for(&self, dev: u64, ino: u64, size: u64) -> Option<&[format::CachedFolio]> {
        let known = self.cache.get(&(dev, ino))?;
        known
            .iter()
            .find(|s| s.size >= size)
            .or(known.last())
            .map(|s| s.folios.as_slice())
    }
}

fn dev_of(maj: u64, min: u64) -> u64 {
    maj << 20 | min
}

/// Reads the address space of a stopped process: `/proc/PID/maps` and present pages.
fn snapshot_image(pid: i32, files: &mut Files) -> Image {
    let mut img = Image::default();
    let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else {
        return img;
    };
    let mut pagemap = std::fs::File::open(format!("/proc/{pid}/pagemap")).ok();
    for line in maps.lines() {
        let mut it = line.split_whitespace();
        let (Some(range), Some(perms), Some(off), Some(dev), Some(ino)) =
            (it.next(), it.next(), it.next(), it.next(), it.next())
        else {
            continue;
        };
        let path: String = it.collect::<Vec<_>>().join(" ");
        let Some((s, e)) = range.split_once('-') else {
            continue;
        };
        let (Ok(start), Ok(end)) = (u64::from_str_radix(s, 16), u64::from_str_radix(e, 16)) else {
            continue;
        };
        if end > crate::USER_TOP || start >= end {
            continue; // [vsyscall]
        }
        let p = perms.as_bytes();
        let prot = (p.first() == Some(&b'r')) as u8
            | ((p.get(1) == Some(&b'w')) as u8) << 1
            | ((p.get(2) == Some(&b'x')) as u8) << 2;
        let mut flags = 0;
        if p.get(3) == Some(&b's') {
            flags |= IMG_SHARED;
        }
        if path == "[stack]" {
            flags |= IMG_STACK;
        }
        if path.starts_with("[v") {
            flags |= IMG_SPECIAL;
        }
        let ino: u64 = ino.parse().unwrap_or(0);
        let offset = u64::from_str_radix(off, 16).unwrap_or(0);
        let file = if ino != 0 && path.starts_with('/') {
            let (ma, mi) = dev.split_once(':').unwrap_or(("0", "0"));
            let d = dev_of(
                u64::from_str_radix(ma, 16).unwrap_or(0),
                u64::from_str_radix(mi, 16).unwrap_or(0),
            );
            Some(files.id(d, ino, None, &path, offset + (end - start)))
        } else {
            None
        };
        img.vmas.push(ImageVma {
            start,
            end,
            prot,
            flags,
            file,
            offset,
        });
        if flags & IMG_SPECIAL != 0 {
            continue;
        }
        let Some(pm) = pagemap.as_mut() else {
            continue;
        };
        let n = ((end - start) / 4096) as usize;
        let mut buf = vec![0u8; n * 8];
        if pm.seek(SeekFrom::Start(start / 4096 * 8)).is_err() || pm.read_exact(&mut buf).is_err() {
            continue;
        }
        for (i, c) in buf.chunks_exact(8).enumerate() {
            let v = u64::from_le_bytes(c.try_into().unwrap_or([0; 8]));
            if v >> 63 == 0 {
                continue;
            }
            let file_page = v >> 61 & 1 != 0;
            let exclusive = v >> 56 & 1 != 0;
            img.pages
                .push((start + i as u64 * 4096, !file_page && exclusive));
        }
    }
    img
}

/// (fd, end of the mapping in the file) of the `mmap` a process is stopped in, from
/// `/proc/PID/syscall` (the number, then the six arguments, in hex).
fn file_mmap_args(pid: i32) -> Option<(i32, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/syscall")).ok()?;
    let mut it = s.split_whitespace();
    if it.next()? != "9" {
        return None;
    }
    let args: Vec<u64> = it
        .take(6)
        .map(|a| u64::from_str_radix(a.trim_start_matches("0x"), 16).ok())
        .collect::<Option<_>>()?;
    // The argument is an `int`: its low half.
    let fd = *args.get(4)? as u32 as i32;
    (fd >= 0).then(|| (fd, args[5].saturating_add(args[1])))
}

/// (RssAnon, RssFile, AnonHugePages) in kB of a process stopped at its exit; `None` for a
/// thread that is not the group leader.
fn snapshot_rss(pid: i32) -> Option<(u64, u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    if status_tgid(&status) != Some(pid) {
        return None;
    }
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    Some((
        status_kb(&status, "RssAnon"),
        status_kb(&status, "RssFile"),
        status_kb(&rollup, "AnonHugePages"),
    ))
}

/// What ptrace learnt, keyed by pid.
#[derive(Debug, Default)]
struct Side {
    images: HashMap<u32, VecDeque<Image>>,
    rss: HashMap<u32, VecDeque<(u64, u64, u64)>>,
    shares_vm: HashMap<u32, bool>,
    /// The fault signals the kernel sent, in delivery order: (`CLOCK_MONOTONIC` ns at the
    /// stop, process, signal, faulting address).
    signals: Vec<(u64, u32, u8, u64)>,
}

/// The most fault signals a recording keeps (a program faulting on purpose in a loop could
/// otherwise grow the list without bound); later ones are not recorded.
const MAX_SIGNALS: usize = 1 << 20;

/// A fault signal at `tid`'s signal-delivery stop, if the kernel sent it for an access
/// (`si_code` a fault's reason: not a `kill`, not `SI_KERNEL`): the time, the process
/// (thread group) and the faulting address.
fn fault_signal(tid: i32, sig: i32) -> Option<(u64, u32, u8, u64)> {
    let (code, addr) = sys::ptrace_fault_siginfo(tid).ok()?;
    if !(1..libc::SI_KERNEL).contains(&code) {
        return None;
    }
    let status = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    let tgid = u32::try_from(oracle::procfs::status_tgid(&status)?).ok()?;
    Some((sys::monotonic_ns(), tgid, sig as u8, addr))
}

/// The `--thp` settings as the knobs take them (checked before anything changes).
/// Each pair is read by the workspace's one THP parser (`scenario::ThpSetting::from_pair`:
/// `set thp`'s grammar, which the docs promise `record --thp`).
fn thp_settings(thp: &[(String, String)]) -> Result<Vec<scenario::ThpSetting>, RecordError> {
    thp.iter()
        .map(|(k, v)| {
            scenario::ThpSetting::from_pair(k, v)
                .map_err(|e| RecordError::BadThp(k.clone(), v.clone(), e))
        })
        .collect()
}

/// Sets the host's THP knobs to `never` at every size, then `wanted` over that; returns the
/// held knobs (restored on drop) and the policy for the header: `thp top=P SIZE=P ...`, every
/// size the host has, which replay sets on its machine.
fn recording_policy(
    wanted: &[scenario::ThpSetting],
) -> Result<(oracle::knobs::ThpKnobs, String), RecordError> {
    use scenario::{ThpPolicy, ThpSetting, ThpSize, ThpTop};
    let knobs =
        oracle::knobs::ThpKnobs::acquire().map_err(|e| RecordError::Knobs(e.to_string()))?;
    knobs
        .set_defaults()
        .map_err(|e| RecordError::Knobs(e.to_string()))?;
    let mut settings = vec![ThpSetting::Top(ThpTop::Never)];
    let dir = oracle::knobs::thp_dir();
    let mut sizes = Vec::new();
    for order in 2..=9u32 {
        let bytes = 4096u64 << order;
        if dir
            .join(format!("hugepages-{}kB/enabled", bytes / 1024))
            .exists()
        {
            if let Some(size) = ThpSize::new(bytes) {
                settings.push(ThpSetting::Size {
                    size,
                    policy: ThpPolicy::Never,
                });
                sizes.push(size);
            }
        }
    }
    for w in wanted {
        if let ThpSetting::Size { size, .. } = w {
            if !sizes.contains(size) {
                return Err(RecordError::Knobs(format!(
                    "this host has no {}K THP size",
                    size.bytes() / 1024
                )));
            }
        }
    }
    settings.extend_from_slice(wanted);
    knobs
        .apply(&settings)
        .map_err(|e| RecordError::Knobs(e.to_string()))?;
    // The policy in force: the last setting of each knob.
    let top = settings
        .iter()
        .rev()
        .find_map(|s| match s {
            ThpSetting::Top(t) => Some(*t),
            _ => None,
        })
        .unwrap_or(ThpTop::Never);
    let mut policy = format!("thp top={top}");
    for size in sizes {
        let p = settings
            .iter()
            .rev()
            .find_map(|s| match s {
                ThpSetting::Size { size: z, policy } if *z == size => Some(*policy),
                _ => None,
            })
            .unwrap_or(ThpPolicy::Never);
        policy.push_str(&format!(" {}K={p}", size.bytes() / 1024));
    }
    Ok((knobs, policy))
}

/// Whether `cmd` names an executable file as `execvp` finds it: a path with a slash as it
/// is, a bare name in each directory of `$PATH` (or `/bin:/usr/bin` without one).
fn command_exists(cmd: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let runnable = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if cmd.contains('/') {
        return runnable(Path::new(cmd));
    }
    if cmd.is_empty() {
        return false;
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/bin:/usr/bin".into());
    std::env::split_paths(&path).any(|d| runnable(&d.join(cmd)))
}

/// One CPU's perf events.
struct CpuEvents {
    _fds: Vec<OwnedFd>,
    ring: sys::Ring,
    data: Vec<u8>,
    /// Bytes of `data` already scanned for new files (`MMAP2` records).
    scanned: usize,
}

fn open_events(
    pid: i32,
    tps: &[TpFormat],
    ring_pages: usize,
) -> Result<(Vec<CpuEvents>, HashMap<u64, usize>), RecordError> {
    let mut cpus = Vec::new();
    let mut ids = HashMap::new();
    for cpu in online_cpus() {
        let mut fds: Vec<OwnedFd> = Vec::new();
        let mut ring = None;
        for (i, tp) in tps.iter().enumerate() {
            let mut a = sys::PerfEventAttr {
                type_: sys::PERF_TYPE_TRACEPOINT,
                config: tp.id,
                sample_period: 1,
                // IDENTIFIER | TID | TIME | RAW
                sample_type: (1 << 16) | (1 << 1) | (1 << 2) | (1 << 10),
                flags: sys::attr::DISABLED
                    | sys::attr::INHERIT
                    | sys::attr::ENABLE_ON_EXEC
                    | sys::attr::SAMPLE_ID_ALL
                    | sys::attr::USE_CLOCKID,
                clockid: libc::CLOCK_MONOTONIC,
                wakeup_events: 1,
                ..Default::default()
            };
            if i == 0 {
                a.flags |= sys::attr::TASK
                    | sys::attr::COMM
                    | sys::attr::COMM_EXEC
                    | sys::attr::MMAP
                    | sys::attr::MMAP2
                    | sys::attr::MMAP_DATA;
            }
            let fd = sys::perf_event_open(&a, pid, cpu).map_err(sys_err(format!(
                "perf_event_open(tracepoint {}, cpu {cpu})",
                tp.id
            )))?;
            ids.insert(sys::perf_id(&fd).map_err(sys_err("PERF_EVENT_IOC_ID"))?, i);
            if i == 0 {
                ring = Some(
                    sys::Ring::map(&fd, ring_pages)
                        .map_err(sys_err(format!("mmap of the perf ring buffer, cpu {cpu}")))?,
                );
            } else {
                sys::perf_set_output(&fd, &fds[0]).map_err(sys_err("PERF_EVENT_IOC_SET_OUTPUT"))?;
            }
            fds.push(fd);
        }
        if let Some(ring) = ring {
            cpus.push(CpuEvents {
                _fds: fds,
                ring,
                data: Vec::new(),
                scanned: 0,
            });
        }
    }
    Ok((cpus, ids))
}

/// Records `cmd` into `opts.out`.
pub fn record(cmd: &[String], opts: &RecordOptions) -> Result<RecordSummary, RecordError> {
    if cmd.is_empty() {
        return Err(RecordError::NoCommand);
    }
    let euid = oracle::sys::geteuid();
    if euid != 0 {
        return Err(RecordError::NotRoot(euid));
    }
    // Everything that can be refused is refused before the host is changed or the command
    // runs: the output's directory, the command.
    let thp = thp_settings(&opts.thp)?;
    let mut out = oracle::output::SafeOutput::create(&opts.out, false)?;
    if !command_exists(&cmd[0]) {
        return Err(RecordError::NoSuchCommand(cmd[0].clone()));
    }
    // SIGINT, SIGTERM and SIGHUP end the recording in order (the command is killed, the knobs
    // restored, the trace written); a second one restores the knobs at once and exits.
    oracle::sys::install_stop_handler().map_err(|e| {
        RecordError::Sys(
            "signal handlers".into(),
            std::io::Error::from_raw_os_error(e),
        )
    })?;
    let dir = tracefs_dir()?;
    let mut tps = Vec::new();
    for (i, s) in SYSCALLS.iter().enumerate() {
        tps.push(load_tp(
            &dir,
            "syscalls",
            &format!("sys_enter_{s}"),
            Tp::Enter(i),
        )?);
        tps.push(load_tp(
            &dir,
            "syscalls",
            &format!("sys_exit_{s}"),
            Tp::Exit(i),
        )?);
    }
    tps.push(load_tp(
        &dir,
        "exceptions",
        "page_fault_user",
        Tp::FaultUser,
    )?);
    match load_tp(&dir, "exceptions", "page_fault_kernel", Tp::FaultKernel) {
        Ok(t) => tps.push(t),
        Err(e) => eprintln!("usermm record: {e}; kernel-mode faults are not recorded"),
    }
    let argv: Vec<CString> = cmd
        .iter()
        .map(|a| CString::new(a.as_bytes()))
        .collect::<Result<_, _>>()
        .map_err(|e| {
            RecordError::Sys("argument with a NUL byte".into(), std::io::Error::other(e))
        })?;
    let header = Header {
        host: std::fs::read_to_string("/proc/sys/kernel/hostname")
            .unwrap_or_default()
            .trim()
            .to_string(),
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_string(),
        command: cmd.to_vec(),
        policy: String::new(),
        recorded_at: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    };
    let (knobs, policy) = recording_policy(&thp)?;
    let header = Header { policy, ..header };
    let t0 = Instant::now();
    let root = sys::spawn_traced(&argv, opts.user.as_ref()).map_err(sys_err("fork"))?;
    let res = trace_child(root, &tps, opts);
    let failed = knobs.restore();
    drop(knobs);
    for f in failed {
        eprintln!("usermm record: could not restore THP knob {f}");
    }
    let (cpus, ids, side, files, exit_status) = match res {
        Ok(v) => v,
        Err(e) => {
            oracle::sys::kill(root);
            return Err(e);
        }
    };
    let mut summary = RecordSummary {
        exit_status,
        seconds: t0.elapsed().as_secs_f64(),
        interrupted: oracle::sys::stop_requested(),
        ..Default::default()
    };
    let events = build_events(root as u32, &cpus, &ids, &tps, side, files, &mut summary);
    let (bytes, dropped) = format::write_counted(&header, &events).map_err(sys_err("zstd"))?;
    summary.left_out = dropped;
    out.file()
        .write_all(&bytes)
        .map_err(sys_err(opts.out.display().to_string()))?;
    out.commit()?;
    summary.events = events.len() as u64;
    summary.bytes = bytes.len() as u64;
    Ok(summary)
}

type Traced = (Vec<Vec<u8>>, HashMap<u64, usize>, Side, Files, i32);

fn trace_child(root: i32, tps: &[TpFormat], opts: &RecordOptions) -> Result<Traced, RecordError> {
    let st = sys::wait_pid(root).map_err(sys_err("waitpid"))?;
    if !libc::WIFSTOPPED(st) {
        return Err(RecordError::Sys(
            "the command did not start".into(),
            std::io::Error::other(format!("wait status {st:#x}")),
        ));
    }
    // Armed by enable_on_exec: counting starts at the command's execve.
    let (mut cpus, ids) = open_events(root, tps, opts.ring_pages)?;
    sys::ptrace_setoptions(root, sys::PTRACE_OPTIONS).map_err(sys_err("PTRACE_SETOPTIONS"))?;
    sys::ptrace_cont(root, 0).map_err(sys_err("PTRACE_CONT"))?;
    let mut files = Files::default();
    let mut side = Side::default();
    let mut live: HashSet<i32> = HashSet::from([root]);
    let mut expect_stop: HashSet<i32> = HashSet::new();
    let mut exit_status = 0;
    let mut last_progress = Instant::now();
    let t0 = Instant::now();
    let mut killed = false;
    loop {
        if !killed && oracle::sys::stop_requested() {
            // Asked to stop: end every traced process now; their exits drain the loop.
            killed = true;
            for &pid in &live {
                oracle::sys::kill(pid);
            }
        }
        match sys::wait_any().map_err(sys_err("waitpid"))? {
            sys::Wait::NoChild => break,
            sys::Wait::Nothing => {
                for c in &mut cpus {
                    c.ring.drain(&mut c.data);
                    // A file seen for the first time: its page cache now, before the
                    // process's faults change it further.
                    for (dev, ino, path, extent) in perf::new_files(&c.data, &mut c.scanned) {
                        files.snapshot_cache((dev, ino), extent, || {
                            cache::open_verified(&path, dev, ino)
                        });
                    }
                }
                if opts.progress && last_progress.elapsed() > Duration::from_millis(250) {
                    last_progress = Instant::now();
                    let bytes: usize = cpus.iter().map(|c| c.data.len()).sum();
                    eprint!(
                        "\rusermm record: {:>6.1} s, {} tasks live, {} KiB of perf records   ",
                        t0.elapsed().as_secs_f64(),
                        live.len(),
                        bytes >> 10
                    );
                }
                std::thread::sleep(Duration::from_micros(500));
            }
            sys::Wait::Gone(pid, code) => {
                live.remove(&pid);
                if pid == root {
                    exit_status = code;
                }
            }
            sys::Wait::Stopped { pid, sig, event } => {
                live.insert(pid);
                if killed {
                    // A task that appeared after the kill (a fork in flight).
                    oracle::sys::kill(pid);
                }
                let mut inject = 0;
                match event {
                    libc::PTRACE_EVENT_FORK
                    | libc::PTRACE_EVENT_VFORK
                    | libc::PTRACE_EVENT_CLONE => {
                        if let Ok(child) = sys::ptrace_geteventmsg(pid) {
                            let child = child as i32;
                            if let Some(s) = sys::same_vm(pid, child) {
                                side.shares_vm.insert(child as u32, s);
                            }
                            if live.insert(child) {
                                expect_stop.insert(child);
                            }
                        }
                    }
                    libc::PTRACE_EVENT_EXEC => {
                        let img = snapshot_image(pid, &mut files);
                        // Stopped at exec: the cache is what exec's reads left.
                        for id in img.vmas.iter().filter_map(|v| v.file) {
                            let (dev, ino, size, path) = files.list[id as usize].clone();
                            files.snapshot_cache((dev, ino), size, || {
                                cache::open_verified(&path, dev, ino)
                            });
                        }
                        side.images.entry(pid as u32).or_default().push_back(img);
                    }
                    libc::PTRACE_EVENT_SECCOMP => {
                        // An mmap of a file, stopped before it runs (`sys::spawn_traced`'s
                        // filter): the cache as this mapping finds it.
                        if let Some((fd, extent)) = file_mmap_args(pid) {
                            if let Some(f) = cache::open_fd(pid, fd) {
                                if let Some(key) = cache::identity(&f) {
                                    files.snapshot_cache(key, extent, || Some(f));
                                }
                            }
                        }
                    }
                    libc::PTRACE_EVENT_EXIT => {
                        if let Some(r) = snapshot_rss(pid) {
                            side.rss.entry(pid as u32).or_default().push_back(r);
                        }
                    }
                    0 if sig == libc::SIGSTOP && expect_stop.remove(&pid) => {}
                    0 if sig == libc::SIGTRAP => {}
                    0 => {
                        inject = sig;
                        if (sig == libc::SIGSEGV || sig == libc::SIGBUS)
                            && side.signals.len() < MAX_SIGNALS
                        {
                            side.signals.extend(fault_signal(pid, sig));
                        }
                    }
                    _ => {}
                }
                // A tracee may have been killed meanwhile (ESRCH): it is reported as gone.
                let _ = sys::ptrace_cont(pid, inject);
            }
        }
    }
    for c in &mut cpus {
        c.ring.drain(&mut c.data);
    }
    if opts.progress {
        eprintln!();
    }
    let data = cpus.into_iter().map(|c| c.data).collect();
    Ok((data, ids, side, files, exit_status))
}

#[cfg(test)]
mod tests {
    use super::Files;

    /// A file's record: (size, id).
    fn record(f: &Files, id: u32) -> u64 {
        f.list[id as usize].2
    }

    #[test]
    fn a_reused_inode_number_is_a_new_file() {
        let mut f = Files::default();
        let small = f.id(1, 7, Some(100), "/nonexistent/a", 4096);
        f.emitted = f.list.len();
        // The same inode number, another generation: git's pack where a 4 KiB file was.
        let pack = f.id(1, 7, Some(101), "/nonexistent/pack", 5 << 20);
        assert_ne!(small, pack);
        assert_eq!((record(&f, small), record(&f, pack)), (4096, 5 << 20));
        // Each generation keeps its id.
        assert_eq!(f.id(1, 7, Some(100), "/nonexistent/a", 4096), small);
        assert_eq!(f.id(1, 7, Some(101), "/nonexistent/pack", 4096), pack);
    }

    #[test]
    fn a_snapshot_file_takes_the_first_generation_seen() {
        let mut f = Files::default();
        let lib = f.id(1, 9, None, "/nonexistent/lib.so", 8192);
        assert_eq!(f.id(1, 9, Some(5), "/nonexistent/lib.so", 8192), lib);
        assert_eq!(f.id(1, 9, None, "/nonexistent/lib.so", 4096), lib);
        assert_ne!(f.id(1, 9, Some(6), "/nonexistent/lib.so", 4096), lib);
    }

    #[test]
    fn a_file_mapped_past_its_written_record_gets_a_new_one() {
        let mut f = Files::default();
        let a = f.id(1, 3, Some(1), "/nonexistent/log", 4096);
        // Not yet written to the trace: the record grows.
        assert_eq!(f.id(1, 3, Some(1), "/nonexistent/log", 8192), a);
        assert_eq!(record(&f, a), 8192);
        f.emitted = f.list.len();
        // Written: a larger extent is a new record, a smaller one the same file.
        assert_eq!(f.id(1, 3, Some(1), "/nonexistent/log", 8192), a);
        let b = f.id(1, 3, Some(1), "/nonexistent/log", 1 << 20);
        assert_ne!(a, b);
        assert_eq!(record(&f, b), 1 << 20);
        assert_eq!(f.id(1, 3, Some(1), "/nonexistent/log", 4096), b);
    }
}
