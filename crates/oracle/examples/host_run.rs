//! Runs scenario files on the host kernel alone (no engine, nothing compared) and reports
//! every failed expectation: for checking a scenario's expected values against Linux.
//!
//! `cargo run --release -p oracle --example host_run -- [-v] FILE…` (as root).

fn main() {
    let mut verbose = false;
    let mut files = Vec::new();
    for a in std::env::args().skip(1) {
        if a == "-v" || a == "--verbose" {
            verbose = true;
        } else {
            files.push(a);
        }
    }
    if files.is_empty() {
        eprintln!("usage: host_run [-v] FILE…");
        std::process::exit(2);
    }
    std::process::exit(i32::from(oracle::run_files_host_only(&files, verbose)));
}
