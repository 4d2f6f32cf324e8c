//! The swap observables compared after each statement against the real kernel: a file that
//! pages part of a mapping out to swap, forks and swaps some back in agrees with the host on
//! smaps `Swap`/`SwapPss`, status `VmSwap` and pagemap `swapped` (bit 62). These add swap to
//! the machine (under the machine-wide lock every oracle run takes); each test prints why and
//! returns where the host is not root, has no memory cgroup controller or refuses `swapon`.

mod common;
use common::{host_ready, script};
use oracle::OracleReport;

/// 4 MiB written, its first 1 MiB paged out (MADV_PAGEOUT: `reclaim_pages` swaps the
/// private anonymous folios out at once, the PTEs becoming swap entries), then a fork, whose
/// `copy_nonpresent_pte` gives the child the same swap entries (each slot used twice: SwapPss
/// halves), the child's exit, and 64K read back in (`do_swap_page` with the VMA readahead
/// window); each `madvise … normal` after a read is only there to have the pages compared.
const PAGEOUT: &str = "\
set memory 64M
set swap 256M
p0 = spawn
a = p0 mmap 4M rw private anon
p0 write a 4M pattern=0x5a
p0 madvise a 1M pageout
expect p0 smaps a Rss=3M Swap=1M SwapPss=1M
expect p0 status VmSwap=1M
expect p0 pagemap a swapped
expect p0 pagemap a+1020K swapped
expect p0 pagemap a+1M present
p1 = p0 fork
expect p1 smaps a Swap=1M SwapPss=512K
expect p1 pagemap a swapped
p1 exit
expect p0 smaps a Swap=1M SwapPss=1M
expect p0 read a 64K pattern=0x5a
p0 madvise a+3M 4K normal
expect p0 pagemap a present
expect p0 read a+512K 4K pattern=0x5a
p0 madvise a+3M 4K normal
";

/// Whether `rep` stopped because this host cannot give the file a cgroup or swap; prints why.
fn host_refused(rep: &OracleReport) -> bool {
    match &rep.cannot_run {
        Some((_, m)) if m.contains("host") && (m.contains("swap") || m.contains("cgroup")) => {
            eprintln!("skipped: {m}");
            true
        }
        _ => false,
    }
}

#[test]
fn paged_out_pages_agree() {
    if !host_ready() {
        return;
    }
    let rep = oracle::compare(&script(PAGEOUT), &[]);
    if host_refused(&rep) {
        return;
    }
    eprintln!("{rep}");
    assert!(
        rep.failed.is_none() && rep.cannot_run.is_none() && rep.expect_failures.is_empty(),
        "{rep}"
    );
    assert!(rep.differences.is_empty(), "{rep}");
    assert_eq!(rep.statements, 21, "{rep}");
}

/// Every swap observable is listed as compared, none as left out. (No engine tunable
/// changes what is swapped, so a disagreement is not staged here against the host: the unit
/// test `compare::pages::tests::swapped_pages_are_compared` feeds `compare_pages` pages
/// swapped on one side only and checks each is reported.)
#[test]
fn swap_observables_are_compared() {
    let all = oracle::observables();
    for f in [
        "smaps Swap",
        "smaps SwapPss",
        "status VmSwap",
        "pagemap swapped",
    ] {
        let listed: Vec<bool> = all
            .iter()
            .filter(|o| o.name == f)
            .map(|o| o.compared)
            .collect();
        assert_eq!(listed, [true], "{f}: {all:?}");
    }
}

/// The must-show of the reclaim issue: `scenarios/swap-1g-in-256m.scn`, a 1 GiB working
/// set written into 256 MiB with 2 GiB of swap (direct reclaim to swap on both sides),
/// read back, forked and written by the child, agrees with the host under the pressure
/// rule (`compare/pressure.rs`: residency sizes within 8 MiB, Rss+Swap exact), and the
/// rule was in force (its pages are reported as not compared one by one).
#[test]
fn a_gigabyte_working_set_under_pressure_agrees() {
    if !host_ready() {
        return;
    }
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scenarios/swap-1g-in-256m.scn"
    );
    let text = std::fs::read_to_string(path).expect("scenario");
    let rep = oracle::compare(&script_named(path, &text), &[]);
    if host_refused(&rep) {
        return;
    }
    assert!(
        rep.failed.is_none()
            && rep.cannot_run.is_none()
            && rep.expect_failures.is_empty()
            && rep.differences.is_empty(),
        "{rep}"
    );
    assert!(
        rep.skipped
            .iter()
            .any(|(_, r)| r.contains("after memory pressure")),
        "the pressure rule did not engage: {rep}"
    );
}

fn script_named(name: &str, text: &str) -> scenario::Script {
    scenario::parse(name, text).unwrap_or_else(|e| panic!("{e}"))
}
