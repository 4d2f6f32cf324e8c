//! `record` on this host, when it can run (root, tracefs with the syscall and exception
//! tracepoints): a shell with a fork records, and the recording replays in agreement.

use trace::format::Event;

fn can_record() -> bool {
    let root = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false);
    root && std::path::Path::new("/sys/kernel/tracing/events/exceptions/page_fault_user").exists()
}

#[test]
fn a_recorded_shell_replays_in_agreement() {
    if !can_record() {
        eprintln!("skipped: not root or no page-fault tracepoint");
        return;
    }
    let out = std::env::temp_dir().join(format!("usermm-record-{}.umt", std::process::id()));
    let opts = trace::RecordOptions {
        out: out.clone(),
        progress: false,
        ..Default::default()
    };
    let cmd: Vec<String> = ["/bin/sh", "-c", "ls / | wc -l > /dev/null"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let s = trace::record(&cmd, &opts).unwrap();
    assert_eq!(s.exit_status, 0);
    let t = trace::read_file(&out).unwrap();
    let _ = std::fs::remove_file(&out);
    assert_eq!(s.events, t.events.len() as u64);
    assert_eq!(t.header.command, cmd);
    assert!(t.header.policy.contains("never"));
    let count = |f: fn(&Event) -> bool| t.events.iter().filter(|e| f(e)).count();
    assert!(count(|e| matches!(e, Event::Fork { .. })) >= 1);
    assert!(count(|e| matches!(e, Event::Exec { .. })) >= 2);
    assert!(count(|e| matches!(e, Event::Mmap { .. })) > 10);
    assert!(count(|e| matches!(e, Event::Fault { user: true, .. })) > 50);
    assert!(count(|e| matches!(e, Event::Validate { .. })) >= 2);
    // The page cache of each file as its first mapping found it: libc's is cached (the
    // recorder's own libc), and the seccomp stop at ld.so's mmap of it saw it.
    let libc = t.events.iter().find_map(|e| match e {
        Event::File { id, path, .. } if path.contains("libc.so") => Some(*id),
        _ => None,
    });
    let libc = libc.expect("libc is mapped");
    assert!(t.events.iter().any(|e| matches!(e,
        Event::Cache { file, folios } if *file == libc && !folios.is_empty())));
    let r = trace::replay(&t, &trace::ReplayOptions::default()).unwrap();
    assert_eq!(r.unknown_process, 0);
    assert_eq!(r.errno_mismatches, 0, "{:?}", r.mismatches);
    assert_eq!(r.cache_errors, 0);
    for c in &r.rss {
        assert!(c.anon_rel_err <= 0.05, "{c:?}");
    }
}
