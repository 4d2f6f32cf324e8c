//! `set memory`, `set swap` and `reclaim` on the host backend: the scenario's processes run
//! in a memory cgroup of that size and swap to a swap file of ours, which are both gone
//! after the file; `reclaim` lowers the cgroup's usage; the fixed charge of a server fits
//! what the limit adds for it. These run for real (they add swap to the machine, under the
//! machine-wide lock every oracle run takes); each test prints why and returns where the
//! host is not root, has no memory cgroup controller or does not permit `swapon`.

mod common;
use common::{host_ready, script};
use oracle::cgroup::{self, FIXED_CHARGE};
use oracle::{swapfile, HostBackend, Session};
use scenario::run::{Abort, Runner};

/// Whether the host has a memory cgroup to make ours in; prints why not.
fn cgroup_ready() -> bool {
    if !host_ready() {
        return false;
    }
    match cgroup::locate() {
        Ok(_) => true,
        Err(m) => {
            eprintln!("skipped: {m}");
            false
        }
    }
}

/// Runs `text` statement by statement on the host backend; calls `check` after each with
/// its line, then hands the runner back. `None` (printed) when the host refuses `set swap`
/// for lack of permission.
fn run<'k>(
    session: &'k Session,
    text: &str,
    mut check: impl FnMut(u32, &mut Runner<HostBackend<'k>>),
) -> Option<Runner<HostBackend<'k>>> {
    let s = script(text);
    let host = HostBackend::new(session.knobs()).unwrap_or_else(|e| panic!("host: {e}"));
    let mut r = Runner::new(host);
    for stmt in &s.stmts {
        let step = r.run_stmt(stmt);
        if let Some(Abort::CannotRun(m)) = &step.abort {
            if m.contains("swapon") && m.contains("not permitted") {
                eprintln!("skipped: {m}");
                return None;
            }
        }
        assert!(
            step.abort.is_none() && step.expect_failure.is_none(),
            "line {}: {stmt}: {:?} {:?} {:?}",
            stmt.pos.line,
            step.outcome,
            step.abort,
            step.expect_failure
        );
        check(stmt.pos.line, &mut r);
    }
    Some(r)
}

fn usage(r: &Runner<HostBackend<'_>>) -> (u64, u64) {
    let cg = r.backend.machine().cgroup().expect("a cgroup");
    (cg.usage().expect("usage"), cg.swap_usage())
}

/// No cgroup and no swap file of this process is left.
fn assert_all_gone(swaps_before: &[String]) {
    assert_eq!(
        swapfile::active_areas(),
        swaps_before,
        "/proc/swaps changed"
    );
    let place = cgroup::locate().expect("locate");
    let left = cgroup::cgroups_of(&place.parent, std::process::id());
    assert!(left.is_empty(), "cgroups left: {left:?}");
    let ours = format!("usermm-oracle-{}-", std::process::id());
    let dirs: Vec<_> = std::fs::read_dir(swapfile::SWAP_PARENT)
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().starts_with(&ours))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default();
    assert!(dirs.is_empty(), "swap directories left: {dirs:?}");
}

const SWAP_128M: &str = "\
set memory 64M
set swap 256M
p0 = spawn
a = p0 mmap 128M rw private anon
p0 write a 128M pattern=0xA5
expect p0 read a 128M pattern=0xA5
";

#[test]
fn a_128m_write_in_64m_swaps_and_reads_back() {
    if !cgroup_ready() {
        return;
    }
    let session = Session::new().unwrap_or_else(|e| panic!("{e}"));
    let before = swapfile::active_areas();
    let mut peak_swap = 0;
    let mut limit = 0;
    let mut accounted = false;
    let r = run(&session, SWAP_128M, |line, r| {
        if let Some(cg) = r.backend.machine().cgroup() {
            limit = cg.limit_for(1);
            accounted = cg.swap_accounted();
            let (u, s) = usage(r);
            assert!(u <= limit, "line {line}: usage {u} over the limit {limit}");
            peak_swap = peak_swap.max(s);
        }
        if line == 2 {
            let ours = r.backend.machine().swap_size();
            assert_eq!(ours, 256 << 20);
            assert_eq!(swapfile::active_areas().len(), before.len() + 1);
        }
    });
    let Some(r) = r else { return };
    // The cgroup's limit is the scenario's 64M plus one server's fixed charge, so at least
    // 128M - 64M - FIXED_CHARGE went to swap (v1 and v2 account swap; if not, say so).
    assert_eq!(limit, (64 << 20) + FIXED_CHARGE);
    if !accounted {
        eprintln!("note: this host does not account the cgroup's swap");
    } else {
        assert!(peak_swap >= (64 << 20) - FIXED_CHARGE, "swap {peak_swap}");
    }
    drop(r);
    assert_all_gone(&before);
}

#[test]
fn without_set_swap_the_cgroup_does_not_swap() {
    if !cgroup_ready() {
        return;
    }
    let session = Session::new().unwrap_or_else(|e| panic!("{e}"));
    let before = swapfile::active_areas();
    // Swap exists on the machine (another file's), but this file has no `set swap`: a
    // write over its memory is killed instead of swapped.
    let text = "\
set memory 32M
p0 = spawn
a = p0 mmap 64M rw private anon
";
    let mut other = match swapfile::SwapFile::create(64 << 20) {
        Ok(s) => s,
        Err(m) => panic!("{m}"),
    };
    if let Err(m) = other.activate() {
        eprintln!("skipped: {m}");
        return;
    }
    let mut r = run(&session, text, |_, _| {}).expect("runs");
    let a = name_addr(&r, "a");
    let p0 = r.processes()[0].1;
    let p = r.backend.machine().cgroup().map(|c| c.path().to_path_buf());
    let w = scenario::backend::Backend::write(&mut r.backend, p0, a, 64 << 20, 0x5A);
    assert!(
        w.is_err(),
        "a 64M write fit in 32M without swap: {w:?} ({p:?})"
    );
    let (_, s) = usage(&r);
    assert_eq!(s, 0, "the cgroup swapped without set swap");
    drop(r);
    other.remove().unwrap_or_else(|m| panic!("{m}"));
    assert_all_gone(&before);
}

fn name_addr(r: &Runner<HostBackend<'_>>, name: &str) -> u64 {
    let n = scenario::Name::new(name).expect("a name");
    r.bindings().get(&n).map(|b| b.addr).expect("bound")
}

#[test]
fn reclaim_lowers_the_cgroup_usage() {
    if !cgroup_ready() {
        return;
    }
    let session = Session::new().unwrap_or_else(|e| panic!("{e}"));
    let before = swapfile::active_areas();
    let text = "\
set memory 256M
set swap 256M
p0 = spawn
a = p0 mmap 64M rw private anon
p0 write a 64M pattern=0x3C
p0 reclaim 32M
expect p0 read a 64M pattern=0x3C
";
    let mut at = Vec::new();
    let r = run(&session, text, |line, r| {
        if r.backend.machine().cgroup().is_some() {
            at.push((line, usage(r)));
        }
    });
    let Some(r) = r else { return };
    let get = |l: u32| {
        at.iter()
            .find(|(x, _)| *x == l)
            .map(|(_, u)| *u)
            .expect("line")
    };
    let (written, _) = get(5);
    let (reclaimed, swapped) = get(6);
    assert!(written >= 64 << 20, "usage after the write: {written}");
    assert!(
        reclaimed + (24 << 20) <= written,
        "reclaim 32M took usage from {written} to {reclaimed} only"
    );
    if swapped != 0 {
        assert!(swapped >= 24 << 20, "swap after reclaim: {swapped}");
    }
    drop(r);
    assert_all_gone(&before);
}

/// What idle servers charge: within the [`FIXED_CHARGE`] per server that the limit adds.
#[test]
fn idle_servers_fit_their_fixed_charge() {
    if !cgroup_ready() {
        return;
    }
    let session = Session::new().unwrap_or_else(|e| panic!("{e}"));
    let before = swapfile::active_areas();
    let text = "\
set memory 64M
p0 = spawn
p1 = spawn
p2 = p0 fork
p3 = p1 fork
";
    let mut seen = Vec::new();
    let r = run(&session, text, |line, r| {
        if r.backend.machine().cgroup().is_some() {
            seen.push((line, usage(r).0));
        }
    })
    .expect("runs");
    eprintln!("cgroup usage after each statement (line, bytes): {seen:?}");
    for (i, &(line, u)) in seen.iter().enumerate() {
        let servers = i as u64 + 1;
        assert!(
            u <= servers * FIXED_CHARGE,
            "line {line}: {servers} idle servers charge {u} bytes, over {servers} x {FIXED_CHARGE}"
        );
    }
    drop(r);
    assert_all_gone(&before);
}
