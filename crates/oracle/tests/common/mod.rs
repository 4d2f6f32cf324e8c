//! Helpers shared by the oracle's integration tests.

use oracle::knobs;

/// Whether this host can run the oracle (root and the THP sysfs knobs); prints why not.
pub fn host_ready() -> bool {
    if oracle::sys::geteuid() != 0 {
        eprintln!("skipped: the oracle needs root");
        return false;
    }
    if !std::path::Path::new(knobs::THP_DIR)
        .join("enabled")
        .exists()
    {
        eprintln!("skipped: no THP sysfs knobs on this host");
        return false;
    }
    true
}

/// A test scenario (panics on a parse error: the test itself is wrong).
pub fn script(text: &str) -> scenario::Script {
    match scenario::parse("test.scn", text) {
        Ok(s) => s,
        Err(e) => panic!("bad test scenario: {e}"),
    }
}
