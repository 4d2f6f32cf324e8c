//! A tiny suite run shared by the tests: every benchmark at the smallest scale, no host
//! columns (they need root and change global knobs), so it takes a few seconds.

#![allow(dead_code)]

use usermm_bench::host::HostSide;
use usermm_bench::progress::Progress;
use usermm_bench::{suite, Bench, Options, Report};

/// Options small enough for a test.
pub fn tiny() -> Options {
    Options {
        scale: 4 << 20,
        sharing_scale: 4 << 20,
        munlock_scale: 4 << 20,
        anon_cow_scale: 4 << 20,
        reclaim_memory: 8 << 20,
        reps: 1,
        max_reps: 1,
        tight_pp: 10.0,
        spawn_seconds: 0.01,
        spawn_extra: vec![0, 100],
        folios: vec![4 << 10, 64 << 10, 2 << 20],
        linear_map_gib: vec![1],
        tlbi_ns: 0,
        profile: None,
        recipe_model: true,
        variants: Vec::new(),
    }
}

/// Runs every benchmark at the tiny scale without host columns.
pub fn tiny_report() -> Report {
    let host = HostSide::disabled("left out by the test");
    let progress = Progress::new(Bench::ALL.len() as u64, false);
    match suite::run(&Bench::ALL, &tiny(), &host, &progress, |_| {}) {
        Ok(r) => r,
        Err(e) => panic!("tiny suite failed: {e:#}"),
    }
}
