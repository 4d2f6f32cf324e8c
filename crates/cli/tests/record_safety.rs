//! `usermm record` on a shared host: the output is never written through a link or into a
//! directory another user controls (checked before the command runs), a stop signal ends the
//! recording in order with the THP knobs restored and the trace written, and the command can
//! run as an ordinary user.
//!
//! The knobs are a fake sysfs tree of plain files (`USERMM_THP_DIR`) and the lock directory a
//! private one (`USERMM_LOCK_DIR`), as the oracle's knob tests use, so the host's knobs are
//! never touched. Recording needs root and the page-fault tracepoint; without them each test
//! says so and returns.

mod common;
use common::{can_record, original, text, Scratch};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn the_output_is_refused_in_a_foreign_directory_and_never_written_through_a_link() {
    if !can_record() {
        return;
    }
    let s = Scratch::new("links");
    let victim = s.join("victim");
    fs::write(&victim, "precious\n").expect("victim");
    let nobody = 65534;
    // A directory others may write, one owned by another user, a link owned by another user:
    // each refused before the command runs (its marker file is never made).
    let open = s.join("open");
    fs::create_dir(&open).expect("mkdir");
    fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).expect("chmod");
    let theirs = s.join("theirs");
    fs::create_dir(&theirs).expect("mkdir");
    std::os::unix::fs::chown(&theirs, Some(nobody), Some(nobody)).expect("chown");
    let link = s.join("link");
    std::os::unix::fs::symlink(s.join("open"), &link).expect("symlink");
    std::os::unix::fs::lchown(&link, Some(nobody), Some(nobody)).expect("lchown");
    let marker = s.join("ran");
    for (dir, why) in [
        (&open, "writable by its group or others"),
        (&theirs, "owned by uid 65534"),
        (&link, "a symbolic link owned by uid 65534"),
    ] {
        let out = dir.join("t.umt");
        let o = s
            .record(&[
                "--out",
                out.to_str().expect("utf-8"),
                "--",
                "/bin/touch",
                marker.to_str().expect("utf-8"),
            ])
            .output()
            .expect("run");
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        assert!(text(&o).contains(why), "{}", text(&o));
        assert!(
            !marker.exists(),
            "the command ran before the output was checked"
        );
    }
    // A link planted at the final name before the run, and one planted by the command while
    // it runs: the trace replaces the link; the file it pointed at is untouched.
    let out = s.join("t.umt");
    std::os::unix::fs::symlink(&victim, &out).expect("symlink");
    let plant = format!(
        "rm -f {o}; ln -s {v} {o}",
        o = out.display(),
        v = victim.display()
    );
    let o = s
        .record(&[
            "--out",
            out.to_str().expect("utf-8"),
            "--",
            "/bin/sh",
            "-c",
            &plant,
        ])
        .output()
        .expect("run");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(fs::read_to_string(&victim).expect("victim"), "precious\n");
    let meta = fs::symlink_metadata(&out).expect("out");
    assert!(
        meta.file_type().is_file(),
        "the output is a file of its own"
    );
    trace::read_file(&out).expect("the trace reads back");
    // No temporary file is left beside it.
    let left: Vec<_> = fs::read_dir(&s.0)
        .expect("ls")
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    assert_eq!(s.knobs(), original());
}

#[test]
fn a_stop_signal_restores_the_knobs_kills_the_command_and_keeps_the_trace() {
    if !can_record() {
        return;
    }
    for (sig, name) in [("TERM", "term"), ("INT", "int"), ("HUP", "hup")] {
        let s = Scratch::new(name);
        let out = s.join("t.umt");
        let mut child = s
            .record(&[
                "--out",
                out.to_str().expect("utf-8"),
                "--",
                "/bin/sleep",
                "60",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        // Wait until the recording has set the knobs (top-level `never`).
        let t0 = Instant::now();
        while oracle::knobs::current(&fs::read_to_string(s.join("thp/enabled")).expect("read"))
            != "never"
        {
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "record never set the knobs"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(300));
        let k = Command::new("kill")
            .args(["-s", sig, &child.id().to_string()])
            .status()
            .expect("kill");
        assert!(k.success());
        let t1 = Instant::now();
        let o = loop {
            if let Some(_st) = child.try_wait().expect("wait") {
                break child.wait_with_output().expect("output");
            }
            assert!(
                t1.elapsed() < Duration::from_secs(10),
                "record did not stop"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(o.status.code(), Some(130), "{name}: {}", text(&o));
        assert_eq!(s.knobs(), original(), "{name}: the knobs are restored");
        assert!(
            !s.join("lock/knobs.journal").exists(),
            "{name}: journal removed"
        );
        let t = trace::read_file(&out).expect("the trace of what ran is written");
        assert!(!t.events.is_empty());
    }
}

#[test]
fn the_command_runs_as_the_user_asked_or_as_sudo_s_invoking_user() {
    if !can_record() {
        return;
    }
    let s = Scratch::new("user");
    let out = s.join("t.umt");
    let out = out.to_str().expect("utf-8");
    let id = |extra: &[&str], sudo: Option<&str>| {
        let mut args = vec!["--out", out];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", "/bin/sh", "-c", "echo uid=$(id -u) gid=$(id -g)"]);
        let mut c = s.record(&args);
        if let Some(u) = sudo {
            c.env("SUDO_UID", u);
        }
        let o = c.output().expect("run");
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        let line = String::from_utf8_lossy(&o.stdout)
            .lines()
            .find(|l| l.starts_with("uid="))
            .map(str::to_owned)
            .unwrap_or_default();
        line
    };
    assert_eq!(id(&["--user", "nobody"], None), "uid=65534 gid=65534");
    assert_eq!(id(&["--user", "65534"], None), "uid=65534 gid=65534");
    assert_eq!(id(&[], Some("65534")), "uid=65534 gid=65534");
    assert_eq!(id(&["--user", "root"], Some("65534")), "uid=0 gid=0");
    assert_eq!(id(&[], None), "uid=0 gid=0");
    let o = s
        .record(&["--out", out, "--user", "no-such-user-zz", "--", "/bin/true"])
        .output()
        .expect("run");
    assert_ne!(o.status.code(), Some(0));
    assert!(text(&o).contains("no user"), "{}", text(&o));
}

#[test]
fn a_command_that_does_not_exist_is_refused_before_anything_changes() {
    if !can_record() {
        return;
    }
    let s = Scratch::new("nocmd");
    let out = s.join("t.umt");
    let o = s
        .record(&[
            "--out",
            out.to_str().expect("utf-8"),
            "--",
            "no-such-command-zz",
        ])
        .output()
        .expect("run");
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("no such command"), "{}", text(&o));
    assert!(!out.exists());
    assert_eq!(s.knobs(), original());
}
