//! The reclaim table at a tiny scale without host columns: it builds, its engine counters
//! are the same in two runs, and the pageout row's are exact (every page of it written to
//! swap once and read back once). No timing is asserted.

mod common;

use std::collections::BTreeMap;
use usermm_bench::host::HostSide;
use usermm_bench::progress::Progress;
use usermm_bench::reclaim::{engine_once, Case, CASES};
use usermm_bench::{suite, text, Bench, Options, Report};

const PAGE: u64 = 4096;

fn run(opts: &Options) -> Report {
    let host = HostSide::disabled("left out by the test");
    let progress = Progress::new(1, false);
    match suite::run(&[Bench::Reclaim], opts, &host, &progress, |_| {}) {
        Ok(r) => r,
        Err(e) => panic!("reclaim failed: {e:#}"),
    }
}

fn get(c: &BTreeMap<String, u64>, k: &str) -> u64 {
    c.get(k).copied().unwrap_or(0)
}

/// Every row's engine counters, by row label.
fn engine_cells(r: &Report) -> BTreeMap<String, BTreeMap<String, u64>> {
    r.tables[0]
        .rows
        .iter()
        .map(|row| (row.label.clone(), row.columns[0].counters.clone()))
        .collect()
}

#[test]
fn reclaim_table_at_a_tiny_scale_is_deterministic_and_exact() {
    let opts = Options {
        reps: 2,
        ..common::tiny()
    };
    let memory = opts.reclaim_memory;
    let a = run(&opts);
    let t = &a.tables[0];
    print!("{}", text::render(t));
    assert_eq!(t.id, "reclaim");
    let labels: Vec<String> = CASES.iter().map(|c| c.label()).collect();
    let rows: Vec<&str> = t.rows.iter().map(|r| r.label.as_str()).collect();
    assert_eq!(rows, labels);
    for r in &t.rows {
        let (e, h) = (&r.columns[0], &r.columns[1]);
        assert_eq!(e.samples.len(), opts.reps, "{}", r.label);
        assert!(e.samples.iter().all(|&s| s > 0.0), "{}", r.label);
        assert!(h.unavailable.is_some(), "host left out: {}", r.label);
        assert!(
            e.counters
                .keys()
                .all(|k| !k.starts_with("host_") && !k.starts_with("cg_")),
            "{}: a host counter in the engine cell",
            r.label
        );
    }
    let b = run(&opts);
    assert_eq!(
        engine_cells(&a),
        engine_cells(&b),
        "engine counters differ between runs"
    );
    let cells = engine_cells(&a);

    // MADV_PAGEOUT without pressure: every page written once; the folios stay in the swap
    // cache (their write is in flight on Linux), so reading them back is a swap fault that
    // finds each in the cache, with no read from the device, as the host counts it.
    let pages = Case::Pageout.bytes(memory) / PAGE;
    let po = &cells[&Case::Pageout.label()];
    for k in ["pswpout", "faults_swap", "swap_cache_hit"] {
        assert_eq!(get(po, k), pages, "pageout {k}: {po:?}");
    }
    for k in ["pswpin", "pgsteal_anon"] {
        assert_eq!(get(po, k), 0, "pageout {k}: {po:?}");
    }
    assert_eq!(get(po, "pgscan"), 0, "no page-cache reclaim: {po:?}");
    // The same counters from a direct call.
    let (_, direct) = engine_once(Case::Pageout, memory).expect("engine");
    assert_eq!(&direct, po);

    // Working sets of 2x and 4x the memory: at least what does not fit went to swap, and
    // the sequential read-back swapped every page in (the oldest were evicted first).
    for k in [2, 4] {
        let c = &cells[&Case::Anon(k).label()];
        let ws = Case::Anon(k).bytes(memory) / PAGE;
        assert!(get(c, "pswpout") >= ws - memory / PAGE, "anon {k}x: {c:?}");
        // At most once per page and pass (the read pass writes out again what swap-in
        // freed from the swap area: it is full at 4x).
        assert!(get(c, "pswpout") <= 2 * ws, "anon {k}x: {c:?}");
        assert_eq!(get(c, "pswpin"), ws, "anon {k}x: {c:?}");
        // Stolen: written out, or clean in the swap cache already (swapped in, unchanged).
        assert!(
            get(c, "pgsteal_anon") >= get(c, "pswpout"),
            "anon {k}x: {c:?}"
        );
    }

    // The file: page cache reclaimed, nothing swapped.
    let f = &cells[&Case::File(4).label()];
    assert!(get(f, "pgsteal") >= Case::File(4).bytes(memory) / PAGE - memory / PAGE);
    assert_eq!(get(f, "pswpout"), 0, "{f:?}");
}
