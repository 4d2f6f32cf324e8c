//! Helpers of the `usermm record` tests: whether this host can record, and a private scratch
//! directory with a fake THP sysfs tree (`USERMM_THP_DIR`) and lock directory
//! (`USERMM_LOCK_DIR`), so the host's knobs are never touched.
#![allow(dead_code)] // each test file uses some of them

use std::fs;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

pub fn can_record() -> bool {
    let root = oracle::sys::geteuid() == 0;
    let tp = Path::new("/sys/kernel/tracing/events/exceptions/page_fault_user").exists();
    if !(root && tp) {
        eprintln!("skipped: recording needs root and the page-fault tracepoint");
    }
    root && tp
}

/// A private (0700) scratch directory with a fake THP tree and a lock directory.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        let p = std::env::temp_dir().join(format!(
            "usermm-record-safety-{name}-{}",
            std::process::id()
        ));
        let _ = fs::remove_dir_all(&p);
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&p)
            .expect("scratch");
        let s = Scratch(p);
        for (rel, text) in FAKE_KNOBS {
            let f = s.0.join("thp").join(rel);
            fs::create_dir_all(f.parent().expect("parent")).expect("mkdir");
            fs::write(&f, text).expect("knob");
        }
        fs::DirBuilder::new()
            .mode(0o700)
            .create(s.0.join("lock"))
            .expect("lock dir");
        s
    }

    pub fn join(&self, rel: &str) -> PathBuf {
        self.0.join(rel)
    }

    pub fn knobs(&self) -> Vec<String> {
        FAKE_KNOBS
            .iter()
            .map(|(rel, _)| {
                oracle::knobs::current(
                    &fs::read_to_string(self.join("thp").join(rel)).expect("read"),
                )
            })
            .collect()
    }

    pub fn record(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_usermm"));
        c.arg("record")
            .args(args)
            .env(oracle::knobs::THP_DIR_ENV, self.join("thp"))
            .env(oracle::knobs::LOCK_DIR_ENV, self.join("lock"))
            .env_remove("SUDO_UID")
            .stdin(Stdio::null());
        c
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

pub const FAKE_KNOBS: &[(&str, &str)] = &[
    ("enabled", "always [madvise] never\n"),
    ("use_zero_page", "1\n"),
    ("khugepaged/scan_sleep_millisecs", "10000\n"),
    ("hugepages-64kB/enabled", "always inherit madvise [never]\n"),
    (
        "hugepages-2048kB/enabled",
        "always [inherit] madvise never\n",
    ),
];

pub fn original() -> Vec<String> {
    FAKE_KNOBS
        .iter()
        .map(|(_, t)| oracle::knobs::current(t))
        .collect()
}

pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}
