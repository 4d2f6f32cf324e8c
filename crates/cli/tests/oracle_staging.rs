//! The oracle's file staging on a shared host, in a private mount namespace with a 64 MiB
//! tmpfs over `/dev/shm` (so the host's own `/dev/shm` is never touched): a scenario file
//! that does not fit is refused before a byte is written, and the empty scratch directory a
//! killed oracle left is removed by the next run. The oracle takes the machine-wide lock as
//! always (it sets the host's THP knobs). Needs root and `unshare`; without them the test
//! says so and returns.

use std::process::Command;

#[test]
fn staging_checks_room_and_sweeps_what_a_killed_run_left() {
    let root = oracle::sys::geteuid() == 0;
    let unshare = Command::new("unshare").arg("--version").output().is_ok();
    if !(root && unshare) {
        eprintln!("skipped: needs root and unshare");
        return;
    }
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("oracle_staging");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("mkdir");
    let big = dir.join("big.scn");
    std::fs::write(
        &big,
        "g = file 1G pattern=0x5a\np0 = spawn\na = p0 mmap 4K rw shared file g\n\
         expect p0 read a 4K pattern=0x5a\n",
    )
    .expect("write");
    let small = dir.join("small.scn");
    std::fs::write(
        &small,
        "g = file 1M pattern=0x5a\np0 = spawn\na = p0 mmap 1M r shared file g\n\
         expect p0 read a 1M pattern=0x5a\n",
    )
    .expect("write");
    // A dead pid: a child that has been reaped.
    let mut c = Command::new("true").spawn().expect("spawn");
    let dead = c.id();
    c.wait().expect("wait");
    let script = format!(
        "set -e; mount -t tmpfs -o size=64m,huge=never tmpfs /dev/shm; \
         mkdir -m 700 /dev/shm/usermm-oracle-{dead}-0123456789abcdef; \
         mkdir -m 700 /dev/shm/usermm-oracle-1-fedcba9876543210; \
         set +e; {exe} oracle {big}; echo big=$?; {exe} oracle {small}; echo small=$?; \
         ls -a /dev/shm; df -k --output=used /dev/shm | tail -1",
        exe = env!("CARGO_BIN_EXE_usermm"),
        big = big.display(),
        small = small.display(),
    );
    let o = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &script])
        .output()
        .expect("unshare");
    let out = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    if out.contains("unshare failed") || out.contains("Operation not permitted") {
        eprintln!("skipped: no mount namespace here: {out}");
        return;
    }
    // The 1 GiB file is refused as a host limit (not run), naming what was free.
    assert!(out.contains("big=2"), "{out}");
    assert!(out.contains("1024 MiB to write on /dev/shm"), "{out}");
    // A file that fits runs and agrees.
    assert!(out.contains("small=0"), "{out}");
    // The dead run's directory is gone; pid 1's (alive) is left; nothing else remains.
    assert!(!out.contains(&format!("usermm-oracle-{dead}-")), "{out}");
    assert!(out.contains("usermm-oracle-1-fedcba9876543210"), "{out}");
    // The df line is the script's last line of standard output (notes go to stderr).
    let used_kb: u64 = String::from_utf8_lossy(&o.stdout)
        .lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or(u64::MAX);
    assert_eq!(used_kb, 0, "{out}");
}
