//! The oracle's hardening against other local users and against inputs that cost too much:
//! no socket a stranger can connect to, forked servers' connections checked against their
//! creator, observation cost that follows the pages mapped rather than the size of the
//! mappings, and accesses whose range wraps past the top of the address space.
//!
//! These need root and the THP sysfs knobs; without them each test prints why and returns
//! (CI runs as root).

mod common;
use common::{host_ready, script};
use oracle::{host, sys};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

fn assert_agrees(rep: &oracle::OracleReport) {
    assert_eq!(rep.exit_code(), 0, "{rep}");
    assert!(rep.differences.is_empty(), "{rep}");
    assert!(rep.cannot_run.is_none(), "{rep}");
}

/// Several forks, of ordinary and of privileged servers, with accesses in between.
const FORKS: &str = "\
p0 = spawn
a = p0 mmap 1M rw private anon fixed 0x200000000
p0 write a 1M pattern=0x11
p1 = p0 fork
p2 = p1 fork
p1 write a 4K pattern=0x22
p3 = p0 fork
expect p2 read a 1M pattern=0x11
expect p3 read a 4K pattern=0x11
expect p1 read a 4K pattern=0x22
p2 exit
p4 = p3 fork
expect p4 pagemap a+4K shared
r = spawn privileged
b = r mmap 64K rw private anon fixed 0x300000000
r write b 64K pattern=0x33
r1 = r fork
expect r1 read b 64K pattern=0x33
";

/// Inodes of the sockets this process holds open.
fn own_socket_inodes() -> Vec<u64> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter_map(|l| {
            let l = l.to_string_lossy().into_owned();
            l.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
        })
        .collect()
}

/// Unix sockets that a stranger could connect to: every listening socket of this process,
/// and any socket (of anyone) with an oracle-like name. `(inode, path)`.
fn connectable_sockets() -> Vec<(u64, String)> {
    const ACCEPTING: u64 = 0x1_0000; // __SO_ACCEPTCON in the Flags column
    let ours = own_socket_inodes();
    let text = std::fs::read_to_string("/proc/net/unix").unwrap_or_default();
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            let flags = u64::from_str_radix(cols.get(3)?, 16).ok()?;
            let inode: u64 = cols.get(6)?.parse().ok()?;
            let path = cols.get(7).copied().unwrap_or("").to_string();
            let listening_here = flags & ACCEPTING != 0 && ours.contains(&inode);
            (listening_here || path.contains("usermm")).then_some((inode, path))
        })
        .collect()
}

/// While a compare forks servers, nothing of the oracle's is there for another user to
/// connect to (the old design listened on `@usermm-oracle-PID-N`, where a silent `nobody`
/// client could hang the controller and a speaking one forge answers), and the run agrees.
#[test]
fn forking_opens_no_socket_to_connect_to() {
    if !host_ready() {
        return;
    }
    let text = FORKS.to_string();
    let run = std::thread::spawn(move || oracle::compare(&script(&text), &[]));
    let mut seen = Vec::new();
    let mut polls = 0u32;
    while !run.is_finished() {
        seen.extend(connectable_sockets());
        polls += 1;
        std::thread::sleep(Duration::from_millis(2));
    }
    let rep = match run.join() {
        Ok(r) => r,
        Err(_) => panic!("the compare thread panicked"),
    };
    assert_agrees(&rep);
    assert!(
        seen.is_empty(),
        "connectable sockets during the run: {seen:?}"
    );
    eprintln!("forking_opens_no_socket_to_connect_to: {polls} polls of /proc/net/unix, none");
}

/// The check the controller makes on a forked server's connection: its peer (for a socket
/// pair passed with SCM_RIGHTS, the process that made the pair) must be the forking server,
/// by pid and user. Here another process (a fork of this test) makes the pair and passes one
/// end, as a server does.
#[test]
fn passed_connection_is_checked_against_its_creator() {
    let (ours, theirs) = match UnixStream::pair() {
        Ok(p) => p,
        Err(e) => panic!("socketpair: {e}"),
    };
    let theirs_fd = theirs.as_raw_fd();
    let child = match sys::fork() {
        Ok(pid) => pid,
        Err(e) => panic!("fork: errno {e}"),
    };
    if child == 0 {
        // Allocation-free, like a server after fork of a multi-threaded process.
        let code = match sys::socketpair() {
            Ok((a, _b)) => match sys::send_with_fd(theirs_fd, &[7u8], a) {
                Ok(1) => 0,
                _ => 1,
            },
            Err(_) => 1,
        };
        sys::exit_now(code);
    }
    drop(theirs);
    let mut buf = [0u8; 1];
    let got = sys::recv_with_fd(ours.as_raw_fd(), &mut buf);
    let status = sys::wait_child(child);
    assert_eq!(status, Ok(0), "the child could not pass a socket");
    let fd = match got {
        Ok((1, Some(fd))) => fd,
        other => panic!("expected one byte and a descriptor, got {other:?}"),
    };
    assert_eq!(buf[0], 7);
    let uid = sys::geteuid();
    assert_eq!(host::check_peer(&fd, child, uid), Ok(()));
    // Same user, another process (this one): rejected.
    let err = host::check_peer(&fd, sys::getpid(), uid);
    assert!(err.is_err(), "{err:?}");
    // The right process, but the server was expected to run as another user: rejected.
    let err = host::check_peer(&fd, child, uid.wrapping_add(1));
    assert!(err.is_err(), "{err:?}");
    // A socket pair made here names this process.
    assert_eq!(host::check_peer(&ours, sys::getpid(), uid), Ok(()));
}

const HUGE_NORESERVE: &str = "\
p0 = spawn
a = p0 mmap 64G rw private anon norserve
p0 write a+1G 4K pattern=0x5
expect p0 read a+1G 4K pattern=0x5
";

/// This process's peak resident set size in KiB (`VmHWM`: the high-water mark of its own
/// address space; getrusage's ru_maxrss also counts the process it was exec'd from, here
/// cargo, so it cannot see growth below that).
fn vm_hwm_kib() -> u64 {
    let text = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// A 64 GiB reservation with one written page is compared at the cost of that page: the
/// run agrees and the test process's peak RSS grows by well under 100 MB (page-by-page
/// records on both sides took 1.2 GB and 45 s).
#[test]
fn huge_sparse_mapping_is_cheap_to_compare() {
    if !host_ready() {
        return;
    }
    let maxrss_before = match sys::peak_rss_kib() {
        Ok(k) => k,
        Err(e) => panic!("getrusage: errno {e}"),
    };
    let hwm_before = vm_hwm_kib();
    let t = Instant::now();
    let rep = oracle::compare(&script(HUGE_NORESERVE), &[]);
    let took = t.elapsed();
    let maxrss_after = sys::peak_rss_kib().unwrap_or(u64::MAX);
    let hwm_after = vm_hwm_kib();
    eprintln!(
        "huge_sparse_mapping_is_cheap_to_compare: {:.3} s; VmHWM {hwm_before} -> {hwm_after} KiB; \
         ru_maxrss {maxrss_before} -> {maxrss_after} KiB",
        took.as_secs_f64(),
    );
    assert_agrees(&rep);
    assert_eq!(rep.statements, 4, "{rep}");
    for (what, before, after) in [
        ("VmHWM", hwm_before, hwm_after),
        ("ru_maxrss", maxrss_before, maxrss_after),
    ] {
        assert!(
            after.saturating_sub(before) < 100 * 1024,
            "peak RSS ({what}) grew by {} KiB",
            after.saturating_sub(before)
        );
    }
}

/// An access whose range wraps past 2^64 is SIGSEGV on the host as in the engine, with
/// nothing touched (the host accessors used to compute a wrapped end and succeed).
#[test]
fn wrapping_access_is_sigsegv_on_both_sides() {
    if !host_ready() {
        return;
    }
    let rep = oracle::compare(
        &script(
            "\
p0 = spawn
a = p0 mmap 64K rw private anon
expect p0 read 0xfffffffffffff000 4K = SIGSEGV
expect p0 write 0xfffffffffffff000 8K pattern=0x1 = SIGSEGV
expect p0 touch 0xffffffffffffe000 16K write = SIGSEGV
expect p0 touch 0xfffffffffffff000 4K read = SIGSEGV
p0 write a 64K pattern=0x2
expect p0 read a 64K pattern=0x2
",
        ),
        &[],
    );
    assert_agrees(&rep);
    assert!(rep.expect_failures.is_empty(), "{rep}");
    assert_eq!(rep.statements, 8, "{rep}");
}

/// A host process is the small host agent, not a fork of this (large) test binary: it runs
/// from the in-memory file, as nobody, its whole address space is under 4 MiB before the
/// scenario maps anything (so `mlockall(MCL_CURRENT)` under an 8 MiB limit fits a few MiB of
/// scenario, as in a minimal C program), its fences end at [`oracle::server::FENCE_ALIGN`]
/// (where its first mapping ends), its heap starts at the engine's heap start, and a fork of
/// it is an agent too.
#[test]
fn host_processes_are_the_small_agent() {
    use scenario::backend::{Backend, MmapReq, Place};
    use scenario::{Prot, Sharing};
    if !host_ready() {
        return;
    }
    let knobs = oracle::knobs::ThpKnobs::acquire().expect("knobs");
    knobs.set_defaults().expect("defaults");
    let mut h = host::HostBackend::new(&knobs).expect("host");
    let p = h.spawn(false, Some(8 << 20)).expect("spawn");
    let c = h.fork(p).expect("fork");
    for pid in [p, c] {
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).expect("exe");
        assert!(
            exe.to_string_lossy().contains("memfd:usermm-host-agent"),
            "{exe:?}"
        );
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
        let field = |name: &str| -> u64 {
            let line = status.lines().find(|l| l.starts_with(name)).expect(name);
            line.split_whitespace()
                .nth(1)
                .and_then(|v| v.parse().ok())
                .expect(name)
        };
        // About 1 MiB of program, stack and vDSO, and up to FENCE_ALIGN of fences (from below
        // the program down to the boundary; 1.1 MiB without address randomisation on x86-64).
        assert!(field("VmSize:") < 4 << 10, "{status}");
        assert_eq!(field("Uid:"), 65534, "{status}");
        // The scenario's heap starts where the engine's does (`/proc/PID/stat` field 47).
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
        let after = &stat[stat.rfind(')').expect("stat") + 2..];
        let start_brk: u64 = after
            .split_whitespace()
            .nth(47 - 3)
            .and_then(|v| v.parse().ok())
            .expect("start_brk");
        assert_eq!(start_brk, usermm::machine::START_BRK, "{stat}");
    }
    let req = MmapReq {
        len: 1 << 20,
        prot: Prot::Rw,
        sharing: Sharing::Private,
        populate: false,
        locked: false,
        noreserve: false,
        place: Place::Anywhere,
        file: None,
    };
    let a = h.mmap(p, &req).expect("mmap");
    assert_eq!((a + (1 << 20)) % oracle::server::FENCE_ALIGN, 0, "{a:#x}");
    h.exit(c).expect("exit");
    h.exit(p).expect("exit");
}

/// `on cpuN` pins the host process to host CPU N; a CPU this host lacks is refused by name
/// (the file cannot run, exit 2), never run on another CPU.
#[test]
fn on_cpu_refuses_a_cpu_the_host_lacks() {
    if !host_ready() {
        return;
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let missing = 4096u32;
    assert!((missing as usize) >= cpus);
    let rep = oracle::compare(
        &script(&format!(
            "set cpus 8192\np0 = spawn\na = p0 mmap 64K rw private anon\np0 write a 4K pattern=0x1 on cpu{missing}\n"
        )),
        &[],
    );
    assert_eq!(rep.exit_code(), 2, "{rep}");
    let (line, why) = rep.cannot_run.clone().expect("cannot run");
    assert_eq!(line, 4, "{rep}");
    assert!(why.contains(&format!("cpu{missing}")), "{why}");
}
