//! The reclaim table at a tiny scale without host columns: it builds, its engine counters
//! are the same in two runs, and the pageout row's are exact.

mod common;

use usermm_bench::host::HostSide;
use usermm_bench::progress::Progress;
use usermm_bench::reclaim::{Case, CASES};
use usermm_bench::{suite, text, Bench, Options, Report};

fn run(opts: &Options) -> Report {
    let host = HostSide::disabled("left out by the test");
    let progress = Progress::new(1, false);
    match suite::run(&[Bench::Reclaim], opts, &host, &progress, |_| {}) {
        Ok(r) => r,
        Err(e) => panic!("reclaim failed: {e:#}"),
    }
}

#[test]
fn reclaim_table_at_a_tiny_scale() {
    let opts = Options {
        reps: 2,
        ..common::tiny()
    };
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
    }
}
