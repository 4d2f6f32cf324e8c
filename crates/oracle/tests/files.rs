//! Files on the host (v2): the scratch directories' safety, and a few behaviours of the
//! host backend checked against Linux. These need root; without it each test says why and
//! returns.

mod common;
use common::{host_ready, script};
use oracle::files::{self, ScratchDir};
use oracle::knobs::ThpKnobs;
use oracle::HostBackend;
use scenario::backend::{Backend, Fail, MmapReq, Place};
use scenario::run::Runner;
use scenario::{FileKind, Prot, Sharing};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

fn root() -> bool {
    if oracle::sys::geteuid() != 0 {
        eprintln!("skipped: needs root");
        return false;
    }
    true
}

/// A fresh directory of this test's own, standing in for /dev/shm or /var/tmp.
fn test_parent(tag: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("usermm-files-test-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    std::fs::create_dir(&p).expect("create the test parent");
    p
}

#[test]
fn scratch_dir_is_private_and_removed() {
    if !root() {
        return;
    }
    let parent = test_parent("private");
    let path;
    {
        let d = ScratchDir::create(&parent).expect("scratch dir");
        path = d.path().to_path_buf();
        let m = std::fs::symlink_metadata(&path).expect("stat");
        assert!(m.is_dir());
        assert_eq!(m.mode() & 0o7777, 0o700);
        assert_eq!(m.uid(), 0);
        let f = d.tmpfile().expect("O_TMPFILE");
        f.set_len(8192).expect("ftruncate");
        // The file has no name: the directory stays empty.
        assert_eq!(std::fs::read_dir(&path).expect("readdir").count(), 0);
        assert!(d.holds(&format!("{}/#123 (deleted)", path.display())));
        assert!(!d.holds(&format!("{}x/#1 (deleted)", path.display())));
    }
    assert!(!path.exists(), "{} left behind", path.display());
    std::fs::remove_dir(&parent).expect("parent empty");
}

#[test]
fn a_planted_symlink_is_not_followed() {
    if !root() {
        return;
    }
    let parent = test_parent("planted");
    let target = parent.join("victim");
    std::fs::create_dir(&target).expect("victim dir");
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    // A symbolic link where the oracle would make its directory: refused, not followed.
    std::os::unix::fs::symlink(&target, parent.join("usermm-oracle-x")).expect("symlink");
    match ScratchDir::create_named(&parent, "usermm-oracle-x") {
        Ok(d) => panic!("used the planted link {}", d.path().display()),
        Err((e, m)) => assert_eq!(e, libc::EEXIST, "{m}"),
    }
    // A planted directory (of any owner) is refused the same way.
    std::fs::create_dir(parent.join("usermm-oracle-y")).expect("dir");
    assert!(ScratchDir::create_named(&parent, "usermm-oracle-y").is_err());
    let m = std::fs::metadata(&target).expect("victim");
    assert_eq!(m.mode() & 0o7777, 0o755, "the link's target was changed");
    assert_eq!(std::fs::read_dir(&target).expect("victim").count(), 0);
    // A parent that is itself a symbolic link is refused.
    let link_parent = parent.join("link-parent");
    std::os::unix::fs::symlink(&target, &link_parent).expect("symlink");
    match ScratchDir::create(&link_parent) {
        Ok(d) => panic!("followed the parent link to {}", d.path().display()),
        Err(m) => assert!(m.contains("symbolic link"), "{m}"),
    }
    assert_eq!(std::fs::read_dir(&target).expect("victim").count(), 0);
    std::fs::remove_dir_all(&parent).expect("cleanup");
}

#[test]
fn dev_shm_is_a_huge_never_tmpfs() {
    if !root() || !Path::new(files::TMPFS_PARENT).is_dir() {
        return;
    }
    let d = ScratchDir::create(Path::new(files::TMPFS_PARENT)).expect("scratch dir");
    if let Err(m) = files::check_tmpfs_never(&d) {
        eprintln!("skipped: {m}");
        return;
    }
    assert!(files::check_ext4(&d).is_err());
}

/// Runs `text` on the host alone; panics on a failed expectation or an abort.
fn host_run(text: &str) {
    let knobs = ThpKnobs::acquire().expect("knobs");
    knobs.set_defaults().expect("defaults");
    let mut r = Runner::new(HostBackend::new(&knobs).expect("host"));
    for stmt in &script(text).stmts {
        let step = r.run_stmt(stmt);
        assert!(
            step.expect_failure.is_none() && step.abort.is_none(),
            "line {}: {stmt}: {:?} {:?}",
            stmt.pos.line,
            step.expect_failure,
            step.abort
        );
    }
}

#[test]
fn tmpfs_and_disk_files_behave_as_linux() {
    if !host_ready() {
        return;
    }
    host_run(
        "\
f = file 64K
g = file 1M disk pattern=0x5A
p0 = spawn
expect p0 fincore f 0 64K 0
expect p0 fincore g 0 1M 0
a = p0 mmap 64K rw shared file f fixed 0x200000000
p0 touch a 4K read
expect p0 fincore f 0 64K 4K
expect p0 status RssShmem=4K RssFile=0
expect p0 pread g 0 4K pattern=0x5A
expect p0 fincore g 0 1M 16K
b = p0 mmap 64K rw private file g fixed 0x300000000
p0 write b 4K pattern=0x11
expect p0 pread g 0 4K pattern=0x5A
expect p0 smaps b Anonymous=4K
p0 ftruncate f 16K
expect p0 read a+16K 4K = SIGBUS
expect p0 pread f 0 16K pattern=0x0
",
    );
}

#[test]
fn file_errors_are_linux_errnos() {
    if !host_ready() {
        return;
    }
    let knobs = ThpKnobs::acquire().expect("knobs");
    knobs.set_defaults().expect("defaults");
    let mut h = HostBackend::new(&knobs).expect("host");
    let p = h.spawn(false, Some(8 << 20)).expect("spawn");
    let f = h
        .file_create(8192, FileKind::Tmpfs, Some(0x7))
        .expect("file");
    let einval = Fail::Outcome(scenario::Outcome::Errno(scenario::Errno::EINVAL));
    assert_eq!(h.fallocate(p, f, 0, 0, false), Err(einval.clone()));
    assert_eq!(h.ftruncate(p, f, 1 << 63), Err(einval.clone()));
    // A short read at the end of the file.
    assert_eq!(h.pread(p, f, 4096, 8192), Ok(vec![0x7; 4096]));
    assert_eq!(h.pread(p, f, 1 << 20, 10), Ok(Vec::new()));
    // An mmap offset that is not page-aligned.
    let req = MmapReq {
        len: 4096,
        prot: Prot::Rw,
        sharing: Sharing::Shared,
        populate: false,
        locked: false,
        noreserve: false,
        place: Place::Anywhere,
        file: Some((f, 100)),
    };
    assert_eq!(h.mmap(p, &req), Err(einval));
    let ok = MmapReq {
        file: Some((f, 4096)),
        ..req
    };
    let addr = h.mmap(p, &ok).expect("mmap");
    assert_eq!(h.check(p, addr, 4096, 0x7), Ok(None));
    assert_eq!(h.fincore(p, f, 0, 1 << 20), Ok(8192));
}
